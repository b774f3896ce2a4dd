"""Bars in a figure's static SVG: the bar and histogram traces of one subplot, laid out together.

plotly places the bars of a subplot together (``layout.barmode``): side by side (``group``, the
default), on top of each other (``stack``, ``relative``: positive values up, negative down) or
over each other (``overlay``), in slots ``1 - bargap`` wide. Histograms are binned here the way
plotly bins them (``nbinsx`` equal bins over the data) and drawn as gapless bars. Text labels
(``textposition`` outside / inside / auto) and ``error_y`` / ``error_x`` bars are drawn too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbtoolkit.core.result import escape
from nbtoolkit.core.svg_axes import Axis, as_values, is_categorical, plain_text, text_width
from nbtoolkit.core.svg_marks import Canvas, Mark, per_point

__all__ = ["BarMark"]


@dataclass
class _Bars:
    """One trace's bars in data units: slot positions, bases and tops, and how to paint them."""

    trace: dict[str, Any]
    color: str
    horizontal: bool
    positions: np.ndarray
    values: np.ndarray
    width: float | None = None  # histogram bins: their own width, no gap
    base: np.ndarray = field(default_factory=lambda: np.empty(0))
    offset: float = 0.0
    bar_width: float = 0.8


def _histogram(trace: dict[str, Any], position_axis: Axis) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Bin centres, counts and bin width of a histogram trace (categories: a count per category)."""
    letter = "y" if trace.get("x") is None and trace.get("y") is not None else "x"
    raw = as_values(trace.get(letter))
    if position_axis.kind == "category" or is_categorical(raw):
        codes = position_axis.code(raw)
        codes = codes[np.isfinite(codes)]
        cats, counts = np.unique(codes, return_counts=True)
        return cats, counts.astype(float), None
    values = position_axis.code(raw)
    values = values[np.isfinite(values)]
    if not len(values):
        return np.empty(0), np.empty(0), None
    bins = int(
        trace.get("nbinsx" if letter == "x" else "nbinsy") or min(40, max(5, int(math.sqrt(len(values)))))
    )
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(values, bins=bins, range=(lo, hi))
    return (edges[:-1] + edges[1:]) / 2, counts.astype(float), float(edges[1] - edges[0])


@dataclass
class BarMark(Mark):
    """The bars of one subplot (see the module docstring)."""

    layout: dict[str, Any]
    xref: str = "x"
    yref: str = "y"
    members: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    _laid_out: list[_Bars] | None = None

    def _layout_bars(self, canvas: Canvas) -> list[_Bars]:
        if self._laid_out is not None:
            return self._laid_out
        xa, ya = canvas.axis(self.xref), canvas.axis(self.yref)
        bars: list[_Bars] = []
        for trace, color in self.members:
            horizontal = trace.get("orientation") == "h" or (
                trace.get("type") == "histogram" and trace.get("x") is None and trace.get("y") is not None
            )
            pos_axis, val_axis = (ya, xa) if horizontal else (xa, ya)
            if trace.get("type") == "histogram":
                positions, values, width = _histogram(trace, pos_axis)
            else:
                pos_key, val_key = ("y", "x") if horizontal else ("x", "y")
                values = val_axis.code(trace.get(val_key))
                positions = (
                    pos_axis.code(trace[pos_key])
                    if trace.get(pos_key) is not None
                    else np.arange(len(values), dtype=float)
                )
                n = min(len(values), len(positions))
                positions, values, width = positions[:n], values[:n], None
            bars.append(_Bars(trace, color, horizontal, positions, values, width))
        only_histograms = all(b.trace.get("type") == "histogram" for b in bars)
        gap = float(self.layout.get("bargap", 0.0 if only_histograms else 0.2) or 0.0)
        mode = self.layout.get("barmode") or "group"
        every = np.concatenate([b.positions[np.isfinite(b.positions)] for b in bars]) if bars else np.empty(0)
        unique = np.unique(every)
        slot = float(np.min(np.diff(unique))) if len(unique) > 1 else 1.0
        up: dict[float, float] = {}
        down: dict[float, float] = {}
        for k, b in enumerate(bars):
            full = (b.width or slot) * (1 - gap)
            if mode == "group" and len(bars) > 1:
                b.bar_width = full / len(bars)
                b.offset = -full / 2 + (k + 0.5) * b.bar_width
            else:
                b.bar_width = full
            base = np.zeros(len(b.values))
            if mode in ("stack", "relative"):
                for i, (p, v) in enumerate(zip(b.positions.tolist(), b.values.tolist(), strict=True)):
                    if not (math.isfinite(p) and math.isfinite(v)):
                        continue
                    pile = up if v >= 0 else down
                    base[i] = pile.get(p, 0.0)
                    pile[p] = base[i] + v
            b.base = base
        self._laid_out = bars
        return bars

    def register(self, canvas: Canvas) -> None:
        for b in self._layout_bars(canvas):
            ok = np.isfinite(b.positions) & np.isfinite(b.values)
            if not ok.any():
                continue
            pos_ref, val_ref = (self.yref, self.xref) if b.horizontal else (self.xref, self.yref)
            centres = b.positions[ok] + b.offset
            canvas.axis(pos_ref).extend(
                float(centres.min() - b.bar_width / 2), float(centres.max() + b.bar_width / 2)
            )
            ends = np.concatenate([b.base[ok], b.base[ok] + b.values[ok], *_error_ends(b, ok)])
            canvas.axis(val_ref).extend(min(0.0, float(ends.min())), max(0.0, float(ends.max())), pad=True)

    def svg(self, canvas: Canvas) -> str:
        out: list[str] = []
        for b in self._layout_bars(canvas):
            pos_axis, val_axis = (
                (canvas.axis(self.yref), canvas.axis(self.xref))
                if b.horizontal
                else (canvas.axis(self.xref), canvas.axis(self.yref))
            )
            out.append(_draw_bars(b, pos_axis, val_axis))
        return "".join(out)


def _error_ends(b: _Bars, ok: np.ndarray) -> list[np.ndarray]:
    low, high = _errors(b)
    if low is None or high is None:
        return []
    tops = (b.base + b.values)[ok]
    return [tops - low[ok], tops + high[ok]]


def _errors(b: _Bars) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Minus and plus error lengths per bar, in value units (``error_y`` of vertical bars)."""
    spec = b.trace.get("error_x" if b.horizontal else "error_y") or {}
    if not spec or spec.get("visible") is False:
        return None, None
    n, kind = len(b.values), spec.get("type", "data")
    if kind == "percent":
        plus = np.abs(b.values) * float(spec.get("value", 10)) / 100
        minus = np.abs(b.values) * float(spec.get("valueminus", spec.get("value", 10))) / 100
    elif kind == "constant":
        plus = np.full(n, float(spec.get("value", 0)))
        minus = np.full(n, float(spec.get("valueminus", spec.get("value", 0))))
    else:
        plus = np.array(per_point(spec.get("array"), n, 0.0), dtype=float)
        symmetric = spec.get("symmetric", spec.get("arrayminus") is None)
        minus = plus if symmetric else np.array(per_point(spec.get("arrayminus"), n, 0.0), dtype=float)
    return np.nan_to_num(minus), np.nan_to_num(plus)


