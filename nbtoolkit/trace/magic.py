"""``%%nbt profile``, ``%nbt overlap`` and ``%nbt trace``: one call of the trace API each."""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.core.loop_cell import LOOP_ARGUMENTS, cell_code
from nbtoolkit.core.magic_display import DISPLAY_ARGUMENTS, show_widget
from nbtoolkit.core.magic_registry import APIDefault, Argument, MagicCall, Subcommand, register


def _profile(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.core.progress import CELL_DELAY_S, DelayedProgress
    from nbtoolkit.trace.profile import profile

    code, loop = cell_code(args, call)
    runs = "training steps" if loop else "runs"
    label = f"profiling the cell ({args.warmup} warm-up, {args.steps} recorded {runs})"
    with DelayedProgress(label, delay_s=CELL_DELAY_S):
        return profile(
            code,
            steps=args.steps,
            warmup=args.warmup,
            profile_memory=args.memory,
            record_shapes=args.shapes,
            metrics=args.metrics,
            tokens_per_step=args.tokens,
            loop=loop,
            after=args.after,
        )


def _overlap(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.trace.overlap_report import OverlapReport

    # comm_comp_overlap (the one door for overlap) takes a path, a Trace or a TraceSummary variable.
    return OverlapReport.of(call.resolve(args.traces))


def _trace(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.trace.load import load_trace
    from nbtoolkit.trace.timeline_widget import TraceReportWithWidget
    from nbtoolkit.trace.views import TraceReport

    trace = load_trace(call.resolve(args.traces))
    report = TraceReport.of(trace)
    if not show_widget(args):
        return report
    from nbtoolkit.trace.timeline_widget import timeline_widget

    return TraceReportWithWidget.of_report(report, timeline_widget(trace))


_TRACES = Argument("traces", help="a trace file, a folder of per-rank traces, or a Trace variable")
_OVERLAP_OF = Argument(
    "traces", help="a trace file, a folder of per-rank traces, or a Trace or TraceSummary variable"
)


def _profile_default(parameter: str) -> APIDefault:
    # profile takes None for "MeasureConfig's default": show that default
    return APIDefault("nbtoolkit.core.measure_config", "MeasureConfig", parameter)


register(
    Subcommand(
        name="profile",
        summary="run the cell under torch.profiler (one ProfilerStep per run) and show the Trace",
        mode="cell",
        arguments=(
            Argument(
                "--steps",
                type=int,
                default=_profile_default("steps"),
                help="profiled runs of the cell (default %(default)s), training steps with --loop",
            ),
            Argument(
                "--warmup",
                type=int,
                default=_profile_default("warmup"),
                help="unprofiled runs first (default %(default)s), training steps with --loop (at least 1)",
            ),
            Argument("--memory", action="store_true", help="also record memory allocations (profile_memory)"),
            Argument("--shapes", action="store_true", help="also record input shapes (record_shapes)"),
            Argument("--metrics", action="store_true", help="also count FLOPs: MFU/HFU in the summary"),
            Argument("--tokens", type=int, default=None, help="tokens per run of the cell, for tokens/s"),
            *LOOP_ARGUMENTS,
        ),
        handler=_profile,
    )
)

register(
    Subcommand(
        name="overlap",
        summary="comm/compute overlap per rank (HTA's definition; gloo on CPU) of traces or a Trace",
        mode="line",
        arguments=(_OVERLAP_OF,),
        handler=_overlap,
    )
)

register(
    Subcommand(
        name="trace",
        summary="timeline, steps, breakdowns and overlap of traces or a Trace variable",
        mode="line",
        arguments=(_TRACES, *DISPLAY_ARGUMENTS),
        handler=_trace,
    )
)
