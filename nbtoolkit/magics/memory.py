"""``%%nbt memory`` and ``%nbt snapshot``: thin magics over the memory API."""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.magics._registry import Argument, MagicCall, Subcommand, register


def _show(figure: Any) -> None:
    from IPython.display import display

    display(figure)


def _memory(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.capture.memory import memory_timeline
    from nbtoolkit.views.memory import timeline_figure
    from nbtoolkit.views.progress import CELL_DELAY_S, DelayedProgress

    model = call.lookup(args.model, "model") if args.model else None
    optimizer = call.lookup(args.optimizer, "optimizer") if args.optimizer else None
    runs = f"{args.steps} run" + ("s" if args.steps != 1 else "")
    with DelayedProgress(f"recording the cell's memory ({runs})", delay_s=CELL_DELAY_S):
        timeline = memory_timeline(call.cell_function(), args.steps, model=model, optimizer=optimizer)
    if not args.no_figure:
        _show(timeline_figure(timeline))
    return timeline


def _snapshot(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.io.snapshot import load_memory_snapshot
    from nbtoolkit.model.snapshot import MemorySnapshot
    from nbtoolkit.views.memory import segment_figure, timeline_figure

    value = call.resolve(args.snapshot)
    snapshot = value if isinstance(value, MemorySnapshot) else load_memory_snapshot(value)
    if not args.no_figure:
        _show(segment_figure(snapshot))
        if len(snapshot.trace):
            _show(timeline_figure(snapshot.timeline()))
    return snapshot


register(
    Subcommand(
        name="memory",
        summary="run the cell and show its memory timeline by category, module and phase",
        mode="cell",
        arguments=(
            Argument("--steps", type=int, default=1, help="runs of the cell while recording (default 1)"),
            Argument("--model", default=None, help="the model variable: names modules, counts its tensors"),
            Argument("--optimizer", default=None, help="the optimizer variable: counts its state"),
            Argument("--no-figure", action="store_true", help="only the summary, no timeline figure"),
        ),
        handler=_memory,
    )
)

register(
    Subcommand(
        name="snapshot",
        summary="load a CUDA allocator snapshot (.pickle) and show its segments and timeline",
        mode="line",
        arguments=(
            Argument(
                "snapshot", help="a snapshot file from torch.cuda.memory._dump_snapshot(), or a variable"
            ),
            Argument("--no-figure", action="store_true", help="only the summary, no figures"),
        ),
        handler=_snapshot,
    )
)
