"""The common ground of a figure's static SVG marks (:mod:`nbtoolkit.core.figure_svg`).

A *mark* is one thing the static picture draws for the figure's traces: a scatter trace
(:mod:`~nbtoolkit.core.svg_lines`), the stacked areas of a ``stackgroup``, the bars of one subplot
(:mod:`~nbtoolkit.core.svg_bars`), a heatmap or an icicle (:mod:`~nbtoolkit.core.svg_grids`). A
mark first tells the axes what range it needs (:meth:`Mark.register`), then draws itself once the
axes have pixels (:meth:`Mark.svg`). This module holds what they share: the plot area
(:class:`Canvas`), the base class, and the helpers that keep big data small (:func:`thin`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nbtoolkit.core.svg_axes import Axis, as_values

__all__ = [
    "Canvas",
    "LegendEntry",
    "Mark",
    "per_point",
    "points",
    "run_bounds",
    "runs",
    "thin",
    "trace_axis_values",
    "trace_color",
]


@dataclass
class Canvas:
    """The plot area in pixels and the figure's axes by reference (``x``, ``y2``)."""

    axes: dict[str, Axis]
    left: float
    top: float
    right: float
    bottom: float

    def axis(self, ref: str) -> Axis:
        return self.axes[ref]


@dataclass
class LegendEntry:
    name: str
    color: str
    symbol: str  # line | box | marker
    dash: str | None = None
    opacity: float = 1.0


def points(px: np.ndarray, py: np.ndarray) -> str:
    return " ".join(f"{a:.1f} {b:.1f}" for a, b in zip(px.tolist(), py.tolist(), strict=True))


def run_bounds(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each stretch of consecutive points where both coordinates exist (plotly
    breaks a line at a missing value)."""
    ok = np.isfinite(x) & np.isfinite(y)
    edges = np.flatnonzero(np.diff(np.r_[0, ok.astype(np.int8), 0]))
    return edges[::2], edges[1::2]


def runs(x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The stretches of :func:`run_bounds` as (x, y) pairs."""
    starts, ends = run_bounds(x, y)
    return [(x[a:b], y[a:b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def thin(px: np.ndarray, py: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel column the first, lowest, highest and last point, in order (x must not decrease).

    The drawn line looks the same (every extreme stays) with at most four points per pixel.
    """
    if len(px) < 64 or np.any(np.diff(px) < 0):
        return px, py
    columns = np.floor(px).astype(np.int64)
    if len(np.unique(columns)) * 4 >= len(px):
        return px, py
    order = np.lexsort((py, columns))  # by column, then by height within it
    starts = np.flatnonzero(np.r_[True, np.diff(columns[order]) != 0])
    ends = np.r_[starts[1:], len(order)] - 1
    first = np.flatnonzero(np.r_[True, np.diff(columns) != 0])
    last = np.r_[first[1:], len(columns)] - 1
    keep = np.unique(np.concatenate([first, last, order[starts], order[ends]]))
    return px[keep], py[keep]


def trace_color(trace: dict[str, Any], index: int, colorway: list[str]) -> str:
    for part, key in (("line", "color"), ("marker", "color")):
        value = (trace.get(part) or {}).get(key)
        if isinstance(value, str):
            return value
    if isinstance(trace.get("fillcolor"), str):
        return str(trace["fillcolor"])
    return colorway[index % len(colorway)] if colorway else "#636efa"


def trace_axis_values(trace: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    """The values of ``trace`` that land on its x and y axes (for the axes' kinds and categories)."""
    kind = trace.get("type", "scatter")
    if kind in ("scatter", "scattergl", "bar", "histogram", "heatmap"):
        return [(letter, as_values(trace[letter])) for letter in ("x", "y") if trace.get(letter) is not None]
    return []


def per_point(value: Any, n: int, default: Any) -> list[Any]:
    if value is None:
        return [default] * n
    if isinstance(value, (str, int, float)):
        return [value] * n
    values = list(as_values(value).tolist())
    return (values + [default] * n)[:n]


class Mark:
    """Something drawn (see the module docstring)."""

    xref = "x"
    yref = "y"
    right_px = 0.0  # room it needs right of the plot area (a colour bar)

    def register(self, canvas: Canvas) -> None:  # marks on the paper need no range
        """Tell the axes which range this mark needs."""

    def svg(self, canvas: Canvas) -> str:
        """What it draws inside its subplot (clipped to it)."""
        raise NotImplementedError

    def svg_outside(self, canvas: Canvas) -> str:
        """What it draws beside the plot (a colour bar), not clipped."""
        return ""
