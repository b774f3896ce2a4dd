"""What every sweep measures on a rank, whatever wraps the model (DeepSpeed ZeRO, FSDP2).

:func:`time_and_profile_on_rank` takes one training step of a wrapped model and returns the
numbers a sweep's row is built from (their definitions are in
:mod:`nbtoolkit.integrations.deepspeed.sweep` and :mod:`nbtoolkit.integrations.fsdp2.sweep`).
It runs on a rank (sent there by ``Cluster.run``); torch is imported inside.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.step_runner import run_steps
from nbtoolkit.memory.profile import live_tensor_bytes

__all__ = ["live_bytes_before_model", "rank_batch", "rank_loss", "time_and_profile_on_rank"]


def rank_batch(batch_fn: Callable[[int], Any], rank: int, device: Any) -> tuple[Any, Any]:
    """``batch_fn(rank)`` as ``(inputs, targets)`` on ``device``: a 2-tuple is inputs and targets,
    anything else is the inputs alone (targets None)."""
    batch = batch_fn(rank)
    inputs, targets = batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)
    return inputs.to(device), (targets.to(device) if targets is not None else None)


def rank_loss(out: Any, targets: Any, loss_fn: Callable[[Any, Any], Any] | None) -> Any:
    """The loss of a sweep's or measurement's step: ``loss_fn(out, targets)``, else MSE against the
    targets, else the output's mean square (a loss that needs no labels, for any model)."""
    import torch

    if loss_fn is not None:
        return loss_fn(out, targets)
    if targets is not None:
        return torch.nn.functional.mse_loss(out.float(), targets.float())
    return out.float().pow(2).mean()


def live_bytes_before_model() -> int:
    """What the process holds before the model is built (0 on GPUs, which count with the allocator):
    subtracted from the tensors alive later, so only this configuration's own are counted."""
    import gc

    import torch

    gc.collect()
    return 0 if torch.cuda.is_available() else live_tensor_bytes()


def time_and_profile_on_rank(
    step: Callable[[], float], *, before: int, measure: MeasureConfig
) -> dict[str, Any]:
    """After ``measure.warmup`` steps, time ``measure.steps`` steps (all ranks start together after a
    barrier), then profile as many more.

    Returns ``step_times_s``, ``trace_gz`` (the profiled steps' trace), ``peak_bytes`` (GPU: the
    allocator's peak over the profiled steps; CPU: the configuration's live tensors when profiling
    starts, beyond ``before``, plus the profiler's highest "Total Allocated"), ``state_bytes`` (that
    live part) and ``loss`` (the last step's).
    """
    import dataclasses
    import gc
    import gzip
    import json

    import torch
    import torch.distributed as dist

    from nbtoolkit.cluster.rank_tools import profile_to_bytes

    run_steps(step, measure, warmup_only=True)
    dist.barrier()  # every rank starts its timed steps together
    times = run_steps(step, dataclasses.replace(measure, warmup=0)).times_s
    gc.collect()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = 0
    else:
        base = max(0, live_tensor_bytes() - before)
    profiled = profile_to_bytes(step, steps=measure.steps, warmup=0, profile_memory=not cuda)
    if cuda:
        peak = int(torch.cuda.max_memory_allocated())
    else:
        doc = json.loads(gzip.decompress(profiled["trace_gz"]))
        growth = [
            int(e["args"].get("Total Allocated", 0))
            for e in doc.get("traceEvents", [])
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0
        ]
        peak = base + max([0, *growth])
    return {
        "step_times_s": times,
        "trace_gz": profiled["trace_gz"],
        "peak_bytes": peak,
        "state_bytes": base,
        "loss": profiled["last"],
    }
