"""The axes of a figure's static SVG (:mod:`nbtoolkit.core.figure_svg`): kind, range, pixels, ticks.

An :class:`Axis` is one of the figure's ``xaxis``/``yaxis``/``xaxis2``/... as plotly would draw
it, reduced to what a still picture needs: its kind (``linear``, ``log``, ``category``), the
data range it shows, where that range lies in pixels, and its tick marks with their labels.

Values go through :meth:`Axis.code` once (categories become their index, log values their
log10, anything else a float; missing values NaN) and are then placed with :meth:`Axis.px`.
Ranges are in those coded units, as plotly keeps them (a log axis's ``range`` is in decades).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Axis", "as_values", "format_number", "is_categorical", "plain_text", "text_width"]

CHAR_PX = 0.56  # average glyph width per font pixel, for a sans-serif font: a layout estimate


def text_width(text: str, size: float = 11.0) -> float:
    """Estimated width in pixels of one line of ``text`` (no font metrics on the kernel side)."""
    return len(text) * size * CHAR_PX


def plain_text(text: Any) -> str:
    """plotly's HTML-ish label markup as plain text: ``<br>`` a newline, other tags dropped,
    entities decoded. The caller escapes the result again before it goes into the SVG."""
    import html
    import re

    if text is None:
        return ""
    out = re.sub(r"<br\s*/?>", "\n", str(text), flags=re.IGNORECASE)
    return html.unescape(re.sub(r"<[^>]*>", "", out))


def as_values(values: Any) -> np.ndarray:
    """A trace's data array as a 1-D numpy array (objects kept: strings may be categories)."""
    if values is None:
        return np.empty(0)
    if isinstance(values, np.ndarray):
        return values.ravel()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        return np.asarray([values], dtype=object)
    array = np.asarray(list(values), dtype=object)
    return array.ravel() if array.ndim else np.asarray([values], dtype=object)


def _is_number(value: Any) -> bool:
    """A number, or a missing value (which makes no axis a category axis)."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return value is None
    return isinstance(value, (int, float, np.integer, np.floating))


def is_categorical(values: np.ndarray) -> bool:
    """Whether plotly would put ``values`` on a category axis: some value is not a number."""
    if values.dtype.kind in "iufb":
        return False
    return any(not _is_number(v) for v in values.tolist())


def _decimals(step: float, limit: int) -> int:
    """The fewest decimals that write ``step`` exactly (2.5 needs one, 0.25 two), at most ``limit``."""
    for decimals in range(limit + 1):
        if abs(round(step, decimals) - step) <= abs(step) * 1e-6:
            return decimals
    return limit


def format_number(value: float, step: float) -> str:
    """A tick label: as many decimals as ``step`` needs, SI suffixes past ten thousand."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e4:
        for divisor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if magnitude >= divisor:
                return f"{value / divisor:.{_decimals(step / divisor, 3)}f}{suffix}"
    if magnitude < 1e-4:
        return f"{value:.0e}"
    return f"{value:.{_decimals(step, 6) if step > 0 else 2}f}"


def _nice_step(span: float, count: float) -> float:
    raw = span / max(count, 1.0)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power * 1.0001:
            return factor * power
    return 10 * power


