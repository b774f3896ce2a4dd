"""One rank file's summary records, computed with numpy alone: what a worker at scale runs.

``summarize_rank_file(path)`` returns exactly what
``summarize_trace(load_rank_file(path)).to_records()`` (:mod:`nbtoolkit.trace.summarize_rank`)
returns, without building a single DataFrame and without importing pandas: at hundreds of ranks
the frames cost most of each rank's time (about 30 ms of a rank's 35; msgspec decodes it in 3),
and pandas costs each worker process 40-75 MB of memory.

It is not a second implementation of the analyses. The same code reads the file
(:func:`~nbtoolkit.trace._kineto_stream.stream_file` into
:class:`~nbtoolkit.trace._kineto_columns.EventColumns`, whose :meth:`arrays` are the events frame
before pandas), the same rules prepare the events (HTA's whole µs and last step:
:func:`nbtoolkit.trace._kernels.hta_rows`), and the same functions compute the overlap
(:func:`nbtoolkit.trace.overlap.rank_overlap_rows`), the temporal breakdown
(:func:`nbtoolkit.trace.breakdown.temporal_numbers`) and the steps
(:func:`nbtoolkit.core.profiler_steps.one_row_per_step`); those take :class:`_RankView`, which
answers as the pandas path's :class:`~nbtoolkit.trace._kernels.DeviceView` does. What is written
here is only the glue the pandas path spreads over the Trace: the spans row, and the records' shape.

A file this path does not read the way the pandas path does raises :class:`LeanUnsupported`, and
the caller summarizes it with the pandas path (:mod:`nbtoolkit.trace.summarize_folder`): a document
the streaming reader cannot place (decoded whole there) and a trace without complete events (its
error is worded there). Errors both paths meet in shared code (a truncated file, a bad
ProfilerStep label, a negative duration) are raised as they are.
"""

from __future__ import annotations

import gc
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from nbtoolkit.core.bounded import read_limit
from nbtoolkit.core.profiler_steps import one_row_per_step, profiler_step_names, step_labels
from nbtoolkit.trace._kernels import hta_rows
from nbtoolkit.trace._kineto_columns import EventArrays, EventColumns
from nbtoolkit.trace._kineto_json import StreamingFallback
from nbtoolkit.trace._kineto_ranks import device_type_of, read_rank_info
from nbtoolkit.trace._kineto_stream import stream_file
from nbtoolkit.trace.breakdown import TEMPORAL_COLUMNS, temporal_columns, temporal_numbers
from nbtoolkit.trace.kernel_types import _SYNC_NAMES
from nbtoolkit.trace.overlap import OVERLAP_BY_STEP_COLUMNS, OVERLAP_COLUMNS, rank_overlap_rows
from nbtoolkit.trace.records import SPAN_COLUMNS

__all__ = ["LeanUnsupported", "summarize_rank_file"]

_STEP_COLUMNS = ("rank", "step", "ts", "dur")


class LeanUnsupported(Exception):
    """This file is summarized by the pandas path (the message says why); nothing is wrong with it."""


def summarize_rank_file(file: Path, *, include_last_step: bool = False) -> dict[str, Any]:
    """``summarize_trace(load_rank_file(file), include_last_step=...).to_records()``, without pandas.

    Raises what ``load_rank_file`` raises (TraceError, NotATrace) for the same files, and
    :class:`LeanUnsupported` for the files only the pandas path reads (module docstring).
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as load_rank_file: the decoded structs form no cycles
    try:
        with read_limit(None):
            columns = EventColumns(file)
            try:
                doc = stream_file(file, columns)
            except StreamingFallback:
                raise LeanUnsupported(
                    "the document is decoded whole (no streamable traceEvents list)"
                ) from None
    finally:
        if gc_was_enabled:
            gc.enable()
    info = read_rank_info(file, doc)
    skipped = columns.unknown_phase_note()
    if skipped:
        info.notes.append(skipped)
    if not columns.rows:
        raise LeanUnsupported("the trace has no complete events")
    info.thread_names = columns.threads
    events = columns.arrays()
    names = np.array(events.names, dtype=object)
    # the Trace's labels are those of every name of the file (ProfilerStep events of the profiler's
    # dropped span included), checked in the order of its sorted categories: the same error first
    labels = sorted(profiler_step_names(names))
    step_numbers = step_labels(sorted(events.names), source=str(file))
    cols = events.columns
    info.device_type = device_type_of(info, bool((cols["stream"] >= 0).any()), events.cats)
    rank = info.rank
    view = _RankView.of(rank, events, labels, include_last_step)
    rank_row, step_rows = rank_overlap_rows(view)
    idle, compute, non_compute, span = temporal_numbers(view)
    ts, dur = cols["ts"], cols["dur"]
    return {
        "include_last_step": include_last_step,
        "step_labels": labels,
        "notes": [],
        "info": [info.to_json()],
        "overlap": _frame(OVERLAP_COLUMNS, [rank_row]),
        "overlap_by_step": _frame(OVERLAP_BY_STEP_COLUMNS, step_rows),
        "steps": _steps(rank, events, step_numbers),
        "spans": _frame(
            SPAN_COLUMNS,
            [
                {
                    "rank": rank,
                    "first_us": float(ts.min()),
                    "last_us": float((ts + dur).max()),
                    "events": len(ts),
                }
            ],
        ),
        "temporal": _records(TEMPORAL_COLUMNS, temporal_columns([(rank, idle, compute, non_compute, span)])),
    }


def _frame(columns: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The records of ``pd.DataFrame(rows, columns=columns)``: each column a list of plain values."""
    return {"columns": list(columns), "data": {c: [row[c] for row in rows] for c in columns}}


