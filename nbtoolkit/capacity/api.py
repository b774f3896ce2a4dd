"""``nbt.fit``: will a training configuration fit, and which way is fastest, predicted before it runs.

    table = nbt.fit(make_model, make_batch, devices="8xH100-80GB")
    table.frame          # one row per (strategy, recompute, micro-batch, amp)
                         # recompute "auto": the fewest blocks checkpointed for the row to fit
    table.recommended    # the fastest predicted row that fits with the allocator margin
    table.verify(cluster, rows=[...])   # run rows on real ranks, measured peak beside predicted

One fake step is traced per (micro-batch, blocks recomputed, amp) (:mod:`nbtoolkit.capacity.tracing`); each
strategy's per-rank memory follows from it (:mod:`nbtoolkit.capacity.strategies`), and its time
from a roofline (:mod:`nbtoolkit.capacity.step_time`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from nbtoolkit.capacity.cards import parse_devices
from nbtoolkit.capacity.recompute_blocks import RECOMPUTE, apply_recompute
from nbtoolkit.capacity.result import FitResult, FitSetup
from nbtoolkit.capacity.step_time import step_time
from nbtoolkit.capacity.strategies import (
    CATEGORIES,
    STRATEGIES,
    ZERO_REDUCE_BUCKET,
    RankMemory,
    rank_memory,
)
from nbtoolkit.capacity.tracing import StepTrace, trace_step
from nbtoolkit.core.errors import NbtUsageError

__all__ = ["ALLOCATOR_FRACTION", "RUNTIME_RESERVE", "fit"]

#: the caching allocator's fragmentation, as a share of what the step holds at its peak
ALLOCATOR_FRACTION = 0.05
#: what a GPU process holds outside its tensors (CUDA context, cuBLAS workspace, NCCL buffers)
RUNTIME_RESERVE = 1 << 30


def _as_tuple(value: Any, what: str) -> tuple[Any, ...]:
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not values:
        raise NbtUsageError(f"{what} is empty: give at least one value")
    return values


def fit(
    make_model: Callable[[], Any],
    make_batch: Callable[[int], Any],
    devices: Any = "8xH100-80GB",
    *,
    strategies: Sequence[str] | str = STRATEGIES,
    recompute: Sequence[str] | str = RECOMPUTE,
    micro_batches: Sequence[int] | int = (1,),
    amp: Sequence[str | None] | str | None = ("bf16", None),
    optimizer: str = "adamw",
    loss_fn: Callable[[Any, Any], Any] | None = None,
    blocks: Sequence[str] | None = None,
    zero_bucket: int = ZERO_REDUCE_BUCKET,
) -> FitResult:
    """Predict per-rank peak memory and step time of every configuration (see the module doc).

    ``make_model()`` builds the model, ``make_batch(micro_batch)`` one rank's batch (``inputs`` or
    ``(inputs, targets)``); both run under fake tensors here and for real on ranks in ``verify``.
    ``loss_fn(output, targets)`` defaults to the integrations' (MSE, or the output's mean square;
    a HF output's ``loss``). ``blocks``: the repeated blocks' names (default: found).
    ``zero_bucket``: DeepSpeed's ``reduce_bucket_size`` (elements) for the ZeRO rows.
    """
    world, card = parse_devices(devices)
    strategies = _as_tuple(strategies, "strategies")
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise NbtUsageError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    recomputes = _as_tuple(recompute, "recompute")
    for setting in recomputes:
        if setting not in RECOMPUTE:
            raise NbtUsageError(f"unknown recompute {setting!r}: use one of {', '.join(RECOMPUTE)}")
    micro = _as_tuple(micro_batches, "micro_batches")
    if not all(isinstance(m, int) and m > 0 for m in micro):
        raise NbtUsageError(f"micro_batches must be positive whole numbers, got {micro!r}")
    amps = _as_tuple(amp, "amp")
    for precision in amps:
        card.peak({"bf16": "bf16", "fp16": "fp16"}.get(precision or "", "fp32"))  # clear error if absent
    if not callable(make_model) or not callable(make_batch):
        raise NbtUsageError(
            "make_model and make_batch must be functions (make_batch takes the micro-batch size)"
        )

    rows = []
    traces: dict[tuple[int, str | None, int], StepTrace] = {}

    def traced(mb: int, precision: str | None, checkpointed: int) -> StepTrace:
        """The step with the first ``checkpointed`` blocks recomputed, traced once and shared by every
        strategy and recompute setting that asks for that count."""
        key = (mb, precision, checkpointed)
        if key not in traces:
            traces[key] = trace_step(make_model, make_batch, micro_batch=mb, recompute="none",
                                     amp=precision, optimizer=optimizer, loss_fn=loss_fn, blocks=blocks,
                                     checkpointed=checkpointed)
        return traces[key]

    for mb, setting, precision in itertools.product(micro, recomputes, amps):
        for strategy in strategies:
            if setting == "auto":
                count, trace = _plan_auto(functools.partial(traced, mb, precision), strategy, world,
                                          precision, capacity=card.memory_bytes, zero_bucket=zero_bucket)
            else:
                whole = len(traced(mb, precision, 0).block_parameter_bytes)
                if setting == "all" and not whole:
                    apply_recompute([])  # the clear error: nothing to checkpoint
                count = whole if setting == "all" else 0
                trace = traced(mb, precision, count)
            if strategy in ("zero3", "fsdp2") and world > 1 and not trace.block_parameter_bytes:
                _no_blocks(strategy)
            memory, needed = _needed(trace, strategy, world, precision, zero_bucket)
            timing = step_time(trace, card, strategy, world, precision)
            rows.append({
                "strategy": strategy, "recompute": setting, "micro_batch": mb, "amp": precision or "fp32",
                "recomputed_blocks": count, "blocks": len(trace.block_parameter_bytes),
                **{f"{c}_bytes": getattr(memory, c) for c in CATEGORIES},
                "predicted_peak_bytes": memory.total,
                "allocator_margin_bytes": needed - memory.total,
                "needed_bytes": needed,
                "fits": needed <= card.memory_bytes,
                "headroom_bytes": card.memory_bytes - needed,
                "compute_s": timing.compute_s,
                "communication_s": timing.communication_s,
                "step_time_s": timing.total_s,
                "samples_per_s": world * mb / timing.total_s if timing.total_s > 0 else float("inf"),
            })
    setup = FitSetup(make_model=make_model, make_batch=make_batch, world=world, card=card,
                     optimizer=optimizer, loss_fn=loss_fn, blocks=blocks, zero_bucket=zero_bucket,
                     parameter_count=next(iter(traces.values())).parameter_count)
    return FitResult.from_rows(rows, setup)


def _needed(
    trace: StepTrace, strategy: str, world: int, precision: str | None, zero_bucket: int
) -> tuple[RankMemory, int]:
    """The rank's predicted peak, and what it needs with the allocator margin and runtime reserve."""
    memory = rank_memory(trace, strategy, world, precision, zero_bucket=zero_bucket)
    return memory, memory.total + int(memory.total * ALLOCATOR_FRACTION) + RUNTIME_RESERVE


