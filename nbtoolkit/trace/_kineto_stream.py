"""Streaming a trace file's events: a few MB of JSON at a time, linear in the file, bounded in memory.

The file is inflated a few MB at a time in a background thread (zlib releases the GIL); each
piece is cut at an event boundary (``},{``) and decoded in place by the decoders of
:mod:`nbtoolkit.trace._kineto_json`; :func:`stream_file` hands each decoded chunk to a sink (the
column builder of :mod:`nbtoolkit.trace._kineto_columns`), so memory holds one piece of JSON, not
the document.

Linear: each byte is searched for an event boundary once (a reversed regex over the bytes not
yet searched, plus a short overlap) and decoded once; the document's end (the last events and
the fields after the list) is decoded in one go. A boundary found inside a string (an event
name holding ``},{``) makes the chunk's decode stop short ("truncated"): the chunk is decoded
again once it has doubled, so even a name made of such boundaries costs linear time.

Bounded: at most ``NBT_MAX_EVENT_BYTES`` are held without a boundary (one event, the space
between two events, the document before its ``traceEvents`` list), with a TraceError naming
the limit past it. Errors are worded here, with the byte or event where they are, rather than
by reading the file again whole; only a document this reader cannot place (no ``traceEvents``
list found, and the file under that limit) raises :class:`StreamingFallback` for the
whole-file decode.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from nbtoolkit.core.bounded import (
    CorruptGzip,
    inflate,
    json_depth,
    limit,
    limit_hint,
    max_read_bytes,
    open_regular,
    read_ahead,
    read_chunks,
    too_deep,
)
from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.units import format_bytes
from nbtoolkit.trace import _kineto_json as kj
from nbtoolkit.trace._kineto_json import Document, EventSink, NotATrace, StreamingFallback
from nbtoolkit.trace._kineto_wording import BOM, refuse_duplicate_events, syntax_error

__all__ = ["stream_file"]

_WS = b" \t\r\n"
# "},{" between two events, read backwards (the last boundary of a buffer is the first match of
# its reversed bytes): one regex search in C, linear in the bytes searched whatever they hold.
_SPLIT_REVERSED = re.compile(rb"\{[ \t\r\n]*,[ \t\r\n]*\}")
# A boundary straddling the end of what was searched before is found again from this far back
# (a boundary with more whitespace than this across that end is missed: the next one is used).
_SPLIT_OVERLAP = 4096
_KEY = kj._KEY
_KEY_TAIL = re.compile(rb'"traceEvents"[ \t\r\n]*(:[ \t\r\n]*)?')


def stream_file(file: Path, columns: EventSink) -> Document:
    """Decode the events chunk by chunk into ``columns``; return the document's other fields.

    Raises TraceError for what is wrong with the file (the limit, the byte or the event named),
    NotATrace for JSON that is not a trace, StreamingFallback for a document to decode whole.
    """
    with json_depth():
        try:
            return _Stream(file, columns, limit("event_bytes")).run()
        except RecursionError:
            raise too_deep(file, TraceError, "trace's JSON") from None


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


def _top_level(data: bytearray, key: int) -> bool:
    """Whether the key at ``key`` is one of the document's own (not of an object nested in it).

    The document's start, closed right after that key, is valid JSON only then.
    """
    try:
        msgspec.json.decode(bytes(data[:key]) + b'"traceEvents": []}')
    except msgspec.DecodeError:
        return False
    return True


def _absolute(message: str, first_event: int, *, array_doc: bool) -> str:
    """msgspec's ``$[i]`` of a chunk as the event's index in the file's event list."""
    where = "$" if array_doc else "$.traceEvents"
    return re.sub(r"\$\[(\d+)\]", lambda m: f"{where}[{first_event + int(m.group(1))}]", message)


