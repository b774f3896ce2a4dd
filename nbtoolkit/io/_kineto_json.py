"""Reading a Kineto/Chrome trace file's JSON into typed event structs, streamed or whole.

The file is inflated a few MB at a time in a background thread (zlib releases the GIL);
each piece is cut at an event boundary (``},{``) and decoded in place by msgspec into
typed, GC-untracked structs that declare only the fields the analyses use (input shapes,
stacks and the rest are skipped by the decoder; metadata events become three-field
structs). :func:`stream_file` hands each decoded chunk to a sink (the column builder of
:mod:`nbtoolkit.io._kineto_columns`), so memory holds one piece of JSON, not the document.

Anything unexpected in the streaming path (an unknown event phase, a value of the wrong
type, a truncated file) raises :class:`StreamingFallback`; the caller then reads the file
whole (:func:`read_bytes`) and decodes it with the permissive :func:`decode_document`,
which either reads it or names the exact problem in a TraceError.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator
from functools import partial
from itertools import compress
from operator import attrgetter, is_
from pathlib import Path
from typing import Any, BinaryIO, Protocol, Union

import msgspec

from nbtoolkit.errors import TraceError
from nbtoolkit.io.bounded import CorruptGzip, inflate, max_read_bytes, open_regular, read_all, read_chunks
from nbtoolkit.units import format_bytes

__all__ = [
    "CHUNK_BYTES",
    "Document",
    "NotATrace",
    "StreamingFallback",
    "decode_document",
    "read_bytes",
    "split_phases",
    "stream_file",
]


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


class Document(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None


_DECODER = msgspec.json.Decoder(Document | list[_Event])
# The streaming decoder dispatches on "ph" and builds lean structs for the events it does not
# need (a third of the decode time on traces with many metadata events); an unknown phase
# makes it fail, and the file is then decoded by the permissive _DECODER.
_EVENTS_DECODER = msgspec.json.Decoder(list[_TaggedEvent])
_META_DECODER = msgspec.json.Decoder(Document)
CHUNK_BYTES = 4 << 20  # decompressed JSON decoded at a time: bounds the memory of the Python structs

_PH = attrgetter("ph")
_IS_X, _IS_M = "X".__eq__, "M".__eq__


def split_phases(events: list[Any]) -> tuple[list[Any], list[Any]]:
    """The complete ("X") and metadata ("M") events of a decoded chunk, in order.

    ``events`` are ``_Event`` structs (whole-document decode) or tagged structs (streaming).
    compress/map keep these loops in C: this runs over every event of the file.
    """
    if events and type(events[0]) is _Event:
        phases = list(map(_PH, events))
        return list(compress(events, map(_IS_X, phases))), list(compress(events, map(_IS_M, phases)))
    types = list(map(type, events))
    return list(compress(events, map(_IS_XEVENT, types))), list(compress(events, map(_IS_MEVENT, types)))


class EventSink(Protocol):
    """Where :func:`stream_file` puts each decoded chunk of events."""

    def add(self, events: list[Any]) -> None: ...


class NotATrace(Exception):
    """Valid JSON that is not a profiler trace (skipped inside folders, an error for a file)."""


def read_bytes(file: Path) -> bytes:
    """The whole file, inflated if gzipped, within the read limit (:mod:`nbtoolkit.io.bounded`)."""
    with open_regular(file, TraceError, "trace file") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    if not gzipped and file.name.endswith(".gz"):
        raise TraceError(f"{file}: named .gz but is not gzip-compressed; rename it or compress it")
    return read_all(
        file,
        TraceError,
        "trace file",
        on_corrupt_gzip=lambda detail: TraceError(
            f"{file}: the gzip stream is truncated or corrupt ({detail}); copy the file again"
        ),
    )


def decode_document(file: Path, data: bytes) -> Document:
    if not data:
        raise TraceError(f"{file}: the file is empty; the profiler did not finish writing it")
    if not data.strip():
        raise TraceError(_only_whitespace(file, len(data)))
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if "traceEvents" not in text and "$[" not in text:
            raise NotATrace(f"not a profiler trace (top level: {text})") from None
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
        return Document(traceEvents=doc, schemaVersion="chrome-array")
    if doc.traceEvents is None:
        raise NotATrace("not a profiler trace: the JSON has no 'traceEvents' list")
    return doc


def _only_whitespace(file: Path, size: int) -> str:
    return (
        f"{file}: holds no JSON value, only {format_bytes(size)} of whitespace; "
        "it is not a profiler trace (or its writer failed)"
    )


class StreamingFallback(Exception):
    """The streaming reader cannot handle this file; decode it whole (exact error messages)."""


def _pieces(file: Path) -> Iterator[bytes]:
    """The decompressed bytes of the file, a few MB at a time, within the read limit.

    A gzip file is read and inflated in a background thread (file reads and zlib release
    the GIL), so decompression overlaps the decoding of the previous piece.
    """
    fh = open_regular(file, TraceError, "trace file")
    gzipped = fh.read(2) == b"\x1f\x8b"
    fh.seek(0)
    if gzipped:
        # The limit is read here: the call's max_bytes= lives in this thread's context.
        return _in_background(_inflate(fh, file, max_read_bytes()))
    if file.name.endswith(".gz"):
        fh.close()
        raise StreamingFallback
    return _read(fh, file)


def _read(fh: BinaryIO, file: Path) -> Iterator[bytes]:
    with fh:
        yield from read_chunks(fh, file, TraceError, CHUNK_BYTES)


def _inflate(fh: BinaryIO, file: Path, limit: int) -> Iterator[bytes]:
    with fh:
        try:
            yield from inflate(fh, file, TraceError, CHUNK_BYTES, limit=limit)
        except CorruptGzip:
            raise StreamingFallback from None  # the whole-file read words the exact problem


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


def stream_file(file: Path, columns: EventSink) -> Document:
    """Decode the events chunk by chunk into ``columns``; return the document's other fields.

    Any surprise (no ``traceEvents`` key, a chunk that is not a list of events, a truncated
    stream) raises StreamingFallback, and the file is decoded whole, which names the exact problem.
    """
    pieces = _pieces(file)
    buf = b""
    header = b""
    seen = 0
    for piece in pieces:
        seen += len(piece)
        # Leading whitespace is dropped as it comes, so a file of nothing else costs no memory.
        buf = (buf + piece) if buf else piece.lstrip(_WS)
        key = buf.find(b'"traceEvents"')
        if key < 0:
            if len(buf) > 64 * CHUNK_BYTES:
                raise StreamingFallback
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
            raise StreamingFallback
        header, buf = buf[:key], buf[j:]  # buf starts with the array's "["
        break
    else:
        if seen and not buf:
            raise TraceError(_only_whitespace(file, seen))
        raise StreamingFallback
    # A bytearray so that chunks are decoded in place: the "," after a chunk's last event is
    # turned into "]" for the decode, then into the next chunk's "[" (no copies of the JSON).
    data = bytearray(buf)
    del buf
    try:
        for piece in pieces:
            data += piece
            if len(data) < CHUNK_BYTES:
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
                raise StreamingFallback
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
        raise StreamingFallback from None
