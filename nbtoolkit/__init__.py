"""nbtoolkit: see why PyTorch training is slow or out of memory, fix it, and measure the fix.

In a notebook::

    %load_ext nbtoolkit
    %nbt help

In Python, every feature is a plain function (``nbt.load_trace``, ``nbt.profile``,
``nbt.capture_graphs``, ``nbt.memory_timeline``, ``nbt.optimize``, ``nbt.Cluster`` ...).

Public names are resolved lazily (PEP 562): ``import nbtoolkit`` and
``%load_ext nbtoolkit`` import neither torch, ray, deepspeed nor plotly;
each name's module is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nbtoolkit.errors import (
    CaptureError,
    ClusterError,
    CompileLogError,
    DataError,
    DataUnavailableError,
    MetricsError,
    NbtError,
    NbtUsageError,
    PlanError,
    RemoteCellError,
    SaveError,
    SnapshotError,
    StepError,
    TraceError,
)

__version__ = "0.1.0"

# name -> module that defines it. One line per public name; keep sorted by name.
_LAZY_EXPORTS: dict[str, str] = {
    "Cluster": "nbtoolkit.cluster.cluster",
    "Comparison": "nbtoolkit.model.comparison",
    "CriticalPath": "nbtoolkit.model.critical_path",
    "GraphComparison": "nbtoolkit.model.graphs",
    "GraphReport": "nbtoolkit.model.graphs",
    "HangReport": "nbtoolkit.model.hang",
    "MeasureConfig": "nbtoolkit.model.measure_config",
    "Measurement": "nbtoolkit.model.comparison",
    "MemoryDiff": "nbtoolkit.model.memory_reports",
    "MemoryImbalance": "nbtoolkit.model.memory_reports",
    "MemorySnapshot": "nbtoolkit.model.snapshot",
    "MemoryTimeline": "nbtoolkit.model.memory",
    "OptimizeConfig": "nbtoolkit.optimizations.config",
    "OverlapReport": "nbtoolkit.views.trace_views",
    "RankMemory": "nbtoolkit.model.rank_memory",
    "RecomputeConfig": "nbtoolkit.optimizations.config",
    "RecomputePlan": "nbtoolkit.model.plan",
    "Roofline": "nbtoolkit.model.roofline",
    "StepMetrics": "nbtoolkit.model.metrics",
    "Trace": "nbtoolkit.model.trace",
    "TraceReport": "nbtoolkit.views.trace_views",
    "TraceSummary": "nbtoolkit.model.trace_summary",
    "capture_graphs": "nbtoolkit.capture.graphs",
    "comm_comp_overlap": "nbtoolkit.analysis.overlap",
    "compare": "nbtoolkit.analysis.diff",
    "critical_path": "nbtoolkit.analysis.critical_path",
    "critical_path_by_rank": "nbtoolkit.analysis.critical_path",
    "export_memory_snapshot": "nbtoolkit.io.snapshot_export",
    "idle_breakdown": "nbtoolkit.analysis.breakdown",
    "kernel_breakdown": "nbtoolkit.analysis.breakdown",
    "load_compile_log": "nbtoolkit.io.compile_log",
    "load_flight_recorder": "nbtoolkit.io.flight_recorder",
    "load_memory_snapshot": "nbtoolkit.io.snapshot",
    "load_memory_timeline": "nbtoolkit.io.snapshot",
    "load_rank_snapshots": "nbtoolkit.io.snapshot_ranks",
    "load_trace": "nbtoolkit.io.kineto",
    "locate_data": "nbtoolkit.datasets",
    "memory_by": "nbtoolkit.analysis.memory_breakdown",
    "memory_diff": "nbtoolkit.analysis.memory_diff",
    "memory_timeline": "nbtoolkit.capture.memory",
    "memory_widget": "nbtoolkit.views.timeline_widget",
    "mfu_chart": "nbtoolkit.views.metrics",
    "optimize": "nbtoolkit.optimizations.apply",
    "optimize_panel": "nbtoolkit.views.optimize",
    "plan_recompute": "nbtoolkit.optimizations.recompute",
    "profile": "nbtoolkit.capture.profiler",
    "report": "nbtoolkit.views.report",
    "roofline": "nbtoolkit.analysis.roofline",
    "step_metrics": "nbtoolkit.capture.step_metrics",
    "stragglers": "nbtoolkit.analysis.stragglers",
    "summarize_traces": "nbtoolkit.io.trace_summaries",
    "temporal_breakdown": "nbtoolkit.analysis.breakdown",
    "timeline_widget": "nbtoolkit.views.timeline_widget",
}

_EAGER_EXPORTS = [
    "CaptureError",
    "ClusterError",
    "CompileLogError",
    "DataError",
    "DataUnavailableError",
    "MetricsError",
    "NbtError",
    "NbtUsageError",
    "PlanError",
    "RemoteCellError",
    "SaveError",
    "SnapshotError",
    "StepError",
    "TraceError",
    "__version__",
    "load_ipython_extension",
    "memory_imbalance",
    "unload_ipython_extension",
]
# Computed, so that a new entry of _LAZY_EXPORTS is public at once; a test checks it is sorted.
__all__ = sorted({*_EAGER_EXPORTS, *_LAZY_EXPORTS})  # noqa: PLE0605


def memory_imbalance(ranks: Any) -> MemoryImbalance:
    """Which rank peaks highest and why (:func:`nbtoolkit.analysis.memory_diff.memory_imbalance`).

    ``ranks``: a RankMemory, ``{rank: snapshot or timeline}``, a list in rank order, or a folder of
    per-rank snapshots. A folder is read here (``nbt.load_rank_snapshots``): the analysis reads no files.
    """
    from nbtoolkit.analysis.memory_diff import memory_imbalance as imbalance_of
    from nbtoolkit.io.snapshot_ranks import load_rank_snapshots
    from nbtoolkit.model.inputs import is_path

    return imbalance_of(load_rank_snapshots(ranks) if is_path(ranks) else ranks)


def __getattr__(name: str) -> Any:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'nbtoolkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # cache: the next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%nbt`` / ``%%nbt``. Imports only the light magic layer."""
    from nbtoolkit.magics._dispatch import register_magics

    register_magics(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove ``%nbt`` / ``%%nbt`` again."""
    from nbtoolkit.magics._dispatch import unregister_magics

    unregister_magics(ipython)


if TYPE_CHECKING:  # give type checkers and IDEs the real names
    from nbtoolkit.analysis.breakdown import idle_breakdown, kernel_breakdown, temporal_breakdown
    from nbtoolkit.analysis.critical_path import critical_path, critical_path_by_rank
    from nbtoolkit.analysis.diff import compare
    from nbtoolkit.analysis.memory_breakdown import memory_by
    from nbtoolkit.analysis.memory_diff import memory_diff
    from nbtoolkit.analysis.overlap import comm_comp_overlap
    from nbtoolkit.analysis.roofline import roofline
    from nbtoolkit.analysis.stragglers import stragglers
    from nbtoolkit.capture.graphs import capture_graphs
    from nbtoolkit.capture.memory import memory_timeline
    from nbtoolkit.capture.profiler import profile
    from nbtoolkit.capture.step_metrics import step_metrics
    from nbtoolkit.cluster.cluster import Cluster
    from nbtoolkit.datasets import locate_data
    from nbtoolkit.io.compile_log import load_compile_log
    from nbtoolkit.io.flight_recorder import load_flight_recorder
    from nbtoolkit.io.kineto import load_trace
    from nbtoolkit.io.snapshot import load_memory_snapshot, load_memory_timeline
    from nbtoolkit.io.snapshot_export import export_memory_snapshot
    from nbtoolkit.io.snapshot_ranks import load_rank_snapshots
    from nbtoolkit.io.trace_summaries import summarize_traces
    from nbtoolkit.model.comparison import Comparison, Measurement
    from nbtoolkit.model.critical_path import CriticalPath
    from nbtoolkit.model.graphs import GraphComparison, GraphReport
    from nbtoolkit.model.hang import HangReport
    from nbtoolkit.model.measure_config import MeasureConfig
    from nbtoolkit.model.memory import MemoryTimeline
    from nbtoolkit.model.memory_reports import MemoryDiff, MemoryImbalance
    from nbtoolkit.model.metrics import StepMetrics
    from nbtoolkit.model.plan import RecomputePlan
    from nbtoolkit.model.rank_memory import RankMemory
    from nbtoolkit.model.roofline import Roofline
    from nbtoolkit.model.snapshot import MemorySnapshot
    from nbtoolkit.model.trace import Trace
    from nbtoolkit.model.trace_summary import TraceSummary
    from nbtoolkit.optimizations.apply import optimize
    from nbtoolkit.optimizations.config import OptimizeConfig, RecomputeConfig
    from nbtoolkit.optimizations.recompute import plan_recompute
    from nbtoolkit.views.metrics import mfu_chart
    from nbtoolkit.views.optimize import optimize_panel
    from nbtoolkit.views.report import report
    from nbtoolkit.views.timeline_widget import memory_widget, timeline_widget
    from nbtoolkit.views.trace_views import OverlapReport, TraceReport
