"""Level of detail for timelines (analysis.timeline_lod*): checked against brute force on random lanes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.memory.timeline import MemoryTimeline
from nbtoolkit.memory.timeline_index import memory_index
from nbtoolkit.timeline.lod import build_lane

from .timeline_data import synthetic_memory_events


def _lane(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    starts = rng.uniform(0, n * 2.0, n)  # unsorted on purpose: build_lane sorts
    durs = rng.exponential(1.0, n)
    durs[::97] *= 300
    return starts, durs


@pytest.mark.parametrize(("t0_frac", "t1_frac", "width"), [(0, 1, 300), (0.3, 0.31, 500), (0.5, 0.5001, 50)])
def test_small_lane_view_matches_brute_force(t0_frac: float, t1_frac: float, width: int) -> None:
    starts, durs = _lane(3000)  # below the pyramid's threshold: every bin is exact
    lane = build_lane(starts, durs)
    t0, t1 = lane.start + t0_frac * (lane.end - lane.start), lane.start + t1_frac * (lane.end - lane.start)
    view = lane.view(t0, t1, width)
    px = (t1 - t0) / width
    inside = (starts >= t0) & (starts < t1)
    pixel = np.minimum(((starts[inside] - t0) / px).astype(int), width - 1)
    counts = np.bincount(pixel, minlength=width)
    assert np.array_equal(np.flatnonzero(counts), view.agg_px)
    assert np.array_equal(counts[view.agg_px], view.agg_count)
    busy = np.bincount(pixel, weights=durs[inside], minlength=width) / px
    assert np.allclose(busy[view.agg_px], view.agg_busy)
    # the bin's row is its longest event
    for px_i, row in zip(view.agg_px[:50], view.agg_row[:50], strict=False):
        in_px = np.flatnonzero(inside)[pixel == px_i]
        assert durs[row] == durs[in_px].max()
    # exact: every event at least a pixel long that overlaps the window, and nothing else
    exact = np.flatnonzero((durs >= px) & (starts < t1) & (starts + durs > t0))
    assert sorted(view.exact_row.tolist()) == sorted(exact.tolist())


def test_big_lane_keeps_counts_and_bounds_rectangles() -> None:
    starts, durs = _lane(400_000, seed=1)
    lane = build_lane(starts, durs)
    assert len(lane.levels) >= 2  # the pyramid exists at this size
    view = lane.view(lane.start, lane.end + 1, 1000)
    assert view.agg_count.sum() == len(starts)  # every event counted once at full zoom-out
    assert len(view.agg_px) <= 1000
    assert view.rectangles <= 5 * 1000
    # zoomed in, a window's total count is exact up to the two boundary bins of the chosen level
    t0, t1 = np.quantile(starts, [0.4, 0.6])
    view = lane.view(t0, t1, 1000)
    truth = int(((starts >= t0) & (starts < t1)).sum())
    assert abs(int(view.agg_count.sum()) - truth) <= 2 * 8 * 64
    # an event that starts before the window and reaches into it is exact
    long_row = int(np.argmax(durs))
    a = starts[long_row] + durs[long_row] / 2
    view = lane.view(a, a + 1.0, 100)
    assert long_row in view.exact_row.tolist()


def test_an_unfinished_lane_answers_the_same_by_scanning() -> None:
    """Before its background finish, a lane scans the window: same exact events, same counts."""
    starts, durs = _lane(200_000, seed=4)
    finished = build_lane(starts, durs)
    scanning = build_lane(starts, durs, finish=False)
    assert not scanning.finished and scanning.levels == []
    for t0, t1 in [(finished.start, finished.end), tuple(np.quantile(starts, [0.3, 0.35]))]:
        a, b = finished.view(t0, t1, 700), scanning.view(t0, t1, 700)
        assert np.array_equal(a.exact_row, b.exact_row)
        assert abs(int(a.agg_count.sum()) - int(b.agg_count.sum())) <= 2 * 8 * 64  # boundary bins
    assert scanning.finish() is scanning and scanning.finished and len(scanning.levels) >= 2


def test_exact_events_capped_to_the_longest() -> None:
    starts = np.arange(10_000, dtype=float)
    durs = np.full(10_000, 5.0)
    durs[1234] = 50.0
    view = build_lane(starts, durs).view(0, 10_000, 100, max_exact_per_px=1)  # a pixel is 100 µs
    assert view.exact_row.size == 0  # nothing is a pixel long
    view = build_lane(starts, durs).view(0, 10_000, 5000, max_exact_per_px=1)  # 2 µs pixels: all are
    assert view.exact_row.size == 5000 and 1234 in view.exact_row.tolist()


def test_bad_windows_are_usage_errors() -> None:
    lane = build_lane(np.arange(10.0), np.ones(10))
    with pytest.raises(NbtUsageError, match="t0 < t1"):
        lane.view(5, 5, 100)
    with pytest.raises(NbtUsageError, match="width"):
        lane.view(0, 5, 0)
    with pytest.raises(NbtUsageError, match="as many"):
        build_lane(np.arange(3.0), np.ones(2))


def test_memory_view_keeps_every_peak() -> None:
    events = synthetic_memory_events(20_000, seed=3)
    timeline = MemoryTimeline(events=events)
    index = memory_index(timeline)
    total = np.cumsum(events["delta_bytes"].to_numpy())
    assert index.total[1:].tolist() == total.tolist()
    view = index.view(index.start, index.end, 300)
    assert int(view.max_total.max()) == int(total.max()) == timeline.peak_bytes
    # stacked categories at the max add up to the max total (float32, so within a byte per MiB)
    assert np.allclose(view.at_max.sum(axis=1), view.max_total, rtol=1e-5)
    assert (view.min_total <= view.max_total).all()
    # brute force on one zoomed window: per pixel the max of the states it covers
    t0, t1 = np.quantile(events["time_us"], [0.2, 0.21])
    view = index.view(t0 - index.origin, t1 - index.origin, 40)  # windows are µs from the first event
    edges = np.linspace(t0, t1, 41)
    times = events["time_us"].to_numpy()
    for k in range(40):
        first = np.searchsorted(times, edges[k], side="right")
        last = np.searchsorted(times, edges[k + 1], side="right")
        states = np.r_[0, total][first : last + 1]
        assert view.max_total[k] == states.max() and view.min_total[k] == states.min()


def test_zoom_round_trip_on_ten_million_events_is_fast() -> None:
    """Issue 20's target: a view of a 10M-event lane in <= 50 ms (kernel side), build aside."""
    n = 10_000_000
    rng = np.random.default_rng(0)
    starts = np.cumsum(rng.exponential(1.0, n))
    lane = build_lane(starts, rng.exponential(0.6, n))
    timings = []
    for frac in (1.0, 0.1, 0.001, 1e-5):
        t1 = lane.start + (lane.end - lane.start) * frac
        runs = []
        for _ in range(3):  # best of 3: the machine is shared, the claim is about the work
            began = time.perf_counter()
            view = lane.view(lane.start, t1, 1500)
            runs.append(time.perf_counter() - began)
        timings.append(min(runs))
        assert len(view.agg_px) <= 1500
    assert max(timings) < 0.05, f"views took {[round(t * 1e3, 1) for t in timings]} ms"


