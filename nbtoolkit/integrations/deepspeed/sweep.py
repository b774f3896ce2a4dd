"""A sweep of DeepSpeed ZeRO's communication knobs on the cluster's ranks, and its reading.

    sweep = zero_sweep(cluster, make_model, make_batch)      # a ZeroSweep result
    sweep.table; sweep.figure(); print(sweep.reading())

What the sweep measures, per configuration, on every rank:

- **step time**: wall time of each of ``steps`` training steps (forward, backward,
  ``engine.step()``), after ``warmup`` steps, with a barrier before the first; the
  configuration's step time is the median over steps of the slowest rank.
- **communication and exposed communication**: from a torch.profiler trace of ``steps``
  more steps on each rank, :func:`nbtoolkit.comm_comp_overlap` (nbtoolkit's CPU/gloo
  definition on CPU ranks, HTA's on GPUs), per step (all profiled steps kept), mean over
  ranks; ``collectives_per_step`` counts the collective calls of rank 0 per step.
- **how far step times can be trusted**: configurations cannot be interleaved step by step (each
  is a DeepSpeed engine of its own), so the first configuration runs again after the last and
  the change between its two runs (``ZeroSweep.drift``) is the machine's own drift over the
  sweep. A configuration's step time is called changed only when the change exceeds the noise
  band: the larger of 10%, that drift and the two configurations' step-time spreads (IQR over
  the timed steps, ``step_time_spread_ms``) relative to the baseline.
- **peak memory per rank**: on GPUs ``torch.cuda.max_memory_allocated`` over the
  profiled steps. On CPUs (no allocator statistics) nbtoolkit's definition: the bytes of
  the tensors this configuration holds when profiling starts (all tensors the garbage
  collector finds, each storage counted once, minus those alive before the model was
  built: parameters, gradients, optimizer state, DeepSpeed's flat buffers) plus the
  highest the profiler's allocations rise during the profiled steps above where they stood when
  profiling started, leaving out gloo's own buffers
  (:func:`~nbtoolkit.integrations.rank_measure.cpu_peak_growth_bytes`). The largest rank is reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.integrations.deepspeed.config import (
    KNOBS,
    default_settings,
    grid_settings,
    label,
    short_count,
    zero_config,
)
from nbtoolkit.integrations.deepspeed.rank import parameter_count, sweep_one_on_rank
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
    from nbtoolkit.trace.trace import Trace

__all__ = ["ZeroSweep", "read_sweep", "zero_sweep"]

@dataclass(repr=False)  # the repr is Result's (the text summary)
class ZeroSweep(SweepResult):
    """One row per ZeRO configuration: step time, communication, peak memory; plus its traces."""

    TITLE = "ZeRO sweep"
    CSS_CLASS = "nbt-zero-sweep"
    FIGURE_TITLE = "ZeRO configurations"

    def reading(self) -> str:
        """What the knobs changed, in plain words, each configuration against the first."""
        return read_sweep(self.table, noise=self.noise)


def zero_sweep(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    settings: Sequence[dict[str, Any]] | None = None,
    grid: dict[str, Iterable[Any]] | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    micro_batch_size: int = 8,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    keep_traces: bool = True,
    config: MeasureConfig | None = None,
) -> ZeroSweep:
    """Run a few DeepSpeed steps per ZeRO configuration on every rank of ``cluster``.

    Args:
        model_fn: builds the model (called on each rank, seeded the same).
        batch_fn: ``batch_fn(rank)`` -> ``inputs`` or ``(inputs, targets)`` for that rank.
        settings: configurations (dicts of :data:`KNOBS`); default :func:`default_settings`.
        grid: instead of settings, every combination of these knob values.
        loss_fn: ``loss_fn(output, targets)``; default MSE against targets, or mean square.
        steps, warmup, config: how each configuration is timed (a :class:`~nbtoolkit.MeasureConfig`;
            ``steps=``/``warmup=`` given as well win; defaults ``MeasureConfig()``'s).
    Returns:
        A :class:`ZeroSweep` (definitions of each number in the module docstring).
    """
    import pandas as pd

    if settings is not None and grid is not None:
        raise NbtUsageError("give settings or grid, not both")
    measure = measure_config(config, steps=steps, warmup=warmup)
    steps = measure.steps
    if grid is not None:
        chosen = grid_settings(grid)
    elif settings is not None:
        chosen = [dict(s) for s in settings]
    else:
        chosen = default_settings(cluster.run(lambda: parameter_count(model_fn), ranks=0)[0])
    for setting in chosen:
        unknown = sorted(set(setting) - set(KNOBS))
        if unknown:
            raise NbtUsageError(f"unknown ZeRO knob(s) {unknown} in {setting}: use {', '.join(KNOBS)}")
    rows = []
    traces: dict[str, Trace] = {}

    def run_on_ranks(setting: dict[str, Any]) -> list[dict[str, Any]]:
        ds_config = zero_config(micro_batch_size=micro_batch_size, **setting)
        return list(cluster.run(
            lambda ds_config=ds_config: sweep_one_on_rank(
                model_fn, batch_fn, ds_config, measure=measure, lr=lr, loss_fn=loss_fn
            )
        ))

    for setting in chosen:
        name = label(setting)
        measured, trace = measured_row(run_on_ranks(setting), steps=steps)
        rows.append({"config": name, **{k: setting.get(k) for k in KNOBS}, **measured})
        if keep_traces:
            traces[name] = trace
    table = pd.DataFrame(rows)
    table["stage"] = table["stage"].fillna(1).astype(int)
    drift = None
    if len(chosen) > 1:
        # the baseline once more: how much the machine itself changed over the sweep
        drift = rerun_drift(float(table["step_time_ms"].iloc[0]), run_on_ranks(chosen[0]))
    notes = sweep_notes(measure, cluster.world_size, str(table["config"].iloc[0]), drift)
    return ZeroSweep(table=table, traces=traces, notes=notes, drift=drift)


_STAGE_MEANING = {
    1: "ZeRO-1 partitions the optimizer state across ranks",
    2: "ZeRO-2 partitions the optimizer state and the gradients (reduce-scatter instead of all-reduce)",
    3: "ZeRO-3 partitions parameters too, gathering each layer's parameters before its forward and backward",
}


def read_sweep(table: pd.DataFrame, *, noise: float = NOISE) -> str:
    """One plain-words line per configuration, against the first one (the baseline).

    A step-time change under ``noise`` (10% by default: timings on shared CPUs vary that much;
    a sweep passes its measured drift when larger) or under the two rows' step-time spreads
    (``step_time_spread_ms``, when the table has it) is called "no clear change".
    """
    if table.empty:
        return "no configurations were run"
    base = table.iloc[0]
    lines = [
        f"baseline {base['config']}: {base['step_time_ms']:.1f} ms per step, "
        f"{base['exposed_comm_ms']:.1f} ms exposed communication, {base['peak_mb']:.1f} MB peak per rank. "
        + _STAGE_MEANING.get(int(base["stage"]), "")
    ]
    for _, row in table.iloc[1:].iterrows():
        changed = [k for k in KNOBS if differs(row[k], base[k])]
        what = ", ".join(f"{k}={_show(row[k])}" for k in changed) or "nothing"
        spread = spread_share(row, base)
        parts = [
            verb(change(row["step_time_ms"], base["step_time_ms"]), "step time",
                  f"{row['step_time_ms']:.1f} ms", f"{base['step_time_ms']:.1f} ms", max(noise, spread)),
            verb(change(row["peak_mb"], base["peak_mb"]), "peak memory",
                  f"{row['peak_mb']:.1f} MB", f"{base['peak_mb']:.1f} MB"),
        ]  # fmt: skip
        calls_new, calls_old = row["collectives_per_step"], base["collectives_per_step"]
        if calls_new != calls_old:
            parts.append(f"{calls_new:.0f} collective calls per step instead of {calls_old:.0f}")
        why = []
        if "stage" in changed:
            why.append(_STAGE_MEANING.get(int(row["stage"]), ""))
        if any(k.endswith("bucket_size") for k in changed):
            why.append(
                "smaller buckets split the same bytes into more, smaller collectives (more fixed cost per "
                "call, but each can start sooner); larger ones do the opposite. DeepSpeed allocates each "
                "bucket at its full size (elements x 4 bytes in fp32), so bucket sizes also move peak "
                "memory: the default of 500M elements is a ~1.9 GB buffer however small the model"
            )
        if "overlap_comm" in changed:
            why.append(
                "overlap_comm runs reductions on a side stream while the backward pass continues "
                "(on CPU ranks with gloo there is no side stream, so expect little effect)"
            )
        line = f"{row['config']} (changed {what}): " + "; ".join(parts) + "."
        if why:
            line += " Why: " + " ".join(w.rstrip(".") + "." for w in why if w)
        lines.append(line)
    return "\n".join(lines)


def _show(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "default"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        return short_count(v)
    return str(v)
