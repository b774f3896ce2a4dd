"""Settings of ``nbt.optimize``, of its measurements and of ``nbt.plan_recompute``, as frozen dataclasses.

Every field is keyword-only and checked when the object is made, so a wrong setting fails
before anything runs, with one message naming it. The ``from_env()`` classmethods are the
only place nbtoolkit reads these settings from the environment; arguments given in code
always win over it. The variables:

``NBTOOLKIT_RECOMPUTE``
    ``auto``: plan recomputation under ``NBTOOLKIT_MEMORY_BUDGET`` (``OptimizeConfig.recompute``);
    ``off``/``none``/``0``/``false``/``no`` or empty: no recomputation.
``NBTOOLKIT_MEMORY_BUDGET``
    the device's total peak for ``recompute="auto"``: bytes, text like ``1.5GB`` / ``1400MiB``,
    or on a GPU a share of its memory like ``90%`` (``OptimizeConfig.budget_bytes``).
``NBTOOLKIT_MEASURE_STEPS`` / ``NBTOOLKIT_MEASURE_WARMUP``
    steps and warm-up of every measurement: read by ``nbtoolkit.core.measure_config``
    (``MeasureConfig``).

So a training script can be switched without editing it::

    NBTOOLKIT_RECOMPUTE=auto NBTOOLKIT_MEMORY_BUDGET=1.5GB python train.py
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import DEFAULT_STEPS, MeasureConfig
from nbtoolkit.core.units import DeviceShare, parse_budget
from nbtoolkit.recompute.amp import AMP_DTYPES
from nbtoolkit.recompute.apply_compile import compile_options

if TYPE_CHECKING:
    from nbtoolkit.recompute.plan import RecomputePlan

__all__ = [
    "ENV_BUDGET",
    "ENV_RECOMPUTE",
    "OptimizeConfig",
    "RecomputeConfig",
]

ENV_RECOMPUTE = "NBTOOLKIT_RECOMPUTE"
ENV_BUDGET = "NBTOOLKIT_MEMORY_BUDGET"

_OFF = {"", "none", "off", "0", "false", "no"}


def _block_names(blocks: Any) -> tuple[str, ...] | None:
    if blocks is None:
        return None
    names = (blocks,) if isinstance(blocks, str) else tuple(blocks)
    if not names:
        raise NbtUsageError("blocks is empty: name at least one module, or leave it out")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise NbtUsageError(f"blocks must be module names (text), got {bad!r}")
    return names


@dataclass(frozen=True, kw_only=True)
class RecomputeConfig:
    """How ``nbt.plan_recompute`` measures its candidates.

    Attributes:
        blocks: candidate module names (``model.named_modules()`` paths); None: the model's
            repeated blocks.
        steps: timing rounds at least (each: one plain step and one step with every candidate
            checkpointed; more while the costs are imprecise, up to a time limit), >= 1.
        verify: apply the chosen plan and measure its real peak.

    It reads no environment variable (``plan_recompute`` never did); ``OptimizeConfig.plan``
    holds the one ``nbt.optimize`` uses.
    """

    blocks: tuple[str, ...] | None = None
    steps: int = DEFAULT_STEPS
    verify: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", _block_names(self.blocks))
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise NbtUsageError(f"steps must be >= 1, got {self.steps!r}")


def _plan_while_optimizing() -> RecomputeConfig:
    # two timing rounds: enough to rank the blocks, and optimize() measures the result anyway
    return RecomputeConfig(steps=2)


@dataclass(frozen=True, kw_only=True)
class OptimizeConfig:
    """What ``nbt.optimize`` applies and how it measures.

    Attributes:
        compile: False; True (torch.compile defaults); a mode name; or a dict of torch.compile
            options (``mode``, ``fullgraph``, ``dynamic``, ``backend``, ``options``).
        recompute: None (no checkpointing); ``"auto"`` (plan under ``budget_bytes``); the
            module names to checkpoint (kept as a tuple); or a
            :class:`~nbtoolkit.recompute.plan.RecomputePlan` (``nbt.plan_recompute``'s), applied as
            planned (its per-block choices or partitioner budget too) without planning again.
        budget_bytes: the device's total peak for ``recompute="auto"``: bytes, text like ``"1.5GB"``,
            or on a GPU a share of its memory like ``"90%"``
            (kept as int bytes).
        amp: None, ``"bf16"`` or ``"fp16"`` (autocast around the forward).
        undo: restore the model at the end; False keeps the changes (``comparison.applied``).
        measure: how each side is measured.
        plan: how ``recompute="auto"`` measures its candidates (two timing rounds by default).
    """

    compile: bool | str | dict[str, Any] | None = False
    recompute: str | tuple[str, ...] | RecomputePlan | None = None
    budget_bytes: int | DeviceShare | None = None
    amp: str | None = None
    undo: bool = True
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    plan: RecomputeConfig = field(default_factory=_plan_while_optimizing)

    def __post_init__(self) -> None:
        compile_options(self.compile)  # raises on a bad mode or option
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise NbtUsageError(f"amp must be None, 'bf16' or 'fp16', got {self.amp!r}")
        if self.budget_bytes is not None:
            object.__setattr__(self, "budget_bytes", parse_budget(self.budget_bytes))
        recompute = self.recompute
        wrong = "recompute must be None, 'auto', a list of module names or a plan (nbt.plan_recompute), got"
        if isinstance(recompute, str) and recompute != "auto":
            raise NbtUsageError(f"{wrong} {recompute!r}")
        if self.given_plan is not None:
            if self.budget_bytes is None:  # the budget the plan was made for ("peak under budget")
                object.__setattr__(self, "budget_bytes", self.given_plan.budget_bytes)
        elif recompute is not None and not isinstance(recompute, str):
            if not isinstance(recompute, Sequence):
                raise NbtUsageError(f"{wrong} {type(recompute).__name__}")
            object.__setattr__(self, "recompute", _block_names(recompute))
        if recompute == "auto" and self.budget_bytes is None:
            raise NbtUsageError(
                f"recompute='auto' needs a memory budget: pass budget_bytes=... or set {ENV_BUDGET}=1.5GB"
            )
        if not isinstance(self.measure, MeasureConfig) or not isinstance(self.plan, RecomputeConfig):
            raise NbtUsageError("measure must be a MeasureConfig and plan a RecomputeConfig")

    @property
    def compile_options(self) -> dict[str, Any] | None:
        """The checked torch.compile options, or None when nothing is compiled."""
        return compile_options(self.compile)

    @property
    def blocks(self) -> list[str] | None:
        """The module names to checkpoint when given by name (None for ``"auto"``, a plan or none)."""
        return list(self.recompute) if isinstance(self.recompute, tuple) else None

    @property
    def given_plan(self) -> RecomputePlan | None:
        """The plan passed as ``recompute`` (None when names, ``"auto"`` or nothing were)."""
        from nbtoolkit.recompute.plan import RecomputePlan

        return self.recompute if isinstance(self.recompute, RecomputePlan) else None

    @classmethod
    def from_env(cls, *, environ: Mapping[str, str] | None = None, **given: Any) -> OptimizeConfig:
        """Fields ``given`` (not None) win; ``recompute`` and ``budget_bytes`` left out or None come
        from ``NBTOOLKIT_RECOMPUTE``/``NBTOOLKIT_MEMORY_BUDGET`` when set; ``measure`` left out is
        ``MeasureConfig.from_env(environ=environ)``. ``environ`` defaults to ``os.environ``."""
        env = os.environ if environ is None else environ
        fields = {k: v for k, v in given.items() if v is not None}
        if "recompute" not in fields:
            raw = env.get(ENV_RECOMPUTE, "").strip()
            if raw.lower() == "auto":
                fields["recompute"] = "auto"
            elif raw.lower() not in _OFF:
                raise NbtUsageError(
                    f"{ENV_RECOMPUTE}={raw!r} is not understood: set it to 'auto' "
                    f"(plan recomputation under {ENV_BUDGET}) or 'off'"
                )
        if "budget_bytes" not in fields and env.get(ENV_BUDGET, "").strip():
            fields["budget_bytes"] = parse_budget(env[ENV_BUDGET], what=ENV_BUDGET)
        if "measure" not in fields:
            fields["measure"] = MeasureConfig.from_env(environ=env)
        return cls(**fields)
