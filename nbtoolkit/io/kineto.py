"""Read PyTorch profiler (Kineto) Chrome traces into a :class:`~nbtoolkit.model.trace.Trace`.

``load_trace(path)`` takes one ``.json``/``.json.gz`` file, or a folder with one file per
rank. It is fast and small because it never builds Python dicts for events:

- the file is inflated a few MB at a time in a background thread (zlib releases the GIL);
- each piece is cut at an event boundary (``},{``) and decoded in place by msgspec into
  typed, GC-untracked structs that declare only the fields the analyses use (input
  shapes, stacks and the rest are skipped by the decoder; metadata events become
  three-field structs);
- the structs of a piece are turned into numpy columns (names interned once per file)
  and dropped before the next piece is decoded, so memory holds one piece of JSON, not
  the whole document;
- the cyclic garbage collector is paused while loading (the objects form no cycles).

Anything unexpected in the streaming path (an unknown event phase, a value of the wrong
type, a truncated file) makes the file be decoded whole by a permissive decoder, which
either reads it or names the exact problem in a TraceError.

The rank of a file comes from its ``distributedInfo``; files without it get the rank
their file name states (``rank-34``, ``rank0``, ``worker3``, ``_rank_1``), else rank 0,
and the Trace notes say so.
"""

from __future__ import annotations

import gc
import gzip
import math
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, is_, is_not
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Union

import msgspec

from nbtoolkit.errors import TraceError
from nbtoolkit.model.trace import COLLECTIVE_COLUMNS

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from nbtoolkit.model.trace import RankInfo, Trace

__all__ = ["load_trace", "parse_profiler_step"]

_INT64_MAX = 2**63 - 1
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_TRACE_SUFFIXES = (".json", ".json.gz")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The event ``args`` the analyses use; msgspec skips every other key without building it."""

    external_id: int = msgspec.field(default=-1, name="External id")
    correlation: int = -1
    stream: int | str = -1
    device: int | str = -1
    name: str | None = None  # metadata events (process_name, thread_name)
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")


_NO_ARGS = _Args()  # shared default: events without args cost no allocation


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = math.nan  # NaN: missing
    dur: float = math.nan
    args: _Args = _NO_ARGS


class _XEvent(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event, when the streaming decoder dispatches on ``ph``."""

    name: str = ""
    cat: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = math.nan
    dur: float = math.nan
    args: _Args = _NO_ARGS


class _MetaArgs(msgspec.Struct, frozen=True, gc=False):
    name: str | None = None


_NO_META_ARGS = _MetaArgs()