def test_windows_narrower_than_a_nanosecond_widen_about_their_centre() -> None:
    from nbtoolkit.timeline.lod import MIN_WINDOW_US, check_window, widen_window

    assert widen_window(10.0, 10.0) == pytest.approx((10.0 - 5e-4, 10.0 + 5e-4))
    assert widen_window(10.0, 10.0002) == pytest.approx((10.0001 - 5e-4, 10.0001 + 5e-4))
    assert widen_window(1.0, 2.0) == (1.0, 2.0)  # wide enough: unchanged
    assert widen_window(2.0, 1.0) == (2.0, 1.0)  # reversed and non-finite: left for check_window
    assert np.isnan(widen_window(float("nan"), 1.0)[0])
    t0, t1 = widen_window(20_850.0, 20_850.0)  # relative µs: a 1 ns window stays 1 ns
    check_window(t0, t1, 1200)
    assert t1 - t0 == pytest.approx(MIN_WINDOW_US, rel=1e-6)
    lane = build_lane(np.array([20_849.9995, 20_850.0004]), np.array([0.0002, 0.0]))
    view = lane.view(t0, t1, 1000)  # pixels of 1 ps: both events, each in its own pixel
    assert sorted(view.agg_px.tolist()) == [0, 900]
    # An epoch origin added back collapses the same window: why the indexes store offsets.
    origin = 1_694_128_201_421_221.0
    with pytest.raises(NbtUsageError, match="t0 < t1"):
        check_window(t0 + origin, t1 + origin, 1200)