def _records(columns: Any, data: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"columns": list(columns), "data": {c: data[c].tolist() for c in columns}}


def _steps(rank: int, events: EventArrays, step_numbers: dict[str, int]) -> dict[str, Any]:
    """``Trace.steps`` of the rank (:func:`~nbtoolkit.core.profiler_steps.host_steps`, one row per step)."""
    if not step_numbers:
        return _records(_STEP_COLUMNS, {c: np.empty(0) for c in _STEP_COLUMNS})
    cols = events.columns
    step_of_code = np.array([step_numbers.get(name, -1) for name in events.names], dtype=np.int64)
    steps = step_of_code[cols["name"]]
    host = (steps >= 0) & (cols["stream"] < 0)
    step, ts, dur = steps[host], cols["ts"][host], cols["dur"][host]
    ranks = np.full(len(step), rank, dtype=np.int64)
    chosen = one_row_per_step(ranks, step, dur)
    return _records(
        _STEP_COLUMNS, {"rank": ranks[chosen], "step": step[chosen], "ts": ts[chosen], "dur": dur[chosen]}
    )


class _RankView:
    """One rank's events after HTA's preprocessing, as numpy: the interface of ``DeviceView``
    (``rank``, ``filtered``, ``host_rows``, ``device_rows``, ``values``, ``codes``) that the overlap
    and the temporal breakdown read."""

    def __init__(
        self,
        rank: int,
        columns: dict[str, np.ndarray],
        categories: dict[str, np.ndarray],
        *,
        keep: np.ndarray,
        filtered: bool,
    ) -> None:
        self.rank, self.filtered = rank, filtered
        self._columns, self._categories, self._keep = columns, categories, keep

    @classmethod
    def of(cls, rank: int, events: EventArrays, labels: list[str], include_last_step: bool) -> _RankView:
        """The view :func:`nbtoolkit.trace._kernels.device_view` makes of the same events."""
        cols = events.columns
        if "" in events.cats:  # HTA drops events without a category
            has_cat = cols["cat"] != events.cats.index("")
            cols = {c: values[has_cat] for c, values in cols.items()}
        names = np.array(events.names, dtype=object)
        name_codes = cols["name"]
        is_sync = np.isin(names, _SYNC_NAMES)[name_codes]
        is_step = np.isin(names, labels)[name_codes] if len(labels) >= 2 else None
        ts, end, keep, filtered = hta_rows(
            cols["ts"],
            cols["dur"],
            cols["stream"],
            cols["correlation"],
            is_sync=is_sync,
            is_step=is_step,
            include_last_step=include_last_step,
        )
        columns = {**cols, "ts": ts, "end": end}
        categories = {"name": names, "cat": np.array(events.cats, dtype=object)}
        return cls(rank, columns, categories, keep=keep, filtered=filtered)

    @cached_property
    def host_rows(self) -> np.ndarray:
        return np.flatnonzero(self._keep & (self._columns["stream"] == -1))

    @cached_property
    def device_rows(self) -> np.ndarray:
        return np.flatnonzero(self._keep & (self._columns["stream"] != -1))

    def values(self, column: str, rows: np.ndarray) -> np.ndarray:
        if column in self._categories:  # a name column holds names, not codes
            return self._categories[column][self._columns[column][rows]]
        return self._columns[column][rows]

    def codes(self, column: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._columns[column][rows], self._categories[column]
