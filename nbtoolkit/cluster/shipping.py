"""On each rank: what of a cell's value goes back to the notebook, and how much of it may.

A value travels pickled (Ray's cloudpickle) through the object store to the notebook. One that
does not pickle goes back as a stand-in showing its repr (:class:`Unshippable`); one that pickles
to more than the call's ``max_result_bytes`` (default :data:`RESULT_MAX_BYTES`, like ``fetch``'s
``max_bytes``) is refused with :class:`ResultTooLarge`, naming its size and how to raise the
limit: a cell ending in a 1 GiB tensor would otherwise fill the object store and the notebook's
memory. The value stays on the rank (assign it to keep it). Imports neither ray nor torch at
import time.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESULT_MAX_BYTES", "ResultTooLarge", "Unshippable", "safe_repr", "shippable"]

#: The most bytes (pickled) one rank's value may send back to the notebook. The object store of a
#: local cluster is 256 MiB (``Cluster.local(object_store_mb=...)``): past it Ray spills to disk.
RESULT_MAX_BYTES = 256 * 2**20


class ResultTooLarge(Exception):
    """A cell's value pickles to more than the call's limit (the message names both and the way out)."""


class Unshippable:
    """Stands in for a cell value that cannot be pickled back to the notebook."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _too_large(size: int, limit: int) -> ResultTooLarge:
    from nbtoolkit.core.units import format_bytes

    return ResultTooLarge(
        f"ResultTooLarge: the cell's value is {format_bytes(size)} pickled, more than max_result_bytes "
        f"({format_bytes(limit)}) may send back to the notebook. Keep it on the ranks (assign it to a "
        "variable) and return a summary, write it to a file and cluster.fetch() it, or raise the limit: "
        "cluster.max_result_bytes = N (or cluster.run(..., max_result_bytes=N))"
    )


def shippable(value: Any, max_bytes: int | None = None) -> Any:
    """The value itself if it pickles within ``max_bytes``, a stand-in if it does not pickle.

    Raises :class:`ResultTooLarge` past ``max_bytes`` (None: no limit).
    """
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (str, bytes)):
        size = len(value) if isinstance(value, bytes) or value.isascii() else 4 * len(value)
        if max_bytes is not None and size > max_bytes:
            raise _too_large(size, max_bytes)
        return value
    try:
        from ray import cloudpickle  # the pickler Ray ships results with

        size = len(cloudpickle.dumps(value))
    except Exception as exc:  # any pickling failure: send the repr instead
        return Unshippable(f"{safe_repr(value)}  (not picklable: {type(exc).__name__})")
    if max_bytes is not None and size > max_bytes:
        raise _too_large(size, max_bytes)
    return value


def safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break the cell's result
        text = f"<{type(value).__name__} (repr failed: {exc!r})>"
    return text if len(text) <= 2000 else text[:2000] + "…"
