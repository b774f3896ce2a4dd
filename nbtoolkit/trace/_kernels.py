"""The device-kernel view of a rank that HolisticTraceAnalysis (HTA 0.5) analyses, computed our way.

HTA's numbers depend on three preprocessing rules, reproduced here so that nbtoolkit's
breakdowns and overlap give HTA's numbers on the same trace:

1. Times in whole microseconds: ``ts`` is rounded up, ``end = ts + dur`` is rounded
   down, ``dur = end - ts`` (HTA does this for ns-resolution traces to avoid spurious
   overlaps; it is a no-op for integral times). Unlike HTA we clip the few intervals
   this makes negative (sub-µs events) to zero length, which is why nbtoolkit stays
   consistent (idle + compute + non-compute = span) where HTA's assertion fails.
2. The last ProfilerStep is left out unless asked (HTA's ``include_last_profiler_step=False``),
   and only when the trace has two or more ProfilerStep labels: host events are kept when
   they start before the last step starts, device events when the host event that
   launched them (same ``correlation``) is kept. A ProfilerStep label is a name that starts
   with ``ProfilerStep`` (:mod:`nbtoolkit.core.profiler_steps`); HTA takes any name containing the
   word, which would also count a user annotation such as ``"my ProfilerStep helper"``.
3. A device event is any event with a stream (``stream != -1``). Its kernel type is
   COMMUNICATION for ``nccl...Kernel`` names, MEMORY for names starting ``Memcpy``,
   ``Memset`` or ``dma``, OTHER for synchronisation events and other memcpy/memset names,
   and COMPUTATION for the rest. nbtoolkit also counts HCCL kernels (names starting
   ``hccl``/``HCCL``/``hcom_``) as COMMUNICATION, which HTA 0.5 does not.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nbtoolkit.core.profiler_steps import profiler_step_names
from nbtoolkit.trace.kernel_types import _SYNC_NAMES, kernel_types

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = [
    "DeviceView",
    "EventView",
    "device_view",
    "hta_rows",
]


class EventView(Protocol):
    """What the per-rank analyses read of a rank's preprocessed events (:class:`DeviceView`'s
    numpy interface; the lean summarizer's view has it too, without pandas)."""

    rank: int
    filtered: bool

    @property
    def host_rows(self) -> np.ndarray: ...

    @property
    def device_rows(self) -> np.ndarray: ...

    def values(self, column: str, rows: np.ndarray) -> np.ndarray: ...

    def codes(self, column: str, rows: np.ndarray) -> tuple[np.ndarray, Any]: ...


class DeviceView:
    """One rank's events after HTA's preprocessing: ``host`` and ``device`` frames with ``end``.

    Both frames are built on first use (a GPU breakdown never needs the large host frame).
    """

    def __init__(
        self,
        rank: int,
        frame: pd.DataFrame,
        *,
        ts: np.ndarray,
        end: np.ndarray,
        keep: np.ndarray,
        filtered: bool,
    ) -> None:
        self.rank = rank
        self.filtered = filtered  # whether the last ProfilerStep was left out
        self._frame, self._ts, self._end, self._keep = frame, ts, end, keep
        self._stream = frame["stream"].to_numpy()
        self._columns: dict[str, np.ndarray] = {}  # column -> numpy, read once (a frame lookup costs µs)

    def _rows(self, index: np.ndarray) -> pd.DataFrame:
        return self._frame.iloc[index].assign(ts=self._ts[index], end=self._end[index])

    @cached_property
    def host_rows(self) -> np.ndarray:
        """Positions of the kept host events (stream == -1) among the rank's events."""
        return np.flatnonzero(self._keep & (self._stream == -1))

    @cached_property
    def device_rows(self) -> np.ndarray:
        """Positions of the kept device events (stream != -1) among the rank's events."""
        return np.flatnonzero(self._keep & (self._stream != -1))

    def values(self, column: str, rows: np.ndarray) -> np.ndarray:
        """One column at the given positions as numpy (``ts``/``end`` in whole µs): no frame is built.

        The analyses that run once per rank at scale read columns this way; a DataFrame of
        the rows costs a millisecond or more each time.
        """
        if column == "ts":
            return self._ts[rows]
        if column == "end":
            return self._end[rows]
        values = self._columns.get(column)
        if values is None:
            values = self._columns[column] = self._frame[column].to_numpy()
        return values[rows]

    def codes(self, column: str, rows: np.ndarray) -> tuple[np.ndarray, pd.Index]:
        """A categorical column's codes at the given positions, and its categories."""
        key = column + ".codes"
        codes = self._columns.get(key)
        if codes is None:
            codes = self._columns[key] = self._frame[column].cat.codes.to_numpy()
        return codes[rows], self._frame[column].cat.categories

    @cached_property
    def host(self) -> pd.DataFrame:
        """Kept host events (stream == -1) with whole-µs ts/end."""
        return self._rows(self.host_rows)

    @cached_property
    def device(self) -> pd.DataFrame:
        """Kept device events (stream != -1) with whole-µs ts/end and ``kernel_type``."""
        device = self._rows(self.device_rows)
        return device.assign(kernel_type=kernel_types(device["name"]))


