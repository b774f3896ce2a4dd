"""What the recompute planner measured: per candidate block, what checkpointing it saves and costs.

:class:`RecomputeCosts` is the table between the two halves of ``nbt.plan_recompute``:
the measurement (``nbtoolkit.optimizations.recompute_measure``, which runs the step) makes
one, and the solver (``nbtoolkit.analysis.recompute``, pure) turns one and a budget into a
:class:`~nbtoolkit.model.plan.RecomputePlan`. Plain numbers, so a solver test or a what-if
can write one by hand.

The memory model the numbers feed (written out in ``nbtoolkit.optimizations.recompute``):
the step splits into *phases*, stretches with one set of *alive* blocks (a block is alive
from the end of its forward to the start of its backward); ``phase_bytes[p]`` is the highest
live total measured in phase ``p``. Checkpointing a set S gives the predicted peak
``fixed + max_p (phase_bytes[p] - sum of saved_bytes[i] for i in S alive in p)``, where
``fixed`` is memory no checkpointing changes (0 today: budgets count the step's own
allocations) and the predicted overhead is the sum of the chosen ``recompute_time_s``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nbtoolkit.errors import NbtUsageError

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
        recompute_time_s: per block, the step-time increase when only that block is checkpointed.
        phase_bytes: per phase, the highest live total measured in it without checkpointing.
        phase_alive: per phase, the names of the blocks alive in it.
        forward_time_s: per block, its fastest forward (for reference); default zeros.
        modules: per block, its class name; default empty names.
        baseline_peak_bytes: the measured peak without checkpointing; default the highest phase.
        baseline_step_time_s: the measured median step time without checkpointing.
        notes: what the measurement wants the reader of the plan to know.

    Lists are accepted and kept as tuples; wrong lengths, unknown block names in
    ``phase_alive`` and negative numbers raise NbtUsageError.
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
        set_(self, "recompute_time_s", _numbers("recompute_time_s", self.recompute_time_s, float, n))
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

    @property
    def alive_indices(self) -> list[frozenset[int]]:
        """``phase_alive`` as sets of positions in ``blocks`` (what the solver works on)."""
        position = {name: i for i, name in enumerate(self.blocks)}
        return [frozenset(position[b] for b in alive) for alive in self.phase_alive]
