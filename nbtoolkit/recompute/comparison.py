"""Measurements of a training step and a before/after comparison of two of them.

A :class:`Measurement` is what :mod:`nbtoolkit.recompute.paired_measure`
records for one configuration of a model: the median step time with its spread,
the peak memory (total and by torch's memory categories), the compile time and
graph breaks when the model was compiled, and the losses the steps returned.
A :class:`Comparison` holds two of them (``before`` and ``after``) plus what was
changed, and shows them side by side.

Both are plain data: they import neither torch nor widgets, and save/load as JSON.

Room for more step metrics: ``Measurement.extra`` is an open mapping (for example
``{"model_flops": 1.2e9, "mfu": 0.41}``, added by ``nbt.step_metrics``). Every entry is
shown as one more row of :meth:`Comparison.table`; numbers are compared like the
built-in rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.interleaved import FASTER, SLOWER, InterleavedTiming
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes, format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Comparison", "Measurement"]


@dataclass
class Measurement:
    """One measured configuration of a training step.

    Attributes:
        label: what was measured (``"before"``, ``"after"``, or a name you give).
        step_time_s: median wall time of one step over ``step_times_s`` (seconds), after warm-up.
        step_time_spread_s: interquartile range (75th minus 25th percentile) of ``step_times_s``.
        step_times_s: every timed step (seconds), in order.
        step_cpu_time_s: median processor time of the timed steps (``time.process_time``, all
            threads of the process): unlike wall time, not inflated by waiting for a busy CPU.
        peak_bytes: peak of the bytes one step allocates and still holds, above what was live
            before it started (parameters and optimizer state are not counted; gradients are,
            when the step allocates them anew). Summed per allocation from the allocator events
            of ``torch.profiler(profile_memory=True)``; see ``nbtoolkit.recompute.measure``.
        resident_bytes: bytes live when the step started (parameters, optimizer state, ...).
        total_peak_bytes: the device's whole peak during the profiled step: everything allocated
            then, parameters, gradients and optimizer state included (``torch.cuda.max_memory_allocated``
            on a GPU, the total torch's memory profiler classifies on the CPU). What a memory budget
            is compared with. None when it was not measured.
        peak_by_category: bytes per torch memory category (``torch.profiler._memory_profiler``:
            PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL,
            unknown) alive at the moment of the peak. Empty when it was not measured.
        warmup_times_s: wall seconds of each warm-up step (the first pays for compilation).
        compile_time_s: time the warm-up steps took beyond as many steady (median) steps (seconds),
            when the model was compiled; None otherwise. So ``compile_time_s + len(warmup_times_s)
            * step_time_s`` is the warm-up's wall time.
        graph_count: graphs torch.compile produced during the measurement; None if not compiled.
        graph_breaks: graph breaks torch.compile reported during the measurement; None if not compiled.
        break_reasons: graph-break reason -> count.
        losses: the value each step returned (as float), warm-up steps included, in order.
        config: what was applied (compile options, recomputed blocks, AMP dtype).
        extra: further metrics (for example ``model_flops``, ``mfu``); each is one row of the table.
    """

    label: str
    step_time_s: float
    step_time_spread_s: float
    step_times_s: list[float] = field(default_factory=list)
    step_cpu_time_s: float | None = None
    peak_bytes: int = 0
    resident_bytes: int = 0
    total_peak_bytes: int | None = None
    peak_by_category: dict[str, int] = field(default_factory=dict)
    warmup_times_s: list[float] = field(default_factory=list)
    compile_time_s: float | None = None
    graph_count: int | None = None
    graph_breaks: int | None = None
    break_reasons: dict[str, int] = field(default_factory=dict)
    losses: list[float | None] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def first_loss(self) -> float | None:
        """The first loss a step returned (``nbt.optimize`` starts both measurements from the same
        weights, so equal first losses mean the changes did not alter what the step computes)."""
        for value in self.losses:
            if value is not None:
                return value
        return None

    @property
    def final_loss(self) -> float | None:
        """The last loss a step returned, or None when the step returns nothing."""
        for value in reversed(self.losses):
            if value is not None:
                return value
        return None

    def rows(self, categories: list[str] | None = None) -> list[tuple[str, Any, str]]:
        """(metric, raw value, shown value) for the table; ``extra`` entries come last.

        ``categories``: the memory categories to list (a side-by-side table passes the union
        of both measurements' so the rows line up); default: this measurement's own.
        """
        rows: list[tuple[str, Any, str]] = [
            ("step time (median)", self.step_time_s, format_seconds(self.step_time_s)),
            ("step time spread (IQR)", self.step_time_spread_s, format_seconds(self.step_time_spread_s)),
            ("step CPU time (median)", self.step_cpu_time_s, format_seconds(self.step_cpu_time_s)),
            ("peak memory", self.peak_bytes, format_bytes(self.peak_bytes)),
            ("peak memory, device total", self.total_peak_bytes, format_bytes(self.total_peak_bytes)),
        ]
        for category in sorted(self.peak_by_category) if categories is None else categories:
            nbytes = self.peak_by_category.get(category)
            rows.append((f"  at peak: {category}", nbytes, format_bytes(nbytes)))
        rows.append(("compile time", self.compile_time_s, format_seconds(self.compile_time_s)))
        if self.warmup_times_s:
            warm = sum(self.warmup_times_s)
            label = f"warm-up ({len(self.warmup_times_s)} step(s), compile included)"
            rows.append((label, warm, format_seconds(warm)))
        rows.append(("graphs", self.graph_count, "-" if self.graph_count is None else str(self.graph_count)))
        rows.append(
            ("graph breaks", self.graph_breaks, "-" if self.graph_breaks is None else str(self.graph_breaks))
        )
        first, final = self.first_loss, self.final_loss
        rows.append(("first loss", first, "-" if first is None else f"{first:.6g}"))
        rows.append(("final loss", final, "-" if final is None else f"{final:.6g}"))
        for key, value in self.extra.items():
            shown = f"{value:,.4g}" if isinstance(value, (int, float)) else str(value)
            rows.append((str(key), value, shown))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _quartiles(m: Measurement) -> tuple[float, float]:
    """The middle half (25th to 75th percentile) of a measurement's step times.

    From the timed steps when there are several; else (a loaded comparison without them) the
    median plus or minus half the stored interquartile range.
    """
    import numpy as np

    times = [t for t in m.step_times_s if isinstance(t, (int, float)) and math.isfinite(t)]
    if len(times) >= 2:
        low, high = np.percentile(times, [25, 75])
        return float(low), float(high)
    half = max(m.step_time_spread_s or 0.0, 0.0) / 2
    return m.step_time_s - half, m.step_time_s + half


def _change(before: Any, after: Any) -> str:
    """after/before as a ratio (``0.62×``) for positive numbers; blank otherwise."""
    if isinstance(before, bool) or isinstance(after, bool):
        return ""
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and before > 0:
        return f"{after / before:.2f}×"
    return ""


@dataclass(repr=False)  # the Result mixin's repr (the table) must win over dataclass's
class Comparison(Result):
    """A step measured before and after a change, shown side by side.

    ``changes`` lists in words what was applied (``"torch.compile(mode='default')"``,
    ``"checkpoint 3 blocks: layers.0, ..."``, ``"autocast bf16"``). ``plan`` is the
    :class:`~nbtoolkit.recompute.plan.RecomputePlan` used, if any (not saved by :meth:`save`).
    ``applied`` is the handle of the changes when ``optimize(..., undo=False)`` kept them
    (call ``comparison.applied.undo()`` to restore the model), else None.
    ``nothing_applied`` says why nothing was changed (``optimize`` found nothing to apply):
    then the two measurements are of the same step and the summary claims no speed-up.

    ``timing`` is how the step times were compared: ``nbt.optimize`` times the two
    configurations interleaved (:mod:`nbtoolkit.core.interleaved`) and the speed-up is the
    median of the paired ratios, called a speed-up or a slow-down only when its confidence
    interval lies outside the noise. A comparison without it (made from two measurements
    taken apart) falls back to the older rule: when the middle halves (25th to 75th
    percentile) of the two measurements' step times overlap, the difference is noise.
    ``budget_bytes``: the device-total budget the change was planned for, if any; the headline
    then says whether the measured device total is within it.
    """

    before: Measurement
    after: Measurement
    changes: list[str] = field(default_factory=list)
    plan: Any = None
    notes: list[str] = field(default_factory=list)
    applied: Any = None
    nothing_applied: str | None = None
    timing: InterleavedTiming | None = None
    budget_bytes: int | None = None

    @property
    def time_within_noise(self) -> bool:
        """True when the step-time difference is not outside the measured noise."""
        if self.timing is not None:
            return self.timing.verdict not in (FASTER, SLOWER)
        b_low, b_high = _quartiles(self.before)
        a_low, a_high = _quartiles(self.after)
        return a_low <= b_high and b_low <= a_high

    @property
    def speedup(self) -> float:
        """before step time / after step time (above 1 means faster): from the interleaved rounds'
        median paired ratio when there is ``timing``, else the medians' ratio."""
        if self.timing is not None and math.isfinite(self.timing.speedup):
            return self.timing.speedup
        return self.before.step_time_s / self.after.step_time_s if self.after.step_time_s > 0 else math.nan

    @property
    def memory_ratio(self) -> float:
        """after peak / before peak of the step's own memory (below 1 means less memory)."""
        return self.after.peak_bytes / self.before.peak_bytes if self.before.peak_bytes > 0 else math.nan

    def peak_reading(self) -> str:
        """The peak in one phrase: the device total (what a budget speaks of) before -> after, and
        whether it is within ``budget_bytes``; the step's own peak where no total was measured."""
        before, after = self.before.total_peak_bytes, self.after.total_peak_bytes
        if before is not None and after is not None:
            text = f"device peak {format_bytes(before)} -> {format_bytes(after)}"
            if before > 0:
                text += f" ({after / before:.2f}×)"
            if self.budget_bytes is not None:
                over = after - self.budget_bytes
                text += (
                    f", within the budget {format_bytes(self.budget_bytes)}" if over <= 0
                    else f", over the budget {format_bytes(self.budget_bytes)} by {format_bytes(over)}"
                )
            return text
        if not (self.before.peak_bytes or self.after.peak_bytes):
            return ""  # memory was not measured
        return (
            f"step peak {format_bytes(self.before.peak_bytes)} -> {format_bytes(self.after.peak_bytes)} "
            f"({self.memory_ratio:.2f}×)"
        )

    def memory_diff(self) -> Any:
        """What grew or shrank in memory from before to after (``nbt.memory_diff``), or None.

        By category at each side's peak, from the measurements ``nbt.optimize`` took; None when
        a side has no memory data (``optimize(..., measure=MeasureConfig(memory=False))``).
        """
        if not (self.before.peak_by_category and self.after.peak_by_category):
            return None
        from nbtoolkit.memory.diff import memory_diff

        return memory_diff(self.before, self.after, labels=("before", "after"))

    def _memory_reading(self) -> str:
        """The memory diff in one sentence for the summary ('' without memory data on both sides)."""
        diff = self.memory_diff()
        return str(diff.reading()) if diff is not None else ""

    def table(self) -> pd.DataFrame:
        """One row per metric: ``metric``, ``before``, ``after``, ``change`` (after/before)."""
        import pandas as pd

        categories = sorted(set(self.before.peak_by_category) | set(self.after.peak_by_category))
        before = {name: (raw, shown) for name, raw, shown in self.before.rows(categories)}
        after = {name: (raw, shown) for name, raw, shown in self.after.rows(categories)}
        names = list(before)
        names += [n for n in after if n not in before]
        records = []
        for name in names:
            b_raw, b_shown = before.get(name, (None, "-"))
            a_raw, a_shown = after.get(name, (None, "-"))
            # the losses come from different training steps (the after-steps continue training),
            # so their ratio is not an effect of the change: no ratio shown for them
            change = "" if name == "final loss" else _change(b_raw, a_raw)
            if name == "step time (median)" and self.timing is not None and math.isfinite(self.timing.ratio):
                change = f"{self.timing.ratio:.2f}× (paired)"
            if name == "step time (median)" and change and self.time_within_noise:
                change += " (noise)"
            records.append({"metric": name, "before": b_shown, "after": a_shown, "change": change})
        return pd.DataFrame.from_records(records, columns=["metric", "before", "after", "change"])

    def _summary(self) -> str:
        times = f"{format_seconds(self.before.step_time_s)} -> {format_seconds(self.after.step_time_s)}"
        if self.nothing_applied:
            return (
                f"nothing to apply ({self.nothing_applied}); the same step measured twice: "
                f"step time {times}, the difference is measurement noise"
            )
        if self.timing is not None:
            speed = self.timing.reading().replace(f"{self.timing.labels[1]} is ", "", 1)
        elif self.time_within_noise:
            speed = f"{self.speedup:.2f}×, within the measured noise: no speed-up shown"
        else:
            speed = f"{self.speedup:.2f}× speed"
        peak = self.peak_reading()
        return f"step time {times} ({speed})" + (f", {peak}" if peak else "")

    def _text(self) -> str:
        frame = self.table()
        lines = [f"Comparison: {self._summary()}"]
        if self.changes:
            lines.append("changes: " + "; ".join(self.changes))
        memory = self._memory_reading()
        if memory:
            lines.append(f"memory: {memory}")
        width = max(len(m) for m in frame["metric"])
        bw = max(6, *(len(v) for v in frame["before"]))
        aw = max(5, *(len(v) for v in frame["after"]))
        lines.append(f"  {'metric':<{width}}  {'before':>{bw}}  {'after':>{aw}}  change")
        lines.extend(
            f"  {row.metric:<{width}}  {row.before:>{bw}}  {row.after:>{aw}}  {row.change}"
            for row in frame.itertuples(index=False)
        )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _html(self) -> str:
        parts = [f"<div class='nbt-comparison'><p><b>Comparison</b>: {escape(self._summary())}</p>"]
        if self.changes:
            parts.append("<p>changes: " + "; ".join(escape(c) for c in self.changes) + "</p>")
        memory = self._memory_reading()
        if memory:
            parts.append(f"<p>memory: {escape(memory)}</p>")
        parts.append(html_table(self.table(), max_rows=100))
        parts.extend(f"<p><i>note: {escape(n)}</i></p>" for n in self.notes)
        parts.append("</div>")
        return "".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "changes": list(self.changes),
            "notes": list(self.notes),
            "nothing_applied": self.nothing_applied,
            "timing": self.timing.to_dict() if self.timing is not None else None,
            "budget_bytes": self.budget_bytes,
        }

    def save(self, path: str | Path) -> Path:
        """Write the comparison as JSON (the plan object is not included)."""
        from nbtoolkit.core.errors import SaveError
        from nbtoolkit.core.paths import path_errors
        from nbtoolkit.core.saved import file_to_save

        target = file_to_save(path, what="Comparison")
        text = json.dumps(self.to_dict(), indent=1, default=str)
        with path_errors(target, "save the Comparison to", error=SaveError):
            target.write_text(text)
        return target

    @classmethod
    def load(cls, path: str | Path) -> Comparison:
        from nbtoolkit.core.errors import NbtUsageError
        from nbtoolkit.core.paths import user_path

        source = user_path(path)
        try:
            data = json.loads(source.read_text())
            return cls(
                before=Measurement.from_dict(data["before"]),
                after=Measurement.from_dict(data["after"]),
                changes=list(data.get("changes", [])),
                notes=list(data.get("notes", [])),
                nothing_applied=data.get("nothing_applied"),
                timing=InterleavedTiming.from_dict(data["timing"]) if data.get("timing") else None,
                budget_bytes=data.get("budget_bytes"),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NbtUsageError(
                f"cannot read a saved Comparison from {str(source)!r}: {exc}; pass a file written by "
                "Comparison.save()"
            ) from None
