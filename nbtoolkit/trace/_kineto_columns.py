"""Decoded trace events turned into the columnar frames of a :class:`~nbtoolkit.trace.trace.Trace`.

:class:`EventColumns` takes the events chunk by chunk (as :mod:`nbtoolkit.trace._kineto_json`
decodes them), turns each chunk into numpy columns (names and categories interned once per
file) and keeps the collective metadata and thread names; :meth:`EventColumns.frame`
then checks times and builds the rank's events and collectives frames.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, repeat
from operator import attrgetter, is_not
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nbtoolkit.core.errors import TraceError
from nbtoolkit.trace._kineto_json import split_phases, unknown_phases
from nbtoolkit.trace.records import COLLECTIVE_COLUMNS

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = ["EventArrays", "EventColumns"]

_INT64_MAX = 2**63 - 1


class EventColumns:
    """Numpy columns accumulated chunk by chunk, names interned in one table for the whole file."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c in _NUMERIC}
        self.name_codes: list[np.ndarray] = []
        self.cat_codes: list[np.ndarray] = []
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.collectives: list[dict[str, Any]] = []
        self.threads: dict[str, str] = {}
        self.rows = 0
        self.unknown_phases: dict[str, int] = {}  # phase -> events skipped (not in the Chrome format)

    def add(self, events: list[Any]) -> None:
        """Add a chunk of events: decoded by :mod:`nbtoolkit.trace._kineto_json`, either way."""
        import numpy as np

        complete, metadata = split_phases(events)
        for phase, count in unknown_phases(events).items():
            self.unknown_phases[phase] = self.unknown_phases.get(phase, 0) + count
        for ev in compress(metadata, map(_THREAD_META.__contains__, map(_NAME, metadata))):
            if ev.args.name:
                key = f"{ev.pid}:{ev.tid}" if ev.name == "thread_name" else f"{ev.pid}"
                self.threads[key] = ev.args.name
        n = len(complete)
        if not n:
            return
        file = self.file
        self.parts["ts"].append(np.fromiter(map(_TS, complete), dtype=np.float64, count=n))
        self.parts["dur"].append(np.fromiter(map(_DUR, complete), dtype=np.float64, count=n))
        self.parts["pid"].append(_ints(file, "pid", complete, _PID))
        self.parts["tid"].append(_ints(file, "tid", complete, _TID))
        args = list(map(_ARGS, complete))
        self.parts["stream"].append(_ints(file, "stream", args, _STREAM))
        self.parts["device"].append(_ints(file, "device", args, _DEVICE))
        self.parts["correlation"].append(_ints(file, "correlation", args, _CORRELATION))
        self.parts["external_id"].append(_ints(file, "External id", args, _EXTERNAL))
        self.name_codes.append(_intern(list(map(_NAME, complete)), self.names))
        self.cat_codes.append(_intern(list(map(_CAT, complete)), self.cats))
        with_collective = compress(range(n), map(is_not, map(_COLLECTIVE, args), repeat(None)))
        fields = COLLECTIVE_COLUMNS[1:]  # the frame's columns after "row" are the args we keep
        for i in with_collective:
            a = args[i]
            row = {f: getattr(a, f) for f in fields}
            row["row"] = self.rows + i
            if row["pg_ranks"] is not None:
                row["pg_ranks"] = str(row["pg_ranks"])
            self.collectives.append(row)
        self.rows += n

    def unknown_phase_note(self) -> str | None:
        """The note for events skipped because their phase is not one of the Chrome trace format."""
        if not self.unknown_phases:
            return None
        total = sum(self.unknown_phases.values())
        shown = sorted(self.unknown_phases.items(), key=lambda item: (-item[1], item[0]))
        values = ", ".join(f"{phase[:20]!r} ({count:,})" for phase, count in shown[:8])
        more = f" and {len(shown) - 8} more" if len(shown) > 8 else ""
        return (
            f"skipped {total:,} event(s) whose phase ('ph') is not one of the Chrome trace format: "
            f"{values}{more}"
        )

    def arrays(self) -> EventArrays:
        """The complete events as numpy columns (times checked, the profiler's span dropped, by start).

        No pandas: what the lean summarizer (:mod:`nbtoolkit.trace.summarize_rank_lean`) reads;
        :meth:`frame` builds the Trace's frames from it.
        """
        import numpy as np

        file = self.file
        cols = {c: np.concatenate(p) for c, p in self.parts.items()}
        name_codes, cat_codes = np.concatenate(self.name_codes), np.concatenate(self.cat_codes)
        ts, dur = cols["ts"], cols["dur"]
        bad = np.isnan(ts) | ~(dur >= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            problem = (
                "no timestamp"
                if np.isnan(ts[i])
                else ("no duration" if np.isnan(dur[i]) else f"negative duration {dur[i]}")
            )
            name = list(self.names)[name_codes[i]]
            raise TraceError(
                f"{file}: {int(bad.sum())} complete event(s) have a missing or negative duration or "
                f"timestamp, e.g. {name!r} at ts={ts[i]} ({problem}); the trace is corrupt"
            )
        if np.abs(ts).max() * 1e3 > _INT64_MAX or dur.max() * 1e3 > _INT64_MAX:
            raise TraceError(
                f"{file}: a timestamp or duration does not fit in int64 nanoseconds; the trace is corrupt"
            )
        cols["name"], cols["cat"] = name_codes, cat_codes
        # the profiler's own "Trace" span is not an event of the program
        keep = cat_codes != self.cats["Trace"] if "Trace" in self.cats else None
        if keep is not None:
            cols = {c: values[keep] for c, values in cols.items()}
        order: np.ndarray | None = np.argsort(cols["ts"], kind="stable")
        assert order is not None
        if (order[1:] < order[:-1]).any():
            cols = {c: values[order] for c, values in cols.items()}
        else:
            order = None
        return EventArrays(cols, list(self.names), list(self.cats), keep, order)

    def frame(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The events frame (complete events, sorted by start) and the collectives frame."""
        import numpy as np
        import pandas as pd

        from nbtoolkit.trace.records import empty_collectives

        rows = self.arrays()
        cols = rows.columns
        frame = pd.DataFrame(
            {
                "ts": cols["ts"],
                "dur": cols["dur"],
                "name": _categorical(cols["name"], self.names),
                "cat": _categorical(cols["cat"], self.cats),
                "pid": cols["pid"],
                "tid": cols["tid"],
                "stream": cols["stream"],
                "device": cols["device"],
                "correlation": cols["correlation"],
                "external_id": cols["external_id"],
            }
        )
        coll = (
            pd.DataFrame(self.collectives, columns=list(COLLECTIVE_COLUMNS))
            if self.collectives
            else empty_collectives()
        )
        if rows.kept is not None:
            new_index = np.cumsum(rows.kept) - 1
            coll = coll[rows.kept[coll["row"].to_numpy()]].assign(
                row=lambda c: new_index[c["row"].to_numpy()]
            )
        if rows.order is not None:
            position = np.empty(len(rows.order), dtype=np.int64)
            position[rows.order] = np.arange(len(rows.order))
            coll = coll.assign(row=position[coll["row"].to_numpy()])
        if len(coll):
            coll = coll.sort_values("row", ignore_index=True)
            for column in ("in_msg_nelems", "out_msg_nelems", "group_size"):
                coll[column] = pd.array(coll[column], dtype="Int64")
        return frame, coll


class EventArrays(NamedTuple):
    """A rank's complete events as numpy, in start order (:meth:`EventColumns.arrays`).

    ``columns``: the numeric columns of :data:`~nbtoolkit.trace.records.EVENT_COLUMNS`, with
    ``name`` and ``cat`` as codes into ``names`` and ``cats`` (every string of the file, in the
    order first seen, including those of dropped events). ``kept``: which decoded events were kept
    (None: all); ``order``: the stable sort by start applied after that (None: already in order).
    """

    columns: dict[str, np.ndarray]
    names: list[str]
    cats: list[str]
    kept: np.ndarray | None
    order: np.ndarray | None


_COLLECTIVE = attrgetter("collective")
_THREAD_META = frozenset(("thread_name", "process_name"))
_NUMERIC = ("ts", "dur", "pid", "tid", "stream", "device", "correlation", "external_id")
_TS, _DUR, _PID, _TID, _ARGS, _NAME, _CAT = (
    attrgetter(a) for a in ("ts", "dur", "pid", "tid", "args", "name", "cat")
)
_STREAM, _DEVICE, _CORRELATION, _EXTERNAL = (
    attrgetter(a) for a in ("stream", "device", "correlation", "external_id")
)


def _ints(file: Path, what: str, items: list[Any], get: Callable[[Any], Any]) -> np.ndarray:
    """An int64 column of ``get(item)``; non-numeric values (e.g. pid "Spans") become -1;
    overflow is an error."""
    import numpy as np

    try:
        return np.fromiter(map(get, items), dtype=np.int64, count=len(items))
    except (OverflowError, TypeError, ValueError):
        values = list(map(get, items))
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        bad = next(v for v in values if isinstance(v, int) and not -_INT64_MAX - 1 <= v <= _INT64_MAX)
        raise TraceError(
            f"{file}: {what} value {bad} does not fit in 64 bits; the trace is corrupt"
        ) from None
    except (TypeError, ValueError):
        # one odd value (a "Spans" pid) sends the whole chunk here: keep the ints' path call-free
        low, high = -_INT64_MAX - 1, _INT64_MAX
        return np.array(
            [v if type(v) is int and low <= v <= high else _as_int(v) for v in values], dtype=np.int64
        )


def _as_int(value: Any) -> int:
    if isinstance(value, int) and -_INT64_MAX - 1 <= value <= _INT64_MAX:
        return value
    try:
        number = int(value)
    except (TypeError, ValueError):
        return -1
    return number if -_INT64_MAX - 1 <= number <= _INT64_MAX else -1


def _intern(values: list[str], table: dict[str, int]) -> np.ndarray:
    """Codes of ``values`` in ``table`` (extended with new strings, in the order first seen)."""
    import numpy as np

    # dict.fromkeys and map run in C: the distinct strings in order, then one lookup per value
    for value in dict.fromkeys(values):
        if value not in table:
            table[value] = len(table)
    return np.fromiter(map(table.__getitem__, values), dtype=np.int64, count=len(values))


def _categorical(codes: np.ndarray, table: dict[str, int]) -> pd.Categorical:
    """A categorical with sorted categories (deterministic, whatever the chunking)."""
    import numpy as np
    import pandas as pd

    labels = np.array(list(table), dtype=object)
    order = np.argsort(labels, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return pd.Categorical.from_codes(rank[codes] if len(codes) else codes, categories=labels[order])
