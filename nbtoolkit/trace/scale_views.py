"""Views of a large job (a :class:`~nbtoolkit.trace.summary.TraceSummary`) readable at 100s of ranks.

Lanes of every rank would be unreadable (and would need every rank's events), so the views
of a summary are per-rank numbers drawn densely, plus lanes for a chosen few:

- :func:`rank_step_heatmap`: rank x step heatmap of exposed communication (or step time,
  or overlap %): a slow rank is a row, a slow step a column;
- :func:`overlap_distribution`: histogram of the ranks' overlap %, median marked;
- :func:`straggler_ranking`: the ranks that work longest per step (``nbt.stragglers``),
  as bars, the top ``n`` named;
- :func:`straggler_lanes`: the lanes of the top stragglers next to the median rank
  (``nbtoolkit.trace.timeline_figure.timeline`` with a rank selection; events loaded for those ranks only).

``summary.figures()`` returns all of them in a :class:`ScaleView` that shows text in a
terminal and the figures in a notebook. plotly is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from nbtoolkit.core.errors import NbtUsageError, TraceError
from nbtoolkit.core.result import escape
from nbtoolkit.trace.views import _FigureDisplay

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.records import RankInfo
    from nbtoolkit.trace.trace import StragglerReport, Trace

__all__ = ["ScaleView", "overlap_distribution", "rank_step_heatmap", "straggler_lanes", "straggler_ranking"]



class ScaleSummary(Protocol):
    """What these views read of a :class:`nbtoolkit.trace.summary.TraceSummary`.

    Named here rather than imported: ``TraceSummary.figures`` imports this module.
    """

    @property
    def overlap(self) -> pd.DataFrame: ...

    @property
    def overlap_by_step(self) -> pd.DataFrame: ...

    @property
    def steps(self) -> pd.DataFrame: ...

    @property
    def info(self) -> dict[int, RankInfo]: ...

    @property
    def ranks(self) -> list[int]: ...

    def stragglers(self, *, threshold_pct: float = 5.0) -> StragglerReport: ...

    def load_ranks(self, ranks: Iterable[int]) -> Trace: ...

    def _text(self) -> str: ...

    def _html(self) -> str: ...


HeatmapValue = Literal["exposed_comm_ms", "step_time_ms", "overlap_pct"]
_TITLES = {
    "exposed_comm_ms": "Exposed communication per rank and step (ms)",
    "step_time_ms": "Step time per rank and step (ms)",
    "overlap_pct": "Overlap per rank and step (%)",
}


def rank_step_table(summary: ScaleSummary, value: HeatmapValue = "exposed_comm_ms") -> pd.DataFrame:
    """The heatmap's numbers: one row per rank, one column per step."""
    if value == "step_time_ms":
        frame = summary.steps.assign(v=summary.steps["dur"] / 1e3)
    elif value == "exposed_comm_ms":
        frame = summary.overlap_by_step.assign(v=summary.overlap_by_step["exposed_comm_us"] / 1e3)
    elif value == "overlap_pct":
        frame = summary.overlap_by_step.assign(v=summary.overlap_by_step["overlap_pct"])
    else:
        raise NbtUsageError(f"value must be one of {sorted(_TITLES)}, got {value!r}")
    table = frame.pivot_table(index="rank", columns="step", values="v", aggfunc="max")
    return table.reindex(summary.ranks)


