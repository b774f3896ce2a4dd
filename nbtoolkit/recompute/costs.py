"""What the recompute planner measured: per candidate block, what checkpointing it saves and costs.

:class:`RecomputeCosts` is the table between the two halves of ``nbt.plan_recompute``:
the measurement (``nbtoolkit.recompute.plan_measure``, which runs the step) makes
one, and the solver (``nbtoolkit.recompute.solver``, pure) turns one and a budget into a
:class:`~nbtoolkit.recompute.plan.RecomputePlan`. Plain numbers, so a solver test or a what-if
can write one by hand.

The memory model the numbers feed (written out in ``nbtoolkit.recompute.planner``):
the step splits into *phases*, stretches with one set of *alive* blocks (a block is alive
from the end of its forward to the start of its backward); ``phase_bytes[p]`` is the highest
live total measured in phase ``p``. Checkpointing a set S gives the predicted peak
``fixed + max_p (phase_bytes[p] - sum of saved_bytes[i] for i in S alive in p)``, where
``fixed`` (``fixed_bytes``) is the device memory outside the step's own allocations that no
checkpointing changes (parameters, optimizer state, inputs: the device's total at the
baseline peak minus the step's own peak), and the predicted overhead is the sum of the
chosen ``recompute_time_s``, its spread the sums of their ``recompute_time_p25_s`` and
``recompute_time_p75_s`` (what varies from step to step, chiefly the overhead factor, varies
for every block alike, and quantiles of quantities that move together add). A budget of the
device's whole peak counts ``fixed``; a budget of the step's own memory (``step_budget_bytes``)
leaves it out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["RecomputeCosts"]


def _numbers(name: str, values: Iterable[Any], kind: type, count: int | None) -> tuple[Any, ...]:
    items = tuple(values)
    if count is not None and len(items) != count:
        raise NbtUsageError(f"{name} has {len(items)} entries for {count} blocks: give one per block")
    for value in items:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise NbtUsageError(f"{name} must hold numbers >= 0, got {value!r}")
    return tuple(kind(v) for v in items)


@dataclass(frozen=True, kw_only=True)
class RecomputeCosts:
    """Per candidate block: bytes saved and seconds added by checkpointing it; the step's phases.

    Attributes:
        blocks: candidate names (``model.named_modules()`` paths), in model order.
        saved_bytes: per block, the drop in live bytes when only that block is checkpointed.
        recompute_time_s: per block, the step-time increase checkpointing it is predicted to cost
            (the median of its measured samples, see ``nbtoolkit.recompute.recompute_timing``).
        recompute_time_p25_s / recompute_time_p75_s: the 25th and 75th percentiles of those
            samples, the cost's spread; default empty: no spread known (:attr:`recompute_time_spread_s`
            then gives the cost itself).
        phase_bytes: per phase, the highest live total measured in it without checkpointing.
        phase_alive: per phase, the names of the blocks alive in it.
        forward_time_s: per block, its median forward in the plain steps (for reference); default zeros.
        modules: per block, its class name; default empty names.
        baseline_peak_bytes: the measured peak without checkpointing; default the highest phase.
        baseline_step_time_s: the measured median step time without checkpointing.
        notes: what the measurement wants the reader of the plan to know.
        fixed_bytes: device memory outside ``phase_bytes`` that checkpointing never changes
            (the baseline's total peak minus its own peak); 0 when the total was not measured.
        fixed_by_category: what makes up the fixed memory and the gradients, for messages:
            ``parameter``, ``optimizer_state``, ``input``, ``gradient`` (bytes of the trainable
            parameters' gradients, made during backward) as far as they were measured.
        timing: numbers about the timing rounds, for reports: ``rounds``, ``seconds``,
            ``precise`` (1.0 when the rounds stopped because the estimates were precise), and the
            overhead factor's ``overhead_factor_p25``, ``overhead_factor``, ``overhead_factor_p75``.

    Lists are accepted and kept as tuples; wrong lengths, unknown block names in
    ``phase_alive``, negative numbers and a cost outside its quartiles raise NbtUsageError.
    """

    blocks: tuple[str, ...]
    saved_bytes: tuple[int, ...]
    recompute_time_s: tuple[float, ...]
    phase_bytes: tuple[int, ...]
    phase_alive: tuple[frozenset[str], ...]
    forward_time_s: tuple[float, ...] = ()
    modules: tuple[str, ...] = ()
    baseline_peak_bytes: int | None = None
    baseline_step_time_s: float = 0.0
    notes: tuple[str, ...] = ()
    fixed_bytes: int = 0
    fixed_by_category: dict[str, int] = field(default_factory=dict)
    recompute_time_p25_s: tuple[float, ...] = ()
    recompute_time_p75_s: tuple[float, ...] = ()
    timing: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        blocks = (self.blocks,) if isinstance(self.blocks, str) else tuple(self.blocks)
        if len(set(blocks)) != len(blocks):
            raise NbtUsageError(f"a block is named twice in {list(blocks)}: name each block once")
        n = len(blocks)
        phase_bytes = _numbers("phase_bytes", self.phase_bytes, int, None)
        alive = tuple(frozenset(a) for a in self.phase_alive)
        if len(alive) != len(phase_bytes):
            raise NbtUsageError(
                f"phase_alive has {len(alive)} entries for {len(phase_bytes)} phases: give one set per phase"
            )
        unknown = sorted({b for a in alive for b in a} - set(blocks))
        if unknown:
            raise NbtUsageError(f"phase_alive names {unknown}, which are not in blocks {list(blocks)}")
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "blocks", blocks)
        set_(self, "saved_bytes", _numbers("saved_bytes", self.saved_bytes, int, n))
        cost = _numbers("recompute_time_s", self.recompute_time_s, float, n)
        set_(self, "recompute_time_s", cost)
        # quartiles left out stay empty (no spread known), so replacing only the costs stays valid
        given = bool(self.recompute_time_p25_s) or bool(self.recompute_time_p75_s)
        low = _numbers("recompute_time_p25_s", self.recompute_time_p25_s, float, n if given else 0)
        high = _numbers("recompute_time_p75_s", self.recompute_time_p75_s, float, n if given else 0)
        outside = [blocks[i] for i in range(len(low)) if not low[i] <= cost[i] <= high[i]]
        if outside:
            raise NbtUsageError(
                f"recompute_time_s of {outside} is outside its recompute_time_p25_s..recompute_time_p75_s: "
                "give the 25th percentile <= the cost <= the 75th percentile"
            )
        set_(self, "recompute_time_p25_s", low)
        set_(self, "recompute_time_p75_s", high)
        set_(self, "timing", {str(k): float(v) for k, v in dict(self.timing).items()})
        set_(self, "phase_bytes", phase_bytes)
        set_(self, "phase_alive", alive)
        forward = self.forward_time_s or (0.0,) * n
        set_(self, "forward_time_s", _numbers("forward_time_s", forward, float, n))
        modules = tuple(self.modules) or ("",) * n
        if len(modules) != n:
            raise NbtUsageError(f"modules has {len(modules)} entries for {n} blocks: give one per block")
        set_(self, "modules", modules)
        if self.baseline_peak_bytes is None:
            set_(self, "baseline_peak_bytes", max(phase_bytes, default=0))
        set_(self, "notes", tuple(self.notes))
        set_(self, "fixed_bytes", _numbers("fixed_bytes", (self.fixed_bytes,), int, None)[0])
        set_(self, "fixed_by_category", {str(k): int(v) for k, v in dict(self.fixed_by_category).items()})

    @property
    def recompute_time_spread_s(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per block the cost's 25th and 75th percentiles; the cost itself where none were measured."""
        if not self.recompute_time_p25_s:
            return self.recompute_time_s, self.recompute_time_s
        return self.recompute_time_p25_s, self.recompute_time_p75_s

    @property
    def alive_indices(self) -> list[frozenset[int]]:
        """``phase_alive`` as sets of positions in ``blocks`` (what the solver works on)."""
        position = {name: i for i, name in enumerate(self.blocks)}
        return [frozenset(position[b] for b in alive) for alive in self.phase_alive]

    @classmethod
    def worst_of(cls, per_rank: list[RecomputeCosts]) -> RecomputeCosts:
        """One table that keeps every rank's prediction safe: what one plan for all ranks is solved on.

        Each rank's phases are kept, with that rank's fixed bytes added (so ``fixed_bytes`` is 0):
        a plan fits the budget only if it fits on every rank. Per block the saving is the
        smallest over ranks and the recompute time (and each of its quartiles) the largest (the
        slowest rank sets the step).
        The blocks must be the same on every rank.
        """
        if not per_rank:
            raise NbtUsageError("no per-rank measurements to combine")
        first = per_rank[0]
        for costs in per_rank[1:]:
            if costs.blocks != first.blocks:
                raise NbtUsageError(
                    f"ranks measured different blocks ({list(first.blocks)} vs {list(costs.blocks)}): "
                    "every rank must build the same model"
                )
        n = len(first.blocks)
        categories = sorted({k for c in per_rank for k in c.fixed_by_category})
        low = [c.recompute_time_spread_s[0] for c in per_rank]
        high = [c.recompute_time_spread_s[1] for c in per_rank]
        return cls(
            blocks=first.blocks,
            modules=first.modules,
            saved_bytes=tuple(min(c.saved_bytes[i] for c in per_rank) for i in range(n)),
            recompute_time_s=tuple(max(c.recompute_time_s[i] for c in per_rank) for i in range(n)),
            recompute_time_p25_s=tuple(max(rank[i] for rank in low) for i in range(n)),
            recompute_time_p75_s=tuple(max(rank[i] for rank in high) for i in range(n)),
            forward_time_s=tuple(max(c.forward_time_s[i] for c in per_rank) for i in range(n)),
            phase_bytes=tuple(c.fixed_bytes + level for c in per_rank for level in c.phase_bytes),
            phase_alive=tuple(alive for c in per_rank for alive in c.phase_alive),
            baseline_peak_bytes=max(c.fixed_bytes + int(c.baseline_peak_bytes or 0) for c in per_rank),
            baseline_step_time_s=max(c.baseline_step_time_s for c in per_rank),
            notes=tuple(dict.fromkeys(note for c in per_rank for note in c.notes)),
            fixed_bytes=0,
            fixed_by_category={k: max(c.fixed_by_category.get(k, 0) for c in per_rank) for k in categories},
        )
