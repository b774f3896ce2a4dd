"""Read PyTorch profiler (Kineto) Chrome traces into a :class:`~nbtoolkit.model.trace.Trace`.

``load_trace(path)`` takes one ``.json``/``.json.gz`` file, or a folder with one file per
rank. It is fast because it never builds Python dicts for events: the JSON is decoded
by msgspec straight into typed structs that declare only the fields the analyses use
(everything else, such as input shapes, is skipped by the decoder), and the structs are
turned into numpy columns in one pass.

The rank of a file comes from its ``distributedInfo``; files without it get the rank
their file name states (``rank-34``, ``rank0``, ``worker3``, ``_rank_1``), else rank 0,
and the Trace notes say so.
"""

from __future__ import annotations

import gzip
import re
import zlib
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from nbtoolkit.errors import TraceError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from nbtoolkit.model.trace import RankInfo, Trace

__all__ = ["load_trace", "parse_profiler_step"]

_INT64_MAX = 2**63 - 1
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_TRACE_SUFFIXES = (".json", ".json.gz")


class _Args(msgspec.Struct):
    """The event ``args`` the analyses use; msgspec skips every other key without building it."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    stream: int | str | None = None
    device: int | str | None = None
    name: str | None = None  # metadata events (process_name, thread_name)
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")


class _Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _Document(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None


_DECODER = msgspec.json.Decoder(_Document | list[_Event])


def parse_profiler_step(name: str, *, source: str = "") -> int:
    """The step number of a ``ProfilerStep#N`` label; a TraceError for any other ProfilerStep label."""
    match = _STEP_RE.match(name)
    if match is None:
        where = f"{source}: " if source else ""
        raise TraceError(
            f"{where}ProfilerStep label {name!r} is not of the form 'ProfilerStep#N' (N an integer); "
            "the trace was edited or written by an unknown tool"
        )
    return int(match.group(1))


# ----------------------------------------------------------------------------- public
def load_trace(path: str | Path) -> Trace:
    """Load a Kineto/Chrome trace file, or a folder of per-rank trace files, into a Trace.

    Args:
        path: a ``.json`` or ``.json.gz`` trace, or a folder holding one trace per rank.
            Files in the folder that are not ``.json``/``.json.gz``, and JSON files that
            are not profiler traces (e.g. execution traces), are skipped and named in
            ``Trace.notes``.

    Raises:
        TraceError: the path is missing, the folder holds no trace, a file is truncated,
            corrupt or not a trace, two files claim the same rank, ranks use different
            trace formats, a ProfilerStep label is malformed, an event has a missing or
            negative duration, a number overflows int64, or a name is not valid UTF-8.
    """
    from nbtoolkit.model.trace import Trace

    root = Path(path).expanduser()
    if not root.exists():
        raise TraceError(f"{root}: no such file or folder; give a .json/.json.gz trace or a folder of them")
    notes: list[str] = []
    if root.is_dir():
        files, skipped = _trace_files(root)
        if skipped:
            notes.append(
                f"skipped {len(skipped)} file(s) that are not .json/.json.gz traces: "
                + ", ".join(sorted(skipped)[:10])
                + (" ..." if len(skipped) > 10 else "")
            )
        if not files:
            raise TraceError(
                f"{root}: folder holds no .json/.json.gz trace files"
                + (f" (only {', '.join(sorted(skipped)[:5])})" if skipped else " (it is empty)")
            )
        loaded = []
        for file in files:
            try:
                loaded.append(_load_file(file))
            except _NotATrace as exc:
                notes.append(f"skipped {file.name}: {exc}")
        if not loaded:
            raise TraceError(
                f"{root}: none of the {len(files)} JSON file(s) is a profiler trace ({notes[-1]})"
            )
    else:
        try:
            loaded = [_load_file(root)]
        except _NotATrace as exc:
            raise TraceError(f"{root}: {exc}") from None

    events: dict[int, pd.DataFrame] = {}
    collectives: dict[int, pd.DataFrame] = {}
    info: dict[int, RankInfo] = {}
    for rank_info, frame, coll in loaded:
        rank = rank_info.rank
        if rank in info:
            raise TraceError(
                f"{root}: rank {rank} appears twice ({Path(info[rank].source).name} and "
                f"{Path(rank_info.source).name}); keep one trace per rank in the folder"
            )
        info[rank], events[rank], collectives[rank] = rank_info, frame, coll
    formats = {i.trace_format for i in info.values()}
    if len(formats) > 1:
        detail = "; ".join(
            f"rank {r}: {info[r].trace_format} ({Path(info[r].source).name})" for r in sorted(info)
        )
        raise TraceError(f"{root}: ranks have different trace formats ({detail}); load them separately")
    return Trace(events=events, info=info, collectives=collectives, notes=notes)


# ---------------------------------------------------------------------------- reading
class _NotATrace(Exception):
    """Valid JSON that is not a profiler trace (skipped inside folders, an error for a file)."""


