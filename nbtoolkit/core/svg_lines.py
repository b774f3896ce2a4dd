"""Scatter traces in a figure's static SVG: lines, markers, point labels, fills, stacked areas.

Lines stay small whatever their length: per pixel column only the first, lowest, highest and
last point are kept (:func:`nbtoolkit.core.svg_marks.thin`), and a lane timeline's horizontal
bars (two-point segments, thousands per lane) merge where they touch at pixel resolution. A
``stackgroup`` is drawn as cumulative areas painted from the top of the stack down, faded together
(plotly fills a stacked area with its line colour at half opacity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbtoolkit.core.result import escape
from nbtoolkit.core.svg_axes import Axis, plain_text
from nbtoolkit.core.svg_marks import Canvas, Mark, per_point, points, run_bounds, runs, thin

__all__ = ["ScatterMark", "StackMark"]

_DASHES = {"dash": "6,4", "dot": "2,3", "dashdot": "6,3,2,3", "longdash": "10,5", "longdashdot": "10,4,2,4"}


@dataclass
class ScatterMark(Mark):
    trace: dict[str, Any]
    color: str
    xref: str = "x"
    yref: str = "y"

    def _xy(self, canvas: Canvas) -> tuple[np.ndarray, np.ndarray]:
        t = self.trace
        y = canvas.axis(self.yref).code(t.get("y"))
        x = canvas.axis(self.xref).code(t["x"]) if t.get("x") is not None else np.arange(len(y), dtype=float)
        n = min(len(x), len(y))
        return x[:n], y[:n]

    def _mode(self, n: int) -> str:
        return str(self.trace.get("mode") or ("lines+markers" if n < 20 else "lines"))

    def register(self, canvas: Canvas) -> None:
        x, y = self._xy(canvas)
        ok = np.isfinite(x) & np.isfinite(y)
        if not ok.any():
            return
        markers = "markers" in self._mode(len(x)) or "text" in self._mode(len(x))
        canvas.axis(self.xref).extend(float(x[ok].min()), float(x[ok].max()), pad=markers)
        canvas.axis(self.yref).extend(float(y[ok].min()), float(y[ok].max()), pad=True)
        if self.trace.get("fill") in ("tozeroy",):
            canvas.axis(self.yref).extend(0.0, 0.0)

    def svg(self, canvas: Canvas) -> str:
        xa, ya = canvas.axis(self.xref), canvas.axis(self.yref)
        x, y = self._xy(canvas)
        px, py = xa.px(x), ya.px(y)
        mode, t, parts = self._mode(len(x)), self.trace, []
        line = t.get("line") or {}
        width = float(line.get("width", 2) if line.get("width") is not None else 2)
        fill = t.get("fill")
        if fill in ("tozeroy", "tonexty", "toself", "tozerox"):
            parts.append(self._fill(px, py, xa, ya, str(fill)))
        if "lines" in mode and width > 0:
            dash = line.get("dash")
            style = f"fill='none' stroke='{escape(self.color)}' stroke-width='{width:g}'" + (
                f" stroke-dasharray='{_DASHES[dash]}'" if dash in _DASHES else ""
            )
            parts.append(_line_path(px, py, style, line.get("shape")))
        if "markers" in mode:
            parts.append(_markers(px, py, t.get("marker") or {}, self.color))
        if "text" in mode and t.get("text") is not None:
            parts.append(_point_texts(px, py, t, self.color))
        opacity = t.get("opacity")
        body = "".join(parts)
        return f"<g opacity='{float(opacity):.2f}'>{body}</g>" if opacity not in (None, 1) else body

    def _fill(self, px: np.ndarray, py: np.ndarray, xa: Axis, ya: Axis, fill: str) -> str:
        given = self.trace.get("fillcolor")
        colour, fade = (given, "") if given else (self.color, " fill-opacity='0.5'")  # plotly's default fill
        out = []
        for run_x, run_y in runs(px, py):
            rx, ry = thin(run_x, run_y)
            if fill == "toself":
                corners = points(rx, ry)
            elif fill == "tozerox":
                zero = float(np.clip(xa.px(0.0), min(xa.start_px, xa.end_px), max(xa.start_px, xa.end_px)))
                corners = f"{zero:.1f} {ry[0]:.1f} {points(rx, ry)} {zero:.1f} {ry[-1]:.1f}"
            else:
                zero = float(np.clip(ya.px(0.0), min(ya.start_px, ya.end_px), max(ya.start_px, ya.end_px)))
                corners = f"{rx[0]:.1f} {zero:.1f} {points(rx, ry)} {rx[-1]:.1f} {zero:.1f}"
            out.append(f"<polygon fill='{escape(colour)}'{fade} stroke='none' points='{corners}'/>")
        return "".join(out)


def _line_path(px: np.ndarray, py: np.ndarray, style: str, shape: Any) -> str:
    """One <path> for every stretch of the line (``shape="hv"``: steps)."""
    starts, ends = run_bounds(px, py)
    if not len(starts):
        return ""
    if len(starts) > 8 and np.all(ends - starts == 2) and np.array_equal(py[starts], py[starts + 1]):
        # A lane timeline (thousands of [start, end, None] bars): touching bars merge.
        return f"<path {style} d='{_merged_bars(px[starts], px[starts + 1], py[starts])}'/>"
    pieces = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        rx, ry = px[a:b], py[a:b]
        if shape == "hv" and len(rx) > 1:
            rx, ry = np.repeat(rx, 2)[1:], np.repeat(ry, 2)[:-1]
        tx, ty = thin(rx, ry)
        if len(tx) == 1:
            pieces.append(f"M{tx[0]:.1f} {ty[0]:.1f}h0.1")
        else:
            pieces.append(f"M{tx[0]:.1f} {ty[0]:.1f}L" + points(tx[1:], ty[1:]))
    return f"<path {style} stroke-linejoin='round' d='{''.join(pieces)}'/>"


def _merged_bars(x0: np.ndarray, x1: np.ndarray, rows: np.ndarray) -> str:
    """Horizontal segments, merged per row where they touch or overlap within half a pixel."""
    starts, ends = np.minimum(x0, x1), np.maximum(x0, x1)
    pieces = []
    for row in np.unique(rows):
        on = rows == row
        order = np.argsort(starts[on], kind="stable")
        s, e = starts[on][order], ends[on][order]
        reach = np.maximum.accumulate(e)
        group_starts = np.flatnonzero(np.r_[True, s[1:] > reach[:-1] + 0.5])
        lo = s[group_starts]
        hi = np.maximum(np.maximum.reduceat(e, group_starts), lo + 0.6)  # a sub-pixel event still shows
        pieces += [f"M{a:.1f} {row:.1f}H{b:.1f}" for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
    return "".join(pieces)


def _marker_shape(symbol: str, x: float, y: float, r: float) -> str:
    base = symbol.replace("-open", "").replace("-dot", "")
    if base == "square":
        return f"M{x - r:.1f} {y - r:.1f}h{2 * r:.1f}v{2 * r:.1f}h{-2 * r:.1f}z"
    if base == "diamond":
        return f"M{x:.1f} {y - r:.1f}l{r:.1f} {r:.1f}l{-r:.1f} {r:.1f}l{-r:.1f} {-r:.1f}z"
    if base == "triangle-up":
        return f"M{x:.1f} {y - r:.1f}l{r:.1f} {2 * r:.1f}h{-2 * r:.1f}z"
    if base == "triangle-down":
        return f"M{x - r:.1f} {y - r:.1f}h{2 * r:.1f}l{-r:.1f} {2 * r:.1f}z"
    if base == "star":
        corners = []
        for k in range(10):
            radius = r if k % 2 == 0 else r * 0.45
            angle = math.pi / 2 + k * math.pi / 5
            corners.append(f"{x + radius * math.cos(angle):.1f} {y - radius * math.sin(angle):.1f}")
        return "M" + "L".join(corners) + "z"
    return f"M{x - r:.1f} {y:.1f}a{r:.1f} {r:.1f} 0 1 0 {2 * r:.1f} 0a{r:.1f} {r:.1f} 0 1 0 {-2 * r:.1f} 0"


def _markers(px: np.ndarray, py: np.ndarray, marker: dict[str, Any], color: str) -> str:
    n = len(px)
    sizes = per_point(marker.get("size"), n, 6)
    colours = per_point(marker.get("color"), n, color)
    symbol = str(marker.get("symbol") or "circle")
    opacity = marker.get("opacity")
    attrs = f" fill-opacity='{float(opacity):.2f}'" if isinstance(opacity, (int, float)) else ""
    out = []
    for i in range(n):
        if not (math.isfinite(px[i]) and math.isfinite(py[i])):
            continue
        r = max(float(sizes[i] or 6), 1.0) / 2
        fill = colours[i] if isinstance(colours[i], str) else color
        open_ = symbol.endswith("-open")
        paint = f"fill='none' stroke='{escape(fill)}'" if open_ else f"fill='{escape(fill)}'"
        out.append(f"<path {paint}{attrs} d='{_marker_shape(symbol, float(px[i]), float(py[i]), r)}'/>")
    return "".join(out)


def _point_texts(px: np.ndarray, py: np.ndarray, trace: dict[str, Any], color: str) -> str:
    n = len(px)
    texts = per_point(trace.get("text"), n, "")
    position = str(trace.get("textposition") or "middle center")
    sizes = per_point((trace.get("marker") or {}).get("size"), n, 6)
    anchor = "start" if "right" in position else "end" if "left" in position else "middle"
    out = []
    for i in range(n):
        if not (math.isfinite(px[i]) and math.isfinite(py[i])) or texts[i] in (None, ""):
            continue
        r = max(float(sizes[i] or 6), 1.0) / 2
        dy = -(r + 3) if position.startswith("top") else (r + 11) if position.startswith("bottom") else 4
        dx = (r + 3) if "right" in position else -(r + 3) if "left" in position else 0
        out.append(
            f"<text x='{px[i] + dx:.1f}' y='{py[i] + dy:.1f}' text-anchor='{anchor}' font-size='10' "
            f"fill='#333'>{escape(plain_text(texts[i]))}</text>"
        )
    return "".join(out)


@dataclass
class StackMark(Mark):
    """The traces of one ``stackgroup``: cumulative areas, painted from the top of the stack down."""

    members: list[tuple[dict[str, Any], str]]
    xref: str = "x"
    yref: str = "y"
    _stack: tuple[np.ndarray, list[np.ndarray]] | None = None

    def _stacked(self, canvas: Canvas) -> tuple[np.ndarray, list[np.ndarray]]:
        if self._stack is None:
            xa, ya = canvas.axis(self.xref), canvas.axis(self.yref)
            series = []
            for trace, _ in self.members:
                y = ya.code(trace.get("y"))
                x = xa.code(trace["x"]) if trace.get("x") is not None else np.arange(len(y), dtype=float)
                n = min(len(x), len(y))
                series.append((x[:n], np.nan_to_num(y[:n])))
            same = all(len(x) == len(series[0][0]) and np.array_equal(x, series[0][0]) for x, _ in series)
            grid = series[0][0] if same else np.unique(np.concatenate([x for x, _ in series]))
            total = np.zeros(len(grid))
            cumulative = []
            for x, y in series:
                total = total + (y if same else np.interp(grid, x, y, left=0.0, right=0.0))
                cumulative.append(total.copy())
            self._stack = (grid, cumulative)
        return self._stack

    def register(self, canvas: Canvas) -> None:
        grid, cumulative = self._stacked(canvas)
        if len(grid):
            canvas.axis(self.xref).extend(float(np.nanmin(grid)), float(np.nanmax(grid)))
            tops = np.concatenate(cumulative)
            canvas.axis(self.yref).extend(min(0.0, float(tops.min())), float(tops.max()), pad=True)

    def svg(self, canvas: Canvas) -> str:
        xa, ya = canvas.axis(self.xref), canvas.axis(self.yref)
        grid, cumulative = self._stacked(canvas)
        if not len(grid):
            return ""
        px = xa.px(grid)
        keep = _column_peaks(px, cumulative[-1])  # the same instants for every layer: bands stay stacked
        px = px[keep]
        zero = float(ya.px(0.0))
        out = []
        for (trace, colour), top in reversed(list(zip(self.members, cumulative, strict=True))):
            py = ya.px(top[keep])
            fill = escape(trace.get("fillcolor") or colour)
            out.append(
                f"<polygon fill='{fill}' stroke='{escape(colour)}' stroke-width='0.5' "
                f"points='{px[0]:.1f} {zero:.1f} {points(px, py)} {px[-1]:.1f} {zero:.1f}'/>"
            )
        # Opaque layers (each covers the part of the one above it that lies below its own top),
        # faded as one group: every band shows its colour at half strength, as plotly fills it,
        # and no two bands mix.
        return f"<g opacity='0.5'>{''.join(out)}</g>"


def _column_peaks(px: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Indices of the highest ``total`` in each pixel column (all when x is not in order)."""
    if len(px) < 64 or np.any(np.diff(px) < 0):
        return np.arange(len(px))
    columns = np.floor(px).astype(np.int64)
    order = np.lexsort((-total, columns))  # by column, highest total first within it
    first = np.flatnonzero(np.r_[True, np.diff(columns[order]) != 0])
    return np.sort(order[first])
