"""What runs on each rank of an FSDP2 sweep or recompute plan: the sharded model and its training step.

Sent to the ranks by ``Cluster.run`` (from :mod:`.sweep` and :mod:`.recompute`); torch is imported
inside, on the rank. The numbers a sweep returns are measured by
:func:`nbtoolkit.integrations.rank_measure.time_and_profile_on_rank`, as for DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.integrations.fsdp2.wrap import ShardSettings, shard_model
from nbtoolkit.integrations.rank_measure import live_bytes_before_model, time_and_profile_on_rank

__all__ = ["ShardedStep", "sharded_step", "sweep_one_on_rank"]


@dataclass
class ShardedStep:
    """A model sharded with FSDP2 on this rank and one training step of it (returns the loss)."""

    model: Any
    step: Callable[[], float]


def sharded_step(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    settings: ShardSettings,
    *,
    rank: int,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
    blocks: Sequence[str] | None = None,
) -> ShardedStep:
    """On a rank: the model (seeded alike on every rank) sharded under ``settings``, an AdamW over
    its shards, and one step on this rank's batch (forward, backward, ``optimizer.step()``)."""
    import torch

    torch.manual_seed(0)
    model = model_fn()
    if torch.cuda.is_available():
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    device = next(model.parameters()).device
    shard_model(model, settings, blocks=blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batch = batch_fn(rank)
    inputs, targets = batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)
    inputs = inputs.to(device)
    targets = targets.to(device) if targets is not None else None

    def step() -> float:
        out = model(inputs)
        if loss_fn is not None:
            loss = loss_fn(out, targets)
        elif targets is not None:
            loss = torch.nn.functional.mse_loss(out.float(), targets.float())
        else:
            loss = out.float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return ShardedStep(model=model, step=step)


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

    import torch.distributed as dist

    before = live_bytes_before_model()
    built = sharded_step(
        model_fn, batch_fn, settings, rank=dist.get_rank(), lr=lr, loss_fn=loss_fn, blocks=blocks
    )
    try:
        return time_and_profile_on_rank(built.step, before=before, measure=measure)
    finally:
        del built  # FSDP2 holds no process-wide state: dropping the model frees its shards and buffers
        gc.collect()
