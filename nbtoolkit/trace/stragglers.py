"""Which rank holds the others back, and by how much.

In synchronous training every rank finishes a step at about the same time, because the
collectives make the fast ranks wait for the slow one. The slow rank is therefore not the
one with the longest step but the one that waits least: its *work time*
(step time minus exposed communication, i.e. time not spent waiting in a collective)
is the largest.

Per rank (times in ms, averaged over the analysed steps, or over the whole trace when it has
no ProfilerStep annotations):

- ``step_time_ms``: mean duration of the rank's ProfilerSteps (host clock);
- ``exposed_comm_ms``: communication not hidden behind compute (:func:`comm_comp_overlap`)
  divided by the number of steps;
- ``work_ms = step_time_ms - exposed_comm_ms``;
- ``slowdown_pct``: ``100 * (work_ms / median work_ms - 1)``;
- ``is_straggler``: the rank with the largest ``work_ms`` when its slowdown is at least
  ``threshold_pct`` (default 5 %).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from nbtoolkit.trace import _kernels as k
from nbtoolkit.trace.overlap import comm_comp_overlap
from nbtoolkit.trace.trace import StragglerReport

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = ["SummarizedStragglers", "stragglers", "summary_stragglers"]


class SummarizedStragglers(Protocol):
    """What :func:`summary_stragglers` reads of a :class:`~nbtoolkit.trace.summary.TraceSummary`."""

    @property
    def ranks(self) -> list[int]: ...

    @property
    def overlap(self) -> pd.DataFrame: ...

    @property
    def steps(self) -> pd.DataFrame: ...

    @property
    def spans(self) -> pd.DataFrame: ...

    @property
    def step_labels(self) -> list[str]: ...

    @property
    def include_last_step(self) -> bool: ...


def stragglers(
    trace: Trace, *, threshold_pct: float = 5.0, include_last_step: bool = False
) -> StragglerReport:
    """Per-rank step, work and communication-wait times, and the slowest rank, of a loaded Trace.

    The analysis behind ``nbt.stragglers`` (:mod:`nbtoolkit.trace.api`, which also takes a path
    or a TraceSummary); definitions in the module docstring.
    """

    overlap = comm_comp_overlap(trace, include_last_step=include_last_step)
    spans = {
        rank: float((frame["ts"] + frame["dur"]).max() - frame["ts"].min())
        for rank, frame in trace.events.items()
    }
    filtered = k.count_step_labels(trace) >= 2 and not include_last_step
    return _report(trace.ranks, overlap, trace.steps, spans, filtered=filtered, threshold_pct=threshold_pct)


def summary_stragglers(summary: SummarizedStragglers, *, threshold_pct: float = 5.0) -> StragglerReport:
    """:func:`stragglers` of a TraceSummary (its per-rank overlap, steps and spans)."""
    spans = {int(r.rank): float(r.last_us - r.first_us) for r in summary.spans.itertuples(index=False)}
    filtered = len(summary.step_labels) >= 2 and not summary.include_last_step
    return _report(
        summary.ranks, summary.overlap, summary.steps, spans, filtered=filtered, threshold_pct=threshold_pct
    )


def _report(
    ranks: list[int],
    overlap_table: pd.DataFrame,
    steps: pd.DataFrame,
    spans_us: dict[int, float],
    *,
    filtered: bool,
    threshold_pct: float,
) -> StragglerReport:
    import pandas as pd

    overlap = overlap_table.set_index("rank").reindex(ranks)
    steps = steps.sort_values(["rank", "step"], kind="stable")
    if filtered:  # the same steps the overlap analysis used: a rank's last step left out (when it has two)
        per_rank = steps.groupby("rank")["step"].transform("size").to_numpy()
        is_last = ~steps["rank"].duplicated(keep="last").to_numpy()
        steps = steps[~(is_last & (per_rank >= 2))]
    counted = steps.groupby("rank")["dur"].agg(["size", "mean"]).reindex(ranks)
    has_steps = counted["size"].fillna(0).to_numpy() > 0
    n_steps = np.where(has_steps, counted["size"].fillna(1).to_numpy(), 1.0)
    span_ms = np.array([spans_us[r] for r in ranks], dtype=np.float64) / 1e3
    step_ms = np.where(has_steps, counted["mean"].to_numpy() / 1e3, span_ms)
    exposed = overlap["exposed_comm_us"].to_numpy(dtype=np.float64) / 1e3 / n_steps
    comm = overlap["comm_time_us"].to_numpy(dtype=np.float64) / 1e3 / n_steps
    rows = {
        "rank": ranks,
        "steps": n_steps.astype(np.int64),
        "step_time_ms": step_ms,
        "comm_ms": comm,
        "exposed_comm_ms": exposed,
        "work_ms": step_ms - exposed,
    }
    table = pd.DataFrame(rows)
    median = float(table["work_ms"].median())
    table["slowdown_pct"] = 100.0 * (table["work_ms"] / median - 1.0) if median > 0 else np.nan
    slowest = int(table.loc[table["work_ms"].idxmax(), "rank"])
    slowdown = float(table.loc[table["rank"] == slowest, "slowdown_pct"].iloc[0])
    table["is_straggler"] = (table["rank"] == slowest) & (table["slowdown_pct"] >= threshold_pct)
    return StragglerReport(
        table=table, slowest_rank=slowest, slowdown_pct=slowdown, threshold_pct=threshold_pct
    )
