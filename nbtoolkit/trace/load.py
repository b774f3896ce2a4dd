"""``nbt.load_trace``: one door for a trace file, a few ranks, or thousands of ranks.

A file, or a folder of fewer than :data:`MANY_RANKS` rank files, is read whole in this process
(:func:`nbtoolkit.trace.kineto.load_trace`): every event in memory, every analysis at hand.
A folder of more is read by :func:`nbtoolkit.trace.summarize_folder.summarize_traces` (worker
processes summarize each rank and send back a few KB) and comes back as a
:class:`~nbtoolkit.trace.rank_folder_trace.RankFolderTrace`: the same Trace type, whose overlap,
temporal breakdown, stragglers and step times are answered from the per-rank summaries and
whose events are read per rank when asked for. The numbers are the same either way
(tests/trace/test_rank_folder_trace.py compares them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.inputs import is_path
from nbtoolkit.trace.kineto import load_trace as load_events
from nbtoolkit.trace.trace import Trace

if TYPE_CHECKING:
    from os import PathLike

__all__ = ["MANY_RANKS", "load_trace"]

#: from this many rank files on, a folder is summarized in workers instead of held whole: below
#: it a process holds every event comfortably (the 8-rank DLRM job: ~50 MB) and the analyses
#: that need events (kernel breakdown, critical path, timeline) run without reading a file again
MANY_RANKS = 32


def load_trace(
    path: str | PathLike[str] | Trace,
    *,
    max_bytes: int | str | None = None,
    hold_events: bool | None = None,
    workers: int | None = None,
    cache: bool = False,
    critical_path: bool = False,
) -> Trace:
    """Load a trace file, or a folder of per-rank trace files, into a Trace.

    Args:
        path: a ``.json``/``.json.gz`` trace, a folder holding one trace per rank, or a Trace
            (returned unchanged). Details of what is read and refused:
            :func:`nbtoolkit.trace.kineto.load_trace`.
        max_bytes: stop reading a file past this many (inflated) bytes (default
            ``NBT_MAX_READ_BYTES``, else 8 GiB); applies where every event is held.
        hold_events: ``True`` reads every event into this process; ``False`` summarizes each rank
            in a worker process and reads a rank's events when asked for
            (``trace.events[rank]``); default: hold them below 32 rank files.
        workers: processes that summarize when the events are not held (default: the cores
            this process may use).
        cache: when the events are not held, keep each rank's summary and events in
            ``<folder>/.nbt-cache`` so a second load reads only the summaries, and a rank's events
            come from Parquet.
        critical_path: when the events are not held, also find each rank's critical path in the
            workers; ``nbt.critical_path_by_rank(trace)`` then answers from the summary.

    Overlap, temporal breakdown, stragglers and step times of a trace whose events are not held
    equal those of the held one; a corrupt rank file raises in both (``nbt.summarize_traces``
    skips it with a note instead).
    """
    if isinstance(path, Trace):
        return path
    if hold_events is None and is_path(path):
        hold_events = _rank_files(path) < MANY_RANKS
    if hold_events or not is_path(path):
        return load_events(path, max_bytes=max_bytes)  # (not a path: its clear error)
    if max_bytes is not None:
        raise NbtUsageError(
            "max_bytes applies where every event is held: pass hold_events=True with it, or leave it "
            "out (the workers read each rank file with NBT_MAX_READ_BYTES)"
        )
    from nbtoolkit.trace.rank_folder_trace import from_summary
    from nbtoolkit.trace.summarize_folder import summarize_traces

    summary = summarize_traces(
        path, workers=workers, cache=cache, on_error="raise", critical_path=critical_path
    )
    return from_summary(summary)


def _rank_files(path: str | PathLike[str]) -> int:
    """How many trace files a folder holds (0 for a file, or a path that is not there: the reader
    then names the problem)."""
    from nbtoolkit.core.errors import TraceError
    from nbtoolkit.core.paths import user_path

    root = user_path(path, error=TraceError)
    if not root.is_dir():
        return 0
    try:
        return sum(
            1
            for entry in root.iterdir()
            if entry.name.endswith((".json", ".json.gz")) and not entry.name.startswith(".")
        )
    except OSError:
        return 0
