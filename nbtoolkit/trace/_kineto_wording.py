"""What is wrong with a trace file's JSON, in words the user can act on.

msgspec says where a document stops parsing ("invalid character (byte 0)"); these helpers look
at the bytes there and say why, for the mistakes seen in the wild: a file compressed twice,
UTF-16 text (Windows tools), a ``NaN`` or ``Infinity`` literal (a writer that printed a float
which is not a number), and a document with two top-level ``traceEvents`` keys, which JSON
decoders read as the last one alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nbtoolkit.core.errors import TraceError

__all__ = ["BOM", "malformed", "refuse_duplicate_events", "shift_bytes", "syntax_error"]

BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark: JSON readers may skip it (RFC 8259), and we do
_AT_BYTE = re.compile(r"\(byte (\d+)\)")
_NON_NUMBERS = (b"-Infinity", b"-NaN", b"Infinity", b"NaN")  # the longest first


def malformed(file: Path, data: bytes | bytearray, detail: str, offset: int = 0) -> TraceError:
    """The TraceError for JSON msgspec could not parse (``detail``: its message).

    ``data``: the bytes msgspec read, which start at byte ``offset`` of the (inflated) file; its
    ``(byte N)`` is reported as the byte of the file.
    """
    if offset == 0 and data[:2] == b"\x1f\x8b":
        return TraceError(
            f"{file}: the file is gzip-compressed twice (what is inside the gzip is gzip again); "
            "decompress it once (gunzip) and load the result"
        )
    if offset == 0 and (
        data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 3 and (data[0] == 0) != (data[1] == 0))
    ):
        return TraceError(
            f"{file}: the file is UTF-16 (or UTF-32) text, not UTF-8 as JSON traces are; convert it, "
            "e.g. iconv -f UTF-16 -t UTF-8"
        )
    found = _AT_BYTE.search(detail)
    if found is not None:
        at = int(found.group(1))
        window = bytes(data[max(0, at - 1) : at + 10])
        literal = next((word for word in _NON_NUMBERS if word in window), None)
        if literal is not None:
            return TraceError(
                f"{file}: the JSON holds the literal {literal.decode()} near byte {offset + at:,}, which "
                "JSON does not allow (its writer printed a float that is not a number); the trace is corrupt"
            )
    return TraceError(f"{file}: the JSON is malformed ({shift_bytes(detail, offset)})")


def syntax_error(file: Path, data: bytes | bytearray, exc: Exception, offset: int = 0) -> TraceError:
    """The TraceError for msgspec's DecodeError (or a UnicodeDecodeError) on ``data``.

    ``data`` starts at byte ``offset`` of the (inflated) file (a chunk of it, when streaming).
    """
    if isinstance(exc, UnicodeDecodeError):
        return TraceError(
            f"{file}: text in the trace is not valid UTF-8 (byte {exc.object[exc.start : exc.end]!r} "
            "in a string); the file is corrupt or was written with another encoding"
        )
    text = shift_bytes(str(exc), offset)
    if "utf-8" in text.lower():
        return TraceError(f"{file}: text in the trace is not valid UTF-8 ({text})")
    if "truncated" in text.lower():
        return TraceError(f"{file}: the JSON is truncated ({text}); the profiler did not finish writing it")
    return malformed(file, data, str(exc), offset)


def shift_bytes(message: str, offset: int) -> str:
    """msgspec's ``(byte N)`` of a part of the file as the byte's offset in the whole (inflated) file."""
    if not offset:
        return message
    return _AT_BYTE.sub(lambda m: f"(byte {offset + int(m.group(1))})", message)


def refuse_duplicate_events(file: Path, text: bytes) -> None:
    """A TraceError when the document has several top-level ``traceEvents`` keys.

    JSON decoders keep the last value of a repeated key, so the events of every earlier
    ``traceEvents`` list would be dropped without a word. Python's json reports every key of
    an object (``object_pairs_hook``); each nested object becomes None, so this takes little
    memory, and callers run it only when the key's text occurs more than once.
    """
    top: list[str] = []

    def keys(pairs: list[tuple[str, Any]]) -> None:
        nonlocal top
        top = [k for k, _ in pairs]  # the top-level object is the last one to close

    try:
        json.loads(text, object_pairs_hook=keys)
    except ValueError:
        return  # the decoder that read the file already said what is wrong
    count = top.count("traceEvents")
    if count > 1:
        raise TraceError(
            f"{file}: the document has {count} 'traceEvents' lists; JSON readers keep only the last "
            "and would drop the events of the others without a word. The file was edited or two "
            "traces were joined: keep one list (or merge their events into one list)"
        )
