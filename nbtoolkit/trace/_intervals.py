"""Interval arithmetic on numpy arrays shared by the trace analyses (no pandas needed).

Intervals are half-open ``[start, end)`` pairs of float64 arrays in µs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["intersection_length", "merge", "self_times", "subtract_length", "union_length"]


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge overlapping intervals into disjoint sorted ones.

    Same rule as HTA's ``merge_kernel_intervals``: sorted by start, an interval joins the
    current group unless it starts strictly after the running maximum end (touching
    intervals join).
    """
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.float64)[order]
    e = np.asarray(ends, dtype=np.float64)[order]
    running_end = np.maximum.accumulate(e)
    new_group = np.empty(len(s), dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > running_end[:-1]
    group_starts = np.flatnonzero(new_group)
    group_ends = np.r_[group_starts[1:], len(s)] - 1
    return s[group_starts], running_end[group_ends]


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    s, e = merge(starts, ends)
    return float((e - s).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two sets of *merged* (disjoint, sorted) intervals."""
    return float(_intersection_per_interval(a, b).sum())


def _intersection_per_interval(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """For each interval of ``a`` (merged), the length of it covered by ``b`` (merged)."""
    a_s, a_e = a
    b_s, b_e = b
    out = np.zeros(len(a_s))
    if len(a_s) == 0 or len(b_s) == 0:
        return out
    # Coverage of b as a cumulative function: covered(x) = length of b inside (-inf, x].
    cum = np.concatenate([[0.0], np.cumsum(b_e - b_s)])

    def covered(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(b_s, x, side="right")  # intervals of b starting at or before x
        full = cum[np.maximum(i - 1, 0)]  # all intervals before the (i-1)-th are complete
        last_s = b_s[np.maximum(i - 1, 0)]
        last_e = b_e[np.maximum(i - 1, 0)]
        partial = np.clip(x - last_s, 0.0, last_e - last_s)
        return np.where(i > 0, full + partial, 0.0)

    out = covered(a_e) - covered(a_s)
    return out


def covered_per_interval(
    starts: np.ndarray, ends: np.ndarray, other: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """For each (possibly overlapping) interval, the length of it covered by the merged set ``other``."""
    return _intersection_per_interval((np.asarray(starts, float), np.asarray(ends, float)), other)


def subtract_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of merged ``a`` not covered by merged ``b``."""
    return float((a[1] - a[0]).sum()) - intersection_length(a, b)


def self_times(host: pd.DataFrame) -> np.ndarray:
    """Self time (µs) of each host event: its duration minus that of its direct children.

    Children are the events on the same (pid, tid) that start inside the event, found with
    a stack over events sorted by start (longer first on ties). Returned in ``host`` order.
    """
    n = len(host)
    result = host["dur"].to_numpy(dtype=np.float64).copy()
    if n == 0:
        return result
    ts = host["ts"].to_numpy(dtype=np.float64)
    dur = result.copy()
    pid = host["pid"].to_numpy()
    tid = host["tid"].to_numpy()
    order = np.lexsort((-dur, ts, tid, pid))
    ends = ts + dur
    stack: list[int] = []
    lane: tuple[int, int] | None = None
    for i in order.tolist():
        key = (int(pid[i]), int(tid[i]))
        if key != lane:
            stack.clear()
            lane = key
        start = ts[i]
        while stack and ends[stack[-1]] <= start:
            stack.pop()
        if stack:
            result[stack[-1]] -= dur[i]
        stack.append(i)
    np.maximum(result, 0.0, out=result)
    return result