class _Stream:
    """One file's pieces, the bytes held (``data``) and what was decoded of them."""

    def __init__(self, file: Path, columns: EventSink, max_event: int) -> None:
        self.file, self.columns, self.max_event = file, columns, max_event
        self.data = bytearray()
        self.seen = 0  # bytes of the (inflated) file received; data[0] is byte seen - len(data)
        self.header: bytes | None = None  # the document before "traceEvents"; None: a top-level list
        self.events = 0  # events decoded so far (for the index in error messages)
        self.searched = 0  # data[:searched] holds no event boundary (or no key, before the list)
        self.retry_at = 0  # after a boundary inside a string: decode again at this many bytes

    def run(self) -> Document:
        pieces = _pieces(self.file)
        if not self._find_list(pieces):
            if self.seen and not self.data:
                raise TraceError(kj._only_whitespace(self.file, self.seen))
            if self.seen > self.max_event:  # never read whole: say what was not found
                raise NotATrace(f"no 'traceEvents' list in its {format_bytes(self.seen)} of JSON")
            raise StreamingFallback
        self.searched = 0
        data = self.data
        for piece in pieces:
            self.seen += len(piece)
            data += piece
            if len(data) >= min(kj.CHUNK_BYTES, self.max_event):
                self._cut()
        if len(data) > self.max_event:
            self._cut()  # the last events and the document's end must be within the limit too
        return self._tail()

    def _find_list(self, pieces: Iterator[bytes]) -> bool:
        """Read up to the events list's ``[`` (``data`` then starts with it); False: none found."""
        data = self.data
        for piece in pieces:
            self.seen += len(piece)
            # A UTF-8 byte order mark, which JSON readers may skip, is skipped.
            start = len(BOM) if self.seen == len(piece) and piece.startswith(BOM) else 0
            # Leading whitespace is dropped as it comes, so a file of nothing else costs no memory.
            data += piece[start:] if data else piece[start:].lstrip(_WS)
            if data[:1] == b"[":  # a top-level list of events (the "chrome-array" form)
                return True
            while (key := data.find(_KEY, max(0, self.searched - len(_KEY)))) >= 0:
                tail = _KEY_TAIL.match(data, key)
                assert tail is not None
                if tail.end() == len(data):  # only whitespace after the key so far: keep it short
                    data[key + len(_KEY) :] = b":" if tail.group(1) else b""
                    self.searched = key
                    break
                if tail.group(1) and data[tail.end()] == 0x5B and _top_level(data, key):
                    self.header = bytes(data[:key])
                    del data[: tail.end()]
                    return True
                self.searched = tail.end()  # the key's text elsewhere (a value, a nested key): look further
            else:
                self.searched = len(data)
            if len(data) > self.max_event:  # in a folder, skipped as any JSON that is no trace
                raise NotATrace(
                    f"no 'traceEvents' list in its first {format_bytes(len(data))} of JSON, over "
                    f"{limit_hint('event_bytes', self.max_event)} (real traces start their list within "
                    "a few KB)"
                )
        return False

    def _cut(self) -> None:
        """Decode the events before the last boundary of ``data`` (if any); past the limit, an error."""
        data = self.data
        split = _event_split(data, max(0, self.searched - _SPLIT_OVERLAP))
        self.searched = len(data)  # the boundary found is the last one, or there is none
        if split >= 0 and len(data) >= self.retry_at:
            close = data.rindex(b",", 0, split)
            data[close] = 0x5D  # "]"
            try:
                with memoryview(data) as view, view[: close + 1] as chunk:
                    decoded = self._decode(chunk)
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                data[close] = 0x2C  # ","
                if isinstance(exc, UnicodeDecodeError) or "truncated" not in str(exc).lower():
                    raise syntax_error(self.file, data, exc, self.seen - len(data)) from None
                # The boundary was inside a string (or a nested list): try again when twice as long.
                self.retry_at = 2 * len(data)
            else:
                self.events += len(decoded)
                self.columns.add(decoded)
                del decoded
                data[close] = 0x5B  # "["
                del data[:close]
                self.searched, self.retry_at = len(data), 0
        if len(data) > self.max_event:
            raise TraceError(
                f"{self.file}: read {format_bytes(len(data))} of JSON without an event boundary (one "
                f"event, or the space between two events, is that long), over "
                f"{limit_hint('event_bytes', self.max_event)}; real events are a few KB, so the file is "
                "damaged or a decompression bomb"
            )

    def _decode(self, chunk: memoryview | bytearray) -> list[Any]:
        """A chunk of events: lean tagged structs, else (an unknown phase) the permissive structs.

        A value of the wrong type is a TraceError naming the event's index in the file (a chunk
        is whole events, so such an error is the file's), as the whole-file decode words it.
        """
        try:
            return kj._EVENTS_DECODER.decode(chunk)
        except msgspec.ValidationError:
            pass  # an unknown or missing "ph": the permissive decoder takes any phase
        try:
            return kj._LIST_DECODER.decode(chunk)
        except msgspec.ValidationError as exc:
            detail = _absolute(str(exc), self.events, array_doc=self.header is None)
            raise TraceError(f"{self.file}: an event has a value of the wrong type ({detail})") from None

    def _tail(self) -> Document:
        """The last events, the array's ``]`` and the document's trailing fields, in one decode."""
        data, offset = self.data, self.seen - len(self.data)
        if self.header is None:
            try:
                self.columns.add(self._decode(data))
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                raise syntax_error(self.file, data, exc, offset) from None
            return Document(schemaVersion="chrome-array")
        prefix = self.header + _KEY + b":"
        text = prefix + data
        del data[:]
        tail: Any
        try:
            try:
                tail = kj._TAIL_DECODER.decode(text)
            except msgspec.ValidationError:  # an unknown phase among the last events
                tail = kj._META_DECODER.decode(text)
        except msgspec.ValidationError as exc:
            detail = _absolute(str(exc), self.events, array_doc=False)
            raise TraceError(f"{self.file}: an event has a value of the wrong type ({detail})") from None
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise syntax_error(self.file, text, exc, offset - len(prefix)) from None
        if text.count(_KEY) > 1:
            refuse_duplicate_events(self.file, text)
        self.columns.add(tail.traceEvents or [])
        return Document(
            schemaVersion=tail.schemaVersion,
            distributedInfo=tail.distributedInfo,
            deviceProperties=tail.deviceProperties,
            baseTimeNanoseconds=tail.baseTimeNanoseconds,
            displayTimeUnit=tail.displayTimeUnit,
        )


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
        raise StreamingFallback  # the whole-file read says it is no gzip, reading nothing
    return _read(fh, file)


def _read(fh: BinaryIO, file: Path) -> Iterator[bytes]:
    with fh:
        yield from read_chunks(fh, file, TraceError, kj.CHUNK_BYTES)


def _inflate(fh: BinaryIO, file: Path, limit_bytes: int) -> Iterator[bytes]:
    with fh:
        try:
            yield from inflate(fh, file, TraceError, kj.CHUNK_BYTES, limit=limit_bytes)
        except CorruptGzip as exc:
            raise TraceError(
                f"{file}: the gzip stream is truncated or corrupt ({exc}); copy the file again"
            ) from None
