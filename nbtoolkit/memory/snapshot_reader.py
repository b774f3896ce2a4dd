"""Read CUDA caching-allocator snapshots and torch's memory-timeline exports.

``load_memory_snapshot(path)`` reads what ``torch.cuda.memory._snapshot()`` /
``_dump_snapshot()`` wrote (or takes that dict, or a loaded snapshot, as it is), in every
format seen in the wild:

* the newest dict format (``segments``, ``device_traces`` with ``time_us``,
  ``compile_context``, ``user_metadata``; ``external_annotations``; ``allocator_settings``),
* the older dict format without ``time_us`` in trace entries,
* the legacy bare list of segments (what ``torch.cuda.memory_snapshot()`` returned),
* blocks that carry ``history`` instead of ``frames``/``requested_size`` (oldest format).

Pickles can run code when loaded. These are loaded with a restricted unpickler that
resolves no global at all: only the pickle opcodes for builtin containers and scalars
(dict, list, tuple, str, bytes, int, float, bool, None) can succeed; a pickle that
names any module attribute (``os.system``, ``builtins.eval``, a torch class...) is
refused before anything is imported or called.

Bounded: files are opened and read through :mod:`nbtoolkit.core.bounded` (regular files only,
at most ``NBT_MAX_READ_BYTES`` inflated). Unpickling itself cannot grow past the pickle: every
opcode makes at most one object, so the objects are bounded by the file's size. What can grow
is what a pickle *shares*: a 400 KB pickle whose segments list holds the same block list
ten thousand times (memo references) unpickles to a few objects but would become millions of
rows. So before any row is built the rows the snapshot stands for (segments, blocks, trace
entries, annotations) are counted, without expanding anything, and a snapshot over
``NBT_MAX_SNAPSHOT_ROWS`` (default 5 million, about five times the largest real snapshot of
a full 8-GPU history; a row costs a few hundred bytes) is refused with a SnapshotError saying
how to raise it (that variable, or ``max_rows=``).

``load_memory_timeline(path)`` reads the raw JSON of the profiler's
``export_memory_timeline`` (``.raw``/``.json``, optionally gzipped) or a timeline saved
by ``MemoryTimeline.save``.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.bounded import read_all, read_limit
from nbtoolkit.core.errors import NbtError, NbtUsageError, SnapshotError
from nbtoolkit.core.inputs import is_path, wrong_type
from nbtoolkit.core.paths import user_path
from nbtoolkit.core.units import parse_bytes
from nbtoolkit.memory.schema import TORCH_CATEGORIES
from nbtoolkit.memory.snapshot_columns import SnapshotFilter
from nbtoolkit.memory.snapshot_pickle import UNPICKLING_ERRORS, RefusingUnpickler, corrupt_pickle
from nbtoolkit.memory.snapshot_stream import stack_limits

if TYPE_CHECKING:
    from nbtoolkit.memory.snapshot import MemorySnapshot
    from nbtoolkit.memory.timeline import MemoryTimeline

__all__ = [
    "DEFAULT_MAX_SNAPSHOT_ROWS",
    "ENV_MAX_SNAPSHOT_ROWS",
    "STREAM_ABOVE_BYTES",
    "load_memory_snapshot",
    "load_memory_timeline",
    "restricted_loads",
]

ENV_MAX_SNAPSHOT_ROWS = "NBT_MAX_SNAPSHOT_ROWS"
DEFAULT_MAX_SNAPSHOT_ROWS = 5_000_000


def restricted_loads(data: bytes, *, name: str = "<bytes>") -> Any:
    """Unpickle ``data`` allowing only builtin containers and scalars.

    Raises ``SnapshotError`` naming ``name`` when the pickle is corrupt or truncated, and
    ``SnapshotError("refused: the pickle tries to load <module.name>")`` when it tries to
    import anything; in that case nothing from the pickle has been executed.
    """
    try:
        return RefusingUnpickler(io.BytesIO(data)).load()
    except SnapshotError as exc:
        raise SnapshotError(f"{name}: {exc}") from None
    except UNPICKLING_ERRORS as exc:
        raise corrupt_pickle(name, exc) from None


def _read_bytes(path: Path, *, what: str = "memory snapshot") -> bytes:
    if not path.exists():
        raise SnapshotError(f"no {what} at {path}: check the path")
    if path.is_dir():
        raise SnapshotError(f"{path} is a folder; pass one {what} file")
    return read_all(
        path,
        SnapshotError,
        what,
        on_corrupt_gzip=lambda detail: SnapshotError(
            f"{path} is a corrupt or truncated gzip file ({detail}); copy or dump the {what} again"
        ),
    )


def _max_rows(max_rows: object) -> int:
    """The row budget: ``max_rows=``, else ``NBT_MAX_SNAPSHOT_ROWS``, else the default."""
    given = max_rows if max_rows is not None else os.environ.get(ENV_MAX_SNAPSHOT_ROWS, "").strip() or None
    if given is None:
        return DEFAULT_MAX_SNAPSHOT_ROWS
    try:
        value = parse_bytes(given, what="max_rows")  # plain numbers, and "5e6"
    except NbtError:
        value = 0
    if value <= 0:
        source = "max_rows" if max_rows is not None else ENV_MAX_SNAPSHOT_ROWS
        raise NbtUsageError(f"{source}={given!r} must be a positive number of rows")
    return value


def _count_rows(snapshot: dict[str, Any], source: str, limit: int) -> None:
    """Refuse a snapshot that stands for more than ``limit`` rows, counting without expanding.

    Only list lengths are read (a list shared a thousand times is counted a thousand times,
    as building the rows would), so a pickle of shared references is refused in microseconds.
    """
    rows = 0

    def length(value: Any) -> int:
        return len(value) if isinstance(value, (list, tuple)) else 0

    longest = 0  # the most frames of one stack (a 10**7-frame list is refused before it is read)

    def frames_of(entries: Any) -> None:
        nonlocal longest
        if isinstance(entries, (list, tuple)) and rows <= limit:
            lists = [e.get("frames") for e in entries if type(e) is dict]
            longest = max([longest, *(len(f) for f in lists if type(f) is list)])

    segments = snapshot.get("segments")
    rows += length(segments)
    for segment in segments if isinstance(segments, (list, tuple)) else []:
        if isinstance(segment, dict):
            rows += length(segment.get("blocks"))
            frames_of(segment.get("blocks"))
        if rows > limit:
            break
    traces = snapshot.get("device_traces")
    for entries in traces if isinstance(traces, (list, tuple)) else []:
        rows += length(entries)
        frames_of(entries)
        if rows > limit:
            break
    rows += length(snapshot.get("external_annotations"))
    if rows > limit:
        raise SnapshotError(
            f"{source} stands for more than {limit:,} rows (segments, blocks and trace entries, "
            "counting lists the pickle shares each time they are referenced); real snapshots are far "
            "smaller, so it is likely a pickle bomb. If it is real, raise the budget with max_rows= "
            f"or the environment variable {ENV_MAX_SNAPSHOT_ROWS}"
        )
    if longest > stack_limits().frames:
        raise SnapshotError(
            f"{source} has a stack of {longest:,} frames, over {stack_limits().frames_hint}; real "
            "stacks have hundreds, so it is damaged or a pickle bomb"
        )


def _looks_like_json(data: bytes) -> bool:
    head = data[:64].lstrip()
    return head[:1] in (b"[", b"{")


def _as_snapshot_dict(raw: Any, source: str) -> dict[str, Any]:
    """Normalize the three top-level shapes into one dict with ``segments`` and ``device_traces``."""
    if isinstance(raw, list):  # the legacy bare list of segments
        return {"segments": raw, "device_traces": [], "legacy_segment_list": True}
    if isinstance(raw, dict) and "segments" in raw:
        out = dict(raw)
        out.setdefault("device_traces", [])
        return out
    kind = type(raw).__name__
    keys = sorted(raw)[:8] if isinstance(raw, dict) else []
    raise SnapshotError(
        f"{source} holds a {kind}{f' with keys {keys}' if keys else ''}, not a CUDA allocator snapshot "
        "(expected a dict with 'segments' or a list of segments from torch.cuda.memory._snapshot())"
    )


def _from_raw(
    raw: Any,
    source: str,
    *,
    in_memory: bool = False,
    max_rows: object = None,
    keep: SnapshotFilter | None = None,
) -> MemorySnapshot:
    """The snapshot from unpickled data; ``source`` names it in errors (and in the result, from a file)."""
    from nbtoolkit.memory.snapshot import MemorySnapshot

    snapshot = _as_snapshot_dict(raw, source)
    _count_rows(snapshot, source, _max_rows(max_rows))
    try:
        built = MemorySnapshot.from_dict(
            snapshot, source=source, keep=keep, stack_limits=stack_limits()
        )
        if in_memory:
            built.source = ""
        return built
    # RecursionError: a value nested thousands deep, which str() cannot print
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        IndexError,
        RecursionError,
        OverflowError,
    ) as exc:
        detail = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
            detail = "a number in it has more than 4,300 digits"  # not Python's advice to raise that
        raise SnapshotError(
            f"{source} looks like an allocator snapshot but a field is missing or malformed ({detail})"
        ) from None


def load_memory_snapshot(
    path: str | Path | MemorySnapshot | dict[str, Any] | list[Any],
    *,
    max_bytes: int | str | None = None,
    max_rows: int | None = None,
    devices: int | Iterable[int] | None = None,
    time_range_us: tuple[float | None, float | None] | None = None,
    stream: bool | None = None,
    history: bool = True,
    cache: bool = False,
    cache_dir: str | Path | None = None,
) -> MemorySnapshot:
    """A CUDA allocator snapshot as a :class:`~nbtoolkit.memory.snapshot.MemorySnapshot`, from wherever it is.

    Args:
        path: a file written by ``torch.cuda.memory._dump_snapshot()``, a pickle of
            ``torch.cuda.memory._snapshot()`` / ``torch.cuda.memory_snapshot()``, or a
            folder written by ``MemorySnapshot.save``; or the snapshot itself: the dict
            ``torch.cuda.memory._snapshot()`` returned (or the legacy list of segments), or
            a ``MemorySnapshot`` already loaded (returned as it is). So a notebook variable
            and a file on disk go through the same call (``%nbt snapshot`` takes either).
        max_bytes: stop reading the file past this many (inflated) bytes; default
            ``NBT_MAX_READ_BYTES``, else 8 GiB (:mod:`nbtoolkit.core.bounded`).
        max_rows: refuse a snapshot standing for more segments + blocks + trace entries than
            this; default ``NBT_MAX_SNAPSHOT_ROWS``, else 5 million (see the module docstring).
            When streaming, the rows *kept* count, and the default grows with the file
            (one row per 16 bytes of pickle at most: each row is a dict of its own in the file).
        devices: keep only these devices (an int or several); applied while reading.
        time_range_us: ``(start, end)`` in the snapshot's own ``time_us`` clock (either may be
            None): keep the trace entries and annotations inside it; applied while reading.
            Segments and blocks (the state at the end) are kept whole.
        history: False reads segments and blocks only (what ``stats()`` and the segment views
            need): no trace entries, no annotations. Streaming then stops reading the file
            where the history begins (torch writes it after the segments).
        stream: read the file in bounded memory (:mod:`nbtoolkit.memory.snapshot_stream`): about the
            size of the file at most instead of 5-10 times it. Default: for files over
            ``STREAM_ABOVE_BYTES`` (64 MiB) and gzip files.
        cache: keep what was read as Parquet in ``<file's folder>/.nbt-cache`` and read that
            next time (same file, same filters): a 1 GB pickle takes most of a minute to
            unpickle, its cache about a second (:mod:`nbtoolkit.memory.snapshot_cache`).
        cache_dir: where to cache (implies ``cache=True``), e.g. when the file's folder is read-only.

    Raises:
        SnapshotError: the file is missing, not a regular file, over the read limit, corrupt,
            truncated, not a snapshot, over the row budget, has a negative size, a stack longer
            than ``NBT_MAX_STACK_FRAMES`` or stacks whose text passes ``NBT_MAX_STACK_TEXT_BYTES``,
            or tries to import or call anything when unpickled (it is then never run); the object
            is not a snapshot.
        NbtUsageError: ``path`` is none of the above types.
    """
    from nbtoolkit.memory.snapshot import MemorySnapshot

    if isinstance(path, MemorySnapshot):
        return path
    if isinstance(path, (dict, list)):  # what torch.cuda.memory._snapshot() returns, in memory
        return _from_raw(
            path,
            "the snapshot given",
            in_memory=True,
            max_rows=max_rows,
            keep=_snapshot_filter(devices, time_range_us, history),
        )
    if not is_path(path):
        raise wrong_type(
            "load_memory_snapshot()",
            "a file path, the dict from torch.cuda.memory._snapshot(), or a MemorySnapshot",
            path,
        )
    keep = _snapshot_filter(devices, time_range_us, history)
    source = user_path(path, error=SnapshotError)
    if source.is_dir() and (source / "snapshot.json").is_file():
        return MemorySnapshot.load(source)  # a folder written by MemorySnapshot.save
    if (cache or cache_dir is not None) and source.is_file():
        from nbtoolkit.memory.snapshot_cache import cached_snapshot

        folder = user_path(cache_dir, error=SnapshotError) if cache_dir is not None else None
        return cached_snapshot(
            source, keep, folder, lambda: _read_file(source, keep, max_bytes, max_rows, stream)
        )
    return _read_file(source, keep, max_bytes, max_rows, stream)


def _read_file(
    source: Path, keep: SnapshotFilter, max_bytes: int | str | None, max_rows: int | None, stream: bool | None
) -> MemorySnapshot:
    with read_limit(max_bytes):
        if _should_stream(source, stream):
            from nbtoolkit.memory.snapshot_stream import stream_snapshot

            # Streaming, each kept row was a dict of its own in the file (16 bytes at least).
            budget = (
                _max_rows(max_rows)
                if max_rows is not None or os.environ.get(ENV_MAX_SNAPSHOT_ROWS)
                else max(DEFAULT_MAX_SNAPSHOT_ROWS, source.stat().st_size // 16)
            )
            streamed = stream_snapshot(source, keep=keep, max_rows=budget)
            if streamed is not None:
                return streamed
        data = _read_bytes(source)
    if _looks_like_json(data):
        raise SnapshotError(
            f"{source} is JSON, not an allocator snapshot pickle; if it is the profiler's "
            "export_memory_timeline output, read it with nbt.load_memory_timeline(path)"
        )
    return _from_raw(restricted_loads(data, name=str(source)), str(source), max_rows=max_rows, keep=keep)


#: files larger than this are read streaming by default (load_memory_snapshot(stream=None))
STREAM_ABOVE_BYTES = 64 << 20


def _should_stream(source: Path, stream: bool | None) -> bool:
    if stream is not None:
        return stream and source.is_file()
    try:
        return source.is_file() and source.stat().st_size > STREAM_ABOVE_BYTES
    except OSError:
        return False


def _snapshot_filter(
    devices: int | Iterable[int] | None,
    time_range_us: tuple[float | None, float | None] | None,
    history: bool = True,
) -> SnapshotFilter:
    kept: frozenset[int] | None = None
    if devices is not None:
        try:
            kept = frozenset([int(devices)] if isinstance(devices, int) else (int(d) for d in devices))
        except (TypeError, ValueError):
            raise NbtUsageError(f"devices= takes a device number or several, got {devices!r}") from None
    window: tuple[float | None, float | None] | None = None
    if time_range_us is not None:
        try:
            start, end = time_range_us
            window = (None if start is None else float(start), None if end is None else float(end))
        except (TypeError, ValueError):
            raise NbtUsageError(
                f"time_range_us= takes (start, end) in the snapshot's time_us clock, got {time_range_us!r}"
            ) from None
        if window[0] is not None and window[1] is not None and window[0] > window[1]:
            raise NbtUsageError(f"time_range_us=({start}, {end}) starts after it ends")
    return SnapshotFilter(devices=kept, time_range_us=window, history=bool(history))


# -- torch.profiler export_memory_timeline raw output ----------------------------------

#: torch.profiler._memory_profiler._CATEGORY_TO_INDEX order (index 7 is torch's None); nbtoolkit's
#: own CATEGORIES follow it and add FSDP2's two before "unknown".
_RAW_EXPORT_CATEGORIES = TORCH_CATEGORIES
#: torch.profiler._memory_profiler.Action values.
_RAW_EXPORT_ACTIONS = {1: "preexisting", 2: "alloc", 3: "recategorize", 4: "free"}


def _timeline_from_raw_export(rows: list[Any], source: Path) -> MemoryTimeline:
    import numpy as np
    import pandas as pd

    from nbtoolkit.memory.timeline import MemoryTimeline

    if not rows:
        return MemoryTimeline(events=pd.DataFrame(), source=str(source), device="unknown")
    try:
        array = np.asarray(rows, dtype="int64")
        if array.ndim != 2 or array.shape[1] != 4:
            raise ValueError(f"rows have shape {array.shape[1:]} instead of 4 fields")
    except (ValueError, TypeError, OverflowError) as exc:
        raise SnapshotError(
            f"{source} is JSON but not export_memory_timeline raw output "
            f"([time_ns, action, bytes, category] rows): {exc}"
        ) from None
    times_ns, actions, sizes, categories = array.T
    known = times_ns[times_ns >= 0]
    start = int(known.min()) if len(known) else 0
    # torch puts pre-existing memory at time -1 and plots it at the first timestamp.
    time_us = np.where(times_ns < 0, 0.0, (times_ns - start) / 1e3)
    bad = sorted(set(actions.tolist()) - set(_RAW_EXPORT_ACTIONS))
    if bad or categories.min() < 0 or categories.max() >= len(_RAW_EXPORT_CATEGORIES):
        raise SnapshotError(f"{source}: unknown action or category codes in the raw export ({bad})")
    phase = np.where(times_ns < 0, "before", "other")
    events = pd.DataFrame(
        {
            "time_us": time_us,
            "action": [_RAW_EXPORT_ACTIONS[a] for a in actions.tolist()],
            "delta_bytes": sizes,
            "category": np.asarray(_RAW_EXPORT_CATEGORIES, dtype=object)[categories],
            "tensor": _match_raw_identities(actions.tolist(), sizes.tolist(), categories.tolist()),
            "phase": phase,
        }
    )
    return MemoryTimeline(
        events=events,
        source=str(source),
        device="unknown",
        category_method="torch.profiler (export_memory_timeline raw)",
        notes=[
            (
                "torch's raw export carries no tensor identity, module, stack or device: each free "
                "is matched to the latest live allocation of the same size and category, so "
                "alive_at_peak() is exact in bytes per category but may swap equal-sized tensors"
            )
        ],
    )


def _match_raw_identities(actions: list[int], sizes: list[int], categories: list[int]) -> list[int]:
    """Tensor ids for raw export rows: a negative row closes the latest open (bytes, category) row.

    Positive rows (pre-existing, create, the second half of a recategorize) open an
    allocation; negative rows (destroy, the first half of a recategorize) close the most
    recent open allocation with the same size and category (last in, first out). A
    recategorize's positive half continues the identity its negative half closed.
    """
    open_ids: dict[tuple[int, int], list[int]] = {}
    ids: list[int] = []
    next_id = 0
    carried: int | None = None
    for action, size, category in zip(actions, sizes, categories, strict=True):
        if size < 0:
            stack = open_ids.get((-size, category))
            if stack:
                tensor = stack.pop()
            else:
                tensor = next_id
                next_id += 1
            carried = tensor if action == 3 else None  # 3: INCREMENT_VERSION (a recategorize)
            ids.append(tensor)
        else:
            if carried is not None and action == 3:  # the + half of a recategorize: same tensor
                tensor = carried
            else:
                tensor = next_id
                next_id += 1
            carried = None
            open_ids.setdefault((size, category), []).append(tensor)
            ids.append(tensor)
    return ids


def load_memory_timeline(path: str | Path, *, max_bytes: int | str | None = None) -> MemoryTimeline:
    """Read a memory timeline: torch's ``export_memory_timeline`` raw JSON or a saved ``MemoryTimeline``.

    The raw export (``prof.export_memory_timeline("x.raw.json.gz")``, rows of
    ``[time_ns, action, bytes, category_index]``) keeps torch's categories exactly; times
    become microseconds since the first timed event, pre-existing memory sits at 0.
    ``max_bytes``: as for :func:`load_memory_snapshot`.
    """
    from nbtoolkit.memory.timeline import MemoryTimeline

    if not is_path(path):
        raise wrong_type("load_memory_timeline()", "the path of a memory timeline file", path)
    source = user_path(path, error=SnapshotError)
    if source.suffix == ".parquet":
        return MemoryTimeline.load(source)
    with read_limit(max_bytes):
        data = _read_bytes(source, what="memory timeline")
    if data[:4] == b"PAR1":
        return MemoryTimeline.load(source)
    if not _looks_like_json(data):
        raise SnapshotError(
            f"{source} is neither JSON nor a saved MemoryTimeline; for a CUDA allocator "
            "snapshot pickle use nbt.load_memory_snapshot(path)"
        )
    try:
        rows = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise SnapshotError(f"{source} is corrupt or truncated JSON: {exc}") from None
    if (
        isinstance(rows, list)
        and len(rows) == 2
        and all(isinstance(r, list) for r in rows)
        and (rows[1] and isinstance(rows[1][0], list))
    ):
        raise SnapshotError(
            f"{source} is export_memory_timeline's coalesced [times, sizes] output; export the raw "
            "events instead (a path ending in .raw.json.gz) so that allocations keep their identity"
        )
    if not isinstance(rows, list):
        raise SnapshotError(f"{source} holds a JSON {type(rows).__name__}, not a list of memory events")
    return _timeline_from_raw_export(rows, source)