def _plan_auto(
    traced: Callable[[int], StepTrace], strategy: str, world: int, precision: str | None, *,
    capacity: int, zero_bucket: int,
) -> tuple[int, StepTrace]:
    """``recompute="auto"``: the fewest of the first blocks to checkpoint for the row to fit ``capacity``
    (none when it fits as it is; all when even that does not fit). The count is first estimated
    linearly between no block and every block (the blocks repeat, so each saves about as much), then
    checked and corrected with real traces of that count."""
    import math

    def needed(k: int) -> int:
        return _needed(traced(k), strategy, world, precision, zero_bucket)[1]

    whole = len(traced(0).block_parameter_bytes)
    if whole == 0 or needed(0) <= capacity:
        return 0, traced(0)
    if needed(whole) > capacity:
        return whole, traced(whole)
    per_block = (needed(0) - needed(whole)) / whole
    count = min(whole, max(1, math.ceil((needed(0) - capacity) / per_block)))
    while count < whole and needed(count) > capacity:
        count += 1
    while count > 1 and needed(count - 1) <= capacity:
        count -= 1
    return count, traced(count)


def _no_blocks(strategy: str) -> None:
    raise NbtUsageError(
        f"strategy {strategy!r} gathers the model one repeated block at a time, and this model has no "
        "repeated blocks (no two same-class submodules or ModuleList entries holding layers): name them "
        "with blocks=[...] (single layers count when named: the indices of an nn.Sequential of Linear "
        "layers, blocks=['0', '1', ...]), or leave it out of strategies"
    )
