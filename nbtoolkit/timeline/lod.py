"""Level of detail for timelines of millions of events: what one screen of lanes needs.

A lane is one row of a timeline (a rank's GPU stream, a host thread). Given a window
``[t0, t1]`` (µs) and its width in pixels, :meth:`LaneIndex.view` returns at most a few
rectangles per pixel, however many events the window holds:

- **exact** events: those at least ``min_px`` pixels long (default one pixel), start and
  duration exact, each with its row in the source frame (so a click can name the event);
  at most ``max_exact_per_px`` per pixel (the longest ones are kept);
- **aggregate** bins, one per pixel that holds events: ``count`` (events starting in that
  pixel, long ones included), ``busy`` (the sum of their durations over the pixel's width,
  may exceed 1 where events overlap or nest), and ``longest``: the row of the longest of
  them (its name is the bin's name; a click selects it).

Algorithm (written out because the numbers depend on it):

1. Once per lane (:func:`build_lane`): sort events by start. Build a pyramid of coarser
   *levels*: level k groups consecutive events into uniform time bins of width
   ``span / (n / 8**k)``, keeping per bin the first start, the summed duration, the count
   and the longest event (duration and row). Also split the events into duration classes
   (powers of two of µs), each kept sorted by start with its largest duration.
2. Per request: pick the coarsest level whose bin width is at most half a pixel (level 0,
   the events themselves, when none is); the items of that level whose start falls in the
   window are found with ``np.searchsorted`` and reduced per pixel with ``np.add.reduceat``
   (items are sorted by start, so each pixel's items are contiguous). Work is bounded by
   about 16 items per pixel, not by the number of events.
3. Exact events come from the duration classes at least one pixel long: per class, the
   events starting in ``[t0 - max duration of the class, t1]`` (so an event that began
   before the window and reaches into it is kept), filtered to those that overlap the window.

So a zoom round trip costs O(pixels + exact events shown) after an O(n log n) build.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["MIN_WINDOW_US", "LaneIndex", "LaneView", "build_lane", "check_window", "widen_window"]

MIN_WINDOW_US = 1e-3  # the narrowest window a widget shows: 1 ns (traces resolve ns at best)

_FANOUT = 8  # events per bin from one level to the next
_MIN_LEVEL_ITEMS = 2048  # no coarser level once a level has this few bins


@dataclass
class _Level:
    """Consecutive events grouped by start time: one row per non-empty bin."""

    starts: np.ndarray  # float64, first start in the bin
    busy: np.ndarray  # float64, summed durations (µs)
    count: np.ndarray  # int64
    longest_dur: np.ndarray  # float64
    longest_row: np.ndarray  # int64, row in the source frame
    bin_width: float


@dataclass
class LaneView:
    """What one lane shows in one window; arrays are aligned per kind (exact / aggregate)."""

    exact_start: np.ndarray  # float64 µs
    exact_dur: np.ndarray  # float64 µs
    exact_row: np.ndarray  # int64, row in the source frame
    agg_px: np.ndarray  # int64 pixel index in [0, width)
    agg_count: np.ndarray  # int64
    agg_busy: np.ndarray  # float64 fraction of the pixel's width (summed durations)
    agg_row: np.ndarray  # int64, row of the longest event starting in the pixel

    @property
    def rectangles(self) -> int:
        return len(self.exact_start) + len(self.agg_px)


@dataclass
class LaneIndex:
    """One lane's events, sorted, with its pyramid and duration classes (see the module docstring)."""

    starts: np.ndarray
    durs: np.ndarray
    rows: np.ndarray
    levels: list[_Level] = field(default_factory=list)
    # duration classes: (lower bound µs, max duration, indices into the sorted arrays, their starts)
    classes: list[tuple[float, float, np.ndarray, np.ndarray]] = field(default_factory=list)
    max_dur: float = 0.0
    finished: bool = False  # levels and classes built (see finish)
    _level0: _Level | None = field(default=None, repr=False)

    def finish(self) -> LaneIndex:
        """Build the pyramid and the duration classes (views before this scan the window directly).

        Safe to run in a background thread while views are served: each attribute is assigned
        once, whole, and a view reads each once.
        """
        if not self.finished:
            self.levels = _build_levels(self)
            self.classes = _build_classes(self)
            self.finished = True
        return self

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def start(self) -> float:
        return float(self.starts[0]) if len(self.starts) else 0.0

    @property
    def end(self) -> float:
        return float((self.starts + self.durs).max()) if len(self.starts) else 0.0

    def view(
        self, t0: float, t1: float, width: int, *, min_px: float = 1.0, max_exact_per_px: int = 4
    ) -> LaneView:
        """The rectangles of ``[t0, t1]`` drawn ``width`` pixels wide (see the module docstring)."""
        check_window(t0, t1, width)
        px = (t1 - t0) / width
        agg = self._aggregate(t0, t1, width, px)
        exact = self._exact(t0, t1, px * min_px, max_exact_per_px * width)
        return LaneView(
            exact_start=self.starts[exact],
            exact_dur=self.durs[exact],
            exact_row=self.rows[exact],
            agg_px=agg[0],
            agg_count=agg[1],
            agg_busy=agg[2] / px,
            agg_row=agg[3],
        )

    def _aggregate(
        self, t0: float, t1: float, width: int, px: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        level = self._events_level()
        for candidate in self.levels:  # finest first; the coarsest fine enough wins
            if candidate.bin_width <= px / 2:
                level = candidate
        lo, hi = np.searchsorted(level.starts, [t0, t1], side="left")
        starts = level.starts[lo:hi]
        if not len(starts):
            empty_i, empty_f = np.zeros(0, np.int64), np.zeros(0, np.float64)
            return empty_i, empty_i, empty_f, empty_i
        pixel = np.minimum(((starts - t0) / px).astype(np.int64), width - 1)
        firsts = np.flatnonzero(np.r_[True, pixel[1:] != pixel[:-1]])
        count = np.add.reduceat(level.count[lo:hi], firsts)
        busy = np.add.reduceat(level.busy[lo:hi], firsts)
        row = _longest_rows(level.longest_dur[lo:hi], level.longest_row[lo:hi], firsts)
        return pixel[firsts], count, busy, row

    def _events_level(self) -> _Level:
        """The events themselves as level 0 (one item per event), made once."""
        if self._level0 is None:
            ones = np.ones(len(self.starts), np.int64)
            self._level0 = _Level(self.starts, self.durs, ones, self.durs, self.rows, 0.0)
        return self._level0

    def _exact(self, t0: float, t1: float, min_dur: float, cap: int) -> np.ndarray:
        picked = []
        finished = self.finished  # read once: a background finish() may complete meanwhile
        if not finished:  # no classes yet: scan the events that may reach into the window
            lo, hi = np.searchsorted(self.starts, [t0 - self.max_dur, t1], side="left")
            candidates = lo + np.flatnonzero(self.durs[lo:hi] >= min_dur)
            picked.append(candidates[self.starts[candidates] + self.durs[candidates] > t0])
        for lower, max_dur, indices, class_starts in self.classes if finished else []:
            if max_dur < min_dur:
                continue
            lo, hi = np.searchsorted(class_starts, [t0 - max_dur, t1], side="left")
            candidates = indices[lo:hi]
            if lower < min_dur:  # the class straddles the threshold: filter it
                candidates = candidates[self.durs[candidates] >= min_dur]
            ends = self.starts[candidates] + self.durs[candidates]
            picked.append(candidates[ends > t0])
        if not picked:
            return np.zeros(0, np.int64)
        chosen = np.concatenate(picked)
        if len(chosen) > cap:  # keep the longest: they carry the picture
            chosen = chosen[np.argsort(-self.durs[chosen], kind="stable")[:cap]]
        return np.sort(chosen)


def check_window(t0: float, t1: float, width: int) -> None:
    """A clear error for a window a caller (or a front end) got wrong."""
    if not (np.isfinite(t0) and np.isfinite(t1)) or t1 <= t0:
        raise NbtUsageError(f"timeline window must satisfy t0 < t1 (finite µs); got t0={t0}, t1={t1}")
    if not 1 <= width <= 20_000:
        raise NbtUsageError(f"timeline width must be 1..20000 pixels; got {width}")


def widen_window(t0: float, t1: float, *, minimum: float = MIN_WINDOW_US) -> tuple[float, float]:
    """``[t0, t1]`` (µs from an origin) widened about its centre to at least ``minimum`` µs.

    A front end zooming in ends at the narrowest window; rounding may hand over one a hair
    narrower, or ``t0 == t1``: that is clamped, not an error. Reversed or non-finite windows
    are still errors (:func:`check_window`).
    """
    if np.isfinite(t0) and np.isfinite(t1) and t0 <= t1 < t0 + minimum:
        centre = t0 / 2 + t1 / 2
        t0, t1 = centre - minimum / 2, centre + minimum / 2
    return float(t0), float(t1)


def build_lane(
    starts: np.ndarray, durs: np.ndarray, rows: np.ndarray | None = None, *, finish: bool = True
) -> LaneIndex:
    """Index one lane's events (``starts``, ``durs`` in µs; ``rows`` in the source frame, default 0..n-1).

    With ``finish=False`` only the sorted arrays are made (views work, scanning the window);
    :meth:`LaneIndex.finish` builds the rest later, e.g. in a background thread.
    """
    starts = np.asarray(starts, dtype=np.float64)
    durs = np.maximum(np.nan_to_num(np.asarray(durs, dtype=np.float64)), 0.0)
    rows = np.arange(len(starts), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if not (len(starts) == len(durs) == len(rows)):
        raise NbtUsageError(
            f"a lane needs as many durations and rows as starts; got {len(starts)}, {len(durs)}, {len(rows)}"
        )
    if len(starts) > 1 and not (starts[1:] >= starts[:-1]).all():  # trace frames come sorted already
        order = np.argsort(starts, kind="stable")
        starts, durs, rows = starts[order], durs[order], rows[order]
    lane = LaneIndex(starts=starts, durs=durs, rows=rows, max_dur=float(durs.max()) if len(durs) else 0.0)
    return lane.finish() if finish else lane


def _build_levels(lane: LaneIndex) -> list[_Level]:
    levels: list[_Level] = []
    n = len(lane.starts)
    if n < 2 * _MIN_LEVEL_ITEMS:
        return levels
    span = max(lane.end - lane.start, 1e-9)
    below = _Level(lane.starts, lane.durs, np.ones(n, np.int64), lane.durs, lane.rows, 0.0)
    bins = n // _FANOUT
    while bins >= _MIN_LEVEL_ITEMS:
        width = span / bins
        key = ((below.starts - lane.start) / width).astype(np.int64)
        firsts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        below = _Level(
            starts=below.starts[firsts],
            busy=np.add.reduceat(below.busy, firsts),
            count=np.diff(np.r_[firsts, len(key)]) if not levels else np.add.reduceat(below.count, firsts),
            longest_dur=np.maximum.reduceat(below.longest_dur, firsts),
            longest_row=_longest_rows(below.longest_dur, below.longest_row, firsts),
            bin_width=width,
        )
        levels.append(below)
        bins //= _FANOUT
    return levels


def _build_classes(lane: LaneIndex) -> list[tuple[float, float, np.ndarray, np.ndarray]]:
    """Events split by duration into power-of-two classes of µs, each sorted by start."""
    if not len(lane.durs):
        return []
    # frexp's exponent is floor(log2(d)) + 1, without a log; int8 makes the stable sort a radix sort.
    exponent = np.frexp(np.maximum(lane.durs, 2.0**-20))[1].clip(-100, 100).astype(np.int8)
    order = np.argsort(exponent, kind="stable")  # within a class: start order (the lane's)
    values, firsts = np.unique(exponent[order], return_index=True)
    classes = []
    for e, indices in zip(values.tolist(), np.split(order, firsts[1:]), strict=True):
        classes.append((2.0 ** (e - 1), float(lane.durs[indices].max()), indices, lane.starts[indices]))
    return classes


def _longest_rows(durs: np.ndarray, rows: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """Per contiguous group (starting at ``firsts``): the row of its longest item (the first on ties)."""
    group_max = np.maximum.reduceat(durs, firsts)
    sizes = np.diff(np.r_[firsts, len(durs)])
    at_max = np.flatnonzero(durs == np.repeat(group_max, sizes))  # about one per group
    group = np.searchsorted(firsts, at_max, side="right") - 1
    first_in_group = np.r_[True, group[1:] != group[:-1]]
    return rows[at_max[first_in_group]]
