"""``%%nbt profile``, ``%nbt overlap`` and ``%nbt trace``: one call of the trace API each."""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.magics._registry import APIDefault, Argument, MagicCall, Subcommand, register


def _profile(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.capture.profiler import profile
    from nbtoolkit.views.progress import CELL_DELAY_S, DelayedProgress

    label = f"profiling the cell ({args.warmup} warm-up, {args.steps} recorded)"
    with DelayedProgress(label, delay_s=CELL_DELAY_S):
        return profile(
            call.cell_function(),
            steps=args.steps,
            warmup=args.warmup,
            profile_memory=args.memory,
            record_shapes=args.shapes,
            metrics=args.metrics,
            tokens_per_step=args.tokens,
        )


def _overlap(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.io.kineto import load_trace
    from nbtoolkit.views.trace_views import OverlapView

    # load_trace takes a path or a Trace variable alike.
    return OverlapView.of(load_trace(call.resolve(args.traces)))


def _trace(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.io.kineto import load_trace
    from nbtoolkit.views.timeline_widget_static import TraceReportWithWidget, widgets_enabled
    from nbtoolkit.views.trace_views import TraceReport

    trace = load_trace(call.resolve(args.traces))
    report = TraceReport.of(trace)
    if not show_widget(args, widgets_enabled):
        return report
    from nbtoolkit.views.timeline_widget import timeline_widget

    return TraceReportWithWidget.of_report(report, timeline_widget(trace))


def show_widget(args: argparse.Namespace, auto: Any) -> bool:
    """--widget / --static for this call, else the front end's default (``auto()``)."""
    if args.widget and args.static:
        from nbtoolkit.errors import NbtUsageError

        raise NbtUsageError("--widget and --static exclude each other: pick one")
    return bool(args.widget or (not args.static and auto()))


# Shared by the magics that can show a timeline widget (trace, memory, snapshot).
DISPLAY_ARGUMENTS = (
    Argument(
        "--static",
        action="store_true",
        help="static figure and text, no widget (the default outside widget front ends; see NBT_WIDGETS)",
    ),
    Argument("--widget", action="store_true", help="the zoomable timeline widget, whatever the front end"),
)


_TRACES = Argument("traces", help="a trace file, a folder of per-rank traces, or a Trace variable")


def _profile_default(parameter: str) -> APIDefault:
    return APIDefault("nbtoolkit.capture.profiler", "profile", parameter)


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
                help="profiled runs of the cell (default %(default)s)",
            ),
            Argument(
                "--warmup",
                type=int,
                default=_profile_default("warmup"),
                help="unprofiled runs first (default %(default)s)",
            ),
            Argument("--memory", action="store_true", help="also record memory allocations (profile_memory)"),
            Argument("--shapes", action="store_true", help="also record input shapes (record_shapes)"),
            Argument("--metrics", action="store_true", help="also count FLOPs: MFU/HFU in the summary"),
            Argument("--tokens", type=int, default=None, help="tokens per run of the cell, for tokens/s"),
        ),
        handler=_profile,
    )
)

register(
    Subcommand(
        name="overlap",
        summary="comm/compute overlap per rank (HTA's definition; gloo on CPU) of traces or a Trace",
        mode="line",
        arguments=(_TRACES,),
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
