"""Which mark draws each trace of a figure in its static SVG, and the legend of those traces.

plotly draws traces in their order; marks keep it, except that the traces of one ``stackgroup``
are one mark (their areas stack) and the bars of one subplot are one mark (their slots are
shared). A trace type the static picture does not draw says so in the plot instead of vanishing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbtoolkit.core.result import escape
from nbtoolkit.core.svg_axes import plain_text
from nbtoolkit.core.svg_bars import BarMark
from nbtoolkit.core.svg_grids import HeatmapMark, IcicleMark
from nbtoolkit.core.svg_lines import ScatterMark, StackMark
from nbtoolkit.core.svg_marks import Canvas, LegendEntry, Mark, trace_color

__all__ = ["build_marks", "legend_entries"]


@dataclass
class UnknownMark(Mark):
    kind: str

    def svg(self, canvas: Canvas) -> str:
        return (
            f"<text x='{(canvas.left + canvas.right) / 2:.1f}' y='{(canvas.top + canvas.bottom) / 2:.1f}' "
            f"text-anchor='middle' fill='#888'>(a {escape(self.kind)} trace: not drawn in the static "
            "copy; run the notebook for the interactive figure)</text>"
        )


def build_marks(traces: list[dict[str, Any]], layout: dict[str, Any], colorway: list[str]) -> list[Mark]:
    """The marks of the figure's traces, in plotly's drawing order (trace order)."""
    marks: list[Mark] = []
    stacks: dict[tuple[str, str, str], StackMark] = {}
    bars: dict[tuple[str, str], BarMark] = {}
    for index, trace in enumerate(traces):
        if trace.get("visible") in (False, "legendonly"):
            continue
        kind = trace.get("type", "scatter")
        xref, yref = str(trace.get("xaxis") or "x"), str(trace.get("yaxis") or "y")
        color = trace_color(trace, index, colorway)
        if kind in ("scatter", "scattergl") and trace.get("stackgroup"):
            key = (xref, yref, str(trace["stackgroup"]))
            if key not in stacks:
                stacks[key] = StackMark(members=[], xref=xref, yref=yref)
                marks.append(stacks[key])
            stacks[key].members.append((trace, color))
        elif kind in ("scatter", "scattergl"):
            marks.append(ScatterMark(trace=trace, color=color, xref=xref, yref=yref))
        elif kind in ("bar", "histogram"):
            if (xref, yref) not in bars:
                bars[(xref, yref)] = BarMark(layout=layout, xref=xref, yref=yref)
                marks.append(bars[(xref, yref)])
            bars[(xref, yref)].members.append((trace, color))
        elif kind == "heatmap":
            marks.append(HeatmapMark(trace=trace, xref=xref, yref=yref))
        elif kind == "icicle":
            marks.append(IcicleMark(trace=trace, colorway=colorway))
        else:
            marks.append(UnknownMark(kind=str(kind)))
    return marks


def legend_entries(
    traces: list[dict[str, Any]], layout: dict[str, Any], colorway: list[str]
) -> list[LegendEntry]:
    """The legend as plotly shows it: one entry per named trace, when two or more would show."""
    entries: list[LegendEntry] = []
    for index, trace in enumerate(traces):
        kind = trace.get("type", "scatter")
        name = plain_text(trace.get("name"))
        if (
            trace.get("showlegend") is False
            or not name
            or kind in ("heatmap", "icicle")
            or trace.get("visible") is False
        ):
            continue
        color = trace_color(trace, index, colorway)
        if kind in ("bar", "histogram") or trace.get("stackgroup") or trace.get("fill"):
            faded = (
                0.5 if trace.get("stackgroup") or (trace.get("fill") and not trace.get("fillcolor")) else 1.0
            )
            entries.append(LegendEntry(name, color, "box", opacity=faded))
        elif "lines" in str(trace.get("mode") or "lines"):
            entries.append(LegendEntry(name, color, "line", (trace.get("line") or {}).get("dash")))
        else:
            entries.append(LegendEntry(name, color, "marker"))
    shown = layout.get("showlegend")
    if shown is False or (shown is None and len(entries) < 2):
        return []
    return entries
