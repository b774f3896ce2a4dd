"""Views of a Trace: the per-rank lane timeline, the overlap chart, and the report ``%nbt trace`` shows.

The timeline draws one lane per rank and stream (device) or thread (host); each lane
shows compute, communication, memory and other time in its own colour, collectives in
red, and ProfilerSteps as shaded bands. It stays responsive on traces with hundreds of
thousands of events by *decimating*: within a lane and kind, intervals closer together
than one pixel-equivalent (``span / resolution``) are merged before drawing, so the
figure never holds more than about ``resolution`` segments per lane and kind, whatever
the size of the trace. Segments are drawn with WebGL (``Scattergl``).

plotly is imported inside the functions (``%load_ext nbtoolkit`` stays light).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nbtoolkit.core.result import Result, html_table
from nbtoolkit.trace.timeline_figure import timeline

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import StragglerReport, Trace

__all__ = ["TraceReport", "overlap_chart"]

def overlap_chart(trace_or_overlap: Trace | pd.DataFrame) -> Any:
    """Bar chart per rank: communication hidden behind compute vs exposed (ms), overlap % on top."""

    from nbtoolkit.core.static_figure import StaticFigure
    from nbtoolkit.trace.overlap import comm_comp_overlap
    from nbtoolkit.trace.trace import Trace

    overlap = comm_comp_overlap(trace_or_overlap) if isinstance(trace_or_overlap, Trace) else trace_or_overlap
    ranks = [f"rank {r}" for r in overlap["rank"]]
    fig = StaticFigure()
    fig.add_bar(
        x=ranks, y=overlap["overlap_time_us"] / 1e3, name="hidden behind compute", marker_color="#54A24B"
    )
    fig.add_bar(
        x=ranks,
        y=overlap["exposed_comm_us"] / 1e3,
        name="exposed",
        marker_color="#E45756",
        text=[f"{p:.1f} % overlap" if np.isfinite(p) else "no comm" for p in overlap["overlap_pct"]],
        textposition="outside",
    )
    fig.update_layout(
        barmode="stack",
        title="Communication time per rank",
        yaxis_title="communication (ms)",
        height=360,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig


class _FigureDisplay(Result):
    """Shows its text/HTML bundle, then its figures (as plotly's own output) in a notebook."""

    def _figures(self) -> list[Any]:
        return []

    def _report_figures(self) -> list[Any]:  # used by nbt.report
        return self._figures()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)
        for fig in self._figures():
            display(fig)


@dataclass(repr=False, eq=False)
class TraceReport(_FigureDisplay):
    """What ``%nbt trace`` shows: summary, step times, breakdowns, overlap, stragglers, timeline.

    ``TraceReport.of(nbt.load_trace(path))``; each table is the result of the public analysis
    of the same name (``nbt.temporal_breakdown``, ``nbt.comm_comp_overlap``, ...).
    """

    trace: Trace
    temporal: pd.DataFrame
    overlap: pd.DataFrame
    idle: pd.DataFrame
    stragglers: StragglerReport
    kernel_types: pd.DataFrame | None = None

    @classmethod
    def of(cls, trace: Trace) -> TraceReport:
        import pandas as pd

        from nbtoolkit.trace.breakdown import idle_breakdown, kernel_breakdown, temporal_breakdown
        from nbtoolkit.trace.overlap import comm_comp_overlap
        from nbtoolkit.trace.rank_folder_trace import RankFolderTrace
        from nbtoolkit.trace.stragglers import stragglers, summary_stragglers

        if isinstance(trace, RankFolderTrace) and not trace.summary.include_last_step:
            # a folder of many ranks: what the per-rank summaries answer (as nbt.comm_comp_overlap
            # and friends do); the kernel and idle breakdowns would read every rank's events again
            # (nbt.kernel_breakdown(trace) does, one rank at a time)
            summary = trace.summary
            return cls(
                trace=trace,
                temporal=summary.temporal.copy(),
                overlap=summary.overlap.copy(),
                idle=pd.DataFrame(),
                stragglers=summary_stragglers(summary),
            )
        return cls(
            trace=trace,
            temporal=temporal_breakdown(trace),
            overlap=comm_comp_overlap(trace),
            idle=idle_breakdown(trace),
            stragglers=stragglers(trace),
            kernel_types=kernel_breakdown(trace).by_type,
        )

    def _text(self) -> str:
        parts = [
            self.trace._text(),
            "Temporal breakdown (µs; HTA's definition):",
            self.temporal.round(2).to_string(index=False),
            "Communication/computation overlap (µs):",
            self.overlap.round(2).to_string(index=False),
        ]
        if self.kernel_types is not None and len(self.kernel_types):
            parts += [
                "Kernel time by type (µs, all ranks):",
                self.kernel_types.round(2).to_string(index=False),
            ]
        if len(self.idle):
            parts += ["Idle time per stream (µs):", self.idle.round(2).to_string(index=False)]
        parts.append(self.stragglers._text())
        return "\n".join(parts)

    def _html(self) -> str:
        parts = [
            self.trace._html(),
            "<p><b>Temporal breakdown</b> (µs; HTA's definition)</p>",
            html_table(self.temporal, max_rows=64),
            "<p><b>Communication/computation overlap</b> (µs)</p>",
            html_table(self.overlap, max_rows=64),
        ]
        if self.kernel_types is not None and len(self.kernel_types):
            parts += ["<p><b>Kernel time by type</b> (µs, all ranks)</p>", html_table(self.kernel_types)]
        if len(self.idle):
            parts += ["<p><b>Idle time per stream</b> (µs)</p>", html_table(self.idle, max_rows=64)]
        parts.append(self.stragglers._html())
        return "<div class='nbt-trace-report'>" + "".join(parts) + "</div>"

    def _figures(self) -> list[Any]:
        return [timeline(self.trace), overlap_chart(self.overlap)]
