"""``TraceDiff``: the result of ``nbt.compare(before, after)`` on two Traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nbtoolkit.core.result import Result, escape, html_table

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.step_time import StepTimeComparison

__all__ = ["TraceDiff"]

_STEP_TIME = "step time (ms, median)"  # the summary's step-time row (nbtoolkit.trace.diff.STEP_TIME)


@dataclass(repr=False, eq=False)
class TraceDiff(Result):
    """Before/after numbers of two traces.

    ``summary``: metric, before, after, delta, change_pct (step time and time per category); the
    step time is the median of the steps no other work disturbed when the traces carry the load
    around their steps (``nbt.profile``), of all steps otherwise;
    ``operators``: host operators whose self time per step changed most (ms);
    ``kernels``: the same for device kernels (None for CPU traces);
    ``step_time``: the step-time verdict (:class:`~nbtoolkit.trace.step_time.StepTimeComparison`):
    faster, slower, the same, no measurable change, not comparable (a trace was recorded while the
    machine was busy) or load unknown (traces of other tools), with the ratio's interval and how
    many steps of each trace other work disturbed.
    ``time_within_noise``: True when the step-time change is noise (no faster/slower verdict; for
    traces without load measurements: the steps' middle halves, 25th to 75th percentile, overlap);
    None when it cannot be told (fewer than 2 steps, or not comparable).
    """

    summary: pd.DataFrame
    operators: pd.DataFrame
    kernels: pd.DataFrame | None = None
    time_within_noise: bool | None = None
    step_time: StepTimeComparison | None = None

    def _row(self, metric: str) -> pd.Series:
        return self.summary.set_index("metric").loc[metric]

    @property
    def step_time_change_pct(self) -> float:
        return float(self._row(_STEP_TIME)["change_pct"])

    def _step_time_lines(self) -> list[str]:
        """The verdict, then its notes (the load the steps met, the machine)."""
        if self.step_time is None:
            return []
        lines = [self.step_time.reading(), *self.step_time.notes()]
        if self.step_time.before.disturbed or self.step_time.after.disturbed:
            lines.append(
                "the times per category and per operator below cover all steps, the disturbed ones included"
            )
        return lines

    def _text(self) -> str:
        lines = ["Trace comparison (before -> after):"]
        step_lines = self._step_time_lines()
        if step_lines:
            lines.append(f"  Step time: {step_lines[0]}")
            lines += [f"    - {note}" for note in step_lines[1:]]
        for row in self.summary.itertuples(index=False):
            pct = "" if row.change_pct != row.change_pct else f"  ({row.change_pct:+.1f} %)"
            if pct and row.metric == _STEP_TIME and self.time_within_noise:
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
        step_lines = self._step_time_lines()
        verdict = ""
        if step_lines:
            verdict = f"<p><b>Step time</b>: {escape(step_lines[0])}</p>"
            if len(step_lines) > 1:
                verdict += "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in step_lines[1:]) + "</ul>"
        parts = [
            f"<p><b>Trace comparison</b> (before → after)</p>{verdict}",
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
