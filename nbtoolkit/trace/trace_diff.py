"""``TraceDiff``: the result of ``nbt.compare(before, after)`` on two Traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nbtoolkit.core.result import Result, html_table

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TraceDiff"]


@dataclass(repr=False, eq=False)
class TraceDiff(Result):
    """Before/after numbers of two traces.

    ``summary``: metric, before, after, delta, change_pct (step time and time per category);
    ``operators``: host operators whose self time per step changed most (ms);
    ``kernels``: the same for device kernels (None for CPU traces).
    ``time_within_noise``: True when the two traces' step durations overlap in their middle halves
    (25th to 75th percentile), the rule of ``Comparison.time_within_noise``: the step-time change
    is then measurement noise, not a speed-up. None when either trace has fewer than 2 steps.
    """

    summary: pd.DataFrame
    operators: pd.DataFrame
    kernels: pd.DataFrame | None = None
    time_within_noise: bool | None = None

    def _row(self, metric: str) -> pd.Series:
        return self.summary.set_index("metric").loc[metric]

    @property
    def step_time_change_pct(self) -> float:
        return float(self._row("step time (ms, median)")["change_pct"])

    def _text(self) -> str:
        lines = ["Trace comparison (before -> after):"]
        for row in self.summary.itertuples(index=False):
            pct = "" if row.change_pct != row.change_pct else f"  ({row.change_pct:+.1f} %)"
            if pct and row.metric == "step time (ms, median)" and self.time_within_noise:
                pct += " within the steps' noise"
            lines.append(f"  {row.metric:34s} {row.before:10.3f} -> {row.after:10.3f}{pct}")
        for title, table in (
            ("Operators that changed most (self ms/step):", self.operators),
            ("Kernels that changed most (ms/step):", self.kernels),
        ):
            if table is None or not len(table):
                continue
            lines.append(title)
            for op in table.head(10).itertuples(index=False):
                name = op.name if len(op.name) <= 70 else op.name[:67] + "..."
                lines.append(f"  {op.before_ms:9.3f} -> {op.after_ms:9.3f}  ({op.delta_ms:+.3f})  {name}")
        return "\n".join(lines)

    def _html(self) -> str:
        noise = (
            "<p>The step-time change is within the steps' noise (their middle halves overlap).</p>"
            if self.time_within_noise else ""
        )
        parts = [
            f"<p><b>Trace comparison</b> (before → after)</p>{noise}",
            html_table(self.summary, float_format="{:,.3f}"),
        ]
        parts.append(
            "<p>Operators that changed most (self ms/step)</p>"
            + html_table(self.operators, float_format="{:,.3f}")
        )
        if self.kernels is not None and len(self.kernels):
            parts.append(
                "<p>Kernels that changed most (ms/step)</p>"
                + html_table(self.kernels, float_format="{:,.3f}")
            )
        return "".join(parts)
