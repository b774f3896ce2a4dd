"""A sweep of FSDP2's knobs on the cluster's ranks, and its reading.

    sweep = fsdp2_sweep(cluster, make_model, make_batch)     # an Fsdp2Sweep result
    sweep.table; sweep.figure(); print(sweep.reading())

Each configuration is a :class:`~nbtoolkit.integrations.fsdp2.wrap.ShardSettings`
(``reshard_after_forward``, ``forward_prefetch``, ``backward_prefetch``, ``param_dtype``,
``reduce_dtype``); the model is built on every rank, sharded with ``shard_model`` (``fully_shard``
per repeated block, then the root) and trained with AdamW. What is measured per configuration is
what the ZeRO sweep measures, the same way (:mod:`nbtoolkit.integrations.rank_measure`,
:mod:`nbtoolkit.integrations.sweep_common`):

- **step time**: the median over ``steps`` timed steps of the slowest rank, after ``warmup``;
- **communication, exposed communication, overlap**: from a profiler trace of as many more steps,
  :func:`nbtoolkit.comm_comp_overlap` per step, mean over ranks; collective calls of rank 0 per step;
- **peak memory per rank** (``peak_mb`` the largest, ``peak_mb_per_rank`` each): on GPUs the
  allocator's peak; on CPUs the configuration's live tensors plus the highest its allocations
  rise during the profiled steps, gloo's own buffers left out
  (:func:`~nbtoolkit.integrations.rank_measure.cpu_peak_growth_bytes`);
- **noise**: the baseline (first configuration) runs again after the last; its drift and the
  step-time spreads bound which step-time changes are named.

Mixed precision on CPU ranks: bf16 matmuls run on CPUs, and gloo reduce-scatters, all-gathers and
all-reduces bf16 and fp16 tensors (checked with torch 2.13), so ``param_dtype``/``reduce_dtype``
"bf16" work on the CPU test cluster; bf16 compute on a CPU is often slower than fp32.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.integrations.fsdp2.sweep_rank import sweep_one_on_rank
from nbtoolkit.integrations.fsdp2.wrap import ShardSettings
from nbtoolkit.integrations.model_fn import check_model_fn
from nbtoolkit.integrations.sweep_common import (
    NOISE,
    change,
    differs,
    measured_row,
    rerun_drift,
    spread_share,
    sweep_notes,
    verb,
)
from nbtoolkit.integrations.sweep_result import SweepResult

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.cluster.cluster import Cluster

__all__ = ["KNOBS", "Fsdp2Sweep", "as_settings", "default_fsdp2_settings", "fsdp2_sweep", "read_fsdp2_sweep"]

#: FSDP2's knobs as the sweep varies them (the fields of ShardSettings).
KNOBS = tuple(f.name for f in dataclasses.fields(ShardSettings))


def default_fsdp2_settings() -> list[ShardSettings]:
    """FSDP2's defaults, then one knob changed at a time: no resharding after forward, explicit
    prefetch of two blocks both ways, bf16 parameters with fp32 gradient reduction."""
    return [
        ShardSettings(),
        ShardSettings(reshard_after_forward=False),
        ShardSettings(forward_prefetch=2, backward_prefetch=2),
        ShardSettings(param_dtype="bf16", reduce_dtype="fp32"),
    ]


def as_settings(value: Any) -> ShardSettings:
    """A checked :class:`ShardSettings` from one (or from a dict of its fields); one clear error for
    an unknown knob, a negative prefetch or an unknown dtype."""
    if isinstance(value, ShardSettings):
        _check(value)
        return value
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(KNOBS))
        if unknown:
            raise NbtUsageError(f"unknown FSDP2 knob(s) {unknown} in {value}: use {', '.join(KNOBS)}")
        settings = ShardSettings(**value)
        _check(settings)
        return settings
    raise NbtUsageError(
        f"an FSDP2 configuration is a ShardSettings or a dict of {', '.join(KNOBS)}, "
        f"got {type(value).__name__}"
    )


def _grid(grid: dict[str, Iterable[Any]]) -> list[ShardSettings]:
    unknown = sorted(set(grid) - set(KNOBS))
    if unknown:
        raise NbtUsageError(f"unknown FSDP2 knob(s) {unknown}: use {', '.join(KNOBS)}")
    keys = list(grid)
    combos = itertools.product(*(list(grid[k]) for k in keys))
    return [as_settings(dict(zip(keys, combo, strict=True))) for combo in combos]


def _check(settings: ShardSettings) -> None:
    from nbtoolkit.integrations.fsdp2.wrap import _DTYPES

    for name in ("forward_prefetch", "backward_prefetch"):
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise NbtUsageError(f"{name} is a number of blocks (0, 1, 2, ...), got {value!r} in {settings}")
    for name in ("param_dtype", "reduce_dtype"):
        value = getattr(settings, name)
        if value is not None and value not in _DTYPES:
            raise NbtUsageError(f"{name}={value!r} in {settings}: use one of {sorted(_DTYPES)} or None")


@dataclass(repr=False)  # the repr is Result's (the text summary)
class Fsdp2Sweep(SweepResult):
    """One row per FSDP2 configuration: step time, communication, overlap, peak memory per rank
    (``peak_mb`` the largest rank's, ``peak_mb_per_rank`` each); plus its traces."""

    TITLE = "FSDP2 sweep"
    CSS_CLASS = "nbt-fsdp2-sweep"
    FIGURE_TITLE = "FSDP2 configurations"
    TEXT_COLUMNS = SweepResult.HTML_COLUMNS  # overlap is one of FSDP2's questions: shown in text too

    def reading(self) -> str:
        """What the knobs changed, in plain words: each configuration against the first, then which
        is fastest, which uses least memory and what keeping parameters after forward costs."""
        return read_fsdp2_sweep(self.table, noise=self.noise)


def fsdp2_sweep(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    settings: Sequence[ShardSettings | dict[str, Any]] | None = None,
    grid: dict[str, Iterable[Any]] | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    blocks: Sequence[str] | None = None,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    keep_traces: bool = True,
    config: MeasureConfig | None = None,
) -> Fsdp2Sweep:
    """Train a few steps per FSDP2 configuration on every rank of ``cluster`` and measure each.

    Args:
        model_fn: builds the (unwrapped) model, on each rank, seeded alike; the sweep shards it.
        batch_fn: ``batch_fn(rank)`` -> ``inputs`` or ``(inputs, targets)`` for that rank.
        settings: configurations (:class:`ShardSettings` or dicts of :data:`KNOBS`); default
            :func:`default_fsdp2_settings`. The first is the baseline the reading compares against.
        grid: instead of settings, every combination of these knob values, e.g.
            ``{"reshard_after_forward": [True, False], "forward_prefetch": [0, 1, 2]}``.
        blocks: the modules that get their own ``fully_shard``; default the repeated blocks.
        loss_fn: ``loss_fn(output, targets)``; default MSE against targets, or mean square.
        steps, warmup, config: how each configuration is timed (``MeasureConfig``; ``steps=`` and
            ``warmup=`` given as well win).
    Returns:
        An :class:`Fsdp2Sweep` (definitions of each number in the module docstring).
    """
    import pandas as pd

    check_model_fn(model_fn, "fsdp2")
    if settings is not None and grid is not None:
        raise NbtUsageError("give settings or grid, not both")
    measure = measure_config(config, steps=steps, warmup=warmup)
    if grid is not None:
        chosen = _grid(grid)
    elif settings is not None:
        chosen = [as_settings(s) for s in settings]
    else:
        chosen = default_fsdp2_settings()
    if not chosen:
        raise NbtUsageError("no FSDP2 configurations to run: give at least one setting")

    def run_on_ranks(setting: ShardSettings) -> list[dict[str, Any]]:
        return list(cluster.run(
            lambda: sweep_one_on_rank(
                model_fn, batch_fn, setting, measure=measure, lr=lr, loss_fn=loss_fn, blocks=blocks
            )
        ))  # fmt: skip

    rows, traces = [], {}
    for setting in chosen:
        results = run_on_ranks(setting)
        measured, trace = measured_row(results, steps=measure.steps)
        per_rank = [r["peak_bytes"] / 2**20 for r in results]
        rows.append({"config": setting.label(), **dataclasses.asdict(setting), **measured,
                     "peak_mb_per_rank": per_rank})  # fmt: skip
        if keep_traces:
            traces[setting.label()] = trace
    table = pd.DataFrame(rows)
    drift = None
    if len(chosen) > 1:
        drift = rerun_drift(float(table["step_time_ms"].iloc[0]), run_on_ranks(chosen[0]))
    notes = sweep_notes(measure, cluster.world_size, str(table["config"].iloc[0]), drift)
    return Fsdp2Sweep(table=table, traces=traces, notes=notes, drift=drift)


_WHY = {
    "reshard_after_forward": (
        "without resharding after forward, each block keeps its gathered parameters until its backward: "
        "no second all-gather in backward (fewer collectives), but the whole unsharded model is held "
        "between forward and backward"
    ),
    "forward_prefetch": (
        "forward prefetch asks for the next blocks' all-gather while the current block runs, so "
        "communication can hide behind compute, at the cost of holding those blocks' parameters earlier"
    ),
    "backward_prefetch": (
        "backward prefetch does the same in backward, gathering earlier blocks' parameters ahead of time"
    ),
    "param_dtype": (
        "the parameter dtype is what blocks are gathered and computed in: bf16 halves the all-gather "
        "bytes and the gathered parameters, while the fp32 shards stay for the optimizer, so the bf16 copies "
        "come on top of them (and on CPUs bf16 matmuls are often slower than fp32)"
    ),
    "reduce_dtype": "the reduce dtype is what gradients are reduce-scattered in",
}


def _row_line(row: Any, base: Any, noise: float) -> str:
    changed = [k for k in KNOBS if differs(row[k], base[k])]
    what = ", ".join(f"{k}={row[k]}" for k in changed) or "nothing"
    parts = [
        verb(change(row["step_time_ms"], base["step_time_ms"]), "step time", f"{row['step_time_ms']:.1f} ms",
             f"{base['step_time_ms']:.1f} ms", max(noise, spread_share(row, base))),
        verb(change(row["peak_mb"], base["peak_mb"]), "peak memory", f"{row['peak_mb']:.1f} MB",
             f"{base['peak_mb']:.1f} MB"),
        verb(change(row["exposed_comm_ms"], base["exposed_comm_ms"]), "exposed communication",
             f"{row['exposed_comm_ms']:.1f} ms", f"{base['exposed_comm_ms']:.1f} ms", noise),
    ]  # fmt: skip
    calls_new, calls_old = row["collectives_per_step"], base["collectives_per_step"]
    if calls_new != calls_old:
        parts.append(f"{calls_new:.0f} collective calls per step instead of {calls_old:.0f}")
    line = f"{row['config']} (changed {what}): " + "; ".join(parts) + "."
    why = [_WHY[k] for k in changed if k in _WHY]
    return line + (" Why: " + " ".join(w + "." for w in why) if why else "")


def _band(a: Any, b: Any, noise: float) -> float:
    """The step-time band within which rows ``a`` and ``b`` are not told apart: the sweep's noise, or
    their two step-time spreads relative to ``b`` when larger."""
    return max(noise, spread_share(a, b))


def _clearly_apart(a: Any, b: Any, noise: float) -> bool:
    """Whether row ``a``'s step time differs from row ``b``'s by more than their band."""
    ratio = change(a["step_time_ms"], b["step_time_ms"])
    return math.isfinite(ratio) and abs(ratio) >= _band(a, b, noise)


def _reshard_pairs(table: pd.DataFrame) -> list[tuple[Any, Any]]:
    """(resharding row, non-resharding row) pairs that differ in reshard_after_forward only."""
    others = [k for k in KNOBS if k != "reshard_after_forward"]
    pairs = []
    kept = table[~table["reshard_after_forward"].astype(bool)]
    for _, yes in table[table["reshard_after_forward"].astype(bool)].iterrows():
        for _, no in kept.iterrows():
            if not any(differs(yes[k], no[k]) for k in others):
                pairs.append((yes, no))
    return pairs


def read_fsdp2_sweep(table: pd.DataFrame, *, noise: float = NOISE) -> str:
    """The reading in plain words: one line per configuration against the first (the baseline), then
    the fastest, the least memory, and what ``reshard_after_forward=False`` costs and gains.

    A step-time difference under ``noise`` (or under the rows' step-time spreads) is called within
    the noise, never named as a gain.
    """
    if table.empty:
        return "no configurations were run"
    base = table.iloc[0]
    lines = [(
        f"baseline {base['config']}: {base['step_time_ms']:.1f} ms per step, "
        f"{base['exposed_comm_ms']:.1f} ms exposed communication ({base['overlap_pct']:.0f}% of "
        f"communication overlapped), {base['peak_mb']:.1f} MB peak on the largest rank."
    )]
    lines += [_row_line(row, base, noise) for _, row in table.iloc[1:].iterrows()]
    if len(table) > 1:
        fastest = table.loc[table["step_time_ms"].idxmin()]
        second = table.drop(index=fastest.name).sort_values("step_time_ms").iloc[0]
        if _clearly_apart(second, fastest, noise):
            lines.append(f"fastest: {fastest['config']} ({fastest['step_time_ms']:.1f} ms per step), clearly "
                         f"ahead of the next, {second['config']} ({second['step_time_ms']:.1f} ms).")
        else:
            lines.append(f"fastest measured: {fastest['config']} ({fastest['step_time_ms']:.1f} ms per "
                         f"step), but {second['config']} ({second['step_time_ms']:.1f} ms) is within the "
                         f"±{_band(second, fastest, noise):.0%} noise of it: no configuration is clearly "
                         "fastest.")
        least = table.loc[table["peak_mb"].idxmin()]
        lines.append(f"least memory: {least['config']} ({least['peak_mb']:.1f} MB peak on the largest rank).")
    for yes, no in _reshard_pairs(table):
        memory = no["peak_mb"] - yes["peak_mb"]
        saved = yes["step_time_ms"] - no["step_time_ms"]
        timing = (
            f"{'gains' if saved > 0 else 'loses'} {abs(saved):.1f} ms per step"
            if _clearly_apart(no, yes, noise)
            else f"its step time is within the ±{_band(no, yes, noise):.0%} noise "
            f"({yes['step_time_ms']:.1f} -> {no['step_time_ms']:.1f} ms)"
        )
        lines.append(
            f"reshard_after_forward=False against {yes['config']}: costs {memory:+.1f} MB peak per rank "
            f"({yes['peak_mb']:.1f} -> {no['peak_mb']:.1f} MB) and {timing}; collective calls per step "
            f"{yes['collectives_per_step']:.0f} -> {no['collectives_per_step']:.0f}."
        )
    return "\n".join(lines)
