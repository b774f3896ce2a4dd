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

from nbtoolkit.core import errors as _errors
from nbtoolkit.core.errors import (
    CaptureError,
    ClusterError,
    CompileLogError,
    DataError,
    DataUnavailableError,
    LoopEndedError,
    LoopError,
    MetricsError,
    NbtError,
    NbtUsageError,
    PlanError,
    RemoteCellError,
    SaveError,
    SnapshotError,
    StepError,
    TraceError,
    TrainingStopped,
)

__version__ = "0.1.0"

# name -> module that defines it. One line per public name; keep sorted by name.
_LAZY_EXPORTS: dict[str, str] = {
    "Cluster": "nbtoolkit.cluster.cluster",
    "Comparison": "nbtoolkit.recompute.comparison",
    "CriticalPath": "nbtoolkit.trace.critical_path",
    "CrossRankPath": "nbtoolkit.trace.critical_path_ranks",
    "GraphComparison": "nbtoolkit.compile.report",
    "GraphReport": "nbtoolkit.compile.report",
    "HangReport": "nbtoolkit.cluster.hang",
    "MeasureConfig": "nbtoolkit.core.measure_config",
    "Measurement": "nbtoolkit.recompute.comparison",
    "MemoryDiff": "nbtoolkit.memory.reports",
    "MemoryImbalance": "nbtoolkit.memory.reports",
    "MemorySnapshot": "nbtoolkit.memory.snapshot",
    "MemoryTimeline": "nbtoolkit.memory.timeline",
    "OptimizeConfig": "nbtoolkit.recompute.config",
    "OverlapReport": "nbtoolkit.trace.overlap_report",
    "RankMemory": "nbtoolkit.memory.rank_memory",
    "RecomputeConfig": "nbtoolkit.recompute.config",
    "RecomputePlan": "nbtoolkit.recompute.plan",
    "Roofline": "nbtoolkit.trace.roofline",
    "StepMetrics": "nbtoolkit.metrics.step_metrics",
    "Trace": "nbtoolkit.trace.trace",
    "TraceReport": "nbtoolkit.trace.views",
    "TraceSummary": "nbtoolkit.trace.summary",
    "capture_graphs": "nbtoolkit.compile.capture",
    "comm_comp_overlap": "nbtoolkit.trace.api",
    "compare": "nbtoolkit.trace.api",
    "critical_path": "nbtoolkit.trace.critical_path_analysis",
    "critical_path_across_ranks": "nbtoolkit.trace.critical_path_ranks",
    "critical_path_by_rank": "nbtoolkit.trace.critical_path_analysis",
    "export_memory_snapshot": "nbtoolkit.memory.snapshot_export",
    "fit": "nbtoolkit.capacity.api",
    "fsdp2_memory": "nbtoolkit.integrations.fsdp2.profile",
    "fsdp2_overlap": "nbtoolkit.integrations.fsdp2.profile",
    "fsdp2_sweep": "nbtoolkit.integrations.fsdp2.sweep",
    "idle_breakdown": "nbtoolkit.trace.api",
    "kernel_breakdown": "nbtoolkit.trace.api",
    "load_compile_log": "nbtoolkit.compile.log_reader",
    "load_flight_recorder": "nbtoolkit.cluster.flight_recorder",
    "load_memory_snapshot": "nbtoolkit.memory.snapshot_reader",
    "load_memory_timeline": "nbtoolkit.memory.snapshot_reader",
    "load_rank_snapshots": "nbtoolkit.memory.snapshot_ranks",
    "load_trace": "nbtoolkit.trace.load",
    "locate_data": "nbtoolkit.core.datasets",
    "memory_by": "nbtoolkit.memory.breakdown",
    "memory_diff": "nbtoolkit.memory.diff",
    "memory_imbalance": "nbtoolkit.memory.api",
    "memory_timeline": "nbtoolkit.memory.capture",
    "memory_widget": "nbtoolkit.memory.timeline_widget",
    "mfu_chart": "nbtoolkit.metrics.figures",
    "optimize": "nbtoolkit.recompute.optimize",
    "optimize_panel": "nbtoolkit.recompute.panel",
    "plan_recompute": "nbtoolkit.recompute.planner",
    "plan_recompute_on": "nbtoolkit.integrations.recompute_strategies",
    "profile": "nbtoolkit.trace.profile",
    "rank_heatmaps": "nbtoolkit.trace.scale_heatmaps",
    "report": "nbtoolkit.reporting.report",
    "roofline": "nbtoolkit.trace.roofline_analysis",
    "step_metrics": "nbtoolkit.metrics.measure",
    "stragglers": "nbtoolkit.trace.api",
    "summarize_traces": "nbtoolkit.trace.summarize_folder",
    "temporal_breakdown": "nbtoolkit.trace.api",
    "timeline_widget": "nbtoolkit.trace.timeline_widget",
    "train_step": "nbtoolkit.core.train_step",
    "write_scale_set": "nbtoolkit.trace.scale_set",
    "zero_config": "nbtoolkit.integrations.deepspeed.config",
    "zero_graph_breaks": "nbtoolkit.integrations.deepspeed.graph_breaks",
    "zero_sweep": "nbtoolkit.integrations.deepspeed.sweep",
}

