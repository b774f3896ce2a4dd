"""``TraceSummary.load_ranks``: the events of a few ranks of a summarized job, read again.

From the per-rank cache (:mod:`nbtoolkit.trace.trace_cache`) when the summary has one, else
parsed from the rank's trace file. Below the TraceSummary: it reads the summary through
:class:`SummarizedRanks` (what it needs of one) and imports neither the summary nor the analyses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from nbtoolkit.trace.kineto import load_trace
from nbtoolkit.trace.records import RankInfo
from nbtoolkit.trace.trace import Trace
from nbtoolkit.trace.trace_cache import cache_key, read_events

__all__ = ["SummarizedRanks", "load_summary_ranks"]


class SummarizedRanks(Protocol):
    """What :func:`load_summary_ranks` reads of a :class:`~nbtoolkit.trace.summary.TraceSummary`."""

    @property
    def info(self) -> dict[int, RankInfo]: ...

    @property
    def cache_dir(self) -> str | None: ...


def load_summary_ranks(summary: SummarizedRanks, ranks: list[int]) -> Trace:
    """The events of the chosen ranks: from the cache when it has them, else parsed again."""
    parts = []
    for rank in ranks:
        source = Path(summary.info[rank].source)
        cached = None
        if summary.cache_dir and source.exists():
            cached = read_events(Path(summary.cache_dir), cache_key(source))
        parts.append(cached if cached is not None else load_trace(source))
    return Trace.combine(parts)
