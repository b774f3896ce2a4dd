"""Checking what a public function was given: one clear NbtUsageError naming the expected type.

Every public entry that takes a model object (or where to find one) starts with one of these
checks, so that ``nbt.comm_comp_overlap(None)`` says what it needs instead of failing deep
inside with ``AttributeError: 'NoneType' object has no attribute 'ranks'``.

Core imports no feature: a feature's own loader (e.g. :func:`nbtoolkit.trace.api.as_trace`,
a Trace or a path) builds on these.
"""

from __future__ import annotations

from os import PathLike
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["describe", "is_path", "wrong_type"]


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
