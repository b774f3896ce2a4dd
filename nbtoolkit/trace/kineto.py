"""Read PyTorch profiler (Kineto) Chrome traces into a :class:`~nbtoolkit.trace.trace.Trace`.

``load_trace(path)`` takes one ``.json``/``.json.gz`` file, or a folder with one file per
rank (or a Trace, returned as it is). This module finds the files and assembles the
ranks; the work per file is split by job:

- :mod:`nbtoolkit.trace._kineto_stream`: the file's JSON, inflated and decoded a few MB at a
  time into the typed structs of :mod:`nbtoolkit.trace._kineto_json` (or decoded whole by its
  permissive decoder when the document cannot be placed, which then names the problem);
- :mod:`nbtoolkit.trace._kineto_columns`: the structs turned into the rank's columnar
  events and collectives frames;
- :mod:`nbtoolkit.trace._kineto_ranks`: the rank, world, backend and device type.

ProfilerStep labels are checked (and their step numbers kept, as ``Trace.steps``) while
loading, with :mod:`nbtoolkit.core.profiler_steps`.
The cyclic garbage collector is paused while loading (the objects form no cycles).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from nbtoolkit.core.bounded import read_limit
from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.inputs import is_path, wrong_type
from nbtoolkit.core.paths import user_path
from nbtoolkit.core.profiler_steps import host_steps, steps_table
from nbtoolkit.trace._kineto_columns import EventColumns
from nbtoolkit.trace._kineto_json import NotATrace, StreamingFallback, decode_document, read_bytes
from nbtoolkit.trace._kineto_ranks import check_same_job, detect_device_type, read_rank_info
from nbtoolkit.trace._kineto_stream import stream_file
from nbtoolkit.trace.trace import Trace

if TYPE_CHECKING:
    from os import PathLike

    import pandas as pd

    from nbtoolkit.trace.records import RankInfo

__all__ = ["load_rank_file", "load_trace"]

_TRACE_SUFFIXES = (".json", ".json.gz")


# ----------------------------------------------------------------------------- public
def load_trace(path: str | PathLike[str] | Trace, *, max_bytes: int | str | None = None) -> Trace:
    """Load a Kineto/Chrome trace file, or a folder of per-rank trace files, into a Trace.

    Args:
        path: a ``.json`` or ``.json.gz`` trace, or a folder holding one trace per rank.
            Files in the folder that are not ``.json``/``.json.gz``, and JSON files that
            are not profiler traces (e.g. execution traces), are skipped and named in
            ``Trace.notes``. A :class:`Trace` (already loaded) is returned unchanged, so
            callers that take "a trace or where to find one" need not tell them apart.
        max_bytes: stop reading a file past this many (inflated) bytes; default the environment
            variable ``NBT_MAX_READ_BYTES``, else 8 GiB (:mod:`nbtoolkit.core.bounded`).

    Raises:
        TraceError: the path is missing or not a regular file or folder (a FIFO, a device), a
            file inflates past the read limit, the folder holds no trace, a file is truncated,
            corrupt or not a trace, two files claim the same rank, ranks of a folder disagree
            on their job (world size, backend, process groups), ranks use different trace
            formats, a ProfilerStep label is malformed, an event has a missing or negative
            duration, a number overflows int64, or a name is not valid UTF-8; an event (or the space
            between two) is longer than ``NBT_MAX_EVENT_BYTES``, values nest deeper than
            ``NBT_MAX_JSON_DEPTH``, or the document has two ``traceEvents`` lists (the limits of
            :data:`nbtoolkit.core.bounded.LIMITS`; each error names the one it met).
        NbtUsageError: ``path`` is neither a path nor a Trace.
    """
    if isinstance(path, Trace):
        return path
    if not is_path(path):
        raise wrong_type(
            "load_trace()", "the path of a .json/.json.gz trace or of a folder of them, or a Trace", path
        )
    # The loader allocates hundreds of thousands of small objects that form no cycles; the
    # cyclic garbage collector would rescan them again and again (a third of the load time).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with read_limit(max_bytes):
            return _load(user_path(path, error=TraceError))
    finally:
        if gc_was_enabled:
            gc.enable()


def load_rank_file(file: Path) -> Trace:
    """One trace file as a one-rank Trace; NotATrace (not a TraceError) for valid JSON that is no trace.

    What the parallel readers (:mod:`nbtoolkit.trace.summarize_folder`) call per file: they tell a
    stray JSON file (a note) from a corrupt trace (a failed rank).
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()  # see load_trace
    try:
        with read_limit(None):
            loaded = _load_file(file)
    finally:
        if gc_was_enabled:
            gc.enable()
    trace = Trace(
        events={loaded.info.rank: loaded.events},
        info={loaded.info.rank: loaded.info},
        collectives={loaded.info.rank: loaded.collectives},
    )
    trace._steps = steps_table([loaded.steps])
    return trace


