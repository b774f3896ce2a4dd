"""A Trace as timeline lanes with level of detail: one :class:`LaneIndex` per rank and stream or thread.

Lanes, in order: per rank (ascending), its GPU/accelerator streams (ascending), then its host
threads (by pid, tid). ProfilerStep annotations are left out of the host lanes (they cover
the whole step and would hide everything; the widget shows steps as bands instead).

Each event gets a *kind* for its colour: for device events HTA's kernel type
(:mod:`nbtoolkit.analysis._kernels`: compute, communication, memory, other), for host events
``host``, or ``communication`` for collectives (the prefixes of
:data:`nbtoolkit.analysis.overlap.COMM_PREFIXES`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from nbtoolkit.analysis.timeline_lod import LaneIndex, build_lane, check_window
from nbtoolkit.errors import NbtUsageError
from nbtoolkit.model.steps import PROFILER_STEP_PREFIX

if TYPE_CHECKING:
    from nbtoolkit.model.trace import Trace

__all__ = ["KINDS", "TraceLane", "TraceTimelineIndex", "trace_timeline_index"]

KINDS: tuple[str, ...] = ("compute", "communication", "memory", "other", "host")
_STEP_KEY = np.iinfo(np.int64).min  # the lane key of host ProfilerStep rows (not shown)


@dataclass
class TraceLane:
    """One lane: its label, where its events come from, and their index."""

    label: str
    rank: int
    stream: int  # -1 for a host thread
    tid: int  # the thread of a host lane, the Kineto tid of a device lane
    index: LaneIndex


@dataclass
class TraceTimelineIndex:
    """Every lane of a trace, built once; :meth:`event` names a row for hover and selection."""

    trace: Trace
    lanes: list[TraceLane]
    origin: float  # µs of the earliest event: the widget's time 0
    end: float
    kinds: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> KINDS code per row
    codes: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> name category code per row
    categories: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> name categories (str)
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (step, ts, end), first rank
    ready: threading.Event = field(default_factory=threading.Event)  # every lane finished

    @property
    def events(self) -> int:
        return sum(len(lane.index) for lane in self.lanes)

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
            "ts_us": float(record["ts"]),
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
    from nbtoolkit.analysis import _kernels as k
    from nbtoolkit.analysis.overlap import COMM_PREFIXES

    frame = trace.events[rank]
    names = frame["name"]
    categories = [str(c) for c in names.cat.categories]
    device_kind = {k.COMPUTATION: 0, k.COMMUNICATION: 1, k.MEMORY: 2, k.OTHER: 3}
    as_device = np.array([device_kind[k.kernel_type(c)] for c in categories] + [3], dtype=np.int8)
    as_host = np.array([1 if c.startswith(COMM_PREFIXES) else 4 for c in categories] + [4], dtype=np.int8)
    codes = names.cat.codes.to_numpy()
    on_device = frame["stream"].to_numpy() >= 0
    return np.where(on_device, as_device[codes], as_host[codes])


def trace_timeline_index(
    trace: Trace, *, ranks: list[int] | None = None, background: bool = False
) -> TraceTimelineIndex:
    """Lanes of ``trace`` (all ranks, or ``ranks``), each indexed for level-of-detail views.

    With ``background`` the lanes' pyramids and duration classes are built in a daemon thread
    (``index.ready`` is set when done): the first views come at once, scanning their window
    (linear in its events), and later ones are O(pixels). A 10M-event trace paints in well
    under its full build time this way.
    """
    chosen = trace.ranks if ranks is None else list(ranks)
    missing = [r for r in chosen if r not in trace.events]
    if missing:
        raise NbtUsageError(f"ranks {missing} are not in this trace; ranks present: {trace.ranks}")
    lanes: list[TraceLane] = []
    kinds: dict[int, np.ndarray] = {}
    codes: dict[int, np.ndarray] = {}
    categories: dict[int, np.ndarray] = {}
    for rank in chosen:
        frame = trace.events[rank]
        kinds[rank] = _rank_kinds(trace, rank)
        codes[rank] = frame["name"].cat.codes.to_numpy()
        categories[rank] = np.array([str(c) for c in frame["name"].cat.categories], dtype=object)
        ts, dur = frame["ts"].to_numpy(np.float64), frame["dur"].to_numpy(np.float64)
        stream, tid, pid = (frame[c].to_numpy() for c in ("stream", "tid", "pid"))
        names = frame["name"]
        step_flags = np.array(
            [str(c).startswith(PROFILER_STEP_PREFIX) for c in names.cat.categories] + [False]
        )
        is_step = step_flags[codes[rank]]
        host = stream < 0
        # One int64 key per row: the stream for device rows, -1 - (pid, tid packed) for host rows,
        # and a key of its own for host ProfilerStep rows (left out). A hash factorize plus a radix
        # sort of the small lane codes keeps this linear (np.unique would sort every row: 1.4 s on
        # 2M events); no row subset is copied before the lanes' own arrays.
        key = np.where(host, -1 - ((pid & 0xFFFFFF) << 32 | (tid & 0xFFFFFFFF)), stream)
        key[host & is_step] = _STEP_KEY
        lane_of_row, uniques = pd.factorize(key, sort=False)
        order = np.argsort(lane_of_row.astype(np.int16 if len(uniques) < 2**15 else np.int64), kind="stable")
        groups = np.split(order, np.cumsum(np.bincount(lane_of_row, minlength=len(uniques)))[:-1])
        threads = trace.info[rank].thread_names
        kept = [i for i in range(len(uniques)) if uniques[i] != _STEP_KEY]
        device_first = sorted(kept, key=lambda i: (uniques[i] < 0, abs(int(uniques[i]))))
        for i in device_first:
            rows = groups[i]
            if uniques[i] >= 0:
                label = f"rank {rank} · stream {int(uniques[i])}"
                lane = TraceLane(
                    label,
                    rank,
                    int(uniques[i]),
                    int(tid[rows[0]]),
                    build_lane(ts[rows], dur[rows], rows, finish=False),
                )
            else:
                p, t = int(pid[rows[0]]), int(tid[rows[0]])
                label = f"rank {rank} · {threads.get(f'{p}:{t}', f'thread {t}')}"
                lane = TraceLane(label, rank, -1, t, build_lane(ts[rows], dur[rows], rows, finish=False))
            lanes.append(lane)
    nonempty = [lane.index for lane in lanes if len(lane.index)]
    origin = min((ix.start for ix in nonempty), default=0.0)
    end = max((ix.end for ix in nonempty), default=origin + 1.0)
    steps = trace.steps
    first = chosen[0] if chosen else None
    step_rows = steps[steps["rank"] == first] if len(steps) else steps
    index = TraceTimelineIndex(
        trace=trace,
        lanes=lanes,
        origin=origin,
        end=max(end, origin + 1e-3),
        kinds=kinds,
        codes=codes,
        categories=categories,
        steps=[(int(r.step), float(r.ts), float(r.ts + r.dur)) for r in step_rows.itertuples(index=False)],
    )
    if background:
        threading.Thread(target=index.finish, name="nbt-timeline-index", daemon=True).start()
    else:
        index.finish()
    return index
