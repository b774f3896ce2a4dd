"""The public functions of the trace feature: each accepts a path, a Trace (or a TraceSummary where
it says so), loads what it needs and calls the analysis.

The analyses (:mod:`~nbtoolkit.trace.overlap`, :mod:`~nbtoolkit.trace.breakdown`,
:mod:`~nbtoolkit.trace.stragglers`, :mod:`~nbtoolkit.trace.diff`) take loaded objects and read no
file; these doors sit above them and above the reader (:func:`nbtoolkit.trace.kineto.load_trace`),
so a path given to ``nbt.comm_comp_overlap("trace.json")`` is loaded here, and bad input is one
clear NbtUsageError naming what the function takes (:func:`as_trace`).
"""

from __future__ import annotations

from os import PathLike
from typing import TYPE_CHECKING, Any, Literal

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.inputs import is_path, wrong_type
from nbtoolkit.trace import breakdown, diff, overlap
from nbtoolkit.trace import stragglers as straggler_analysis
from nbtoolkit.trace.load import load_trace
from nbtoolkit.trace.rank_folder_trace import RankFolderTrace
from nbtoolkit.trace.summary import TraceSummary
from nbtoolkit.trace.trace import Trace

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import KernelBreakdown, StragglerReport
    from nbtoolkit.trace.trace_diff import TraceDiff

__all__ = [
    "as_trace",
    "comm_comp_overlap",
    "compare",
    "idle_breakdown",
    "kernel_breakdown",
    "stragglers",
    "temporal_breakdown",
]

TraceInput = Trace | str | PathLike[str]


def _summary_of(trace: Trace, include_last_step: bool) -> TraceSummary | None:
    """The per-rank summary that answers for ``trace`` (a RankFolderTrace made with the same
    ``include_last_step``), else None: the analysis then reads the events."""
    if isinstance(trace, RankFolderTrace) and trace.summary.include_last_step == include_last_step:
        summary: TraceSummary = trace.summary
        return summary
    return None


def as_trace(value: Any, *, what: str) -> Trace:
    """``value`` as a Trace: a Trace is returned as it is, a path is loaded with ``nbt.load_trace``.

    ``what`` names the caller in the error (``"comm_comp_overlap()"``).
    """
    if isinstance(value, Trace):
        return value
    if is_path(value):
        return load_trace(value)
    raise wrong_type(
        what,
        "a Trace (from nbt.load_trace or nbt.profile) or the path of a .json/.json.gz trace "
        "or a folder of them",
        value,
    )


def comm_comp_overlap(
    trace: Trace | TraceSummary | str | PathLike[str],
    *,
    by: Literal["rank", "iteration", "collective"] = "rank",
    include_last_step: bool = False,
) -> pd.DataFrame:
    """Communication/computation overlap (definitions in the module docstring).

    Args:
        by: ``"rank"`` (default): one row per rank with ``rank, comm_time_us,
            overlap_time_us, overlap_pct, exposed_comm_us, method`` (``method`` is
            ``hta-gpu`` or ``cpu-gloo``). ``"iteration"``: the same per rank and
            ProfilerStep (column ``step``; device work belongs to the step in which the
            host launched it). ``"collective"``: one row per communication kernel or
            collective call: ``rank, name, collective, ts, dur_us, overlap_time_us,
            overlap_pct, exposed_comm_us`` (each call against the merged compute of its rank),
            plus ``in_msg_nelems, out_msg_nelems, dtype, pg_name`` where the trace records
            them (PyTorch 2.x writes them on NCCL kernels and ``record_param_comms``).
        include_last_step: keep the last ProfilerStep (HTA's ``include_last_profiler_step``).

    ``overlap_pct`` is NaN for a rank without any communication (HTA shows it empty too).

    This is the one door for the overlap of a folder of traces: ``trace`` may be a Trace, the path
    of a trace file or of a folder of per-rank traces (read with ``nbt.load_trace``), or a
    :class:`~nbtoolkit.trace.summary.TraceSummary` (``nbt.summarize_traces(folder)`` or
    ``cluster.summarize_traces(where)``, for folders too large to hold every event): its per-rank
    and per-step tables are returned (the events needed per call are not in it). ``%nbt overlap``
    shows this function's table (``nbt.OverlapReport``). A folder of many ranks (``nbt.load_trace``
    gives a RankFolderTrace) is answered from the per-rank summaries its workers computed; only
    ``by="collective"`` reads each rank's events, one rank at a time.
    """
    if isinstance(trace, TraceSummary):
        if include_last_step != trace.include_last_step:
            raise NbtUsageError(
                f"this summary was made with include_last_step={trace.include_last_step}; "
                "summarize the traces again with the other value"
            )
        if by == "collective":
            raise NbtUsageError(
                "a TraceSummary keeps no per-call events: use comm_comp_overlap(summary.load_ranks([...]), "
                "by='collective') for the ranks you want"
            )
        return trace.overlap.copy() if by == "rank" else trace.overlap_by_step.copy()
    loaded = as_trace(trace, what="comm_comp_overlap()")
    summary = _summary_of(loaded, include_last_step) if by in ("rank", "iteration") else None
    if summary is not None:
        return comm_comp_overlap(summary, by=by, include_last_step=include_last_step)
    return overlap.comm_comp_overlap(loaded, by=by, include_last_step=include_last_step)


