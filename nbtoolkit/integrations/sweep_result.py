"""The result every configuration sweep returns (ZeroSweep, Fsdp2Sweep): its table, traces, notes
and the baseline's drift, shown as text and HTML, with a figure; each sweep adds its reading."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.integrations.sweep_common import NOISE

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = ["SweepResult"]


@dataclass(repr=False)  # the repr is Result's (the text summary)
class SweepResult(Result):
    """One row per configuration (step time, communication, peak memory) and its traces.

    Subclasses name themselves (:attr:`TITLE`, :attr:`CSS_CLASS`, :attr:`FIGURE_TITLE`), choose the
    columns shown, and write :meth:`reading`.
    """

    table: pd.DataFrame
    traces: dict[str, Trace] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    drift: float | None = None

    TITLE: ClassVar[str] = "Sweep"
    CSS_CLASS: ClassVar[str] = "nbt-sweep"
    FIGURE_TITLE: ClassVar[str] = "configurations"
    TEXT_COLUMNS: ClassVar[tuple[str, ...]] = (
        "config", "step_time_ms", "comm_ms", "exposed_comm_ms", "collectives_per_step", "peak_mb",
    )  # fmt: skip
    HTML_COLUMNS: ClassVar[tuple[str, ...]] = (
        "config", "step_time_ms", "comm_ms", "exposed_comm_ms", "overlap_pct", "collectives_per_step",
        "peak_mb",
    )  # fmt: skip

    @property
    def noise(self) -> float:
        """The relative step-time change below which no change is named: 10%, or the measured
        drift of the baseline over the sweep when that is larger."""
        return max(NOISE, self.drift or 0.0)

    def reading(self) -> str:
        """What the knobs changed, in plain words (each sweep writes its own)."""
        raise NotImplementedError

    def figure(self) -> Any:
        """Bars per configuration: step time and exposed communication (ms), peak memory (MB); a
        figure that carries its static SVG form for exported notebooks."""
        from nbtoolkit.cluster.figures import sweep_figure

        return sweep_figure(self.table, title=self.FIGURE_TITLE)

    def _text(self) -> str:
        shown = self.table[list(self.TEXT_COLUMNS)].to_string(index=False, float_format=lambda v: f"{v:,.1f}")
        return f"{self.TITLE}: {len(self.table)} configurations\n{shown}\n\n{self.reading()}" + "".join(
            f"\nnote: {n}" for n in self.notes
        )

    def _html(self) -> str:
        reading = "".join(f"<li>{escape(line)}</li>" for line in self.reading().splitlines())
        notes = "".join(f"<p><i>{escape(n)}</i></p>" for n in self.notes)
        return (
            f"<div class='{self.CSS_CLASS}'><b>{escape(self.TITLE)}</b>: {len(self.table)} configurations "
            "(times in ms, memory in MB per rank)"
            + html_table(self.table[list(self.HTML_COLUMNS)])
            + f"<ul>{reading}</ul>{notes}</div>"
        )
