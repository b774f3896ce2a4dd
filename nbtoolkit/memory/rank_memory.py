"""Memory timelines of one step on every rank of a cluster, read side by side.

``Cluster.memory`` (and ``%%nbt remote --memory``) return a :class:`RankMemory`: it is a
sequence of :class:`~nbtoolkit.memory.timeline.MemoryTimeline` in rank order (``out[0]``,
``len(out)``, iteration), so each rank's timeline keeps every view of a local one, and it
adds what only several ranks show: the peak of each rank with its categories at that
peak, and how uneven the peaks are (a rank holding more than the others is the one that
runs out of memory first: uneven ZeRO partitions, rank-0-only work, unbalanced data).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes
from nbtoolkit.memory.schema import category_columns
from nbtoolkit.memory.timeline import MemoryTimeline

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RankMemory"]

#: peaks differing by more than this (max/min - 1) are called uneven in the summary
UNEVEN_PEAKS = 0.10




@dataclass(repr=False)
class RankMemory(Result, Sequence[MemoryTimeline]):
    """One MemoryTimeline per rank (``timelines``: rank -> timeline), in rank order."""

    timelines: dict[int, MemoryTimeline]

    @property
    def ranks(self) -> list[int]:
        return sorted(self.timelines)

    def timeline(self, rank: int) -> MemoryTimeline:
        """The timeline of ``rank`` (by rank number, not position)."""
        if rank not in self.timelines:
            raise KeyError(f"no memory timeline for rank {rank}; ranks here: {self.ranks}")
        return self.timelines[rank]

    @overload
    def __getitem__(self, index: int) -> MemoryTimeline: ...
    @overload
    def __getitem__(self, index: slice) -> list[MemoryTimeline]: ...
    def __getitem__(self, index: int | slice) -> MemoryTimeline | list[MemoryTimeline]:
        ordered = [self.timelines[r] for r in self.ranks]
        return ordered[index]

    def __len__(self) -> int:
        return len(self.timelines)

    def __iter__(self) -> Iterator[MemoryTimeline]:
        return (self.timelines[r] for r in self.ranks)

    def peaks(self) -> pd.DataFrame:
        """Per rank: ``rank``, ``peak_bytes``, ``peak_time_us``, then each category's bytes at the peak."""
        import pandas as pd

        rows = []
        for rank in self.ranks:
            timeline = self.timelines[rank]
            row: dict[str, Any] = {
                "rank": rank,
                "peak_bytes": timeline.peak_bytes,
                "peak_time_us": timeline.peak_time,
            }
            for category in timeline.category_peaks().itertuples():
                if category.category != "total" and category.at_peak_bytes:
                    row[str(category.category)] = int(category.at_peak_bytes)
            rows.append(row)
        frame = pd.DataFrame(rows)
        categories = category_columns(frame)
        frame[categories] = frame[categories].fillna(0).astype("int64")
        return frame

    def imbalance(self) -> float:
        """Highest rank peak over lowest rank peak (1.0 when every rank peaks equally)."""
        peaks = [t.peak_bytes for t in self.timelines.values()]
        return max(peaks) / min(peaks) if peaks and min(peaks) > 0 else 1.0

    def reading(self) -> str:
        """One sentence: which rank peaks highest, by how much, and what dominates that peak."""
        table = self.peaks()
        if table.empty:
            return "no ranks"
        top = table.loc[table["peak_bytes"].idxmax()]
        categories = category_columns(table)
        dominant = max(categories, key=lambda c: top[c]) if categories else "unknown"
        ratio = self.imbalance()
        if ratio - 1 <= UNEVEN_PEAKS:
            return (
                f"peaks are even across {len(table)} ranks (within {(ratio - 1) * 100:.0f}%); "
                f"the highest, rank {int(top['rank'])} at {format_bytes(int(top['peak_bytes']))}, "
                f"is mostly {dominant}"
            )
        return (
            f"rank {int(top['rank'])} peaks highest at {format_bytes(int(top['peak_bytes']))}, "
            f"{ratio:.2f}x the lowest rank's peak; its peak is mostly {dominant}"
        )

    def imbalance_report(self) -> Any:
        """Which rank peaks highest and why: the category and the stacks that differ (MemoryImbalance)."""
        from nbtoolkit.memory.diff import memory_imbalance

        return memory_imbalance(self)

    def figure(self, **options: Any) -> Any:
        """Total allocated bytes per rank over time, and each rank's peak by category (plotly)."""
        from nbtoolkit.memory.figures import ranks_figure

        return ranks_figure(self, **options)

    def _report_figures(self) -> list[Any]:
        return [self.figure()]

    def _display_frame(self) -> pd.DataFrame:
        import pandas as pd

        table = self.peaks()
        shown = pd.DataFrame({"rank": table["rank"], "peak": [format_bytes(v) for v in table["peak_bytes"]]})
        for column in category_columns(table):
            shown[f"{column} at peak"] = [format_bytes(v) for v in table[column]]
        return shown

    def _text(self) -> str:
        devices = sorted({t.device for t in self.timelines.values()})
        return (
            f"RankMemory: {len(self)} ranks on {', '.join(devices)}\n"
            + self._display_frame().to_string(index=False)
            + f"\n{self.reading()}"
        )

    def _html(self) -> str:
        return (
            f"<div class='nbt-memory'><b>RankMemory</b>: memory timelines of {len(self)} ranks"
            f"{html_table(self._display_frame())}<p>{escape(self.reading())}</p>"
            "<p><i>Each rank's own timeline: <code>result.timeline(rank)</code>; "
            "the figure: <code>result.figure()</code>.</i></p></div>"
        )
