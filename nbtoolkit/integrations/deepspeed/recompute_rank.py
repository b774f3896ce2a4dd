"""What runs on each rank of :func:`~nbtoolkit.integrations.deepspeed.recompute.zero_plan_recompute`:
one DeepSpeed engine per ZeRO stage, planned and verified by the shared
:func:`nbtoolkit.integrations.recompute_rank.plan_on_rank` (the method is in its docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.integrations.recompute_rank import plan_on_rank

__all__ = ["recompute_on_rank"]


def recompute_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    config: dict[str, Any],
    *,
    budgets: Sequence[int],
    blocks: Sequence[str] | None,
    steps: int,
    timing: MeasureConfig,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> dict[str, Any]:
    """Build the model under DeepSpeed ``config``; measure, plan and verify inside the engine."""
    import torch.distributed as dist

    from nbtoolkit.integrations.deepspeed.rank import _engine_and_step

    engine, step = _engine_and_step(model_fn, batch_fn, config, rank=dist.get_rank(), lr=lr, loss_fn=loss_fn)
    try:
        return plan_on_rank(engine.module, step, budgets=budgets, blocks=blocks, steps=steps, timing=timing)
    finally:
        engine.destroy()
