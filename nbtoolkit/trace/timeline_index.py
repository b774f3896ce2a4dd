"""A Trace as timeline lanes with level of detail: one :class:`LaneIndex` per rank and stream or thread.

Lanes, in order: per rank (ascending), its GPU/accelerator streams (ascending), then its host
threads (by pid, tid). ProfilerStep annotations are left out of the host lanes (they cover
the whole step and would hide everything; the widget shows steps as bands instead).

Each event gets a *kind* for its colour: for device events HTA's kernel type
(:mod:`nbtoolkit.trace._kernels`: compute, communication, memory, other), for host events
``host``, or ``communication`` for collectives (the prefixes of
:data:`nbtoolkit.trace.overlap.COMM_PREFIXES`).

**Times are offsets from the origin.** Kineto writes epoch µs (1.69e15 for a 2023 run), where a
float64 resolves only 0.25 µs: a window narrower than that collapses to ``t0 == t1`` once the
origin is added back. So every lane's starts are stored as ``ts - origin`` (the subtraction of
two nearby doubles is exact), windows come in and go out relative to the origin, and the epoch
is added back only to name an event (:meth:`TraceTimelineIndex.event`). Relative to an origin,
float64 keeps 1 ns windows exact for traces up to about 100 days long.

**Rank summaries.** :meth:`TraceTimelineIndex.rank_view` merges the views of a rank's lanes
into one (the widget's lane for a folded rank): exact events of every lane, and per pixel the
summed counts and busy fractions with the longest event's row. Nothing is indexed twice.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.profiler_steps import PROFILER_STEP_PREFIX
from nbtoolkit.timeline.lod import LaneIndex, LaneView, _longest_rows, build_lane, check_window

if TYPE_CHECKING:
    from nbtoolkit.trace.trace import Trace

__all__ = ["KINDS", "TraceLane", "TraceTimelineIndex", "trace_timeline_index"]

KINDS: tuple[str, ...] = ("compute", "communication", "memory", "other", "host")
_STEP_KEY = np.iinfo(np.int64).min  # the lane key of host ProfilerStep rows (not shown)
_UNTIMED_KEY = _STEP_KEY + 1  # the lane key of rows without a finite start (not shown)


@dataclass
class TraceLane:
    """One lane: its label, where its events come from, and their index."""

    label: str
    rank: int
    stream: int  # -1 for a host thread
    tid: int  # the thread of a host lane, the Kineto tid of a device lane
    index: LaneIndex  # starts are µs from the timeline's origin


@dataclass
class TraceTimelineIndex:
    """Every lane of a trace, built once; :meth:`event` names a row for hover and selection."""

    trace: Trace
    lanes: list[TraceLane]
    origin: float  # epoch µs of the earliest event: time 0 of every lane and window
    duration: float  # µs from the origin to the end of the last event
    kinds: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> KINDS code per row
    codes: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> name category code per row
    categories: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> name categories (str)
    # (rank, step, start, end), µs from the origin, every rank shown
    steps: list[tuple[int, int, float, float]] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # ranks shown, in lane order
    step_rows: int = 0  # host ProfilerStep annotations: drawn as step bands, not as lane events
    untimed_rows: int = 0  # events without a finite start time: in no lane
    durs: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> dur (µs) per row
    ready: threading.Event = field(default_factory=threading.Event)  # every lane finished

    @property
    def events(self) -> int:
        """Events in the lanes (ProfilerStep annotations and untimed events excluded)."""
        return sum(len(lane.index) for lane in self.lanes)

    @property
    def trace_events(self) -> int:
        """Every event of the ranks shown, as the trace counts them (its summary's number)."""
        return self.events + self.step_rows + self.untimed_rows

    def lanes_of(self, rank: int) -> list[int]:
        """Lane numbers of one rank, in order."""
        return [i for i, lane in enumerate(self.lanes) if lane.rank == rank]

    def lane_of_row(self, rank: int, row: int) -> int:
        """The lane number holding ``row`` of ``rank`` (a click on a rank's summary lane)."""
        for i in self.lanes_of(rank):
            if (self.lanes[i].index.rows == row).any():
                return i
        raise NbtUsageError(f"rank {rank} has no event row {row} in its lanes")

    def rank_view(
        self, rank: int, t0: float, t1: float, width: int, *, max_exact_per_px: int = 4
    ) -> LaneView:
        """One lane for all of ``rank``'s lanes (see the module docstring); rows are the rank's."""
        check_window(t0, t1, width)
        views = [self.lanes[i].index.view(t0, t1, width) for i in self.lanes_of(rank)]
        if not views:
            return _empty_view()
        durs = self.durs[rank]
        exact = np.concatenate([v.exact_row for v in views])
        starts = np.concatenate([v.exact_start for v in views])
        lengths = np.concatenate([v.exact_dur for v in views])
        cap = max_exact_per_px * width
        keep = np.argsort(-lengths, kind="stable")[:cap]  # longest first: drawn first, short ones on top
        px = np.concatenate([v.agg_px for v in views])
        count = np.concatenate([v.agg_count for v in views])
        busy = np.concatenate([v.agg_busy for v in views])
        rows = np.concatenate([v.agg_row for v in views])
        order = np.argsort(px, kind="stable")
        px, count, busy, rows = px[order], count[order], busy[order], rows[order]
        if len(px):
            firsts = np.flatnonzero(np.r_[True, px[1:] != px[:-1]])
            longest = _longest_rows(np.nan_to_num(durs[rows]), rows, firsts)
            px, count, busy = px[firsts], np.add.reduceat(count, firsts), np.add.reduceat(busy, firsts)
            rows = longest
        return LaneView(
            exact_start=starts[keep],
            exact_dur=lengths[keep],
            exact_row=exact[keep],
            agg_px=px,
            agg_count=count,
            agg_busy=busy,
            agg_row=rows,
        )

    def name(self, rank: int, rows: np.ndarray) -> np.ndarray:
        """Names of rows of one rank, as an array of str ("" for a missing name)."""
        return np.r_[self.categories[rank], [""]][self.codes[rank][rows]]

    def name_codes(self, rank: int, rows: np.ndarray) -> np.ndarray:
        """Category codes of the names of rows of one rank (-1 for missing names)."""
        return self.codes[rank][rows]

    def event(self, lane: int, row: int) -> dict[str, Any]:
        """One event as plain values: lane, rank, stream, name, category, ts/dur (µs), row."""
        if not 0 <= lane < len(self.lanes):
            raise NbtUsageError(f"no lane {lane}; the timeline has {len(self.lanes)} lanes")
        where = self.lanes[lane]
        frame = self.trace.events[where.rank]
        if not 0 <= row < len(frame):
            raise NbtUsageError(f"rank {where.rank} has no event row {row} (it has {len(frame)})")
        record = frame.iloc[row]
        return {
            "lane": where.label,
            "rank": where.rank,
            "stream": int(record["stream"]),
            "tid": int(record["tid"]),
            "name": str(record["name"]),
            "cat": str(record["cat"]),
            "ts_us": float(record["ts"]),  # epoch µs, as in the trace
            "start_us": float(record["ts"]) - self.origin,  # µs from the timeline's origin
            "dur_us": float(record["dur"]),
            "row": int(row),
        }

    def check(self, t0: float, t1: float, width: int) -> None:
        check_window(t0, t1, width)

    def finish(self) -> None:
        """Finish every lane's index (largest first: they gain most), then set :attr:`ready`."""
        for lane in sorted(self.lanes, key=lambda lane: -len(lane.index)):
            lane.index.finish()
        self.ready.set()


def _rank_kinds(trace: Trace, rank: int) -> np.ndarray:
    """KINDS code per row of one rank (see the module docstring)."""
    from nbtoolkit.trace import kernel_types as kt
    from nbtoolkit.trace.overlap import COMM_PREFIXES

    frame = trace.events[rank]
    names = frame["name"]
    categories = [str(c) for c in names.cat.categories]
    device_kind = {kt.COMPUTATION: 0, kt.COMMUNICATION: 1, kt.MEMORY: 2, kt.OTHER: 3}
    as_device = np.array([device_kind[kt.kernel_type(c)] for c in categories] + [3], dtype=np.int8)
    as_host = np.array([1 if c.startswith(COMM_PREFIXES) else 4 for c in categories] + [4], dtype=np.int8)
    codes = names.cat.codes.to_numpy()
    on_device = frame["stream"].to_numpy() >= 0
    return np.where(on_device, as_device[codes], as_host[codes])


def _empty_view() -> LaneView:
    i, f = np.zeros(0, np.int64), np.zeros(0, np.float64)
    return LaneView(exact_start=f, exact_dur=f, exact_row=i, agg_px=i, agg_count=i, agg_busy=f, agg_row=i)


def trace_timeline_index(
    trace: Trace, *, ranks: list[int] | None = None, background: bool = False
) -> TraceTimelineIndex:
    """Lanes of ``trace`` (all ranks, or ``ranks``), each indexed for level-of-detail views.

    With ``background`` the lanes' pyramids and duration classes are built in a daemon thread
    (``index.ready`` is set when done): the first views come at once, scanning their window
    (linear in its events), and later ones are O(pixels). A 10M-event trace paints in well
    under its full build time this way.
    """
    chosen = trace.ranks if ranks is None else list(dict.fromkeys(ranks))
    if not chosen:
        raise NbtUsageError(f"ranks={ranks!r} selects no rank to draw; ranks present: {trace.ranks}")
    missing = [r for r in chosen if r not in trace.events]
    if missing:
        raise NbtUsageError(f"ranks {missing} are not in this trace; ranks present: {trace.ranks}")
    kinds: dict[int, np.ndarray] = {}
    codes: dict[int, np.ndarray] = {}
    categories: dict[int, np.ndarray] = {}
    durs: dict[int, np.ndarray] = {}
    # Pass 1, per rank: the lane of every row, and the earliest start (the origin).
    grouped: list[tuple[int, np.ndarray, np.ndarray, list[tuple[int, np.ndarray]]]] = []
    step_rows = untimed_rows = 0
    origin = np.inf
    for rank in chosen:
        frame = trace.events[rank]
        kinds[rank] = _rank_kinds(trace, rank)
        codes[rank] = frame["name"].cat.codes.to_numpy()
        categories[rank] = np.array([str(c) for c in frame["name"].cat.categories], dtype=object)
        ts, dur = frame["ts"].to_numpy(np.float64), frame["dur"].to_numpy(np.float64)
        # NaN/inf durations (a hand-edited or damaged saved result) draw as instants, not as an
        # end at 1e308 µs that would stretch the timeline; untimed events go in no lane.
        dur = np.where(np.isfinite(dur), np.maximum(dur, 0.0), 0.0)
        durs[rank] = dur
        stream, tid, pid = (frame[c].to_numpy() for c in ("stream", "tid", "pid"))
        names = frame["name"]
        step_flags = np.array(
            [str(c).startswith(PROFILER_STEP_PREFIX) for c in names.cat.categories] + [False]
        )
        is_step = step_flags[codes[rank]]
        host = stream < 0
        # One int64 key per row: the stream for device rows, -1 - (pid, tid packed) for host rows,
        # and a key of its own for host ProfilerStep rows and untimed rows (left out). A hash
        # factorize plus a radix sort of the small lane codes keeps this linear (np.unique would
        # sort every row: 1.4 s on 2M events); no row subset is copied before the lanes' own arrays.
        key = np.where(host, -1 - ((pid & 0xFFFFFF) << 32 | (tid & 0xFFFFFFFF)), stream)
        key[host & is_step] = _STEP_KEY
        timed = np.isfinite(ts)
        key[~timed] = _UNTIMED_KEY
        step_rows += int((host & is_step & timed).sum())
        untimed_rows += int((~timed).sum())
        lane_of_row, uniques = pd.factorize(key, sort=False)
        order = np.argsort(lane_of_row.astype(np.int16 if len(uniques) < 2**15 else np.int64), kind="stable")
        groups = np.split(order, np.cumsum(np.bincount(lane_of_row, minlength=len(uniques)))[:-1])
        kept = [i for i in range(len(uniques)) if uniques[i] not in (_STEP_KEY, _UNTIMED_KEY)]
        device_first = sorted(kept, key=lambda i: (uniques[i] < 0, abs(int(uniques[i]))))
        lane_rows = [(int(uniques[i]), groups[i]) for i in device_first]
        for _, rows in lane_rows:
            if len(rows):
                origin = min(origin, float(ts[rows].min()))
        grouped.append((rank, ts, dur, lane_rows))
    origin = 0.0 if not np.isfinite(origin) else origin
    # Pass 2: the lanes, with starts as offsets from the origin.
    lanes: list[TraceLane] = []
    for rank, ts, dur, lane_rows in grouped:
        frame = trace.events[rank]
        tid, pid = frame["tid"].to_numpy(), frame["pid"].to_numpy()
        threads = trace.info[rank].thread_names
        for key_value, rows in lane_rows:
            lane_index = build_lane(ts[rows] - origin, dur[rows], rows, finish=False)
            if key_value >= 0:
                label = f"rank {rank} · stream {key_value}"
                lanes.append(TraceLane(label, rank, key_value, int(tid[rows[0]]), lane_index))
            else:
                p, t = int(pid[rows[0]]), int(tid[rows[0]])
                label = f"rank {rank} · {threads.get(f'{p}:{t}', f'thread {t}')}"
                lanes.append(TraceLane(label, rank, -1, t, lane_index))
    nonempty = [lane.index for lane in lanes if len(lane.index)]
    duration = max((ix.end for ix in nonempty), default=1.0)
    steps = trace.steps
    step_spans = []
    if len(steps):
        shown = steps[steps["rank"].isin(chosen)]
        for r in shown.itertuples(index=False):
            a, b = float(r.ts) - origin, float(r.ts) + float(r.dur) - origin
            if np.isfinite(a) and np.isfinite(b):
                step_spans.append((int(r.rank), int(r.step), a, b))
    index = TraceTimelineIndex(
        trace=trace,
        lanes=lanes,
        origin=origin,
        duration=max(duration, 1e-3),
        kinds=kinds,
        codes=codes,
        categories=categories,
        steps=step_spans,
        ranks=list(chosen),
        step_rows=step_rows,
        untimed_rows=untimed_rows,
        durs=durs,
    )
    if background:
        threading.Thread(target=index.finish, name="nbt-timeline-index", daemon=True).start()
    else:
        index.finish()
    return index
