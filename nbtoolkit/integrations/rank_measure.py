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
    """How far a CPU rank's memory rose above where it stood when profiling started, read from the
    profiled steps' gzipped trace (``profile_memory=True``): the highest sum over time of the bytes
    allocated during the session and not yet freed. None when the trace has no CPU memory events (a
    GPU rank, whose peak is the allocator's).

    The one rule every cluster memory measurement on CPU ranks uses (sweeps, ``nbt.fit``'s verify):

    - the session's own allocations, tracked address by address, not the profiler's "Total
      Allocated": that is a process-wide running count that drifts up from one configuration to
      the next on the same ranks (+10 MiB a row on the MLP stack), and within a session it keeps
      every allocation whose free the trace lacks.
    - in time order, not file order: the trace lists events thread by thread (the main thread,
      autograd's, gloo's, DeepSpeed's), so the first one in the file may come late in the step.
    - without gloo's own buffers (:func:`_collective_buffers`): what it allocates inside a
      collective, and what it releases on a thread the profiler does not record.
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
    left_out = _collective_buffers(trace, events)
    alive: dict[Any, int] = {}  # address -> bytes counted, of the session's allocations not yet freed
    now = peak = 0
    for index, event in enumerate(events):
        size, address = int(event["args"].get("Bytes", 0)), event["args"].get("Addr")
        if size > 0:
            counted = 0 if index in left_out else size
            alive[address] = counted
            now += counted
        elif address in alive:
            now -= alive.pop(address)
        else:  # the free of something allocated before profiling started
            now += size
        peak = max(peak, now)
    return peak


def _collective_buffers(trace: list[dict[str, Any]], events: list[dict[str, Any]]) -> set[int]:
    """The indices (into ``events``, the memory events in time order) of the allocations that are
    gloo's buffers, whose lifetime depends on when the other ranks arrive, not on the step; NCCL
    works in the buffers it is given, so on GPUs there is nothing like them to count:

    - made inside a collective (a ``c10d::`` op, or gloo's own ``gloo:`` spans on its threads) on
      the same thread: the input a reduce-scatter clones, an all-gather's staging buffer. On the
      MLP stack's FSDP2 rows a reduce-scatter's 2 MiB clone was alive at the peak in some runs and
      not in others.
    - never freed in the trace: their address is handed out again with no free in between, or
      they are still held at the end. A buffer handed to a collective (FSDP2's all-gather output)
      is freed by whichever of the main thread and gloo's lets go last; when it is gloo's, the
      free is on a thread the profiler does not record, and the buffer seemed to live on: FSDP2's
      "reshard" row on the MLP stack read 7.08, 8.08 or 9.08 MiB above its state, 7.08 whenever
      every free was recorded. Still held at the end also covers what the last step keeps for the
      next (ZeRO-3's prefetched parameters): with two or more profiled steps, the earlier steps'
      copies of the same allocations are counted until their recorded frees, so only a session of
      one step keeps counting them to the end.
    """
    spans: dict[Any, list[tuple[float, float]]] = {}
    steps = 0
    for e in trace:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith(("c10d::", "gloo:")):
            begin = float(e.get("ts", 0))
            spans.setdefault(e.get("tid"), []).append((begin, begin + float(e.get("dur", 0))))
        steps += name.startswith("ProfilerStep#")
    left_out: set[int] = set()
    unfreed: dict[Any, int] = {}  # address -> index of its allocation, until its free
    for index, event in enumerate(events):
        size, address, at = int(event["args"].get("Bytes", 0)), event["args"].get("Addr"), float(event["ts"])
        if size > 0:
            if any(a <= at <= b for a, b in spans.get(event.get("tid"), ())):
                left_out.add(index)
            if address in unfreed:  # allocated again: its earlier allocation was freed unrecorded
                left_out.add(unfreed[address])
            unfreed[address] = index
        else:
            unfreed.pop(address, None)
    if steps >= 2:
        left_out.update(unfreed.values())
    return left_out
