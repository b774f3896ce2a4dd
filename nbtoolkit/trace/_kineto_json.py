"""The typed event structs of a Kineto/Chrome trace file's JSON, and its whole-file decode.

msgspec decodes events into typed, GC-untracked structs that declare only the fields the
analyses use (input shapes, stacks and the rest are skipped by the decoder; metadata events
become three-field structs). Files are read a few MB at a time by
:func:`nbtoolkit.trace._kineto_stream.stream_file`, which uses these decoders; a document it
cannot place (no ``traceEvents`` list in its first ``NBT_MAX_EVENT_BYTES``, a file named
``.gz`` that is not gzip) raises :class:`StreamingFallback`, and the caller then reads the file
whole (:func:`read_bytes`, bounded by that size) and decodes it with the permissive
:func:`decode_document`, which either reads it or names the exact problem in a TraceError.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import partial
from itertools import compress
from operator import attrgetter, is_
from pathlib import Path
from typing import Any, Protocol, Union

import msgspec

from nbtoolkit.core.bounded import json_depth, open_regular, read_all, too_deep
from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.units import format_bytes
from nbtoolkit.trace._kineto_wording import BOM, refuse_duplicate_events, syntax_error

__all__ = [
    "CHUNK_BYTES",
    "KNOWN_PHASES",
    "Document",
    "NotATrace",
    "StreamingFallback",
    "decode_document",
    "read_bytes",
    "split_phases",
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
_KEY = b'"traceEvents"'

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
    """The whole file, inflated if gzipped, within the read limit (:mod:`nbtoolkit.core.bounded`)."""
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
    except (UnicodeDecodeError, msgspec.DecodeError) as exc:
        raise syntax_error(file, data, exc) from None
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

