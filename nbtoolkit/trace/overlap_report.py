"""``OverlapReport``: what ``%nbt overlap`` shows, ``nbt.comm_comp_overlap``'s table and its bar chart.

Above the public door it calls (:func:`nbtoolkit.trace.api.comm_comp_overlap`), so ``of`` takes
whatever that takes: a Trace, a trace file or folder, or a TraceSummary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.result import html_table
from nbtoolkit.trace.api import comm_comp_overlap
from nbtoolkit.trace.views import _FigureDisplay, overlap_chart

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["OverlapReport"]


@dataclass(repr=False, eq=False)
class OverlapReport(_FigureDisplay):
    """What ``%nbt overlap`` shows: ``nbt.comm_comp_overlap``'s table per rank and its bar chart.

    ``OverlapReport.of(traces)`` takes what ``comm_comp_overlap`` takes (a Trace, a trace file or
    folder of per-rank traces, or a TraceSummary); ``table`` is that function's own DataFrame.
    """

    table: pd.DataFrame

    @classmethod
    def of(cls, traces: Any) -> OverlapReport:
        return cls(table=comm_comp_overlap(traces))

    def _text(self) -> str:
        lines = [
            "Communication/computation overlap per rank (µs):",
            self.table.round(2).to_string(index=False),
        ]
        if (self.table["method"] == "cpu-gloo").any():
            lines.append("cpu-gloo: gloo collectives vs the rank's own operators (see nbt.comm_comp_overlap)")
        return "\n".join(lines)

    def _html(self) -> str:
        return "<p><b>Communication/computation overlap per rank</b> (µs)</p>" + html_table(
            self.table, max_rows=64
        )

    def _figures(self) -> list[Any]:
        return [overlap_chart(self.table)]