def rank_step_heatmap(summary: ScaleSummary, value: HeatmapValue = "exposed_comm_ms") -> Any:
    """Rank x step heatmap of ``value`` (exposed communication by default)."""
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    table = rank_step_table(summary, value)
    fig = StaticFigure(
        go.Heatmap(
            z=table.to_numpy(),
            x=[f"step {s}" for s in table.columns],
            y=[str(r) for r in table.index],
            colorscale="Reds" if value != "overlap_pct" else "Greens",
            colorbar={"title": "%" if value == "overlap_pct" else "ms"},
            hovertemplate="rank %{y}, %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=_TITLES[value],
        yaxis={"title": "rank", "type": "category", "autorange": "reversed"},
        height=min(900, 160 + 4 * len(table)),
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig


def overlap_distribution(summary: ScaleSummary) -> Any:
    """Histogram of the ranks' overlap % (ranks without communication left out), median marked."""
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    pct = summary.overlap["overlap_pct"].dropna()
    fig = StaticFigure(go.Histogram(x=pct, nbinsx=min(50, max(10, len(pct) // 4)), marker_color="#4C78A8"))
    if len(pct):
        fig.add_vline(x=float(pct.median()), line_dash="dash", annotation_text=f"median {pct.median():.1f} %")
    fig.update_layout(
        title=f"Overlap of communication with compute, {len(pct)} ranks",
        xaxis_title="overlap (%)",
        yaxis_title="ranks",
        height=320,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig


def straggler_ranking(summary: ScaleSummary, *, top: int = 4) -> Any:
    """Bars of work time per rank (``nbt.stragglers``), slowest first; the top ``top`` in red."""
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    table = summary.stragglers().table.sort_values("work_ms", ascending=False, ignore_index=True)
    colours = ["#E45756" if i < top else "#9D9D9D" for i in range(len(table))]
    fig = StaticFigure(
        go.Bar(
            x=[str(r) for r in table["rank"]],
            y=table["work_ms"],
            marker_color=colours,
            customdata=table[["slowdown_pct", "exposed_comm_ms"]].to_numpy(),
            hovertemplate="rank %{x}: work %{y:.3f} ms, %{customdata[0]:+.1f} % vs median,"
            " exposed comm %{customdata[1]:.3f} ms<extra></extra>",
        )
    )
    fig.add_hline(y=float(table["work_ms"].median()), line_dash="dash", annotation_text="median")
    fig.update_layout(
        title="Work per step (step time minus exposed communication), slowest rank first",
        xaxis={"title": "rank", "type": "category"},
        yaxis_title="work (ms)",
        height=340,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig


def top_stragglers(summary: ScaleSummary, top: int = 4) -> list[int]:
    """The ``top`` slowest ranks by work time, slowest first."""
    table = summary.stragglers().table.sort_values("work_ms", ascending=False)
    return [int(r) for r in table["rank"].head(top)]


def straggler_lanes(summary: ScaleSummary, *, top: int = 2, resolution: int = 2000) -> Any:
    """Lanes of the ``top`` slowest ranks and of the median rank, for comparison."""
    from nbtoolkit.trace.timeline_figure import timeline

    table = summary.stragglers().table.sort_values("work_ms", ignore_index=True)
    median_rank = int(table["rank"].iloc[len(table) // 2])
    chosen = list(dict.fromkeys([*top_stragglers(summary, top), median_rank]))
    return timeline(summary.load_ranks(chosen), ranks=sorted(chosen), resolution=resolution)


@dataclass(repr=False, eq=False)
class ScaleView(_FigureDisplay):
    """The views of a TraceSummary (``summary.figures()``): text in a terminal, figures in a notebook."""

    summary: ScaleSummary
    top: int = 4
    figures: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _text(self) -> str:
        lines = [self.summary._text()]
        lines.append(f"Slowest ranks: {top_stragglers(self.summary, self.top)}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _html(self) -> str:
        return self.summary._html() + "".join(f"<p><i>{escape(n)}</i></p>" for n in self.notes)

    def _figures(self) -> list[Any]:
        return self.figures


def summary_figures(summary: ScaleSummary, *, top: int = 4) -> ScaleView:
    """Heatmaps, overlap distribution, straggler ranking and the top stragglers' lanes."""
    figures = [rank_step_heatmap(summary, "exposed_comm_ms")]
    if len(summary.steps):
        figures.append(rank_step_heatmap(summary, "step_time_ms"))
    figures.append(overlap_distribution(summary))
    notes = []
    if len(summary.info) >= 2:
        figures.append(straggler_ranking(summary, top=top))
        try:
            figures.append(straggler_lanes(summary, top=min(top, 2)))
        except (TraceError, OSError) as exc:  # traces on cluster nodes: cluster.load_trace_ranks brings them
            notes.append(f"lanes of the slowest ranks not drawn: their traces cannot be read here ({exc})")
    return ScaleView(summary=summary, top=top, figures=figures, notes=notes)