class _MEvent(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    """A metadata event: only thread and process names are kept."""

    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    args: _MetaArgs = _NO_META_ARGS


# Every other phase of the Chrome trace format: decoded to an empty struct (all fields skipped).
_SKIPPED_PHASES = tuple(
    msgspec.defstruct(f"_Skip{i}", [], tag_field="ph", tag=phase, gc=False)
    for i, phase in enumerate("BEiICbnestfPONDRcSTpFvV()a")  # each phase is one character
)
# A union built at run time (py3.10 has no star-unpacking in subscripts); a plain value for mypy.
_TaggedEvent: Any = Union.__getitem__((_XEvent, _MEvent, *_SKIPPED_PHASES))
_IS_XEVENT, _IS_MEVENT = partial(is_, _XEvent), partial(is_, _MEvent)


class _Document(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None


_DECODER = msgspec.json.Decoder(_Document | list[_Event])
# The streaming decoder dispatches on "ph" and builds lean structs for the events it does not
# need (a third of the decode time on traces with many metadata events); an unknown phase
# makes it fail, and the file is then decoded by the permissive _DECODER.
_EVENTS_DECODER = msgspec.json.Decoder(list[_TaggedEvent])
_META_DECODER = msgspec.json.Decoder(_Document)
_CHUNK_BYTES = 4 << 20  # decompressed JSON decoded at a time: bounds the memory of the Python structs


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
    # The loader allocates hundreds of thousands of small objects that form no cycles; the
    # cyclic garbage collector would rescan them again and again (a third of the load time).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _load(Path(path).expanduser())
    finally:
        if gc_was_enabled:
            gc.enable()


def _load(root: Path) -> Trace:
    from nbtoolkit.model.trace import Trace

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
                f"{Path(rank_info.source).name}); keep one trace per rank in the folder, or load the "
                "files one by one"
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


class _Columns:
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

    def add(self, events: list[Any]) -> None:
        """Add a chunk of events: ``_Event`` (whole-document decode) or tagged structs (streaming)."""
        import numpy as np

        # compress/map keep these loops in C: this runs over every event of the file.
        if events and type(events[0]) is _Event:
            phases = list(map(_PH, events))
            complete = list(compress(events, map(_IS_X, phases)))
            metadata = list(compress(events, map(_IS_M, phases)))
        else:
            types = list(map(type, events))
            complete = list(compress(events, map(_IS_XEVENT, types)))
            metadata = list(compress(events, map(_IS_MEVENT, types)))
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

    def frame(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The events frame (complete events, sorted by start) and the collectives frame."""
        import numpy as np
        import pandas as pd

        from nbtoolkit.model.trace import empty_collectives

        file = self.file
        cols = {c: np.concatenate(p) for c, p in self.parts.items()}
        names = _categorical(np.concatenate(self.name_codes), self.names)
        cats = _categorical(np.concatenate(self.cat_codes), self.cats)
        keep = cats.codes != cats.categories.get_loc("Trace") if "Trace" in self.cats else None
        ts, dur = cols["ts"], cols["dur"]
        bad = np.isnan(ts) | ~(dur >= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            problem = (
                "no timestamp"
                if np.isnan(ts[i])
                else ("no duration" if np.isnan(dur[i]) else f"negative duration {dur[i]}")
            )
            raise TraceError(
                f"{file}: {int(bad.sum())} complete event(s) have a missing or negative duration or "
                f"timestamp, e.g. {names[i]!r} at ts={ts[i]} ({problem}); the trace is corrupt"
            )
        if np.abs(ts).max() * 1e3 > _INT64_MAX or dur.max() * 1e3 > _INT64_MAX:
            raise TraceError(
                f"{file}: a timestamp or duration does not fit in int64 nanoseconds; the trace is corrupt"
            )
        frame = pd.DataFrame(
            {
                "ts": ts,
                "dur": dur,
                "name": names,
                "cat": cats,
                "pid": cols["pid"],
                "tid": cols["tid"],
                "stream": cols["stream"],
                "device": cols["device"],
                "correlation": cols["correlation"],
                "external_id": cols["external_id"],
            }
        )
        coll = (
            pd.DataFrame(self.collectives, columns=list(empty_collectives().columns))
            if self.collectives
            else empty_collectives()
        )
        if keep is not None:  # the profiler's own "Trace" span is not an event of the program
            new_index = np.cumsum(keep) - 1
            frame = frame[keep]
            coll = coll[keep[coll["row"].to_numpy()]].assign(row=lambda c: new_index[c["row"].to_numpy()])
        order = np.argsort(frame["ts"].to_numpy(), kind="stable")
        if (order[1:] < order[:-1]).any():
            frame = frame.iloc[order]
            position = np.empty(len(order), dtype=np.int64)
            position[order] = np.arange(len(order))
            coll = coll.assign(row=position[coll["row"].to_numpy()])
        frame = frame.reset_index(drop=True)
        if len(coll):
            coll = coll.sort_values("row", ignore_index=True)
            for column in ("in_msg_nelems", "out_msg_nelems", "group_size"):
                coll[column] = pd.array(coll[column], dtype="Int64")
        return frame, coll


_PH, _COLLECTIVE = attrgetter("ph"), attrgetter("collective")
_IS_X, _IS_M = "X".__eq__, "M".__eq__
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
        return np.array([_as_int(v) for v in values], dtype=np.int64)


def _as_int(value: Any) -> int:
    if isinstance(value, int) and -_INT64_MAX - 1 <= value <= _INT64_MAX:
        return value
    try:
        number = int(value)
    except (TypeError, ValueError):
        return -1
    return number if -_INT64_MAX - 1 <= number <= _INT64_MAX else -1


def _intern(values: list[str], table: dict[str, int]) -> np.ndarray:
    """Codes of ``values`` in ``table`` (extended with new strings)."""
    import numpy as np
    import pandas as pd

    codes, uniques = pd.factorize(np.array(values, dtype=object))
    mapping = np.fromiter(
        (table.setdefault(u, len(table)) for u in uniques), dtype=np.int64, count=len(uniques)
    )
    return mapping[codes] if len(codes) else np.empty(0, dtype=np.int64)


def _categorical(codes: np.ndarray, table: dict[str, int]) -> pd.Categorical:
    """A categorical with sorted categories (deterministic, whatever the chunking)."""
    import numpy as np
    import pandas as pd

    labels = np.array(list(table), dtype=object)
    order = np.argsort(labels, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return pd.Categorical.from_codes(rank[codes] if len(codes) else codes, categories=labels[order])


class _Fallback(Exception):
    """The streaming reader cannot handle this file; decode it whole (exact error messages)."""


def _pieces(file: Path) -> Iterator[bytes]:
    """The decompressed bytes of the file, a few MB at a time.

    A gzip file is read and inflated in a background thread (file reads and zlib release
    the GIL), so decompression overlaps the decoding of the previous piece.
    """
    try:
        fh = file.open("rb")
    except OSError as exc:
        raise TraceError(f"{file}: cannot read the file ({exc.strerror or exc})") from None
    gzipped = fh.read(2) == b"\x1f\x8b"
    fh.seek(0)
    if gzipped:
        return _in_background(_inflate(fh))
    if file.name.endswith(".gz"):
        fh.close()
        raise _Fallback
    return _read(fh)


def _read(fh: BinaryIO) -> Iterator[bytes]:
    with fh:
        while data := fh.read(_CHUNK_BYTES):
            yield data


def _inflate(fh: BinaryIO) -> Iterator[bytes]:
    with fh:
        inflater = zlib.decompressobj(wbits=31)
        while data := fh.read(1 << 20):
            try:
                out = inflater.decompress(data, _CHUNK_BYTES)
                while True:
                    yield out
                    if not inflater.unconsumed_tail:
                        break
                    out = inflater.decompress(inflater.unconsumed_tail, _CHUNK_BYTES)
            except zlib.error:
                raise _Fallback from None
        if not inflater.eof or inflater.unused_data:  # truncated, or several gzip members
            raise _Fallback


_DONE = object()


def _in_background(source: Iterator[bytes]) -> Iterator[bytes]:
    """Run ``source`` in a thread, a few items ahead of the consumer; its exceptions are re-raised here."""
    items: queue.Queue[object] = queue.Queue(maxsize=3)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for piece in source:
                if not put(piece):
                    return
            put(_DONE)
        except BaseException as exc:
            put(exc)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def consume() -> Iterator[bytes]:
        thread = threading.Thread(target=produce, name="nbt-trace-inflate", daemon=True)
        thread.start()
        try:
            while True:
                item = items.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, bytes)
                yield item
        finally:
            stop.set()
            thread.join()

    return consume()


_WS = b" \t\r\n"


def _event_split(buf: bytes | bytearray) -> int:
    """Index of a ``{`` that starts an event at top level of the events array (``},{``), or -1."""
    pos = len(buf)
    while True:
        pos = buf.rfind(b"{", 0, pos)
        if pos <= 0:
            return -1
        j = pos - 1
        while j >= 0 and buf[j] in _WS:
            j -= 1
        if j > 0 and buf[j] == 0x2C:  # ","
            j -= 1
            while j >= 0 and buf[j] in _WS:
                j -= 1
            if j >= 0 and buf[j] == 0x7D:  # "}"
                return pos


def _stream_file(file: Path, columns: _Columns) -> _Document:
    """Decode the events chunk by chunk into ``columns``; return the document's other fields.

    Any surprise (no ``traceEvents`` key, a chunk that is not a list of events, a truncated
    stream) raises _Fallback, and the file is decoded whole, which names the exact problem.
    """
    pieces = _pieces(file)
    buf = b""
    header = b""
    for piece in pieces:
        buf += piece
        key = buf.find(b'"traceEvents"')
        if key < 0:
            if len(buf) > 64 * _CHUNK_BYTES:
                raise _Fallback
            continue
        j = key + len(b'"traceEvents"')
        while j < len(buf) and buf[j] in _WS:
            j += 1
        if j < len(buf) and buf[j] == 0x3A:  # ":"
            j += 1
            while j < len(buf) and buf[j] in _WS:
                j += 1
        if j >= len(buf) - 1:
            continue  # need more bytes to see the "["
        if buf[j] != 0x5B:  # "["
            raise _Fallback
        header, buf = buf[:key], buf[j:]  # buf starts with the array's "["
        break
    else:
        raise _Fallback
    # A bytearray so that chunks are decoded in place: the "," after a chunk's last event is
    # turned into "]" for the decode, then into the next chunk's "[" (no copies of the JSON).
    data = bytearray(buf)
    del buf
    try:
        for piece in pieces:
            data += piece
            if len(data) < _CHUNK_BYTES:
                continue
            split = _event_split(data)
            if split < 0:
                continue
            close = data.rindex(b",", 0, split)
            data[close] = 0x5D  # "]"
            with memoryview(data) as view, view[: close + 1] as chunk:
                columns.add(_EVENTS_DECODER.decode(chunk))
            data[close] = 0x5B  # "["
            del data[:close]
        # The rest: the last events, "]" and the document's trailing fields. The array's "]" is
        # found from the right (the trailer is short): the first candidate whose trailer decodes.
        end = len(data)
        while True:
            end = data.rfind(b"]", 0, end)
            if end < 0:
                raise _Fallback
            j = end - 1
            while j >= 0 and data[j] in _WS:
                j -= 1
            if j > 0 and data[j] != 0x7D:  # "}": the array ends after an event (or is empty)
                continue
            try:
                doc = _META_DECODER.decode(header + b'"traceEvents": []' + bytes(data[end + 1 :]))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            with memoryview(data) as view, view[: end + 1] as chunk:
                columns.add(_EVENTS_DECODER.decode(chunk))
            return doc
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        raise _Fallback from None


def _load_file(file: Path) -> tuple[RankInfo, pd.DataFrame, pd.DataFrame]:
    columns = _Columns(file)
    try:
        doc = _stream_file(file, columns)
    except _Fallback:
        columns = _Columns(file)
        doc = _decode(file, _read_bytes(file))
        events = doc.traceEvents or []
        doc.traceEvents = None
        columns.add(events)
        del events
    rank_info = _rank_info(file, doc)
    if not columns.rows:
        raise TraceError(
            f"{file}: the trace has no events (no complete 'X' events); the profiler recorded nothing"
        )
    rank_info.thread_names = columns.threads
    frame, coll = columns.frame()
    for label in frame["name"].cat.categories:
        if str(label).startswith("ProfilerStep"):
            parse_profiler_step(str(label), source=str(file))
    rank_info.device_type = _device_type(rank_info, frame)
    return rank_info, frame, coll


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