def _load(root: Path) -> Trace:
    if not root.exists():
        raise TraceError(f"{root}: no such file or folder; give a .json/.json.gz trace or a folder of them")
    notes: list[str] = []
    if root.is_dir():
        files, skipped = _trace_files(root)
        if skipped:
            notes.append(
                f"skipped {len(skipped)} file(s) that are not .json/.json.gz traces: "
                + ", ".join(sorted(skipped)[:10])
                + (" ..." if len(skipped) > 10 else "")
            )
        if not files:
            raise TraceError(
                f"{root}: folder holds no .json/.json.gz trace files"
                + (f" (only {', '.join(sorted(skipped)[:5])})" if skipped else " (it is empty)")
            )
        loaded = []
        for file in files:
            try:
                loaded.append(_load_file(file))
            except NotATrace as exc:
                notes.append(f"skipped {file.name}: {exc}")
        if not loaded:
            raise TraceError(
                f"{root}: none of the {len(files)} JSON file(s) is a profiler trace ({notes[-1]})"
            )
    else:
        try:
            loaded = [_load_file(root)]
        except NotATrace as exc:
            raise TraceError(f"{root}: {exc}") from None

    events: dict[int, pd.DataFrame] = {}
    collectives: dict[int, pd.DataFrame] = {}
    info: dict[int, RankInfo] = {}
    for rank_info, frame, coll, _ in loaded:
        rank = rank_info.rank
        if rank in info:
            raise TraceError(
                f"{root}: rank {rank} appears twice ({Path(info[rank].source).name} and "
                f"{Path(rank_info.source).name}); keep one trace per rank in the folder, or load the "
                "files one by one"
            )
        info[rank], events[rank], collectives[rank] = rank_info, frame, coll
    formats = {i.trace_format for i in info.values()}
    if len(formats) > 1:
        detail = "; ".join(
            f"rank {r}: {info[r].trace_format} ({Path(info[r].source).name})" for r in sorted(info)
        )
        raise TraceError(f"{root}: ranks have different trace formats ({detail}); load them separately")
    check_same_job(root, info)
    trace = Trace(events=events, info=info, collectives=collectives, notes=notes)
    # The step numbers were parsed while checking the labels: keep them, Trace.steps need not parse again.
    trace._steps = steps_table(file.steps for file in loaded)
    return trace


# ---------------------------------------------------------------------------- reading
def _trace_files(folder: Path) -> tuple[list[Path], list[str]]:
    files, skipped = [], []
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.name.endswith(_TRACE_SUFFIXES) and not entry.name.startswith("."):
            files.append(entry)
        elif not entry.name.startswith("."):
            skipped.append(entry.name)
    return files, skipped


class _RankFile(NamedTuple):
    """One trace file, read: the rank's metadata, events, collectives and host ProfilerSteps."""

    info: RankInfo
    events: pd.DataFrame
    collectives: pd.DataFrame
    steps: pd.DataFrame


def _load_file(file: Path) -> _RankFile:
    columns = EventColumns(file)
    try:
        doc = stream_file(file, columns)
    except StreamingFallback:
        columns = EventColumns(file)
        doc = decode_document(file, read_bytes(file))
        events = doc.traceEvents or []
        doc.traceEvents = None
        columns.add(events)
        del events
    rank_info = read_rank_info(file, doc)
    skipped = columns.unknown_phase_note()
    if skipped:
        rank_info.notes.append(skipped)
    if not columns.rows:
        raise TraceError(
            f"{file}: the trace has no events (no complete 'X' events); the profiler recorded nothing"
        )
    rank_info.thread_names = columns.threads
    frame, coll = columns.frame()
    steps = host_steps(rank_info.rank, frame, source=str(file))  # a malformed label is a TraceError here
    rank_info.device_type = detect_device_type(rank_info, frame)
    return _RankFile(rank_info, frame, coll, steps)