@dataclass
class Axis:
    """One axis of the figure (see the module docstring)."""

    name: str  # the layout key: "xaxis", "yaxis2", ...
    spec: dict[str, Any]
    kind: str = "linear"  # linear | log | category
    categories: list[str] = field(default_factory=list)
    lo: float = 0.0  # the shown range, in coded units (lo < hi; ``reversed`` flips the pixels)
    hi: float = 1.0
    reversed: bool = False
    start_px: float = 0.0  # pixels of lo and hi (x: left to right, y: bottom to top)
    end_px: float = 1.0
    padded: bool = False  # some trace wants a margin around its data (markers, bars' tops)
    _extent: list[float] = field(default_factory=list)

    @property
    def letter(self) -> str:
        return self.name[0]

    @property
    def ref(self) -> str:
        """The name traces use for this axis: ``x``, ``y2``."""
        return self.letter + self.name[5:]

    def domain(self) -> tuple[float, float]:
        lo, hi = self.spec.get("domain") or (0.0, 1.0)
        return float(lo), float(hi)

    def learn_categories(self, values: np.ndarray) -> None:
        """Add the category names of ``values``, in order of first appearance (plotly's default)."""
        known = set(self.categories)
        for value in values.tolist():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            name = str(value)
            if name not in known:
                known.add(name)
                self.categories.append(name)

    def code(self, values: Any) -> np.ndarray:
        """Data values in this axis's units as float64 (NaN where missing or not placeable)."""
        array = as_values(values)
        if self.kind == "category":
            index = {name: i for i, name in enumerate(self.categories)}
            return np.array(
                [index.get(str(v), np.nan) if v is not None else np.nan for v in array.tolist()], dtype=float
            )
        if array.dtype.kind in "iufb":
            out = array.astype(float)
        else:
            out = np.array(
                [v if _is_number(v) and v is not None else np.nan for v in array.tolist()], dtype=float
            )
        if self.kind == "log":
            with np.errstate(divide="ignore", invalid="ignore"):
                out = np.where(out > 0, np.log10(np.where(out > 0, out, 1.0)), np.nan)
        return out

    def extend(self, lo: float, hi: float, *, pad: bool = False) -> None:
        """Make the data range cover [lo, hi] (coded units)."""
        if math.isfinite(lo) and math.isfinite(hi):
            self._extent += [min(lo, hi), max(lo, hi)]
            self.padded = self.padded or pad

    def settle_range(self) -> None:
        """The shown range: the layout's ``range`` if given, else the data's extent (padded)."""
        given = self.spec.get("range")
        autorange = self.spec.get("autorange")
        self.reversed = autorange == "reversed"
        if given is not None and len(given) == 2 and None not in given and autorange in (None, False):
            a, b = (float(v) for v in given)
            self.lo, self.hi, self.reversed = min(a, b), max(a, b), a > b
            if self.lo < self.hi:
                return
        if self.kind == "category" and self.categories:
            lo, hi = -0.5, len(self.categories) - 0.5
            if self._extent:
                lo, hi = min(lo, *self._extent), max(hi, *self._extent)
        elif self._extent:
            lo, hi = min(self._extent), max(self._extent)
            if self.padded:
                pad = 0.05 * (hi - lo)
                lo = lo if lo == 0 and self.kind == "linear" else lo - pad
                hi = hi if hi == 0 and self.kind == "linear" else hi + pad
        else:
            lo, hi = 0.0, 1.0  # an axis without data: plotly's empty range
        if hi <= lo:
            width = abs(lo) * 0.5 or 1.0
            lo, hi = lo - width, hi + width
        self.lo, self.hi = lo, hi

    def px(self, coded: np.ndarray | float) -> Any:
        """Pixel position of coded values (NaN stays NaN)."""
        a, b = (self.end_px, self.start_px) if self.reversed else (self.start_px, self.end_px)
        return a + (np.asarray(coded, dtype=float) - self.lo) * ((b - a) / (self.hi - self.lo))

    @property
    def length_px(self) -> float:
        return abs(self.end_px - self.start_px)

    def title(self) -> str:
        title = self.spec.get("title")
        if isinstance(title, dict):
            title = title.get("text")
        return plain_text(title)

    def shows_labels(self) -> bool:
        return (
            self.spec.get("showticklabels", True) is not False and self.spec.get("visible", True) is not False
        )

    def ticks(self) -> list[tuple[float, str]]:
        """(coded value, label) of every tick inside the range."""
        spec = self.spec
        if spec.get("tickmode") == "array" or (spec.get("tickvals") is not None and self.kind != "category"):
            values = self.code(spec.get("tickvals"))
            texts = (
                list(as_values(spec.get("ticktext")).tolist()) if spec.get("ticktext") is not None else None
            )
            return [
                (float(v), plain_text(texts[i]) if texts and i < len(texts) else format_number(float(v), 1.0))
                for i, v in enumerate(values.tolist())
                if math.isfinite(v) and self.lo <= v <= self.hi
            ]
        if self.kind == "category":
            first, last = max(0, math.ceil(self.lo)), min(len(self.categories) - 1, math.floor(self.hi))
            shown = list(range(first, last + 1))
            room = 13.0 if self.letter == "y" else 9.0  # px a label needs along the axis, at least
            every = max(1, math.ceil(len(shown) * room / max(self.length_px, 1.0)))
            return [(float(i), self.categories[i]) for i in shown[::every]]
        if self.kind == "log":
            return self._log_ticks()
        count = self.length_px / (90.0 if self.letter == "x" else 45.0)
        step = _nice_step(self.hi - self.lo, max(count, 2.0))
        first = math.ceil(self.lo / step - 1e-9)
        steps = [k * step for k in range(first, first + 200) if k * step <= self.hi + step * 1e-9]
        return [(v, format_number(v, step)) for v in steps]

    def _log_ticks(self) -> list[tuple[float, str]]:
        decades = range(math.floor(self.lo), math.ceil(self.hi) + 1)
        span = self.hi - self.lo
        stride = max(1, math.ceil(span / max(self.length_px / 60.0, 1.0)))
        ticks: list[tuple[float, str]] = []
        for d in decades:
            multipliers = (1, 2, 5) if span < 2.5 else (1,)
            for m in multipliers:
                value = math.log10(m) + d
                if self.lo - 1e-9 <= value <= self.hi + 1e-9 and (m != 1 or d % stride == 0):
                    number = m * 10.0**d
                    ticks.append((value, format_number(number, number)))
        return ticks
