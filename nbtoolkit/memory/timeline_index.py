"""Level of detail for a memory timeline: allocated bytes per category, one column per pixel.

A :class:`~nbtoolkit.memory.timeline.MemoryTimeline` is a step function (bytes change at each
event). For a window ``[t0, t1]`` drawn ``width`` pixels wide, :meth:`MemoryIndex.view`
returns per pixel the highest and lowest total the pixel covers and the bytes of each
category at the instant of that highest total, so a stacked area drawn from it shows every
peak exactly (no decimation can hide a spike shorter than a pixel), and the lowest total
shows how deep the memory falls back inside the pixel.

Algorithm: once, the running total (int64) and the running bytes per category (float32: a
display value; the int64 running sum is cast, so no float error accumulates) after every
event, with a zero state before the first. Per request, the pixel edges are located with
``np.searchsorted``; the states a pixel covers are contiguous (from the state at its left
edge to the state at its right edge), so the max, min and the first index of the max are
``np.maximum/minimum.reduceat`` over them. The cost is linear in the events of the window
(a few ms per million); the build is linear in all of them.

Times are stored as µs from the first event (:attr:`MemoryIndex.origin`), never as epoch
floats, so windows down to 1 ns keep distinct edges whatever the timeline's clock (see
:mod:`nbtoolkit.trace.timeline_index`); windows passed to :meth:`MemoryIndex.view` and
:meth:`MemoryIndex.state_at` are relative too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from nbtoolkit.memory.schema import CATEGORIES
from nbtoolkit.timeline.lod import check_window

if TYPE_CHECKING:
    from nbtoolkit.memory.timeline import MemoryTimeline

__all__ = ["MemoryIndex", "MemoryView", "memory_index"]


@dataclass
class MemoryView:
    """One window: per pixel, the max and min total and the categories at the max (bytes)."""

    max_total: np.ndarray  # int64, one per pixel
    min_total: np.ndarray  # int64
    at_max: np.ndarray  # float32 (width, len(categories))
    max_time: np.ndarray  # float64 µs from the origin: the state holding the max (the window start if before)


@dataclass
class MemoryIndex:
    times: np.ndarray  # float64 µs from the origin, per event (nondecreasing)
    total: np.ndarray  # int64, state after event i at i + 1; state 0 = nothing allocated
    by_category: np.ndarray  # float32 (n + 1, len(categories))
    categories: tuple[str, ...]
    timeline: MemoryTimeline
    origin: float = 0.0  # the timeline's time_us of its first event: time 0 here
    events: pd.DataFrame | None = None  # the timeline's events in index order (state i + 1 = after row i)
    untimed: int = 0  # events without a finite time (a damaged saved timeline): in no state

    @property
    def start(self) -> float:
        return float(self.times[0]) if len(self.times) else 0.0

    @property
    def end(self) -> float:
        return float(self.times[-1]) if len(self.times) else 1.0

    def state_at(self, time_us: float) -> int:
        """Index of the state in force at ``time_us`` (µs from the origin): after every event up to it."""
        return int(np.searchsorted(self.times, time_us, side="right"))

    def view(self, t0: float, t1: float, width: int) -> MemoryView:
        check_window(t0, t1, width)
        edges = np.linspace(t0, t1, width + 1)
        at_edge = np.searchsorted(self.times, edges, side="right")
        lo, hi = int(at_edge[0]), int(at_edge[-1])
        # States of the window [lo, hi]; pixel k covers states at_edge[k] .. at_edge[k+1].
        states = self.total[lo : hi + 1]
        firsts = at_edge[:-1] - lo
        max_open = np.maximum.reduceat(states, firsts)  # over [first_k, first_{k+1}) (last: to the end)
        min_open = np.minimum.reduceat(states, firsts)
        right = states[at_edge[1:] - lo]  # the state at each pixel's right edge belongs to it too
        max_total = np.maximum(max_open, right)
        min_total = np.minimum(min_open, right)
        sizes = np.diff(np.r_[firsts, len(states)])
        position = np.where(states == np.repeat(max_open, sizes), np.arange(len(states)), len(states))
        # An empty group (two edges on the same state) has that one state as its max.
        first_max = np.where(sizes == 0, firsts, np.minimum.reduceat(position, firsts))
        at = np.where(right > max_open, at_edge[1:] - lo, first_max) + lo
        state_time = np.r_[self.times[:1] if len(self.times) else [t0], self.times]
        return MemoryView(
            max_total=max_total,
            min_total=min_total,
            at_max=self.by_category[at],
            max_time=np.maximum(state_time[at], t0),
        )


def memory_index(timeline: MemoryTimeline) -> MemoryIndex:
    """Index ``timeline`` for level-of-detail views (see the module docstring)."""
    events = timeline.events
    times = events["time_us"].to_numpy(np.float64)
    finite = np.isfinite(times)
    untimed = int((~finite).sum())
    if untimed:  # a damaged saved timeline: events without a time have no place on it
        events, times = events[finite], times[finite]
    if len(times) > 1 and (np.diff(times) < 0).any():  # keep the event order of equal times
        order = np.argsort(times, kind="stable")
        events = events.iloc[order]
        times = times[order]
    origin = float(times[0]) if len(times) else 0.0
    times = times - origin
    delta = events["delta_bytes"].to_numpy(np.int64)
    # Category codes, not strings: comparing 1M object strings per category costs seconds.
    codes, names = pd.factorize(events["category"].astype("category").cat.codes.to_numpy())
    labels = [str(c) for c in events["category"].astype("category").cat.categories]
    present = {labels[c] if c >= 0 else "unknown": j for j, c in enumerate(names.tolist())}
    known = [c for c in CATEGORIES if c in present]
    categories = tuple(known + sorted(set(present) - set(known))) or ("unknown",)
    by_category = np.zeros((len(delta) + 1, len(categories)), np.float32)
    for j, name in enumerate(categories):
        if name in present:
            by_category[1:, j] = np.cumsum(np.where(codes == present[name], delta, 0))
    total = np.r_[np.int64(0), np.cumsum(delta)]
    return MemoryIndex(
        times=times, total=total, by_category=by_category, categories=categories, timeline=timeline,
        origin=origin, events=events.reset_index(drop=True), untimed=untimed,
    )