def _trace_files(folder: Path) -> tuple[list[Path], list[str]]:
    files, skipped = [], []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.name.endswith(_TRACE_SUFFIXES) and not entry.name.startswith("."):
            files.append(entry)
        elif not entry.name.startswith("."):
            skipped.append(entry.name)
    return files, skipped


def _read_bytes(file: Path) -> bytes:
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise TraceError(f"{file}: cannot read the file ({exc.strerror or exc})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(
                f"{file}: the gzip stream is truncated or corrupt ({exc}); copy the file again"
            ) from None
    if file.name.endswith(".gz"):
        raise TraceError(f"{file}: named .gz but is not gzip-compressed; rename it or compress it")
    return raw


def _decode(file: Path, data: bytes) -> _Document:
    if not data.strip():
        raise TraceError(f"{file}: the file is empty; the profiler did not finish writing it")
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if "traceEvents" not in text and "$[" not in text:
            raise _NotATrace(f"not a profiler trace (top level: {text})") from None
        raise TraceError(f"{file}: an event has a value of the wrong type ({text})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{file}: text in the trace is not valid UTF-8 (byte {exc.object[exc.start : exc.end]!r} "
            "in a string); the file is corrupt or was written with another encoding"
        ) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "utf-8" in text.lower():
            raise TraceError(f"{file}: text in the trace is not valid UTF-8 ({text})") from None
        if "truncated" in text.lower():
            raise TraceError(
                f"{file}: the JSON is truncated ({text}); the profiler did not finish writing it"
            ) from None
        raise TraceError(f"{file}: the JSON is malformed ({text})") from None
    if isinstance(doc, list):
        return _Document(traceEvents=doc, schemaVersion="chrome-array")
    if doc.traceEvents is None:
        raise _NotATrace("not a profiler trace: the JSON has no 'traceEvents' list")
    return doc


def _load_file(file: Path) -> tuple[RankInfo, pd.DataFrame, pd.DataFrame]:
    doc = _decode(file, _read_bytes(file))
    events = doc.traceEvents or []
    del doc.traceEvents  # the structs live in `events` only, freed as soon as the columns exist
    rank_info = _rank_info(file, doc)
    complete, threads = _split_events(events)
    del events
    if not complete:
        raise TraceError(
            f"{file}: the trace has no events (no complete 'X' events); the profiler recorded nothing"
        )
    rank_info.thread_names = threads
    frame, coll = _columns(file, complete)
    del complete
    for label in frame["name"].cat.categories:
        if str(label).startswith("ProfilerStep"):
            parse_profiler_step(str(label), source=str(file))
    rank_info.device_type = _device_type(rank_info, frame)
    return rank_info, frame, coll


def _split_events(events: list[_Event]) -> tuple[list[_Event], dict[str, str]]:
    complete: list[_Event] = []
    threads: dict[str, str] = {}
    append = complete.append
    for ev in events:
        ph = ev.ph
        if ph == "X":
            if ev.cat != "Trace":  # the profiler's own span, not an event of the program
                append(ev)
        elif (
            ph == "M" and ev.name in ("thread_name", "process_name") and ev.args is not None and ev.args.name
        ):
            key = f"{ev.pid}:{ev.tid}" if ev.name == "thread_name" else f"{ev.pid}"
            threads[key] = ev.args.name
    return complete, threads


def _int_column(file: Path, what: str, values: list[Any]) -> np.ndarray:
    import numpy as np

    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        bad = next(v for v in values if isinstance(v, int) and not -_INT64_MAX - 1 <= v <= _INT64_MAX)
        raise TraceError(
            f"{file}: {what} value {bad} does not fit in 64 bits; the trace is corrupt"
        ) from None


