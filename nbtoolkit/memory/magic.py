"""``%%nbt memory`` and ``%nbt snapshot``: one call of the memory API each.

Each returns what a script calling that function gets: the MemoryTimeline or MemorySnapshot,
shown as its summary. Above the summary the memory timeline is drawn (a snapshot's only when it
recorded its allocation history):

- in a widget front end (see :mod:`nbtoolkit.core.magic_display`; ``--widget`` / ``--static``
  decide per call) as the zoomable memory widget, kept as ``NAME_widget`` (``_nbt_widget`` by
  default) so that ``_nbt_widget.selected`` reads a click;
- elsewhere (nbconvert, nbval, a terminal) as the timeline's figure, whose display carries a
  static SVG for exported HTML (:mod:`nbtoolkit.core.static_figure`); ``--no-figure`` leaves it out.

The figures are also one call away (``_nbt.figure()``) and in ``%nbt report``.
"""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.core.loop_cell import LOOP_ARGUMENTS, cell_code
from nbtoolkit.core.magic_display import DISPLAY_ARGUMENTS, show_widget
from nbtoolkit.core.magic_registry import Argument, MagicCall, Subcommand, register

_NO_FIGURE = Argument(
    "--no-figure",
    action="store_true",
    help="no static timeline figure (shown outside widget front ends): only the summary",
)


def _memory(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.core.progress import CELL_DELAY_S, DelayedProgress
    from nbtoolkit.memory.capture import memory_timeline

    model, optimizer = call.lookup(args.model, "model"), call.lookup(args.optimizer, "optimizer")
    code, loop = cell_code(args, call)
    runs = "training steps" if loop else "runs"
    with DelayedProgress(f"recording the cell's memory ({runs}: {args.steps or 1})", delay_s=CELL_DELAY_S):
        timeline = memory_timeline(
            code, args.steps, model=model, optimizer=optimizer, loop=loop, after=args.after
        )
    _show_memory_timeline(args, call, timeline)
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
        _show_memory_timeline(args, call, snapshot)
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


def _show_memory_timeline(args: argparse.Namespace, call: MagicCall, source: Any) -> None:
    """Above the summary: the memory widget (kept as NAME_widget), else the static figure."""
    from IPython.display import display

    if show_widget(args):
        from nbtoolkit.memory.timeline_widget import memory_widget

        widget = memory_widget(source)
        call.user_ns[f"{args.name}_widget"] = widget
        display(widget)
    elif not args.no_figure:
        from nbtoolkit.memory.timeline import MemoryTimeline

        timeline = source if isinstance(source, MemoryTimeline) else source.timeline()
        if len(timeline.events):
            display(timeline.figure())


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
                help="runs of the cell while recording, or training steps of a loop after one warm-up step "
                "(default 1)",
            ),
            Argument("--model", default=None, help="the model variable: names modules, counts its tensors"),
            Argument("--optimizer", default=None, help="the optimizer variable: counts its state"),
            *LOOP_ARGUMENTS,
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