def stragglers(
    trace: Trace | TraceSummary | str | PathLike[str],
    *,
    threshold_pct: float = 5.0,
    include_last_step: bool = False,
) -> StragglerReport:
    """Per-rank step, work and communication-wait times, and the slowest rank.

    Definitions in :mod:`nbtoolkit.trace.stragglers`. ``trace`` is a Trace, the path of a trace
    file or of a folder of per-rank traces, or a :class:`~nbtoolkit.trace.summary.TraceSummary`
    (``nbt.summarize_traces``): the numbers are the same, read from its per-rank results (its own
    ``include_last_step``).
    """
    if isinstance(trace, TraceSummary):
        return straggler_analysis.summary_stragglers(trace, threshold_pct=threshold_pct)
    loaded = as_trace(trace, what="stragglers()")
    summary = _summary_of(loaded, include_last_step)
    if summary is not None:
        return straggler_analysis.summary_stragglers(summary, threshold_pct=threshold_pct)
    return straggler_analysis.stragglers(
        loaded, threshold_pct=threshold_pct, include_last_step=include_last_step
    )


def temporal_breakdown(trace: TraceInput, *, include_last_step: bool = False) -> pd.DataFrame:
    """Idle, compute and non-compute time per rank (HTA's ``get_temporal_breakdown``).

    On a rank with device kernels (GPU, MTIA ...):

    - ``span_us``: from the start of the first kernel to the end of the last (HTA's
      ``kernel_time``), kernels of the analysed steps only;
    - ``idle_us``: time in the span when no kernel of any type runs on any stream;
    - ``compute_us``: time when at least one COMPUTATION kernel runs (union of intervals);
    - ``non_compute_us``: the rest of the busy time: only communication, memory copies
      or sync events run. ``idle + compute + non_compute = span``.

    HTA computes the same three numbers; it rounds percentages to 2 decimals, we give them
    unrounded. Where HTA trips its own ``non_compute_time >= 0`` assertion (sub-µs events
    whose rounded end falls before their rounded start, e.g. ns-resolution H100 traces)
    nbtoolkit clips those events to zero length and stays consistent.

    On a rank without device kernels (a CPU/gloo run), the same identity is computed on
    the host: ``span_us`` from the first to the last host operator or collective,
    ``compute_us`` = union of the rank's own operators (see :func:`comm_comp_overlap`
    for which events count), ``non_compute_us`` = collective time not covered by
    compute, ``idle_us`` = the rest of the span.

    Args:
        include_last_step: keep the last ProfilerStep (HTA's ``include_last_profiler_step``).
            Traces with fewer than two ProfilerStep labels are never filtered.
    """
    loaded = as_trace(trace, what="temporal_breakdown()")
    summary = _summary_of(loaded, include_last_step)
    if summary is not None:
        return summary.temporal.copy()
    return breakdown.temporal_breakdown(loaded, include_last_step=include_last_step)


def kernel_breakdown(
    trace: TraceInput,
    *,
    include_last_step: bool = False,
    include_memory: bool = True,
) -> KernelBreakdown:
    """Device time per kernel type and per kernel (HTA's ``get_gpu_kernel_breakdown``).

    ``by_type`` (summed over ranks): for every combination of kernel types running at the
    same moment, how long it ran, e.g. ``COMPUTATION``, ``COMMUNICATION``,
    ``COMPUTATION overlapping COMMUNICATION``; each kernel type's intervals are merged
    first, so a moment is counted once. Columns ``kernel_type, sum_us, percentage``
    (HTA's numbers; HTA rounds the percentage to 1 decimal).

    ``by_kernel``: one row per rank, kernel type and kernel name: ``calls``, ``sum_us``,
    ``mean_us``, ``max_us``, ``min_us``, ``std_us`` (every kernel; HTA folds the tail into
    "others", we keep all names).
    """
    loaded = as_trace(trace, what="kernel_breakdown()")
    return breakdown.kernel_breakdown(
        loaded, include_last_step=include_last_step, include_memory=include_memory
    )


def idle_breakdown(
    trace: TraceInput,
    *,
    include_last_step: bool = False,
    consecutive_kernel_delay_us: float = 30.0,
) -> pd.DataFrame:
    """Idle time per rank and stream, split by cause (HTA's ``get_idle_time_breakdown``).

    Per stream, the kernels (kernel, memcpy, memset and MTIA events) sorted by start; each
    gap before a kernel (its start minus the previous kernel's end) is:

    - ``host_wait`` if the host launched the kernel after the previous one had ended
      (the runtime call with the same ``correlation`` started later than that end):
      the CPU did not enqueue work fast enough;
    - ``kernel_wait`` otherwise, if the gap is under ``consecutive_kernel_delay_us``
      (launch overhead between back-to-back kernels);
    - ``other`` otherwise (e.g. waiting on an event from another stream).

    Columns: ``rank, stream, idle_category, idle_us, idle_ratio`` (share of the stream's
    idle time). Categories that never occur on a stream are absent, as in HTA.
    """
    loaded = as_trace(trace, what="idle_breakdown()")
    return breakdown.idle_breakdown(
        loaded, include_last_step=include_last_step, consecutive_kernel_delay_us=consecutive_kernel_delay_us
    )


def compare(
    before: TraceInput, after: TraceInput, *, top: int = 15, include_last_step: bool = False
) -> TraceDiff:
    """Before/after comparison of two Traces or trace paths (the numbers: :mod:`nbtoolkit.trace.diff`)."""
    first = as_trace(before, what="compare() (before)")
    second = as_trace(after, what="compare() (after)")
    return diff.compare(first, second, top=top, include_last_step=include_last_step)