def count_step_labels(trace: Trace) -> int:
    """Distinct ProfilerStep labels over all ranks (HTA filters the last step only from two on).

    Read from ``trace.step_labels``, computed once per Trace: this runs once per rank.
    """
    return len(trace.step_labels)


def device_view(trace: Trace, rank: int, *, include_last_step: bool = False) -> DeviceView:
    """HTA's preprocessed events of one rank (see the module docstring)."""
    frame = trace.rank_events(rank)
    cats = frame["cat"]
    if "" in cats.cat.categories:  # HTA drops events without a category
        frame = frame[(cats.cat.codes != cats.cat.categories.get_loc("")).to_numpy()]
    names = frame["name"]
    filter_steps = count_step_labels(trace) >= 2
    ts, end, keep, filtered = hta_rows(
        frame["ts"].to_numpy(),
        frame["dur"].to_numpy(),
        frame["stream"].to_numpy(),
        frame["correlation"].to_numpy(),
        is_sync=names.isin(_SYNC_NAMES).to_numpy(),
        is_step=names.isin(profiler_step_names(names.cat.categories)).to_numpy() if filter_steps else None,
        include_last_step=include_last_step,
    )
    return DeviceView(rank, frame, ts=ts, end=end, keep=keep, filtered=filtered)


def hta_rows(
    ts_raw: np.ndarray,
    dur: np.ndarray,
    stream: np.ndarray,
    correlation: np.ndarray,
    *,
    is_sync: np.ndarray,
    is_step: np.ndarray | None,
    include_last_step: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Rules 1 and 2 of the module docstring on numpy columns: whole-µs ts and end, the rows kept.

    ``is_step``: which rows are ProfilerStep annotations, None when the trace has fewer than two
    step labels (nothing is left out then). Returns (ts, end, keep, filtered). Shared by
    :func:`device_view` and the lean summarizer (:mod:`nbtoolkit.trace.summarize_rank_lean`).
    """
    ts = np.ceil(ts_raw)
    end = np.maximum(np.floor(ts_raw + dur), ts)
    on_gpu = ((stream >= 0) & (correlation >= 0)) | is_sync
    if is_step is None:
        return ts, end, np.ones(len(ts), dtype=bool), False
    is_step = is_step & ~on_gpu
    if is_step.any():
        last_start = ts[is_step].max()
        last_end = end[is_step].max()
        keep_host = ~on_gpu & ((ts <= last_end) if include_last_step else (ts < last_start))
    else:  # HTA compares with NaN here: no host event survives
        keep_host = np.zeros(len(ts), dtype=bool)
    kept_corr = np.unique(correlation[keep_host])
    keep_gpu = on_gpu & np.isin(correlation, kept_corr)
    return ts, end, keep_host | keep_gpu, not include_last_step


def merged(view_device: pd.DataFrame, kind: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    from nbtoolkit.trace._intervals import merge

    rows = view_device if kind is None else view_device[view_device["kernel_type"].to_numpy() == kind]
    return merge(rows["ts"].to_numpy(), rows["end"].to_numpy())
