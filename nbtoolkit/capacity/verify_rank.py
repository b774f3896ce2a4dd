"""What runs on each rank when ``FitResult.verify`` checks a row: the real strategy for a few steps.

ZeRO stages and FSDP2 run through the project's integrations (the same functions their sweeps
send to the ranks); DDP, which no integration wraps, is torch's ``DistributedDataParallel`` here.
Each returns :func:`~nbtoolkit.integrations.rank_measure.time_and_profile_on_rank`'s numbers, so
the measured peak is the one every other cluster memory API reports (on CPU ranks: the
configuration's live tensors plus how far the profiled steps' allocations rose:
:func:`~nbtoolkit.integrations.rank_measure.cpu_peak_growth_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.integrations.rank_measure import live_bytes_before_model, time_and_profile_on_rank

__all__ = ["batch_for_rank", "ddp_one_on_rank", "measure_on_rank"]


def batch_for_rank(make_batch: Callable[[int], Any], micro_batch: int, rank: int) -> Any:
    """The integrations call ``batch_fn(rank)``; nbt.fit's ``make_batch`` takes the micro-batch."""
    return make_batch(micro_batch)


def ddp_one_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    measure: MeasureConfig,
    lr: float,
    loss_fn: Callable[[Any, Any], Any],
) -> dict[str, Any]:
    """DistributedDataParallel with its defaults and AdamW; the step zeroes gradients to None at its end."""
    import gc

    import torch
    import torch.distributed as dist

    before = live_bytes_before_model()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(model_fn())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batch = batch_fn(dist.get_rank())
    inputs, targets = batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)

    def step() -> float:
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    try:
        return time_and_profile_on_rank(step, before=before, measure=measure)
    finally:
        gc.collect()  # the model goes with this frame; DDP keeps no process-wide state


def measure_on_rank(
    strategy: str,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    micro_batch: int,
    measure: MeasureConfig,
    loss_fn: Callable[[Any, Any], Any],
    blocks: Sequence[str] | None,
    zero_bucket: int,
    lr: float = 1e-3,
) -> dict[str, Any]:
    """Run ``strategy`` on this rank for ``measure``'s steps and measure it."""
    if strategy == "ddp":
        return ddp_one_on_rank(model_fn, batch_fn, measure=measure, lr=lr, loss_fn=loss_fn)
    if strategy == "fsdp2":
        from nbtoolkit.integrations.fsdp2.sweep_rank import sweep_one_on_rank as fsdp2_one
        from nbtoolkit.integrations.fsdp2.wrap import ShardSettings

        return fsdp2_one(model_fn, batch_fn, ShardSettings(), measure=measure, lr=lr, loss_fn=loss_fn,
                         blocks=blocks)
    from nbtoolkit.integrations.deepspeed.config import zero_config
    from nbtoolkit.integrations.deepspeed.rank import sweep_one_on_rank as zero_one

    stage = int(strategy[-1])
    buckets: dict[str, Any] = {"reduce_bucket_size": zero_bucket}
    buckets["stage3_prefetch_bucket_size" if stage == 3 else "allgather_bucket_size"] = zero_bucket
    config = zero_config(stage=stage, micro_batch_size=micro_batch, **buckets)
    return zero_one(model_fn, batch_fn, config, measure=measure, lr=lr, loss_fn=loss_fn)
