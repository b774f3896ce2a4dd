"""A recomputation plan: which blocks to checkpoint, what that is predicted to save and cost.

Made by :func:`nbtoolkit.plan_recompute`; plain data (pandas frames, lists, numbers) that
saves and loads as JSON. ``apply(model)`` wraps the chosen blocks in activation
checkpointing and returns a handle whose ``undo()`` restores the model exactly.

The memory model the numbers come from (written out in full in
``nbtoolkit.recompute.planner``): the step's live bytes were measured over time;
a block is *alive* from the end of its forward to the start of its backward; a phase is a
stretch of the step with one set of alive blocks, and ``phases.baseline_bytes`` is the
highest live total measured in it. Checkpointing a set S of blocks gives the predicted peak

    peak(S) = fixed_bytes
              + max over phases p of ( baseline_bytes[p] - sum of saved_bytes[i] for i in S alive in p )

and the predicted overhead is the sum of the chosen blocks' ``recompute_time_s``, with the
sums of their ``recompute_time_p25_s`` and ``recompute_time_p75_s`` as its spread (how the
costs are timed: ``nbtoolkit.recompute.recompute_timing``). A prediction whose spread is more
than half of it is flagged uncertain (:attr:`RecomputePlan.overhead_uncertain`).
``fixed_bytes`` is device memory no checkpointing changes (parameters, optimizer state,
inputs). ``budget_kind`` says what the budget and every peak count: ``"total"`` (the default)
the device's whole peak, what ``torch.cuda.max_memory_allocated`` reports on a GPU and
MemTracker's total on the CPU; ``"step"`` only what the step allocates above what was live
before it (then ``fixed_bytes`` is 0).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes, format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["UNCERTAIN_SPREAD", "RecomputePlan", "Undoable"]

#: A predicted overhead is uncertain when its spread (p75 - p25) is more than this share of it.
UNCERTAIN_SPREAD = 0.5


class Undoable(Protocol):
    """What ``RecomputePlan.apply`` returns (``nbtoolkit.recompute.handle.Applied``): a
    handle whose ``undo()`` restores the model, also usable as ``with plan.apply(model): ...``."""

    changes: list[str]

    def undo(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass(repr=False)  # the Result mixin's repr (a summary) must win over dataclass's
class RecomputePlan(Result):
    """Blocks to checkpoint so the peak memory stays under ``budget_bytes``.

    Attributes:
        blocks: names (as in ``model.named_modules()``) of the blocks to checkpoint, in model order.
        budget_bytes: the budget the plan was made for, in bytes of the peak ``budget_kind`` names.
        predicted_peak_bytes: peak(blocks) from the memory model above.
        predicted_overhead_s: extra seconds per step: the sum of the chosen blocks' ``recompute_time_s``.
        predicted_overhead_p25_s / predicted_overhead_p75_s: its spread, the sums of the chosen
            blocks' ``recompute_time_p25_s`` / ``recompute_time_p75_s`` (None in plans saved
            before costs had a spread).
        baseline_peak_bytes: the measured peak without any checkpointing (plus ``fixed_bytes``).
        baseline_step_time_s: the measured median step time without checkpointing (the calling
            thread's processor time when the model is on the CPU, see ``plan_recompute``).
        candidates: one row per candidate block: ``block``, ``module`` (class),
            ``saved_bytes`` (measured drop in live bytes when only that block is checkpointed),
            ``recompute_time_s`` (the step-time increase checkpointing it is predicted to cost),
            ``recompute_time_p25_s`` and ``recompute_time_p75_s`` (that cost's spread: the 25th and
            75th percentiles of its measured samples), ``forward_time_s`` (its median forward, for
            reference), ``chosen``.
        tradeoff: the exact memory-vs-time Pareto front: ``predicted_peak_bytes``,
            ``predicted_overhead_s`` (and its ``predicted_overhead_p25_s`` / ``_p75_s``),
            ``n_blocks``, ``blocks`` (comma-separated), from no checkpointing down to the lowest
            reachable peak.
        phases: ``baseline_bytes`` and ``alive`` (block names) per phase of the memory model.
        measured_peak_bytes: the peak measured with the plan applied (None if not verified).
        solver: how the set was chosen.
        notes: what the planner wants you to know (candidates dropped, budget tightened ...).
        fixed_bytes: bytes added to every predicted peak, which no checkpointing changes
            (parameters, optimizer state, inputs; 0 for a ``"step"`` budget).
        budget_kind: ``"total"`` (the device's whole peak) or ``"step"`` (the step's own peak).
        fixed_by_category: what makes up ``fixed_bytes`` and the gradients, as far as measured
            (``parameter``, ``optimizer_state``, ``input``, ``gradient``): what a "no plan fits"
            message names as out of recomputation's reach (``RecomputeCosts.fixed_by_category``).
        choices: per candidate block, ``keep``, ``selective`` (matmul and attention outputs saved,
            the rest recomputed), ``full`` (the whole block recomputed) or ``offload`` (saved
            activations in host memory, GPU only); empty for block-only plans, where ``blocks``
            are the ``full`` ones (``nbtoolkit.recompute.selective``).
        backend: what the plan was measured under: ``"eager"`` or ``"torch.compile(...)"``.
        route: ``"blocks"`` (the per-block choices) or ``"partitioner"`` (torch's
            ``activation_memory_budget`` set to :attr:`activation_memory_budget`, no block wrapped).
        activation_memory_budget: the fraction the ``partitioner`` route sets (None otherwise).
        measured_step_time_s: the step time measured with the plan applied under ``backend``.
    """

    blocks: list[str]
    budget_bytes: int
    predicted_peak_bytes: int
    predicted_overhead_s: float
    baseline_peak_bytes: int
    baseline_step_time_s: float
    candidates: pd.DataFrame
    tradeoff: pd.DataFrame
    phases: pd.DataFrame
    measured_peak_bytes: int | None = None
    solver: str = "integer linear program (PuLP + CBC)"
    notes: list[str] = field(default_factory=list)
    fixed_bytes: int = 0
    budget_kind: str = "total"
    predicted_overhead_p25_s: float | None = None
    predicted_overhead_p75_s: float | None = None
    fixed_by_category: dict[str, int] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    backend: str = "eager"
    route: str = "blocks"
    activation_memory_budget: float | None = None
    measured_step_time_s: float | None = None

    # ---- the model, usable without re-running anything (the panel's slider uses these) ----
    def predict_peak(self, blocks: list[str] | tuple[str, ...]) -> int:
        """Predicted peak (bytes, the kind ``budget_kind`` names) when exactly ``blocks`` are checkpointed."""
        saved = dict(zip(self.candidates["block"], self.candidates["saved_bytes"], strict=True))
        chosen = set(blocks)
        peak = 0
        for baseline, alive in zip(self.phases["baseline_bytes"], self.phases["alive"], strict=True):
            peak = max(peak, int(baseline) - sum(int(saved[b]) for b in alive if b in chosen))
        return int(self.fixed_bytes) + peak

    def predict_overhead(self, blocks: list[str] | tuple[str, ...]) -> float:
        """Predicted extra seconds per step when exactly ``blocks`` are checkpointed."""
        return self._sum_of("recompute_time_s", blocks)

    def predict_overhead_spread(self, blocks: list[str] | tuple[str, ...]) -> tuple[float, float] | None:
        """The 25th and 75th percentiles of :meth:`predict_overhead` (None for a plan saved
        before costs had a spread)."""
        if "recompute_time_p25_s" not in self.candidates:
            return None
        return self._sum_of("recompute_time_p25_s", blocks), self._sum_of("recompute_time_p75_s", blocks)

    def _sum_of(self, column: str, blocks: list[str] | tuple[str, ...]) -> float:
        value = dict(zip(self.candidates["block"], self.candidates[column], strict=True))
        return float(sum(value[b] for b in blocks))

    @property
    def overhead_uncertain(self) -> bool:
        """Whether the predicted overhead's spread (p75 - p25) is more than half of it: the
        timings varied too much for the number to be trusted (a busy machine, too few rounds)."""
        if self.predicted_overhead_p25_s is None or self.predicted_overhead_p75_s is None:
            return False
        spread = self.predicted_overhead_p75_s - self.predicted_overhead_p25_s
        return spread > UNCERTAIN_SPREAD * self.predicted_overhead_s

    @property
    def min_peak_bytes(self) -> int:
        """The lowest peak any plan reaches (all helpful blocks checkpointed)."""
        return int(self.tradeoff["predicted_peak_bytes"].min())

    def best_for(self, budget_bytes: float) -> dict[str, Any] | None:
        """The cheapest point of the trade-off front whose predicted peak fits ``budget_bytes``.

        Exact (the front holds every Pareto-optimal plan), and instant: no re-run, no solver.
        None when no plan fits.
        """
        fits = self.tradeoff[self.tradeoff["predicted_peak_bytes"] <= budget_bytes]
        if fits.empty:
            return None
        row = fits.sort_values(["predicted_overhead_s", "predicted_peak_bytes"]).iloc[0]
        names = [b for b in str(row["blocks"]).split(",") if b]
        return {
            "blocks": names,
            "predicted_peak_bytes": int(row["predicted_peak_bytes"]),
            "predicted_overhead_s": float(row["predicted_overhead_s"]),
        }

    def with_blocks(self, blocks: list[str] | tuple[str, ...]) -> RecomputePlan:
        """This plan with exactly ``blocks`` chosen instead: same measurements and front, the
        predicted peak and overhead recomputed from the model above."""
        from nbtoolkit.core.errors import NbtUsageError

        known = list(self.candidates["block"])
        unknown = [b for b in blocks if b not in known]
        if unknown:
            raise NbtUsageError(f"{unknown} are not candidates of this plan: choose among {known}")
        chosen = set(blocks)
        ordered = [b for b in known if b in chosen]
        candidates = self.candidates.copy()
        candidates["chosen"] = [b in chosen for b in known]
        if "choice" in candidates:
            candidates["choice"] = ["full" if b in chosen else "keep" for b in known]
        spread = self.predict_overhead_spread(ordered)
        return dataclasses.replace(
            self,
            blocks=ordered,
            predicted_peak_bytes=self.predict_peak(ordered),
            predicted_overhead_s=self.predict_overhead(ordered),
            predicted_overhead_p25_s=spread[0] if spread else None,
            predicted_overhead_p75_s=spread[1] if spread else None,
            candidates=candidates,
            notes=list(self.notes),
            choices={b: ("full" if b in chosen else "keep") for b in known} if self.choices else {},
            route="blocks",
            activation_memory_budget=None,
            measured_step_time_s=None,
        )

    def apply(self, model: Any) -> Undoable:
        """Checkpoint the chosen blocks of ``model``; the handle's ``undo()`` restores it exactly.

        The model's own checkpointing (Hugging Face's ``gradient_checkpointing_enable()``, timm's
        ``set_grad_checkpointing()``) is off while the plan is applied and back on after ``undo()``:
        the plan's peak and overhead are for exactly its blocks checkpointed, once."""
        from nbtoolkit.recompute.checkpoint import checkpoint_blocks

        if not self.choices and self.activation_memory_budget is None:
            return checkpoint_blocks(model, self.blocks)
        from nbtoolkit.recompute.backend_plan import apply_backend_plan

        return apply_backend_plan(self, model)

    # ---- display ----
    def _report_figures(self) -> list[Any]:
        """Figures nbt.report embeds with this plan: the memory/time trade-off front."""
        from nbtoolkit.recompute.tradeoff_figure import tradeoff_figure

        return [tradeoff_figure(self)]

    def _summary_lines(self) -> list[str]:
        measured = (
            f", {format_bytes(self.measured_peak_bytes)} measured" if self.measured_peak_bytes else ""
        )
        counted = "total peak" if self.budget_kind == "total" else "step's own peak"
        head = (
            f"RecomputePlan: checkpoint {len(self.blocks)} of {len(self.candidates)} blocks "
            f"for a budget of {format_bytes(self.budget_bytes)} ({counted})"
        )
        fixed = (
            f" (of which {format_bytes(self.fixed_bytes)} fixed: parameters, optimizer state, inputs)"
            if self.fixed_bytes else ""
        )
        peak = (
            f"  peak   {format_bytes(self.baseline_peak_bytes)} -> "
            f"{format_bytes(self.predicted_peak_bytes)} predicted{measured}{fixed}"
        )
        overhead = (
            f"  time   +{format_seconds(self.predicted_overhead_s)} per step predicted"
            f"{self._overhead_spread()} (baseline step {format_seconds(self.baseline_step_time_s)})"
        )
        solver = (
            f"  solver {self.solver}; trade-off front of {len(self.tradeoff)} plans, lowest peak "
            f"{format_bytes(self.min_peak_bytes)}"
        )
        blocks = f"  blocks {', '.join(self.blocks) if self.blocks else '(none)'}"
        lines = [head, peak, overhead, blocks, solver]
        if self.choices or self.route != "blocks":
            from nbtoolkit.recompute.backend_plan import summary_lines

            lines = summary_lines(self, head, peak, overhead)
        return lines

    def _overhead_spread(self) -> str:
        """`` (p25-p75 a-b)`` after the predicted overhead, saying so when it is uncertain."""
        low, high = self.predicted_overhead_p25_s, self.predicted_overhead_p75_s
        if low is None or high is None or not self.blocks:
            return ""
        text = f" (p25-p75 {_range(low, high)}"
        if self.overhead_uncertain:
            text += f"; uncertain: the spread is {_share(high - low, self.predicted_overhead_s)}"
        return text + ")"

    def _cost_spreads(self) -> list[str]:
        """Per candidate, its cost's p25-p75 range as text ("" for a plan saved without it)."""
        if "recompute_time_p25_s" not in self.candidates:
            return [""] * len(self.candidates)
        return [
            _range(low, high)
            for low, high in zip(
                self.candidates["recompute_time_p25_s"], self.candidates["recompute_time_p75_s"], strict=True
            )
        ]

    def _text(self) -> str:
        lines = self._summary_lines()
        if "choice" in self.candidates:
            from nbtoolkit.recompute.backend_plan import choice_lines

            lines.append("  per block (measured):")
            lines.extend(choice_lines(self))
            lines.extend(f"  note: {n}" for n in self.notes)
            return "\n".join(lines)
        lines.append("  candidates:" + (" (cost: median, p25-p75)" if any(self._cost_spreads()) else ""))
        lines.extend(
            f"    {'*' if row.chosen else ' '} {row.block:<24} {row.module:<16} saves "
            f"{format_bytes(row.saved_bytes):>12}  costs {format_seconds(row.recompute_time_s):>9}"
            + (f"  ({spread})" if spread else "")
            for row, spread in zip(self.candidates.itertuples(index=False), self._cost_spreads(), strict=True)
        )
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _display_candidates(self) -> pd.DataFrame:
        frame = self.candidates.copy()
        frame["saved"] = [format_bytes(v) for v in frame["saved_bytes"]]
        frame["recompute time"] = [format_seconds(v) for v in frame["recompute_time_s"]]
        frame["p25-p75"] = self._cost_spreads()
        frame["chosen"] = ["yes" if c else "" for c in frame["chosen"]]
        if "choice" in frame:  # a plan with per-block choices: what each block does, and why
            return frame[["block", "module", "choice", "why"]]
        return frame[["block", "module", "saved", "recompute time", "p25-p75", "chosen"]]

    def _display_tradeoff(self) -> pd.DataFrame:
        frame = self.tradeoff.copy()
        frame["predicted peak"] = [format_bytes(v) for v in frame["predicted_peak_bytes"]]
        frame["predicted overhead"] = [format_seconds(v) for v in frame["predicted_overhead_s"]]
        columns = ["predicted peak", "predicted overhead", "n_blocks", "blocks"]
        if "predicted_overhead_p25_s" in frame:
            ends = zip(frame["predicted_overhead_p25_s"], frame["predicted_overhead_p75_s"], strict=True)
            frame["p25-p75"] = [_range(low, high) for low, high in ends]
            columns.insert(2, "p25-p75")
        return frame[columns]

    def _html(self) -> str:
        head = "<br>".join(escape(line.strip()) for line in self._summary_lines())
        notes = "".join(f"<p><i>note: {escape(n)}</i></p>" for n in self.notes)
        return (
            f"<div class='nbt-plan'><p>{head}</p><p><b>candidates</b></p>"
            f"{html_table(self._display_candidates(), max_rows=64)}"
            f"<p><b>trade-off front</b> (every plan no other plan beats in both memory and time)</p>"
            f"{html_table(self._display_tradeoff(), max_rows=64)}{notes}</div>"
        )

    # ---- save / load ----
    def to_dict(self) -> dict[str, Any]:
        phases = self.phases.copy()
        phases["alive"] = [list(a) for a in phases["alive"]]
        return {
            "blocks": list(self.blocks),
            "budget_bytes": int(self.budget_bytes),
            "predicted_peak_bytes": int(self.predicted_peak_bytes),
            "predicted_overhead_s": float(self.predicted_overhead_s),
            "baseline_peak_bytes": int(self.baseline_peak_bytes),
            "baseline_step_time_s": float(self.baseline_step_time_s),
            "candidates": self.candidates.to_dict(orient="records"),
            "tradeoff": self.tradeoff.to_dict(orient="records"),
            "phases": phases.to_dict(orient="records"),
            "measured_peak_bytes": self.measured_peak_bytes,
            "solver": self.solver,
            "notes": list(self.notes),
            "fixed_bytes": int(self.fixed_bytes),
            "budget_kind": self.budget_kind,
            "predicted_overhead_p25_s": self.predicted_overhead_p25_s,
            "predicted_overhead_p75_s": self.predicted_overhead_p75_s,
            "fixed_by_category": {str(k): int(v) for k, v in self.fixed_by_category.items()},
            "choices": dict(self.choices),
            "backend": self.backend,
            "route": self.route,
            "activation_memory_budget": self.activation_memory_budget,
            "measured_step_time_s": self.measured_step_time_s,
        }

    def save(self, path: str | Path) -> Path:
        from nbtoolkit.core.errors import SaveError
        from nbtoolkit.core.paths import path_errors
        from nbtoolkit.core.saved import file_to_save

        target = file_to_save(path, what="RecomputePlan")
        text = json.dumps(self.to_dict(), indent=1, default=_json_default)
        with path_errors(target, "save the RecomputePlan to", error=SaveError):
            target.write_text(text)
        return target

    @classmethod
    def load(cls, path: str | Path) -> RecomputePlan:
        import pandas as pd

        from nbtoolkit.core.errors import NbtUsageError
        from nbtoolkit.core.paths import user_path

        source = user_path(path)
        try:
            data = json.loads(source.read_text())
            phases = pd.DataFrame.from_records(data["phases"], columns=["phase", "baseline_bytes", "alive"])
            phases["alive"] = [tuple(a) for a in phases["alive"]]
            return cls(
                blocks=list(data["blocks"]),
                budget_bytes=int(data["budget_bytes"]),
                predicted_peak_bytes=int(data["predicted_peak_bytes"]),
                predicted_overhead_s=float(data["predicted_overhead_s"]),
                baseline_peak_bytes=int(data["baseline_peak_bytes"]),
                baseline_step_time_s=float(data["baseline_step_time_s"]),
                candidates=pd.DataFrame.from_records(data["candidates"]),
                tradeoff=pd.DataFrame.from_records(data["tradeoff"]),
                phases=phases,
                measured_peak_bytes=data.get("measured_peak_bytes"),
                solver=str(data.get("solver", "")),
                notes=list(data.get("notes", [])),
                fixed_bytes=int(data.get("fixed_bytes", 0)),
                # plans saved before budgets counted the device's total were step budgets
                budget_kind=str(data.get("budget_kind", "step")),
                predicted_overhead_p25_s=_optional_float(data.get("predicted_overhead_p25_s")),
                predicted_overhead_p75_s=_optional_float(data.get("predicted_overhead_p75_s")),
                fixed_by_category={str(k): int(v) for k, v in data.get("fixed_by_category", {}).items()},
                choices={str(k): str(v) for k, v in data.get("choices", {}).items()},
                backend=str(data.get("backend", "eager")),
                route=str(data.get("route", "blocks")),
                activation_memory_budget=_optional_float(data.get("activation_memory_budget")),
                measured_step_time_s=_optional_float(data.get("measured_step_time_s")),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NbtUsageError(
                f"cannot read a saved RecomputePlan from {str(source)!r}: {exc}; pass a file written by "
                "RecomputePlan.save()"
            ) from None


def _range(low: float, high: float) -> str:
    """``2.0-2.6 ms``: one unit when both ends read best in it."""
    first, second = format_seconds(low), format_seconds(high)
    unit, other = first.rpartition(" ")[2], second.rpartition(" ")[2]
    return f"{first.rpartition(' ')[0]}-{second}" if unit == other else f"{first}-{second}"


def _share(part: float, whole: float) -> str:
    """``80% of the cost``, or ``2.3x the cost`` when larger."""
    if whole <= 0:
        return "larger than the cost"
    ratio = part / whole
    return f"{ratio:.0%} of the cost" if ratio < 1 else f"{ratio:.1f}x the cost"


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