def _as_int(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _columns(file: Path, complete: list[_Event]) -> tuple[pd.DataFrame, pd.DataFrame]:
    import numpy as np
    import pandas as pd

    from nbtoolkit.model.trace import empty_collectives

    n = len(complete)
    ts = np.fromiter(map(attrgetter("ts"), complete), dtype=np.float64, count=n)  # None -> nan
    dur = np.fromiter(map(attrgetter("dur"), complete), dtype=np.float64, count=n)
    bad_dur = ~(dur >= 0)  # missing (nan) or negative
    if bad_dur.any() or np.isnan(ts).any():
        i = int(np.flatnonzero(bad_dur | np.isnan(ts))[0])
        ev = complete[i]
        problem = (
            "no timestamp"
            if np.isnan(ts[i])
            else ("no duration" if np.isnan(dur[i]) else f"negative duration {dur[i]}")
        )
        raise TraceError(
            f"{file}: {int(bad_dur.sum() + np.isnan(ts).sum())} complete event(s) have a missing or negative "
            f"duration/timestamp, e.g. {ev.name!r} at ts={ev.ts} ({problem}); the trace is corrupt"
        )
    if np.abs(ts).max() * 1e3 > _INT64_MAX or dur.max() * 1e3 > _INT64_MAX:
        raise TraceError(
            f"{file}: a timestamp or duration does not fit in int64 nanoseconds; the trace is corrupt"
        )

    pids = [e.pid for e in complete]
    tids = [e.tid for e in complete]
    pid = _int_column(file, "pid", [p if isinstance(p, int) else _as_int(p) for p in pids])
    tid = _int_column(file, "tid", [t if isinstance(t, int) else _as_int(t) for t in tids])

    stream = np.full(n, -1, dtype=np.int64)
    device = np.full(n, -1, dtype=np.int64)
    correlation = np.full(n, -1, dtype=np.int64)
    external = np.full(n, -1, dtype=np.int64)
    coll_rows: list[int] = []
    with_args = [(i, e.args) for i, e in enumerate(complete) if e.args is not None]
    if with_args:
        idx = np.fromiter((i for i, _ in with_args), dtype=np.int64, count=len(with_args))
        args = [a for _, a in with_args]
        streams = [a.stream for a in args]
        stream[idx] = _int_column(file, "stream", [s if isinstance(s, int) else _as_int(s) for s in streams])
        device[idx] = _int_column(
            file, "device", [d if isinstance(d, int) else _as_int(d) for d in (a.device for a in args)]
        )
        correlation[idx] = _int_column(
            file, "correlation", [-1 if c is None else c for c in (a.correlation for a in args)]
        )
        external[idx] = _int_column(
            file, "External id", [-1 if c is None else c for c in (a.external_id for a in args)]
        )
        coll_rows = [i for i, a in with_args if a.collective is not None]

    names = pd.Categorical([e.name for e in complete])
    cats = pd.Categorical([e.cat for e in complete])
    frame = pd.DataFrame(
        {
            "ts": ts,
            "dur": dur,
            "name": names,
            "cat": cats,
            "pid": pid,
            "tid": tid,
            "stream": stream,
            "device": device,
            "correlation": correlation,
            "external_id": external,
        }
    )
    order = np.argsort(ts, kind="stable")
    if not (order == np.arange(n)).all():
        frame = frame.iloc[order].reset_index(drop=True)
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
    else:
        position = None

    if coll_rows:
        rows = []
        for i in coll_rows:
            a = complete[i].args
            assert a is not None
            rows.append(
                {
                    "row": int(position[i]) if position is not None else i,
                    "collective": a.collective,
                    "in_msg_nelems": a.in_msg_nelems,
                    "out_msg_nelems": a.out_msg_nelems,
                    "group_size": a.group_size,
                    "dtype": a.dtype,
                    "pg_name": a.pg_name,
                    "pg_desc": a.pg_desc,
                    "pg_ranks": None if a.pg_ranks is None else str(a.pg_ranks),
                }
            )
        coll = pd.DataFrame(rows, columns=list(empty_collectives().columns)).sort_values(
            "row", ignore_index=True
        )
        for column in ("in_msg_nelems", "out_msg_nelems", "group_size"):
            coll[column] = pd.array(coll[column], dtype="Int64")
    else:
        coll = empty_collectives()
    return frame, coll


# --------------------------------------------------------------------------- metadata
def _rank_info(file: Path, doc: _Document) -> RankInfo:
    from nbtoolkit.model.trace import RankInfo

    notes: list[str] = []
    dist = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    rank = dist.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        matches = list(_RANK_IN_NAME_RE.finditer(file.name))
        match = matches[-1] if matches else None  # the last "rankN"/"workerN" in the name wins
        if match is not None:
            rank = int(match.group(1))
            notes.append(f"rank {rank} taken from the file name {file.name} (no distributedInfo.rank)")
        else:
            rank = 0
            notes.append(
                f"rank unknown (no distributedInfo.rank, none in the file name {file.name}); using 0"
            )
    world = dist.get("world_size")
    schema = doc.schemaVersion
    trace_format = (
        "chrome-array"
        if schema == "chrome-array"
        else f"kineto schema {schema if schema is not None else '?'}"
    )
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    base = doc.baseTimeNanoseconds if isinstance(doc.baseTimeNanoseconds, int) else None
    pg_config = dist.get("pg_config")
    groups = [g for g in pg_config if isinstance(g, dict)] if isinstance(pg_config, list) else []
    return RankInfo(
        rank=int(rank),
        world_size=world if isinstance(world, int) else None,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        device_properties=[p for p in props if isinstance(p, dict)],
        trace_format=trace_format,
        source=str(file),
        base_time_ns=base,
        process_groups=groups,
        notes=notes,
    )


def _device_type(info: RankInfo, frame: pd.DataFrame) -> str:
    if not bool((frame["stream"].to_numpy() >= 0).any()):
        return "cpu"
    cats = {str(c) for c in frame["cat"].cat.categories}
    if any(c.startswith("mtia") for c in cats):
        return "mtia"
    if info.device_properties:
        first = info.device_properties[0]
        if "gcnArchName" in first or "AMD" in str(first.get("name", "")):
            return "rocm"
        return "cuda"
    return "gpu"
