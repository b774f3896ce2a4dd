"""A Trace's per-rank analysis results, kept without its events: the unit of work at scale.

:func:`summarize_trace` runs where a rank's trace was read (a worker process, a cluster
node) and returns a small :class:`~nbtoolkit.trace.summary.TraceSummary`; summaries of
disjoint ranks combine into the job's (``TraceSummary.combine``).

One number depends on the other ranks: like HTA, the last ProfilerStep is left out when the
*job* has two or more ProfilerStep labels (:mod:`nbtoolkit.trace._kernels`). A rank read
alone sees only its own labels, so ``step_labels`` passes the labels the other ranks have:
they become the analysed view's ``Trace.step_labels``, which is what the label count reads.
The loaders summarize each rank with its own labels first and summarize again, with the job's
labels, only the ranks whose decision differs (in practice none).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from nbtoolkit.trace.breakdown import temporal_breakdown
from nbtoolkit.trace.overlap import overlap_by_rank_and_step
from nbtoolkit.trace.records import SPAN_COLUMNS
from nbtoolkit.trace.summary import TraceSummary
from nbtoolkit.trace.trace import Trace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["rank_step_labels", "summarize_trace"]


def rank_step_labels(trace: Trace) -> list[str]:
    """The distinct ProfilerStep labels among the trace's event names, sorted."""
    return list(trace.step_labels)


def summarize_trace(
    trace: Trace,
    *,
    include_last_step: bool = False,
    step_labels: Iterable[str] = (),
    critical_path: bool = False,
) -> TraceSummary:
    """Overlap (by rank and by step), steps, spans and temporal breakdown of every rank of ``trace``.

    ``step_labels``: ProfilerStep labels of ranks that are not in ``trace`` (see the module
    docstring); the numbers then equal those of the whole job's Trace. ``critical_path``: add
    :func:`~nbtoolkit.trace.critical_path_analysis.critical_path_by_rank` (per rank, its default step).
    """
    import pandas as pd

    own = rank_step_labels(trace)
    extra = sorted(set(step_labels) - set(own))
    view = trace
    if extra:  # the job's labels: the last-step rule reads their count (Trace.step_labels)
        view = Trace(
            events=trace.events,
            info=trace.info,
            collectives=trace.collectives,
            notes=trace.notes,
            _steps=trace._steps,
            _step_labels=sorted(set(own) | set(extra)),
        )
    by_rank, by_step = overlap_by_rank_and_step(view, include_last_step=include_last_step)
    spans = pd.DataFrame(
        [
            {
                "rank": rank,
                "first_us": float(frame["ts"].min()) if len(frame) else 0.0,
                "last_us": float((frame["ts"] + frame["dur"]).max()) if len(frame) else 0.0,
                "events": len(frame),
            }
            for rank, frame in sorted(trace.events.items())
        ],
        columns=list(SPAN_COLUMNS),
    )
    return TraceSummary(
        overlap=by_rank,
        overlap_by_step=by_step,
        steps=trace.steps.reset_index(drop=True),
        spans=spans,
        temporal=temporal_breakdown(view, include_last_step=include_last_step),
        info=dict(sorted(trace.info.items())),
        step_labels=sorted(set(own) | set(step_labels)),
        include_last_step=include_last_step,
        notes=list(trace.notes),
        critical_path=_critical_paths(view) if critical_path else None,
    )


def _critical_paths(trace: Trace) -> pd.DataFrame:
    from nbtoolkit.trace.critical_path_analysis import critical_path_by_rank

    return critical_path_by_rank(trace)
