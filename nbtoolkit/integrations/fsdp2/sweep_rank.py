"""What runs on each rank of an FSDP2 sweep or recompute plan.

Sent to the ranks by ``Cluster.run`` (from :mod:`.sweep` and :mod:`.recompute`); torch is imported
inside, on the rank. The model and its step come from :mod:`.rank` (``build_sharded``,
``make_step``); the sweep's numbers are measured by
:func:`nbtoolkit.integrations.rank_measure.time_and_profile_on_rank` and the plans by
:func:`nbtoolkit.integrations.recompute_rank.plan_on_rank`, as for DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.integrations.fsdp2.rank import build_sharded, make_step
from nbtoolkit.integrations.fsdp2.wrap import ShardSettings
from nbtoolkit.integrations.rank_measure import live_bytes_before_model, time_and_profile_on_rank
from nbtoolkit.integrations.recompute_rank import plan_on_rank

__all__ = ["recompute_one_on_rank", "sweep_one_on_rank"]


def sweep_one_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    settings: ShardSettings,
    *,
    measure: MeasureConfig,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
    blocks: Sequence[str] | None,
) -> dict[str, Any]:
    """Shard the model under ``settings`` and measure it (:func:`time_and_profile_on_rank`)."""
    import gc

    before = live_bytes_before_model()
    model, optimizer = build_sharded(model_fn, settings, blocks=blocks, lr=lr)
    try:
        step = make_step(model, optimizer, batch_fn, loss_fn)
        return time_and_profile_on_rank(step, before=before, measure=measure)
    finally:
        # FSDP2 keeps no process-wide state: dropping the model frees its shards and buffers
        del model, optimizer
        gc.collect()


def recompute_one_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    settings: ShardSettings,
    *,
    budgets: Sequence[int],
    blocks: Sequence[str] | None,
    steps: int,
    timing: MeasureConfig,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> dict[str, Any]:
    """Shard the model under ``settings``; measure, plan and verify recomputation of its blocks."""
    import gc

    model, optimizer = build_sharded(model_fn, settings, blocks=blocks, lr=lr)
    try:
        step = make_step(model, optimizer, batch_fn, loss_fn)
        return plan_on_rank(model, step, budgets=budgets, blocks=blocks, steps=steps, timing=timing)
    finally:
        del model, optimizer
        gc.collect()
