"""``CriticalPath``: the chain of work that bounds one iteration of one rank (``nbt.critical_path``).

Plain data: the ``segments`` frame tiles the iteration's span, so its ``dur_us`` add up to
``span_us``; ``opportunities`` ranks what, made shorter, would shorten the step. The figure
(the path over the timeline lanes) is drawn by :mod:`nbtoolkit.trace.critical_path_figure`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SEGMENT_COLUMNS", "CriticalPath"]

# kind, name, start_us (trace clock), dur_us (time it covers), work_us (its weight on the path),
# share_pct (of the span), row (index into trace.events[rank], -1 for gaps), stream (-1 host)
SEGMENT_COLUMNS = ("kind", "name", "start_us", "dur_us", "work_us", "share_pct", "row", "stream")


# repr: the Result text; eq: identity (frames have no truth value)
@dataclass(repr=False, eq=False)
class CriticalPath(Result):
    """The critical path of one iteration; see ``nbt.critical_path`` for the definitions.

    Attributes:
        rank, step: what was analysed (``step`` is the ProfilerStep number, or the annotation text).
        span_us: the iteration's span (µs): from its start on the host to the end of the last
            work it started, host or device.
        length_us: the work on the path (µs): the span less the waiting and the gaps on it;
            HolisticTraceAnalysis reports this number as its critical path's length.
        segments: one row per stretch of the path, in time order (``SEGMENT_COLUMNS``).
        opportunities: the path's work grouped by what it is, largest first, with ``advice``.
        events: the trace rows on the path (host ops, runtime calls, kernels), for comparisons.
    """

    rank: int
    step: Any
    span_us: float
    length_us: float
    start_us: float
    segments: pd.DataFrame
    opportunities: pd.DataFrame
    events: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def by_kind(self) -> pd.DataFrame:
        """Time on the path per kind: ``kind``, ``dur_us``, ``share_pct`` (adds up to 100)."""
        table = self.segments.groupby("kind", as_index=False, observed=True)["dur_us"].sum()
        table["share_pct"] = 100.0 * table["dur_us"] / self.span_us if self.span_us else 0.0
        return table.sort_values("dur_us", ascending=False, ignore_index=True)

    def frames(self) -> dict[str, pd.DataFrame]:
        """The result's tables by name, to save or export (``segments``, ``opportunities``, ``by_kind``)."""
        return {"segments": self.segments, "opportunities": self.opportunities, "by_kind": self.by_kind()}

    def figure(self, trace: Any) -> Any:
        """The path drawn over the rank's timeline lanes (plotly); needs the Trace it came from."""
        from nbtoolkit.trace.critical_path_figure import critical_path_figure

        return critical_path_figure(self, trace)

    def _headline(self) -> str:
        step = f"step {self.step}" if isinstance(self.step, int) else repr(self.step)
        return (
            f"Critical path of rank {self.rank}, {step}: span {format_seconds(self.span_us / 1e6)}, "
            f"work on the path {format_seconds(self.length_us / 1e6)}"
        )

    def _text(self) -> str:
        lines = [self._headline(), "Share of the step by kind:"]
        lines += [
            f"  {row.share_pct:5.1f} %  {format_seconds(row.dur_us / 1e6):>10}  {row.kind}"
            for row in self.by_kind().itertuples(index=False)
        ]
        if len(self.opportunities):
            lines.append("What, shortened, would shorten the step (largest first):")
            top = self.opportunities.head(8)
            lines += [f"  {row.share_pct:5.1f} %  {row.advice}" for row in top.itertuples()]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _html(self) -> str:
        table = self.opportunities.head(10)[["share_pct", "dur_us", "kind", "name", "advice"]]
        return (
            f"<div class='nbt-critical-path'><b>{escape(self._headline())}</b>"
             "<p>Share of the step by kind</p>"
            + html_table(self.by_kind(), float_format="{:,.1f}")
            + "<p>What, shortened, would shorten the step</p>"
            + html_table(table, float_format="{:,.1f}")
            + "".join(f"<p><i>{escape(n)}</i></p>" for n in self.notes)
            + "</div>"
        )