def _draw_bars(b: _Bars, pos_axis: Axis, val_axis: Axis) -> str:
    ok = np.isfinite(b.positions) & np.isfinite(b.values)
    n = len(b.values)
    colours = per_point((b.trace.get("marker") or {}).get("color"), n, b.color)
    line = (b.trace.get("marker") or {}).get("line") or {}
    line_widths = per_point(line.get("width"), n, 0)
    line_colour = line.get("color") if isinstance(line.get("color"), str) else "#444"
    p0 = pos_axis.px(b.positions + b.offset - b.bar_width / 2)
    p1 = pos_axis.px(b.positions + b.offset + b.bar_width / 2)
    v0, v1 = val_axis.px(b.base), val_axis.px(b.base + b.values)
    by_colour: dict[tuple[str, float], list[str]] = {}
    for i in np.flatnonzero(ok).tolist():
        lo_p, hi_p = sorted((float(p0[i]), float(p1[i])))
        lo_v, hi_v = sorted((float(v0[i]), float(v1[i])))
        if b.horizontal:
            path = f"M{lo_v:.1f} {lo_p:.1f}h{hi_v - lo_v:.1f}v{hi_p - lo_p:.1f}h{lo_v - hi_v:.1f}z"
        else:
            path = f"M{lo_p:.1f} {lo_v:.1f}h{hi_p - lo_p:.1f}v{hi_v - lo_v:.1f}h{lo_p - hi_p:.1f}z"
        colour = colours[i] if isinstance(colours[i], str) else b.color
        by_colour.setdefault((colour, float(line_widths[i] or 0)), []).append(path)
    opacity = b.trace.get("opacity")
    fade = (
        f" fill-opacity='{float(opacity):.2f}'" if isinstance(opacity, (int, float)) and opacity < 1 else ""
    )
    out = []
    for (colour, width), paths in by_colour.items():
        stroke = f" stroke='{escape(line_colour)}' stroke-width='{width:g}'" if width > 0 else ""
        out.append(f"<path fill='{escape(colour)}'{fade}{stroke} d='{''.join(paths)}'/>")
    out.append(_error_bars(b, pos_axis, val_axis, ok))
    low, high = _errors(b)
    if high is not None and low is not None:  # a label outside the bar goes past its error bar
        tops = b.base + b.values
        v1 = val_axis.px(np.where(b.values >= 0, tops + high, tops - low))
    out.append(_bar_texts(b, (p0, p1, v0, v1), ok))
    return "".join(out)


