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

__all__ = [
    "cpu_peak_growth_bytes", "live_bytes_before_model", "rank_batch", "rank_loss", "time_and_profile_on_rank",
]


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
    starts, beyond ``before``, plus :func:`cpu_peak_growth_bytes` of the trace), ``state_bytes``
    (that live part) and ``loss`` (the last step's).
    """
    import dataclasses
    import gc

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
        peak = base + (cpu_peak_growth_bytes(profiled["trace_gz"]) or 0)
    return {
        "step_times_s": times,
        "trace_gz": profiled["trace_gz"],
        "peak_bytes": peak,
        "state_bytes": base,
        "loss": profiled["last"],
    }


def cpu_peak_growth_bytes(trace_gz: bytes) -> int | None:
    """How far a CPU rank's allocations rose above where they stood when profiling started: the
    highest growth of the profiler's "Total Allocated" over the profiled steps, read from their
    gzipped trace (``profile_memory=True``). None when the trace has no CPU memory events (a GPU
    rank, whose peak is the allocator's).

    The one rule every cluster memory measurement on CPU ranks uses (sweeps, ``nbt.fit``'s verify):

    - growth, not the absolute total: "Total Allocated" is a process-wide running count that never
      hears of frees of what an earlier profiling session allocated, so it drifts up from one
      configuration to the next on the same ranks (+10 MiB a row on the MLP stack). It is counted
      from its value before this session's first event.
    - that first event in time, not in the file: the trace lists events thread by thread (the main
      thread, autograd's, gloo's, DeepSpeed's), so the first one in the file may come late in the
      step, and the total before it includes whatever the step held then (ZeRO-3's ViT read its
      whole parameters, 3.09 MiB, low).
    - without what gloo allocates inside a collective (:func:`_collective_spans`).
    """
    import gzip
    import json

    trace = json.loads(gzip.decompress(trace_gz)).get("traceEvents", [])
    events = sorted(
        (e for e in trace if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0),
        key=lambda e: float(e.get("ts", 0)),
    )
    if not events:
        return None
    collectives = _collective_spans(trace)
    start = int(events[0]["args"].get("Total Allocated", 0)) - int(events[0]["args"].get("Bytes", 0))
    staging: dict[Any, int] = {}  # gloo's own copies alive: address -> bytes
    growth = 0
    for event in events:
        args = event["args"]
        size, address, at = int(args.get("Bytes", 0)), args.get("Addr"), float(event.get("ts", 0))
        if size > 0 and any(a <= at <= b for a, b in collectives.get(event.get("tid"), ())):
            staging[address] = size
        elif size < 0:
            staging.pop(address, None)
        growth = max(growth, int(args.get("Total Allocated", 0)) - start - sum(staging.values()))
    return growth


def _collective_spans(trace: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float]]]:
    """(start, end) of each collective (``c10d::`` op) by thread. What gloo allocates inside one
    (the input a reduce-scatter clones, an all-gather's staging buffer) is CPU-only and lives until
    gloo's thread finishes the collective, which depends on when the other ranks arrive: on the MLP
    stack's FSDP2 rows a reduce-scatter's 2 MiB clone was alive at the peak in some runs and not in
    others. NCCL works in the buffers it is given, so those copies are not counted."""
    spans: dict[Any, list[tuple[float, float]]] = {}
    for e in trace:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("c10d::"):
            begin = float(e.get("ts", 0))
            spans.setdefault(e.get("tid"), []).append((begin, begin + float(e.get("dur", 0))))
    return spans
