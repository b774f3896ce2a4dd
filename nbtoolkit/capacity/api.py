"""``nbt.fit``: will a training configuration fit, and which way is fastest, predicted before it runs.

    table = nbt.fit(make_model, make_batch, devices="8xH100-80GB")
    table.frame          # one row per (strategy, recompute, micro-batch, amp)
    table.recommended    # the fastest predicted row that fits with the allocator margin
    table.verify(cluster, rows=[...])   # run rows on real ranks, measured peak beside predicted

One fake step is traced per (micro-batch, recompute, amp) (:mod:`nbtoolkit.capacity.tracing`); each
strategy's per-rank memory follows from it (:mod:`nbtoolkit.capacity.strategies`), and its time
from a roofline (:mod:`nbtoolkit.capacity.step_time`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from nbtoolkit.capacity.cards import parse_devices
from nbtoolkit.capacity.recompute_blocks import RECOMPUTE
from nbtoolkit.capacity.result import FitResult, FitSetup
from nbtoolkit.capacity.step_time import step_time
from nbtoolkit.capacity.strategies import CATEGORIES, STRATEGIES, ZERO_REDUCE_BUCKET, rank_memory
from nbtoolkit.capacity.tracing import trace_step
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
    traces = {}
    for mb, setting, precision in itertools.product(micro, recomputes, amps):
        trace = trace_step(make_model, make_batch, micro_batch=mb, recompute=setting, amp=precision,
                           optimizer=optimizer, loss_fn=loss_fn, blocks=blocks)
        traces[(mb, setting, precision)] = trace
        for strategy in strategies:
            if strategy in ("zero3", "fsdp2") and world > 1 and not trace.block_parameter_bytes:
                _no_blocks(strategy)
            memory = rank_memory(trace, strategy, world, precision, zero_bucket=zero_bucket)
            timing = step_time(trace, card, strategy, world, precision)
            margin = int(memory.total * ALLOCATOR_FRACTION) + RUNTIME_RESERVE
            needed = memory.total + margin
            rows.append({
                "strategy": strategy, "recompute": setting, "micro_batch": mb, "amp": precision or "fp32",
                **{f"{c}_bytes": getattr(memory, c) for c in CATEGORIES},
                "predicted_peak_bytes": memory.total,
                "allocator_margin_bytes": margin,
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


def _no_blocks(strategy: str) -> None:
    raise NbtUsageError(
        f"strategy {strategy!r} gathers the model one repeated block at a time, and this model has no "
        "repeated blocks (no two same-class submodules or ModuleList entries): name them with "
        "blocks=[...], or leave it out of strategies"
    )
