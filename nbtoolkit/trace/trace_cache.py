"""The per-rank cache of :func:`nbtoolkit.trace.summarize_folder.summarize_traces`.

A rank's trace file is parsed once; its summary (a few KB of JSON) and its events (Parquet,
through ``Trace.save``) are kept in a cache folder under a key made of the file's name, size
and modification time (nanoseconds) and the cache format, so a file that changes is read
again and a second summary of the same folder reads only the small summaries.

The cache folder is ``<traces folder>/.nbt-cache`` by default (hidden: the loaders skip it),
or the folder the caller names (when the traces' folder is read-only). Nothing here is a
pickle: a cache folder may be shared, and reading it must not run code. Nor does it follow a
link: files and folders are read and written through :mod:`nbtoolkit.core.cache_folder`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.cache_folder import (
    file_identity,
    is_plain_folder,
    read_cached_file,
    usable_cache_folder,
    write_cached_file,
    write_cached_folder,
)
from nbtoolkit.core.errors import TraceError

if TYPE_CHECKING:
    from nbtoolkit.trace.trace import Trace

__all__ = [
    "CACHE_FORMAT",
    "cache_key",
    "read_events",
    "read_summary",
    "write_rank",
]

CACHE_FORMAT = 2


def cache_key(file: Path) -> str:
    """``<name>-<size>-<mtime_ns>-v<format>``: changes whenever the file does."""
    return f"{file_identity(file)}-v{CACHE_FORMAT}"


def read_summary(
    cache_dir: Path, key: str, include_last_step: bool, damaged: list[str] | None = None
) -> dict[str, Any] | None:
    """The cached summary records of a rank file (``TraceSummary.to_records``), or None.

    A cached summary that is damaged or edited (not JSON, or records of the wrong shape:
    ``model.trace_summary.records_problem``) is None too, and why is appended to ``damaged``:
    the trace is read again and the caller says so in a note. A summary that is missing, or
    is a link, a FIFO or too large (``read_cached_file``), is simply not cached.
    """
    from nbtoolkit.trace.records import records_problem

    name = f"{key}.summary.json"
    raw = read_cached_file(cache_dir, name)
    if raw is None:
        return None  # not cached, or nothing a cache may read: not damage
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        problem = f"not valid JSON ({type(exc).__name__})"
        data = None
    else:
        if isinstance(data, dict) and data.get("format") != CACHE_FORMAT:
            return None  # a cache from another version: read the trace again
        if isinstance(data, dict) and data.get("include_last_step") != include_last_step:
            return None
        problem = records_problem(data.get("records")) if isinstance(data, dict) else "not a JSON object"
    if problem:
        if damaged is not None:
            damaged.append(f"{name}: {problem}")
        return None
    records: dict[str, Any] = data["records"]
    return records


def write_rank(cache_dir: Path, key: str, records: dict[str, Any], trace: Trace | None) -> None:
    """Cache a rank's summary records (and events, when given); an unwritable cache is skipped."""
    folder, _ = usable_cache_folder(cache_dir)
    if folder is None:
        return  # a link or a file where the cache should be: the caller has said so in a note
    try:
        if trace is not None:
            write_cached_folder(folder, key, trace.save)
        data = {"format": CACHE_FORMAT, "include_last_step": records["include_last_step"], "records": records}
        # written whole, then renamed: a reader never sees half a summary
        write_cached_file(folder, f"{key}.summary.json", json.dumps(data, default=_plain).encode())
    except OSError:
        return  # a read-only or full disk costs speed next time, not this result


def read_events(cache_dir: Path, key: str) -> Trace | None:
    from nbtoolkit.trace.trace import Trace

    folder = cache_dir / key
    if not is_plain_folder(folder) or not (folder / "trace.json").is_file():
        return None  # missing, or holding a link (which Trace.load would follow)
    try:
        return Trace.load(folder)
    except TraceError:
        return None


def _plain(value: object) -> object:
    """numpy scalars and pandas NA in the frames, as JSON values."""
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    import math

    return None if isinstance(value, float) and math.isnan(value) else str(value)
