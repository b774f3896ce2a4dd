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
import re
from collections import Counter
from collections.abc import Iterator
from functools import partial
from itertools import compress
from operator import attrgetter, is_
from pathlib import Path
from typing import Any, BinaryIO, Protocol, Union

import msgspec

from nbtoolkit.errors import TraceError
from nbtoolkit.io._kineto_wording import BOM, malformed, refuse_duplicate_events
from nbtoolkit.io.bounded import (
    LIMITS,
    CorruptGzip,
    inflate,
    json_depth,
    limit,
    limit_hint,
    max_read_bytes,
    open_regular,
    read_ahead,
    read_all,
    read_chunks,
    too_deep,
)
from nbtoolkit.units import format_bytes

__all__ = [
    "CHUNK_BYTES",
    "KNOWN_PHASES",
    "Document",
    "NotATrace",
    "StreamingFallback",
    "decode_document",
    "read_bytes",
    "split_phases",
    "stream_file",
    "unknown_phases",
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
_OTHER_PHASES = "BEiICbnestfPONDRcSTpFvV()a"  # each phase is one character
_SKIPPED_PHASES = tuple(
    msgspec.defstruct(f"_Skip{i}", [], tag_field="ph", tag=phase, gc=False)
    for i, phase in enumerate(_OTHER_PHASES)
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
_LIST_DECODER = msgspec.json.Decoder(list[_Event])  # a chunk with a phase the tagged union lacks


class _TailDocument(msgspec.Struct):
    """The document's end as the streaming reader decodes it: the last events, lean, and the fields."""

    traceEvents: list[_TaggedEvent] | None = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None


_TAIL_DECODER = msgspec.json.Decoder(_TailDocument)
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


#: Every phase of the Chrome trace format; events of other phases are skipped and noted.
KNOWN_PHASES = frozenset("XM" + _OTHER_PHASES)


def unknown_phases(events: list[Any]) -> dict[str, int]:
    """Count of each phase outside the Chrome trace format in a chunk ("" for a missing ``ph``).

    Only the permissive decoder's ``_Event`` structs can have one: the streaming decoder's
    tagged union fails on an unknown phase, and the chunk is then decoded permissively.
    """
    if not events or type(events[0]) is not _Event:
        return {}
    return {p: n for p, n in Counter(map(_PH, events)).items() if p not in KNOWN_PHASES}


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
    if data.startswith(BOM):
        data = data[len(BOM) :]
    try:
        with json_depth():
            doc = _DECODER.decode(data)
    except RecursionError:
        raise too_deep(file, TraceError, "trace's JSON") from None
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
        raise malformed(file, data, text) from None
    if isinstance(doc, list):
        return Document(traceEvents=doc, schemaVersion="chrome-array")
    if doc.traceEvents is None:
        raise NotATrace("not a profiler trace: the JSON has no 'traceEvents' list")
    if data.count(_KEY) > 1:
        with json_depth():
            refuse_duplicate_events(file, data)
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
        return read_ahead(_inflate(fh, file, max_read_bytes()))
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


_WS = b" \t\r\n"
# "},{" between two events, read backwards (the last boundary of a buffer is the first match of
# its reversed bytes): one regex search in C, linear in the bytes searched whatever they hold.
_SPLIT_REVERSED = re.compile(rb"\{[ \t\r\n]*,[ \t\r\n]*\}")
# A boundary straddling the end of what was searched before is found again from this far back
# (a boundary with more whitespace than this across that end is missed: the next one is used).
_SPLIT_OVERLAP = 4096
_KEY = b'"traceEvents"'


def _event_split(buf: bytes | bytearray, start: int = 0) -> int:
    """Index of the last ``{`` of ``buf[start:]`` that follows ``},`` (an event boundary), or -1.

    Linear in ``len(buf) - start``: the region is reversed once and searched by one regex, so a
    buffer of millions of ``{`` (an event name of braces) costs one pass, not one Python step each.
    """
    region = buf[start:][::-1]
    match = _SPLIT_REVERSED.search(region)
    if match is None:
        return -1
    return start + len(region) - 1 - match.start()


def _no_boundary(file: Path, size: int, limit_bytes: int, *, header: bool) -> TraceError:
    where = (
        "before its 'traceEvents' list"
        if header
        else "without an event boundary (one event, or the space between two events, is that long)"
    )
    return TraceError(
        f"{file}: read {format_bytes(size)} of JSON {where}, over {limit_hint('event_bytes', limit_bytes)}; "
        "real events are a few KB, so the file is damaged or a decompression bomb"
    )


def _absolute(message: str, first_event: int) -> str:
    """msgspec's ``$[i]`` of a chunk as the event's index in the file's event list."""
    return re.sub(r"\$\[(\d+)\]", lambda m: f"$.traceEvents[{first_event + int(m.group(1))}]", message)


def _decode_chunk(
    chunk: memoryview | bytes | bytearray, file: Path, first_event: int, *, array_doc: bool
) -> list[Any]:
    """A chunk of events: lean tagged structs, else (an unknown phase) the permissive structs.

    A value of the wrong type is a TraceError naming the event's index in the file (a chunk is
    whole events, so such an error is the file's); a syntax error is StreamingFallback (the
    split may have been inside a string: the whole-file decode says which).
    """
    try:
        return _EVENTS_DECODER.decode(chunk)
    except msgspec.ValidationError:
        pass  # an unknown or missing "ph": the permissive decoder takes any phase
    try:
        return _LIST_DECODER.decode(chunk)
    except msgspec.ValidationError as exc:
        if array_doc and first_event == 0:
            raise StreamingFallback from None  # a top-level list that may be no trace at all
        raise TraceError(
            f"{file}: an event has a value of the wrong type ({_absolute(str(exc), first_event)})"
        ) from None


def stream_file(file: Path, columns: EventSink) -> Document:
    """Decode the events chunk by chunk into ``columns``; return the document's other fields.

    Linear in the file: each byte is searched for an event boundary once (plus a short overlap)
    and decoded once. Memory holds one chunk, or one event when an event is longer than a chunk,
    up to ``NBT_MAX_EVENT_BYTES`` (a TraceError past it). Any other surprise (no ``traceEvents``
    key, a chunk that does not parse, a truncated stream) raises StreamingFallback, and the file
    is decoded whole, which names the exact problem.
    """
    with json_depth():
        try:
            return _stream(file, columns, limit("event_bytes"))
        except RecursionError:
            raise too_deep(file, TraceError, "trace's JSON") from None


def _stream(file: Path, columns: EventSink, max_event: int) -> Document:
    pieces = _pieces(file)
    data = bytearray()
    seen = 0
    searched = 0  # data[:searched] holds no "traceEvents" key
    header: bytes | None = None  # the document before "traceEvents"; None: a top-level list
    for piece in pieces:
        seen += len(piece)
        # A UTF-8 byte order mark, which JSON readers may skip, is skipped.
        start = len(BOM) if seen == len(piece) and piece.startswith(BOM) else 0
        # Leading whitespace is dropped as it comes, so a file of nothing else costs no memory.
        data += piece[start:] if data else piece[start:].lstrip(_WS)
        if data[:1] == b"[":  # a top-level list of events (the "chrome-array" form)
            break
        key = data.find(_KEY, max(0, searched - len(_KEY)))
        if key < 0:
            searched = len(data)
            if len(data) > max_event:
                raise NotATrace(
                    f"no 'traceEvents' key in its first {format_bytes(len(data))} "
                    f"({LIMITS['event_bytes'].env} bounds how far it is looked for)"
                )
            continue
        j = key + len(_KEY)
        while j < len(data) and data[j] in _WS:
            j += 1
        if j < len(data) and data[j] == 0x3A:  # ":"
            j += 1
            while j < len(data) and data[j] in _WS:
                j += 1
        if j >= len(data) - 1:
            if len(data) > max_event:
                raise _no_boundary(file, len(data), max_event, header=True)
            continue  # need more bytes to see the "["
        if data[j] != 0x5B:  # "["
            raise StreamingFallback
        header = bytes(data[:key])
        del data[:j]  # data starts with the array's "["
        break
    else:
        if seen and not data:
            raise TraceError(_only_whitespace(file, seen))
        raise StreamingFallback
    # A bytearray so that chunks are decoded in place: the "," after a chunk's last event is
    # turned into "]" for the decode, then into the next chunk's "[" (no copies of the JSON).
    events = 0  # events decoded so far (for the index in error messages)
    searched = 0  # data[:searched] was searched for an event boundary and holds none

    def cut() -> None:
        """Decode the events before the last boundary of ``data`` (if any); past the limit, an error."""
        nonlocal events, searched
        split = _event_split(data, max(0, searched - _SPLIT_OVERLAP))
        if split >= 0:
            close = data.rindex(b",", 0, split)
            data[close] = 0x5D  # "]"
            with memoryview(data) as view, view[: close + 1] as chunk:
                decoded = _decode_chunk(chunk, file, events, array_doc=header is None)
            events += len(decoded)
            columns.add(decoded)
            del decoded
            data[close] = 0x5B  # "["
            del data[:close]
        searched = len(data)  # the boundary found was the last one, or there was none
        if len(data) > max_event:
            raise _no_boundary(file, len(data), max_event, header=False)

    try:
        for piece in pieces:
            data += piece
            if len(data) >= min(CHUNK_BYTES, max_event):
                cut()
        if len(data) > max_event:
            cut()  # the last events and the document's end must be within the limit too
        return _decode_tail(file, header, data, columns, events)
    except (msgspec.DecodeError, UnicodeDecodeError):
        raise StreamingFallback from None


def _decode_tail(
    file: Path, header: bytes | None, data: bytearray, columns: EventSink, events: int
) -> Document:
    """The last events, the array's ``]`` and the document's trailing fields, in one decode."""
    if header is None:
        decoded = _decode_chunk(data, file, events, array_doc=True)
        columns.add(decoded)
        return Document(schemaVersion="chrome-array")
    text = header + _KEY + b":" + data
    del data[:]
    tail: _TailDocument | Document
    try:
        tail = _TAIL_DECODER.decode(text)
    except msgspec.ValidationError:
        try:  # an unknown phase among the last events, or a document field of another type
            tail = _META_DECODER.decode(text)
        except msgspec.ValidationError as exc:
            raise TraceError(
                f"{file}: an event has a value of the wrong type ({_absolute(str(exc), events)})"
            ) from None
    if text.count(_KEY) > 1:
        refuse_duplicate_events(file, text)
    columns.add(tail.traceEvents or [])
    return Document(
        schemaVersion=tail.schemaVersion,
        distributedInfo=tail.distributedInfo,
        deviceProperties=tail.deviceProperties,
        baseTimeNanoseconds=tail.baseTimeNanoseconds,
        displayTimeUnit=tail.displayTimeUnit,
    )
