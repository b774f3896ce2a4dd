"""The envelope of torch's structured compile records: the record kind and the compile id.

Every record torch's structured trace logger (``torch.__trace``) writes, live or in a
TORCH_TRACE log, carries a JSON *envelope*: context keys (rank, compile id parts,
timestamp ...) and one key naming the record kind (``dynamo_output_graph``,
``compilation_metrics``, ``artifact`` ...), read here the way tlparse reads them.

Compile ids follow tlparse: ``[!a/]x/y[_z]`` (compiled-autograd id, frame id, frame
compile id, attempt; attempt 0 and a missing attempt are both elided).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CompileKey", "as_float", "as_int", "format_compile_id", "out_of_range", "record_kind"]

# Envelope keys that are context, not the record kind (torch/_logging/_internal.py reserves them).
_ENVELOPE_KEYS = frozenset(
    {
        "rank",
        "compiled_autograd_id",
        "frame_id",
        "frame_compile_id",
        "attempt",
        "severity",
        "timestamp",
        "pathname",
        "thread",
        "subgraph_name",
        "has_payload",
        "stack",
    }
)


@dataclass(frozen=True, order=True)
class CompileKey:
    """A compile id as tlparse keys it (attempt normalized to 0 when the frame compile id is known)."""

    compiled_autograd_id: int | None
    frame_id: int | None
    frame_compile_id: int | None
    attempt: int | None

    @classmethod
    def from_envelope(cls, env: Mapping[str, Any]) -> CompileKey:
        fcid = as_int(env.get("frame_compile_id"))
        attempt = as_int(env.get("attempt"))
        if fcid is not None and attempt is None:
            attempt = 0  # tlparse: "Some runtime compile ids don't have attempts"
        return cls(as_int(env.get("compiled_autograd_id")), as_int(env.get("frame_id")), fcid, attempt)

    @property
    def frame_key(self) -> tuple[int | None, int | None, int | None]:
        """The compile without its attempt: what a recompile or a runtime region refers to."""
        return (self.compiled_autograd_id, self.frame_id, self.frame_compile_id)

    def __str__(self) -> str:
        return format_compile_id(
            self.compiled_autograd_id, self.frame_id, self.frame_compile_id, self.attempt
        )


def format_compile_id(
    compiled_autograd_id: int | None, frame_id: int | None, frame_compile_id: int | None, attempt: int | None
) -> str:
    """tlparse's display of a compile id without the brackets: ``0/0``, ``0/0_1``, ``!0/1/0``, ``-/-``."""
    text = f"!{compiled_autograd_id}/" if compiled_autograd_id is not None else ""
    text += f"{'-' if frame_id is None else frame_id}/{'-' if frame_compile_id is None else frame_compile_id}"
    if attempt:
        text += f"_{attempt}"
    return text


_INT64 = range(-(2**63), 2**63)


def as_int(value: Any) -> int | None:
    """An envelope or metrics field as an int, None when absent or not a number (other torch versions).

    A number outside int64 (``frame_id`` 2**63, a line 10**30) is treated as absent too: torch
    writes int64 counters, so such a value is damage, and frames hold these as int64 columns.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        return None
    return number if number in _INT64 else None


def out_of_range(envelope: Mapping[str, Any]) -> dict[str, str]:
    """The envelope's id fields holding a number that is no int64 (read as absent), shown short.

    orjson reads integers past 64 bits as floats (``1e+30``); those count too, as do NaN and inf.
    """
    found = {}
    for key in ("rank", "compiled_autograd_id", "frame_id", "frame_compile_id", "attempt"):
        value = envelope.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and as_int(value) is None:
            text = repr(value)
            found[key] = text if len(text) <= 24 else f"a {len(text)}-digit number"
    return found


def as_float(value: Any) -> float | None:
    """A metrics field as a float, None when absent or not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def record_kind(envelope: Mapping[str, Any]) -> str | None:
    """The record kind: the first key of the envelope that is not context."""
    for key in envelope:
        if key not in _ENVELOPE_KEYS:
            return str(key)
    return None