def _error_bars(b: _Bars, pos_axis: Axis, val_axis: Axis, ok: np.ndarray) -> str:
    low, high = _errors(b)
    if low is None or high is None:
        return ""
    tops = b.base + b.values
    centre = pos_axis.px(b.positions + b.offset)
    a, z = val_axis.px(tops - low), val_axis.px(tops + high)
    pieces = []
    for i in np.flatnonzero(ok).tolist():
        c, lo, hi = float(centre[i]), float(a[i]), float(z[i])
        if b.horizontal:
            pieces.append(f"M{lo:.1f} {c:.1f}H{hi:.1f}M{lo:.1f} {c - 4:.1f}v8M{hi:.1f} {c - 4:.1f}v8")
        else:
            pieces.append(f"M{c:.1f} {lo:.1f}V{hi:.1f}M{c - 4:.1f} {lo:.1f}h8M{c - 4:.1f} {hi:.1f}h8")
    return f"<path fill='none' stroke='#444' stroke-width='1.2' d='{''.join(pieces)}'/>"


def _bar_texts(b: _Bars, edges: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ok: np.ndarray) -> str:
    """The bars' ``text``; ``edges`` are the pixels of each bar's two sides, its base and its tip."""
    p0, p1, v0, v1 = edges
    if b.trace.get("text") is None:
        return ""
    n = len(b.values)
    texts = per_point(b.trace.get("text"), n, "")
    where = str(b.trace.get("textposition") or "auto")
    if where == "none":
        return ""
    out = []
    for i in np.flatnonzero(ok).tolist():
        label = plain_text(texts[i])
        if not label:
            continue
        breadth, length = abs(float(p1[i] - p0[i])), abs(float(v1[i] - v0[i]))
        along, across = (length, breadth) if b.horizontal else (breadth, length)
        fits = text_width(label, 10) + 4 <= along and across >= 14
        inside = where == "inside" or (where == "auto" and fits)
        centre = float(p0[i] + p1[i]) / 2
        end = float(v1[i])
        grows = 1.0 if float(v1[i]) >= float(v0[i]) else -1.0  # pixel direction from base to tip
        if b.horizontal:
            x = (float(v0[i] + v1[i]) / 2) if inside else end + grows * 3
            anchor = "middle" if inside else ("start" if grows > 0 else "end")
            out.append(
                f"<text x='{x:.1f}' y='{centre + 3.5:.1f}' text-anchor='{anchor}' font-size='10' "
                f"fill='{'#fff' if inside else '#333'}'>{escape(label)}</text>"
            )
        else:
            y = (
                (float(v0[i] + v1[i]) / 2 + 3.5)
                if inside
                else end + (4 if grows > 0 else -4) + (9 if grows > 0 else 0)
            )
            out.append(
                f"<text x='{centre:.1f}' y='{y:.1f}' text-anchor='middle' font-size='10' "
                f"fill='{'#fff' if inside else '#333'}'>{escape(label)}</text>"
            )
    return "".join(out)
