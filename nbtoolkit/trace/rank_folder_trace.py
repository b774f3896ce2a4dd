"""``RankFolderTrace``: the Trace of a folder of many ranks, answered from per-rank summaries.

At hundreds or thousands of ranks the events of every rank do not belong in one process: the
analyses people ask for first (overlap, temporal breakdown, stragglers, step times) are per
rank, so each rank is summarized where it is read (a worker process,
:func:`nbtoolkit.trace.summarize_folder.summarize_traces`) and only the summary comes back.

A RankFolderTrace is a :class:`~nbtoolkit.trace.trace.Trace` (every door that takes a Trace
takes it) whose ``events`` and ``collectives`` are read per rank when asked for
(:class:`RankEvents`): ``trace.events[5]`` parses rank 5 (or reads it from the per-rank cache)
and keeps the last few ranks read, so an analysis that walks every rank holds one rank at a
time, not the job. ``trace.summary`` is the :class:`~nbtoolkit.trace.summary.TraceSummary`
the public doors (:mod:`nbtoolkit.trace.api`) answer from.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.result import escape
from nbtoolkit.trace.summary_ranks import load_summary_ranks
from nbtoolkit.trace.trace import Trace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RankEvents", "RankFolderTrace", "from_summary"]

#: ranks whose events stay in memory after being read (the most recently used ones)
KEPT_RANKS = 4


class _RankReader:
    """Reads one rank's events and collectives on demand, keeping the last :data:`KEPT_RANKS`."""

    # summary: a TraceSummary (not imported: the summary's views import this module)
    # read_ranks: ranks -> their Trace (default: from the cache or the files, in this process;
    # a cluster's trace reads them on the nodes that hold the files)
    def __init__(
        self, summary: Any, kept: int = KEPT_RANKS, read_ranks: Callable[[list[int]], Trace] | None = None
    ) -> None:
        self.summary = summary
        self.kept = kept
        self.read_ranks = read_ranks or (lambda ranks: load_summary_ranks(summary, ranks))
        self.reads = 0  # ranks parsed or read from the cache so far (tests count them)
        self._recent: OrderedDict[int, Trace] = OrderedDict()

    def rank(self, rank: int) -> Trace:
        if rank not in self.summary.info:
            raise KeyError(rank)
        if rank in self._recent:
            self._recent.move_to_end(rank)
            return self._recent[rank]
        one = self.read_ranks([rank])
        self.reads += 1
        self._recent[rank] = one
        while len(self._recent) > self.kept:
            self._recent.popitem(last=False)
        return one


class RankEvents(Mapping[int, "pd.DataFrame"]):
    """rank -> events (or collectives) frame, each read when asked for (see the module docstring)."""

    def __init__(self, reader: _RankReader, part: str) -> None:
        self._reader, self._part = reader, part

    def __getitem__(self, rank: int) -> pd.DataFrame:
        one = self._reader.rank(rank)
        frames: dict[int, pd.DataFrame] = getattr(one, self._part)
        if rank not in frames:  # the file now holds another rank: it changed since it was summarized
            raise TraceError(
                f"{self._reader.summary.info[rank].source} no longer holds rank {rank}; load the folder again"
            )
        return frames[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._reader.summary.info))

    def __len__(self) -> int:
        return len(self._reader.summary.info)

    def __contains__(self, rank: object) -> bool:
        return rank in self._reader.summary.info


# repr: the Result text; eq: identity (as Trace)
@dataclass(repr=False, eq=False)
class RankFolderTrace(Trace):
    """A Trace whose per-rank answers come from ``summary`` and whose events are read per rank."""

    summary: Any = None  # the TraceSummary (Any: a dataclass field after Trace's defaults)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.summary.info)

    @property
    def has_gpu_kernels(self) -> bool:
        return bool((self.summary.overlap["method"] == "hta-gpu").any())

    @property
    def rank_reads(self) -> int:
        """How many ranks' events were read since loading (each read parses the file or the cache)."""
        reader: _RankReader = self.events._reader  # type: ignore[attr-defined]
        return reader.reads

    def _header_lines(self) -> list[str]:
        n_events = int(self.summary.spans["events"].sum())
        ranks = self.ranks
        shown = ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")
        first = self.info[ranks[0]]
        return [
            f"Trace: {len(ranks)} rank(s) [{shown}], {n_events:,} events, device {self.device_type}"
            + (f", backend {first.backend}" if first.backend else "")
            + (f", world size {first.world_size}" if first.world_size else ""),
            (
                "per-rank results computed where each rank was read; a rank's events are read when "
                "asked for (trace.events[rank])"
            ),
        ]

    def _text(self) -> str:
        return "\n".join([*self._header_lines(), *self.summary._text().splitlines()[1:]])

    def _html(self) -> str:
        head = "".join(f"<p><b>{escape(line)}</b></p>" for line in self._header_lines())
        return head + self.summary._html()


def from_summary(
    summary: Any,
    *,
    notes: list[str] | None = None,
    read_ranks: Callable[[list[int]], Trace] | None = None,
) -> RankFolderTrace:
    """The RankFolderTrace of a summarized folder (its events read from the files or the cache).

    ``read_ranks(ranks)``: how a rank's events are read when asked for (default: here, from the
    cache or the file; ``Cluster.load_trace`` reads them on the node holding the file).
    """
    reader = _RankReader(summary, read_ranks=read_ranks)
    return RankFolderTrace(
        events=RankEvents(reader, "events"),  # type: ignore[arg-type]
        info=summary.info,
        collectives=RankEvents(reader, "collectives"),  # type: ignore[arg-type]
        notes=list(notes if notes is not None else summary.notes),
        _steps=summary.steps,
        _step_labels=list(summary.step_labels),
        summary=summary,
    )
