"""What runs on each rank of a DeepSpeed sweep: the engine, the timed and profiled steps, and
the graph capture of a compiled engine.

These functions are sent to the ranks by :func:`nbtoolkit.Cluster.run` (from
:mod:`.sweep` and :mod:`.graph_breaks`); torch and deepspeed are imported inside them, on
the rank. The definitions of the numbers they return are in :mod:`.sweep`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.integrations.rank_measure import (
    live_bytes_before_model,
    rank_batch,
    rank_loss,
    time_and_profile_on_rank,
)

__all__ = ["graph_breaks_one_on_rank", "parameter_count", "sweep_one_on_rank"]


def parameter_count(model_fn: Callable[[], Any]) -> int:
    """Parameters of a freshly built model (what the default sweep settings are scaled to)."""
    return int(sum(p.numel() for p in model_fn().parameters()))


def _engine_and_step(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    config: dict[str, Any],
    *,
    rank: int,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> tuple[Any, Callable[[], float]]:
    """On a rank: the model (seeded alike on every rank) under DeepSpeed ``config``, and one
    training step on this rank's batch (forward, ``engine.backward``, ``engine.step``)."""
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = model_fn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    inputs, targets = rank_batch(batch_fn, rank, engine.device)

    def step() -> float:
        loss = rank_loss(engine(inputs), targets, loss_fn)
        engine.backward(loss)
        engine.step()
        return float(loss.detach())

    return engine, step


def sweep_one_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    config: dict[str, Any],
    *,
    measure: MeasureConfig,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> dict[str, Any]:
    """Build the model under ``config`` and measure it (:func:`time_and_profile_on_rank`)."""
    import torch.distributed as dist

    before = live_bytes_before_model()
    engine, step = _engine_and_step(model_fn, batch_fn, config, rank=dist.get_rank(), lr=lr, loss_fn=loss_fn)
    try:
        return time_and_profile_on_rank(step, before=before, measure=measure)
    finally:
        # Release DeepSpeed's hooks and buffers; the next configuration starts with gc.collect().
        engine.destroy()


def graph_breaks_one_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    config: dict[str, Any],
    *,
    backend: str,
    measure: MeasureConfig,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> Any:
    """Build the model under ``config``, compile it with DeepSpeed's ``engine.compile``, and capture
    the graphs, breaks and recompiles of ``measure.steps`` training steps (a GraphReport)."""
    import torch
    import torch.distributed as dist

    from nbtoolkit.compile.capture import capture_graphs

    torch._dynamo.reset()  # every stage compiles from scratch
    engine, step = _engine_and_step(model_fn, batch_fn, config, rank=dist.get_rank(), lr=lr, loss_fn=loss_fn)

    try:
        engine.compile(backend=backend)
        return capture_graphs(
            step, config=measure, eager_baseline=False, measure_cost=False,
            label=f"ZeRO-{config['zero_optimization']['stage']}",
        )
    finally:
        engine.destroy()
        torch._dynamo.reset()
