"""Heatmaps and icicles in a figure's static SVG.

- A heatmap becomes one PNG image with a pixel per cell (``image-rendering: pixelated``
  keeps the cells sharp when the browser scales it), coloured with the trace's colour scale,
  and a colour bar: a 64-pixel PNG ramp with the lowest and highest value written beside it.
  A rank x step map of a thousand ranks stays a few kilobytes.
- An icicle lays out its nodes as nested rectangles: each node as wide as its value's share of
  its parent, one band per depth (``tiling.orientation`` ``v``: the root on top; ``h``: on the
  left), coloured by its top-level branch in lighter tints with depth, labels where they fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nbtoolkit.core.result import escape
from nbtoolkit.core.svg_axes import CHAR_PX, as_values, format_number, plain_text
from nbtoolkit.core.svg_marks import Canvas, Mark
from nbtoolkit.core.svg_paint import apply_colorscale, png_data_uri, tint

__all__ = ["HeatmapMark", "IcicleMark"]

_BAR_PX = 70.0  # room right of the plot for the colour bar and its labels


@dataclass
class HeatmapMark(Mark):
    trace: dict[str, Any]
    xref: str = "x"
    yref: str = "y"

    def __post_init__(self) -> None:
        self.z = np.array(
            [
                [np.nan if v is None else v for v in row]
                for row in np.asarray(self.trace.get("z"), dtype=object)
            ]
            if self.trace.get("z") is not None
            else np.empty((0, 0)),
            dtype=float,
        )
        if self.z.ndim != 2:
            self.z = self.z.reshape(1, -1) if self.z.size else np.empty((0, 0))
        self.right_px = _BAR_PX if self.trace.get("showscale", True) is not False else 0.0

    def _centres(self, canvas: Canvas) -> tuple[np.ndarray, np.ndarray]:
        rows, cols = self.z.shape
        t = self.trace
        x = (
            canvas.axis(self.xref).code(t["x"])[:cols]
            if t.get("x") is not None
            else np.arange(cols, dtype=float)
        )
        y = (
            canvas.axis(self.yref).code(t["y"])[:rows]
            if t.get("y") is not None
            else np.arange(rows, dtype=float)
        )
        return x, y

    @staticmethod
    def _edges(centres: np.ndarray) -> tuple[float, float]:
        step = float(np.median(np.diff(centres))) if len(centres) > 1 else 1.0
        return float(centres[0]) - step / 2, float(centres[-1]) + step / 2

    def register(self, canvas: Canvas) -> None:
        x, y = self._centres(canvas)
        if self.z.size and len(x) and len(y) and np.isfinite(x).all() and np.isfinite(y).all():
            canvas.axis(self.xref).extend(*sorted(self._edges(x)))
            canvas.axis(self.yref).extend(*sorted(self._edges(y)))

    def svg(self, canvas: Canvas) -> str:
        x, y = self._centres(canvas)
        if not self.z.size or not len(x) or not len(y):
            return ""
        z = self.z[: len(y), : len(x)]
        lo, hi = self._range()
        scale, reverse = self.trace.get("colorscale"), bool(self.trace.get("reversescale"))
        xa, ya = canvas.axis(self.xref), canvas.axis(self.yref)
        x0, x1 = (float(v) for v in xa.px(np.array(self._edges(x))))
        y0, y1 = (float(v) for v in ya.px(np.array(self._edges(y))))
        image = z[:, ::-1] if x1 < x0 else z  # the PNG's first column is the leftmost
        image = image[::-1] if y0 > y1 else image  # and its first row the topmost
        uri = png_data_uri(apply_colorscale(image, scale, lo, hi, reverse=reverse))
        left, top = min(x0, x1), min(y0, y1)
        image_tag = (
            f"<image x='{left:.1f}' y='{top:.1f}' width='{abs(x1 - x0):.1f}' height='{abs(y1 - y0):.1f}' "
            f"preserveAspectRatio='none' style='image-rendering:pixelated' href='{uri}'/>"
        )
        return image_tag

    def _range(self) -> tuple[float, float]:
        finite = self.z[np.isfinite(self.z)]
        zmin, zmax = self.trace.get("zmin"), self.trace.get("zmax")
        lo = float(zmin) if zmin is not None else float(finite.min()) if finite.size else 0.0
        hi = float(zmax) if zmax is not None else float(finite.max()) if finite.size else 1.0
        return lo, hi

    def svg_outside(self, canvas: Canvas) -> str:
        if not self.right_px or not self.z.size:
            return ""
        lo, hi = self._range()
        scale, reverse = self.trace.get("colorscale"), bool(self.trace.get("reversescale"))
        return self._colour_bar(canvas, scale, reverse, lo, hi)

    def _colour_bar(self, canvas: Canvas, scale: Any, reverse: bool, lo: float, hi: float) -> str:
        ramp = apply_colorscale(np.linspace(hi, lo, 64).reshape(64, 1), scale, lo, hi, reverse=reverse)
        left, top = canvas.right + 12, canvas.top
        height = max(canvas.bottom - canvas.top, 20.0)
        title = (self.trace.get("colorbar") or {}).get("title")
        title = plain_text(title.get("text") if isinstance(title, dict) else title)
        step = (hi - lo) or 1.0
        return (
            f"<image x='{left:.1f}' y='{top:.1f}' width='14' height='{height:.1f}' "
            f"preserveAspectRatio='none' href='{png_data_uri(ramp)}'/>"
            f"<text x='{left + 18:.1f}' y='{top + 9:.1f}' font-size='10'>"
            f"{escape(format_number(hi, step / 10))}</text>"
            f"<text x='{left + 18:.1f}' y='{top + height:.1f}' font-size='10'>"
            f"{escape(format_number(lo, step / 10))}</text>"
            + (
                f"<text x='{left:.1f}' y='{top - 4:.1f}' font-size='10'>{escape(title)}</text>"
                if title
                else ""
            )
        )


@dataclass
class IcicleMark(Mark):
    """An icicle over the trace's domain of the plot area (see the module docstring)."""

    trace: dict[str, Any]
    colorway: list[str]

    def svg(self, canvas: Canvas) -> str:
        t = self.trace
        ids = [
            str(v) for v in as_values(t.get("ids") if t.get("ids") is not None else t.get("labels")).tolist()
        ]
        labels = [str(v) for v in as_values(t.get("labels")).tolist()] or ids
        parents = [str(v) if v is not None else "" for v in as_values(t.get("parents")).tolist()]
        values = [float(v or 0) for v in as_values(t.get("values")).tolist()]
        n = min(len(ids), len(parents))
        children: dict[str, list[int]] = {}
        known = set(ids[:n])
        for i in range(n):
            children.setdefault(parents[i] if parents[i] in known else "", []).append(i)
        totals = _totals(children, values, ids, remainder=t.get("branchvalues") == "remainder")
        depth = _depth(children, ids)
        domain = t.get("domain") or {}
        dx, dy = domain.get("x") or [0, 1], domain.get("y") or [0, 1]
        width, height = canvas.right - canvas.left, canvas.bottom - canvas.top
        box = (
            canvas.left + dx[0] * width,
            canvas.top + (1 - dy[1]) * height,
            canvas.left + dx[1] * width,
            canvas.top + (1 - dy[0]) * height,
        )
        vertical = ((t.get("tiling") or {}).get("orientation") or "h") == "v"
        root_colour = (t.get("root") or {}).get("color") or "#e6e6e6"
        out: list[str] = []

        def place(index: int, lo: float, hi: float, level: int, base: str) -> None:
            """Draw node ``index`` across [lo, hi] at depth ``level``, then its children inside it."""
            band = ((box[3] - box[1]) if vertical else (box[2] - box[0])) / max(depth, 1)
            start = (box[1] if vertical else box[0]) + level * band
            x0, y0, x1, y1 = (lo, start, hi, start + band) if vertical else (start, lo, start + band, hi)
            own = root_colour if level == 0 else tint(base, 0.8 ** (level - 1))
            out.append(
                f"<rect x='{x0:.1f}' y='{y0:.1f}' width='{max(x1 - x0, 0):.1f}' "
                f"height='{max(y1 - y0, 0):.1f}' fill='{escape(own)}' stroke='#fff'/>"
            )
            label = plain_text(labels[index] if index < len(labels) else ids[index]).split("\n")[0]
            room = int((x1 - x0 - 6) / (10 * CHAR_PX))
            if room >= 4 and y1 - y0 >= 13:
                shown = label if len(label) <= room else label[: room - 1] + "…"
                out.append(
                    f"<text x='{x0 + 3:.1f}' y='{y0 + 11:.1f}' font-size='10' fill='#222'>"
                    f"{escape(shown)}</text>"
                )
            kids = children.get(ids[index], [])
            whole = totals[index] or sum(totals[k] for k in kids) or 1.0
            cursor = lo
            for rank, kid in enumerate(kids):
                share = (hi - lo) * totals[kid] / whole
                palette = self.colorway or ["#636efa"]
                place(
                    kid,
                    cursor,
                    cursor + share,
                    level + 1,
                    palette[rank % len(palette)] if level == 0 else base,
                )
                cursor += share

        roots = children.get("", [])
        whole = sum(totals[r] for r in roots) or 1.0
        lo = box[0] if vertical else box[1]
        span = (box[2] - box[0]) if vertical else (box[3] - box[1])
        for r in roots:
            share = span * totals[r] / whole
            place(r, lo, lo + share, 0, root_colour)
            lo += share
        return "".join(out)


def _totals(
    children: dict[str, list[int]], values: list[float], ids: list[str], *, remainder: bool
) -> list[float]:
    """Each node's size: its value (``total``), or its value plus its subtree (``remainder``)."""
    totals = [values[i] if i < len(values) else 0.0 for i in range(len(ids))]
    if not remainder:
        return totals

    def size(i: int) -> float:
        return totals[i] + sum(size(k) for k in children.get(ids[i], []))

    return [size(i) for i in range(len(ids))]


def _depth(children: dict[str, list[int]], ids: list[str]) -> int:
    deepest, frontier = 0, [(r, 1) for r in children.get("", [])]
    while frontier:
        node, level = frontier.pop()
        deepest = max(deepest, level)
        frontier += [(k, level + 1) for k in children.get(ids[node], [])]
    return deepest
