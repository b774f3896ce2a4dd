"""``%%nbt memory`` and ``%nbt snapshot``: one call of the memory API each.

Each shows what a script calling that function gets: the MemoryTimeline or MemorySnapshot
and its summary. Their figures are one call away (``_nbt.figure()``) and in ``%nbt report``.
In a widget front end (see :mod:`nbtoolkit.core.magic_display`; ``--widget`` /
``--static`` decide per call) the zoomable memory widget shows above the summary and is kept
as ``NAME_widget`` (``_nbt_widget`` by default) so that ``_nbt_widget.selected`` reads a click.
"""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.core.magic_display import DISPLAY_ARGUMENTS, show_widget
from nbtoolkit.core.magic_registry import Argument, MagicCall, Subcommand, register

# Accepted so that old cells still run: the magics show no figure of their own any more.
_NO_FIGURE = Argument("--no-figure", action="store_true", help=argparse.SUPPRESS)


def _memory(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.core.progress import CELL_DELAY_S, DelayedProgress
    from nbtoolkit.memory.capture import memory_timeline

    model, optimizer = call.lookup(args.model, "model"), call.lookup(args.optimizer, "optimizer")
    with DelayedProgress(f"recording the cell's memory (runs: {args.steps or 1})", delay_s=CELL_DELAY_S):
        timeline = memory_timeline(call.cell_function(), args.steps, model=model, optimizer=optimizer)
    _show_memory_widget(args, call, timeline)
    return timeline


def _snapshot(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.memory.snapshot_reader import load_memory_snapshot

    snapshot = load_memory_snapshot(
        call.resolve(args.snapshot),
        devices=args.device,
        time_range_us=_time_range(args.time_range),
        history=not args.no_history,
    )
    if len(snapshot.trace):  # a snapshot without allocation history has no timeline to show
        _show_memory_widget(args, call, snapshot)
    return snapshot


def _time_range(text: str | None) -> tuple[float | None, float | None] | None:
    """``START:END`` (either side may be empty) as load_memory_snapshot's ``time_range_us``."""
    from nbtoolkit.core.errors import NbtUsageError

    if text is None:
        return None
    start, colon, end = text.partition(":")
    try:
        if not colon:
            raise ValueError
        return (float(start) if start.strip() else None, float(end) if end.strip() else None)
    except ValueError:
        raise NbtUsageError(
            f"--time-range takes START:END in the snapshot's time_us clock (either side may be empty, "
            f"e.g. 1.5e6: or :2e6), got {text!r}"
        ) from None


def _show_memory_widget(args: argparse.Namespace, call: MagicCall, source: Any) -> None:
    """In a widget front end, show the memory widget above the summary and keep it as NAME_widget."""
    if not show_widget(args):
        return
    from IPython.display import display

    from nbtoolkit.memory.timeline_widget import memory_widget

    widget = memory_widget(source)
    call.user_ns[f"{args.name}_widget"] = widget
    display(widget)


register(
    Subcommand(
        name="memory",
        summary="run the cell and show its memory timeline by category, module and phase",
        mode="cell",
        arguments=(
            Argument(
                "--steps",
                type=int,
                default=None,
                help="runs of the cell while recording (default 1)",
            ),
            Argument("--model", default=None, help="the model variable: names modules, counts its tensors"),
            Argument("--optimizer", default=None, help="the optimizer variable: counts its state"),
            *DISPLAY_ARGUMENTS,
            _NO_FIGURE,
        ),
        handler=_memory,
    )
)

register(
    Subcommand(
        name="snapshot",
        summary="load a CUDA allocator snapshot (.pickle, or a variable) and show its summary",
        mode="line",
        arguments=(
            Argument(
                "snapshot", help="a snapshot file from torch.cuda.memory._dump_snapshot(), or a variable"
            ),
            Argument(
                "--no-history",
                action="store_true",
                help="read segments and blocks only (what stats() needs): a large file reads much faster",
            ),
            Argument(
                "--device",
                type=int,
                action="append",
                default=None,
                help="keep this device only (repeat for several); applied while reading",
            ),
            Argument(
                "--time-range",
                default=None,
                metavar="START:END",
                help="keep the history inside this window of the snapshot's time_us clock (read filter)",
            ),
            *DISPLAY_ARGUMENTS,
            _NO_FIGURE,
        ),
        handler=_snapshot,
    )
)
