"""Checking what a public function was given: one clear NbtUsageError naming the expected type.

Every public entry that takes a model object (or where to find one) starts with one of these
checks, so that ``nbt.comm_comp_overlap(None)`` says what it needs instead of failing deep
inside with ``AttributeError: 'NoneType' object has no attribute 'ranks'``.

:func:`as_trace` accepts a :class:`~nbtoolkit.trace.trace.Trace` or a path: the analyses live
below the readers (``analysis`` may not import ``io``), so a path is loaded here, with
:func:`nbtoolkit.trace.kineto.load_trace` imported inside the function. That keeps the analyses
taking paths (``nbt.comm_comp_overlap("trace.json")``), but it is the one place an analysis
still reaches a reader, and an edge of the Trace import cycle that tests/foundation/test_layers.py
lists: the public entry points should load the path and hand the analyses a Trace.
"""

from __future__ import annotations

from os import PathLike
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError

if TYPE_CHECKING:
    from nbtoolkit.trace.trace import Trace

__all__ = ["as_trace", "describe", "is_path", "wrong_type"]


def describe(value: Any) -> str:
    """How a given value reads in an error: its type and a short repr (``an int (5)``)."""
    if value is None:
        return "None"
    name = type(value).__name__
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name} ({text})"


def is_path(value: Any) -> bool:
    """A path given as text or a path object (bytes paths are not accepted anywhere)."""
    return isinstance(value, (str, PathLike))


def wrong_type(what: str, expected: str, value: Any) -> NbtUsageError:
    """``what`` takes ``expected``; the error names what it got instead."""
    return NbtUsageError(f"{what} takes {expected}; got {describe(value)}")


def as_trace(value: Any, *, what: str) -> Trace:
    """``value`` as a Trace: a Trace is returned as it is, a path is loaded with ``nbt.load_trace``.

    ``what`` names the caller in the error (``"comm_comp_overlap()"``).
    """
    from nbtoolkit.trace.trace import Trace

    if isinstance(value, Trace):
        return value
    if is_path(value):
        from nbtoolkit.trace.kineto import load_trace

        return load_trace(value)
    raise wrong_type(
        what,
        "a Trace (from nbt.load_trace or nbt.profile) or the path of a .json/.json.gz trace "
        "or a folder of them",
        value,
    )
