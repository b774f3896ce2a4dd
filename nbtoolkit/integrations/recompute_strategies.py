"""One entry for recompute plans on a cluster under each way of sharding training state.

    import nbtoolkit as nbt
    plans = nbt.plan_recompute_on(cluster, make_model, make_batch, strategy="fsdp2", budget="30MB")
    plans = nbt.plan_recompute_on(cluster, make_model, make_batch, strategy="zero2", budget="30MB")

``strategy`` picks the planner: ``"zero1"``, ``"zero2"``, ``"zero3"`` go to
:func:`~nbtoolkit.integrations.deepspeed.recompute.zero_plan_recompute` with that stage,
``"fsdp2"`` to :func:`~nbtoolkit.integrations.fsdp2.recompute.fsdp2_plan_recompute`. Both keep
every rank's device total under the budget, measured.

Why a function beside the Cluster rather than a ``Cluster.plan_recompute`` method: the cluster
package sits below the integrations (``integrations`` imports ``cluster``, never the reverse; see
tests/foundation/test_layers.py), so a method on the Cluster could reach DeepSpeed and FSDP2 only
through a string import or a registry filled as a side effect of importing. This module is in
``integrations``, where both planners and the Cluster may be imported, and the package top
exports it as ``nbt.plan_recompute_on``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.integrations.model_fn import check_model_fn

if TYPE_CHECKING:
    from nbtoolkit.cluster.cluster import Cluster

__all__ = ["STRATEGIES", "plan_recompute_on"]

#: strategy -> what it shards (for the error message and the docs)
STRATEGIES = {
    "fsdp2": "FSDP2 (fully_shard per block): parameters, gradients and optimizer state",
    "zero1": "DeepSpeed ZeRO-1: optimizer state",
    "zero2": "DeepSpeed ZeRO-2: optimizer state and gradients",
    "zero3": "DeepSpeed ZeRO-3: optimizer state, gradients and parameters",
}
# options each planner takes beyond the common ones
_OPTIONS = {"fsdp2": {"settings"}, "zero": {"knobs", "micro_batch_size"}}


def _strategy(strategy: Any) -> str:
    if not isinstance(strategy, str) or strategy.lower() not in STRATEGIES:
        choices = "; ".join(f"{name!r} ({what})" for name, what in STRATEGIES.items())
        raise NbtUsageError(f"unknown recompute strategy {strategy!r}: use one of {choices}")
    return strategy.lower()


def plan_recompute_on(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    strategy: str,
    budget: Any = None,
    blocks: Any = None,
    steps: int = 2,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    config: Any = None,
    **options: Any,
) -> Any:
    """Which blocks to recompute on ``cluster`` under ``strategy`` so every rank stays under ``budget``.

    Args:
        strategy: ``"fsdp2"``, ``"zero1"``, ``"zero2"`` or ``"zero3"``.
        model_fn: a function building the model on each rank (the strategy wraps it there).
        batch_fn, budget, blocks, steps, lr, loss_fn, config: as for the planners.
        options: the planner's own: ``settings=ShardSettings(...)`` for FSDP2; ``knobs={...}`` and
            ``micro_batch_size=`` for ZeRO.
    Returns:
        An :class:`~nbtoolkit.integrations.fsdp2.recompute.Fsdp2Recompute` or a
        :class:`~nbtoolkit.integrations.deepspeed.recompute.ZeroRecompute`.
    """
    name = _strategy(strategy)
    family = "fsdp2" if name == "fsdp2" else "zero"
    unknown = sorted(set(options) - _OPTIONS[family])
    if unknown:
        raise NbtUsageError(
            f"option(s) {unknown} do not apply to strategy={name!r}: it takes "
            f"{', '.join(sorted(_OPTIONS[family]))} beside budget, blocks, steps, lr, loss_fn, config"
        )
    check_model_fn(model_fn, name)
    common = {
        "budget": budget, "blocks": blocks, "steps": steps, "lr": lr, "loss_fn": loss_fn, "config": config,
    }  # fmt: skip
    if family == "fsdp2":
        from nbtoolkit.integrations.fsdp2.recompute import fsdp2_plan_recompute

        return fsdp2_plan_recompute(cluster, model_fn, batch_fn, **common, **options)
    from nbtoolkit.integrations.deepspeed.recompute import zero_plan_recompute

    return zero_plan_recompute(cluster, model_fn, batch_fn, stage=int(name[-1]), **common, **options)