# every exception class (core/errors.py's __all__, imported above), plus the extension's hooks
_EAGER_EXPORTS = [*_errors.__all__, "__version__", "load_ipython_extension", "unload_ipython_extension"]
# Computed, so that a new entry of _LAZY_EXPORTS is public at once; a test checks it is sorted.
__all__ = sorted({*_EAGER_EXPORTS, *_LAZY_EXPORTS})  # noqa: PLE0605


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
    from nbtoolkit.magic_dispatch import register_magics

    register_magics(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove ``%nbt`` / ``%%nbt`` again."""
    from nbtoolkit.magic_dispatch import unregister_magics

    unregister_magics(ipython)


if TYPE_CHECKING:  # give type checkers and IDEs the real names
    from nbtoolkit.cluster.cluster import Cluster
    from nbtoolkit.cluster.flight_recorder import load_flight_recorder
    from nbtoolkit.cluster.hang import HangReport
    from nbtoolkit.compile.capture import capture_graphs
    from nbtoolkit.compile.log_reader import load_compile_log
    from nbtoolkit.compile.report import GraphComparison, GraphReport
    from nbtoolkit.core.datasets import locate_data
    from nbtoolkit.core.measure_config import MeasureConfig
    from nbtoolkit.core.train_step import train_step
    from nbtoolkit.integrations.deepspeed.config import zero_config
    from nbtoolkit.integrations.deepspeed.graph_breaks import zero_graph_breaks
    from nbtoolkit.integrations.deepspeed.sweep import zero_sweep
    from nbtoolkit.integrations.fsdp2.profile import fsdp2_memory, fsdp2_overlap
    from nbtoolkit.integrations.fsdp2.sweep import fsdp2_sweep
    from nbtoolkit.integrations.recompute_strategies import plan_recompute_on
    from nbtoolkit.memory.api import memory_imbalance
    from nbtoolkit.memory.breakdown import memory_by
    from nbtoolkit.memory.capture import memory_timeline
    from nbtoolkit.memory.diff import memory_diff
    from nbtoolkit.memory.rank_memory import RankMemory
    from nbtoolkit.memory.reports import MemoryDiff, MemoryImbalance
    from nbtoolkit.memory.snapshot import MemorySnapshot
    from nbtoolkit.memory.snapshot_export import export_memory_snapshot
    from nbtoolkit.memory.snapshot_ranks import load_rank_snapshots
    from nbtoolkit.memory.snapshot_reader import load_memory_snapshot, load_memory_timeline
    from nbtoolkit.memory.timeline import MemoryTimeline
    from nbtoolkit.memory.timeline_widget import memory_widget
    from nbtoolkit.metrics.figures import mfu_chart
    from nbtoolkit.metrics.measure import step_metrics
    from nbtoolkit.metrics.step_metrics import StepMetrics
    from nbtoolkit.recompute.comparison import Comparison, Measurement
    from nbtoolkit.recompute.config import OptimizeConfig, RecomputeConfig
    from nbtoolkit.recompute.optimize import optimize
    from nbtoolkit.recompute.panel import optimize_panel
    from nbtoolkit.recompute.plan import RecomputePlan
    from nbtoolkit.recompute.planner import plan_recompute
    from nbtoolkit.reporting.report import report
    from nbtoolkit.trace.api import (
        comm_comp_overlap,
        compare,
        idle_breakdown,
        kernel_breakdown,
        stragglers,
        temporal_breakdown,
    )
    from nbtoolkit.trace.critical_path import CriticalPath
    from nbtoolkit.trace.critical_path_analysis import critical_path, critical_path_by_rank
    from nbtoolkit.trace.critical_path_ranks import CrossRankPath, critical_path_across_ranks
    from nbtoolkit.trace.load import load_trace
    from nbtoolkit.trace.overlap_report import OverlapReport
    from nbtoolkit.trace.profile import profile
    from nbtoolkit.trace.roofline import Roofline
    from nbtoolkit.trace.roofline_analysis import roofline
    from nbtoolkit.trace.scale_heatmaps import rank_heatmaps
    from nbtoolkit.trace.scale_set import write_scale_set
    from nbtoolkit.trace.summarize_folder import summarize_traces
    from nbtoolkit.trace.summary import TraceSummary
    from nbtoolkit.trace.timeline_widget import timeline_widget
    from nbtoolkit.trace.trace import Trace
    from nbtoolkit.trace.views import TraceReport
