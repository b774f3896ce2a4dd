"""DeepSpeed ZeRO on the cluster's ranks: configs, and a sweep of the communication knobs.

    from nbtoolkit.integrations.deepspeed import zero_config, zero_sweep
    cfg = zero_config(stage=2, micro_batch_size=8, reduce_bucket_size=200_000)
    sweep = zero_sweep(cluster, make_model, make_batch)      # a ZeroSweep result
    sweep.table; sweep.figure(); print(sweep.reading())

On CPU ranks DeepSpeed picks its CPU accelerator and talks over the gloo process group
the cluster set up (``deepspeed.initialize`` finds torch.distributed initialized). The
first launch on a machine JIT-builds DeepSpeed's shared-memory communication op (tens of
seconds; cached afterwards in ``~/.cache/torch_extensions``). The sweep passes a plain
``torch.optim.AdamW`` to DeepSpeed so that no fused optimizer op has to be built.

What the sweep measures, per configuration, on every rank:

- **step time**: wall time of each of ``steps`` training steps (forward, backward,
  ``engine.step()``), after ``warmup`` steps, with a barrier before the first; the
  configuration's step time is the median over steps of the slowest rank.
- **communication and exposed communication**: from a torch.profiler trace of ``steps``
  more steps on each rank, :func:`nbtoolkit.comm_comp_overlap` (nbtoolkit's CPU/gloo
  definition on CPU ranks, HTA's on GPUs), per step (all profiled steps kept), mean over
  ranks; ``collectives_per_step`` counts the collective calls of rank 0 per step.
- **peak memory per rank**: on GPUs ``torch.cuda.max_memory_allocated`` over the
  profiled steps. On CPUs (no allocator statistics) nbtoolkit's definition: the bytes of
  the tensors this configuration holds when profiling starts (all tensors the garbage
  collector finds, each storage counted once, minus those alive before the model was
  built: parameters, gradients, optimizer state, DeepSpeed's flat buffers) plus the
  highest "Total Allocated" the profiler reports during the profiled steps (bytes
  allocated since profiling started). The largest rank is reported.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.errors import NbtUsageError
from nbtoolkit.model._result import Result, escape, html_table

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.cluster.cluster import Cluster
    from nbtoolkit.model.trace import Trace

__all__ = ["KNOBS", "ZeroSweep", "default_settings", "zero_config", "zero_sweep"]

# The communication knobs a sweep varies (DeepSpeed config keys under zero_optimization).
KNOBS = (
    "stage",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "overlap_comm",
)
_NOISE = 0.10  # changes smaller than 10% are called "no clear change" (timings on shared CPUs)


def zero_config(
    *,
    stage: int = 1,
    micro_batch_size: int = 8,
    reduce_bucket_size: int | None = None,
    allgather_bucket_size: int | None = None,
    stage3_prefetch_bucket_size: int | None = None,
    overlap_comm: bool | None = None,
    gradient_accumulation_steps: int = 1,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A DeepSpeed config dict for ZeRO ``stage`` (1, 2 or 3); knobs left None keep DeepSpeed's defaults.

    Bucket sizes are in elements (DeepSpeed's unit), not bytes.
    """
    if stage not in (0, 1, 2, 3):
        raise NbtUsageError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    for name, value in (
        ("reduce_bucket_size", reduce_bucket_size),
        ("allgather_bucket_size", allgather_bucket_size),
        ("stage3_prefetch_bucket_size", stage3_prefetch_bucket_size),
    ):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise NbtUsageError(f"{name} must be a positive number of elements, got {value!r}")
    zero: dict[str, Any] = {"stage": stage}
    knobs = {
        "reduce_bucket_size": reduce_bucket_size,
        "allgather_bucket_size": allgather_bucket_size,
        "stage3_prefetch_bucket_size": stage3_prefetch_bucket_size,
        "overlap_comm": overlap_comm,
    }
    zero.update({key: value for key, value in knobs.items() if value is not None})
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # keep DeepSpeed's periodic log lines out of the notebook
        "wall_clock_breakdown": False,
    }
    if extra:
        config.update(extra)
    return config


def default_settings(parameter_count: int) -> list[dict[str, Any]]:
    """Stages 1, 2, 3 with DeepSpeed's default buckets, then small buckets for stages 2 and 3.

    "Small" is an eighth of the model's parameters, so that each collective carries a
    fraction of the model: more, smaller collectives than the defaults (which hold a
    small model in one bucket).
    """
    small = max(1024, parameter_count // 8)
    return [
        {"stage": 1},
        {"stage": 2},
        {"stage": 2, "reduce_bucket_size": small, "allgather_bucket_size": small},
        {"stage": 2, "reduce_bucket_size": small, "allgather_bucket_size": small, "overlap_comm": True},
        {"stage": 3},
        {"stage": 3, "reduce_bucket_size": small, "stage3_prefetch_bucket_size": small},
    ]


def grid_settings(grid: dict[str, Iterable[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values in ``grid`` (keys from :data:`KNOBS`)."""
    unknown = sorted(set(grid) - set(KNOBS))
    if unknown:
        raise NbtUsageError(f"unknown ZeRO knob(s) {unknown}: use {', '.join(KNOBS)}")
    keys = list(grid)
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(list(grid[k]) for k in keys))
    ]


def label(setting: dict[str, Any]) -> str:
    """A short name for a configuration: ``z2 rb=25k ag=25k overlap``."""
    short = {"reduce_bucket_size": "rb", "allgather_bucket_size": "ag", "stage3_prefetch_bucket_size": "pf"}
    parts = [f"z{setting.get('stage', 1)}"]
    for key, tag in short.items():
        if setting.get(key) is not None:
            parts.append(f"{tag}={_count(setting[key])}")
    if setting.get("overlap_comm"):
        parts.append("overlap")
    return " ".join(parts)


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


# ---- runs on each rank ----
def _parameter_count(model_fn: Callable[[], Any]) -> int:
    return int(sum(p.numel() for p in model_fn().parameters()))


def _live_tensor_bytes() -> int:
    """Bytes of all tensors reachable by the garbage collector, each storage once."""
    import gc

    import torch

    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.is_meta:
                continue
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key in seen or key == 0:
                continue
            seen.add(key)
            total += storage.nbytes()
        except (RuntimeError, ReferenceError):  # tensors without storage (sparse, fake)
            continue
    return total


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
    batch = batch_fn(rank)
    inputs, targets = batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)
    inputs = inputs.to(engine.device)
    targets = targets.to(engine.device) if targets is not None else None

    def step() -> float:
        out = engine(inputs)
        if loss_fn is not None:
            loss = loss_fn(out, targets)
        elif targets is not None:
            loss = torch.nn.functional.mse_loss(out.float(), targets.float())
        else:
            loss = out.float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        return float(loss.detach())

    return engine, step


def sweep_one_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    config: dict[str, Any],
    *,
    steps: int,
    warmup: int,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> dict[str, Any]:
    """Build the model under ``config``, time ``steps`` steps, profile ``steps`` more; return numbers."""
    import gc
    import json
    import time

    import torch
    import torch.distributed as dist

    from nbtoolkit.cluster.rank_tools import profile_to_bytes

    rank = dist.get_rank()
    gc.collect()
    before = 0 if torch.cuda.is_available() else _live_tensor_bytes()
    engine, step = _engine_and_step(model_fn, batch_fn, config, rank=rank, lr=lr, loss_fn=loss_fn)

    try:
        for _ in range(warmup):
            step()
        dist.barrier()
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        gc.collect()
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = 0
        else:
            base = max(0, _live_tensor_bytes() - before)
        profiled = profile_to_bytes(step, steps=steps, warmup=0, profile_memory=not cuda)
        if cuda:
            peak = int(torch.cuda.max_memory_allocated())
        else:
            import gzip

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
    finally:
        # Release DeepSpeed's hooks and buffers; the next configuration starts with gc.collect().
        engine.destroy()


# ---- the sweep, from the notebook ----
@dataclass(repr=False)  # the repr is Result's (the text summary)
class ZeroSweep(Result):
    """One row per ZeRO configuration: step time, communication, peak memory; plus its traces."""

    table: pd.DataFrame
    traces: dict[str, Trace] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def figure(self) -> Any:
        """Bars per configuration: step time and exposed communication (ms), peak memory (MB)."""
        from nbtoolkit.views.cluster import sweep_figure

        return sweep_figure(self.table)

    def reading(self) -> str:
        """What the knobs changed, in plain words, each configuration against the first."""
        return read_sweep(self.table)

    def _text(self) -> str:
        cols = [
            "config", "step_time_ms", "comm_ms", "exposed_comm_ms", "collectives_per_step", "peak_mb",
        ]  # fmt: skip
        shown = self.table[cols].to_string(index=False, float_format=lambda v: f"{v:,.1f}")
        return f"ZeRO sweep: {len(self.table)} configurations\n{shown}\n\n{self.reading()}" + "".join(
            f"\nnote: {n}" for n in self.notes
        )

    def _html(self) -> str:
        cols = [
            "config", "step_time_ms", "comm_ms", "exposed_comm_ms", "overlap_pct", "collectives_per_step",
            "peak_mb",
        ]  # fmt: skip
        reading = "".join(f"<li>{escape(line)}</li>" for line in self.reading().splitlines())
        notes = "".join(f"<p><i>{escape(n)}</i></p>" for n in self.notes)
        return (
            f"<div class='nbt-zero-sweep'><b>ZeRO sweep</b>: {len(self.table)} configurations "
            "(times in ms, memory in MB per rank)"
            + html_table(self.table[cols])
            + f"<ul>{reading}</ul>{notes}</div>"
        )


def zero_sweep(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    settings: Sequence[dict[str, Any]] | None = None,
    grid: dict[str, Iterable[Any]] | None = None,
    steps: int = 3,
    warmup: int = 1,
    micro_batch_size: int = 8,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    keep_traces: bool = True,
) -> ZeroSweep:
    """Run a few DeepSpeed steps per ZeRO configuration on every rank of ``cluster``.

    Args:
        model_fn: builds the model (called on each rank, seeded the same).
        batch_fn: ``batch_fn(rank)`` -> ``inputs`` or ``(inputs, targets)`` for that rank.
        settings: configurations (dicts of :data:`KNOBS`); default :func:`default_settings`.
        grid: instead of settings, every combination of these knob values.
        loss_fn: ``loss_fn(output, targets)``; default MSE against targets, or mean square.
    Returns:
        A :class:`ZeroSweep` (definitions of each number in the module docstring).
    """
    import pandas as pd

    from nbtoolkit.analysis.overlap import comm_comp_overlap

    if settings is not None and grid is not None:
        raise NbtUsageError("give settings or grid, not both")
    if steps < 1 or warmup < 0:
        raise NbtUsageError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    if grid is not None:
        chosen = grid_settings(grid)
    elif settings is not None:
        chosen = [dict(s) for s in settings]
    else:
        chosen = default_settings(cluster.run(lambda: _parameter_count(model_fn), ranks=0)[0])
    for setting in chosen:
        unknown = sorted(set(setting) - set(KNOBS))
        if unknown:
            raise NbtUsageError(f"unknown ZeRO knob(s) {unknown} in {setting}: use {', '.join(KNOBS)}")
    rows = []
    traces: dict[str, Trace] = {}
    for setting in chosen:
        config = zero_config(micro_batch_size=micro_batch_size, **setting)
        results = cluster.run(
            lambda config=config: sweep_one_on_rank(
                model_fn, batch_fn, config, steps=steps, warmup=warmup, lr=lr, loss_fn=loss_fn
            )
        )
        name = label(setting)
        trace = _load_traces([r["trace_gz"] for r in results])
        overlap = comm_comp_overlap(trace, include_last_step=True)
        per_call = comm_comp_overlap(trace, by="collective", include_last_step=True)
        slowest = [max(times) for times in zip(*(r["step_times_s"] for r in results), strict=True)]
        rows.append(
            {
                "config": name,
                **{k: setting.get(k) for k in KNOBS},
                "step_time_ms": 1e3 * float(pd.Series(slowest).median()),
                "comm_ms": float(overlap["comm_time_us"].mean()) / 1e3 / steps,
                "exposed_comm_ms": float(overlap["exposed_comm_us"].mean()) / 1e3 / steps,
                "overlap_pct": float(overlap["overlap_pct"].mean()),
                "collectives_per_step": float((per_call["rank"] == trace.ranks[0]).sum()) / steps,
                "peak_mb": max(r["peak_bytes"] for r in results) / 2**20,
                "state_mb": max(r["state_bytes"] for r in results) / 2**20,
                "loss": results[0]["loss"],
            }
        )
        if keep_traces:
            traces[name] = trace
    table = pd.DataFrame(rows)
    table["stage"] = table["stage"].fillna(1).astype(int)
    notes = [
        f"{steps} timed steps after {warmup} warmup, then {steps} profiled steps, {cluster.world_size} ranks",
        (
            "communication is measured in the profiled steps, which the profiler slows down: compare it "
            "between configurations, not with the step time"
        ),
    ]
    return ZeroSweep(table=table, traces=traces, notes=notes)


def _load_traces(blobs: list[bytes]) -> Trace:
    import shutil
    import tempfile
    from pathlib import Path

    from nbtoolkit.io.kineto import load_trace

    folder = Path(tempfile.mkdtemp(prefix="nbt-zero-"))
    try:
        for rank, blob in enumerate(blobs):
            (folder / f"rank{rank}.json.gz").write_bytes(blob)
        return load_trace(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _change(new: float, old: float) -> float:
    return (new - old) / old if old and math.isfinite(old) and math.isfinite(new) else math.nan


def _verb(ratio: float, what: str, unit_new: str, unit_old: str) -> str:
    if not math.isfinite(ratio) or abs(ratio) < _NOISE:
        return f"no clear change in {what} ({unit_old} -> {unit_new})"
    direction = "raised" if ratio > 0 else "cut"
    return f"{direction} {what} by {abs(ratio) * 100:.0f}% ({unit_old} -> {unit_new})"


_STAGE_MEANING = {
    1: "ZeRO-1 partitions the optimizer state across ranks",
    2: "ZeRO-2 partitions the optimizer state and the gradients (reduce-scatter instead of all-reduce)",
    3: "ZeRO-3 partitions parameters too, gathering each layer's parameters before its forward and backward",
}


def read_sweep(table: pd.DataFrame) -> str:
    """One plain-words line per configuration, against the first one (the baseline).

    A change under 10% is called "no clear change": timings on shared CPUs vary that much.
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
        changed = [k for k in KNOBS if _differs(row[k], base[k])]
        what = ", ".join(f"{k}={_show(row[k])}" for k in changed) or "nothing"
        parts = [
            _verb(_change(row["step_time_ms"], base["step_time_ms"]), "step time",
                  f"{row['step_time_ms']:.1f} ms", f"{base['step_time_ms']:.1f} ms"),
            _verb(_change(row["peak_mb"], base["peak_mb"]), "peak memory",
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


def _differs(a: Any, b: Any) -> bool:
    def norm(v: Any) -> Any:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    return bool(norm(a) != norm(b))


def _show(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "default"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        return _count(v)
    return str(v)


# ---- graph breaks of a compiled model under each ZeRO stage ----
def graph_breaks_one_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    config: dict[str, Any],
    *,
    backend: str,
    steps: int,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> Any:
    """Build the model under ``config``, compile it with DeepSpeed's ``engine.compile``, and capture
    the graphs, breaks and recompiles of ``steps`` training steps (a GraphReport)."""
    import torch
    import torch.distributed as dist

    from nbtoolkit.capture.graphs import capture_graphs

    torch._dynamo.reset()  # every stage compiles from scratch
    engine, step = _engine_and_step(model_fn, batch_fn, config, rank=dist.get_rank(), lr=lr, loss_fn=loss_fn)

    try:
        engine.compile(backend=backend)
        return capture_graphs(
            step, steps=steps, eager_baseline=False, measure_cost=False,
            label=f"ZeRO-{config['zero_optimization']['stage']}",
        )
    finally:
        engine.destroy()
        torch._dynamo.reset()


@dataclass(repr=False)  # the repr is Result's (the text summary)
class ZeroGraphBreaks(Result):
    """Graphs and graph breaks of one compiled model under each ZeRO stage (rank 0's reports)."""

    table: pd.DataFrame
    reports: dict[int, Any]

    def _text(self) -> str:
        lines = ["Graph breaks of the compiled model per ZeRO stage (rank 0):",
                 self.table.to_string(index=False)]
        return "\n".join(lines)

    def _html(self) -> str:
        return "<p><b>Graph breaks of the compiled model per ZeRO stage</b> (rank 0)</p>" + html_table(
            self.table
        )


def zero_graph_breaks(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    stages: Sequence[int] = (1, 2, 3),
    backend: str = "eager",
    steps: int = 2,
    micro_batch_size: int = 8,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
) -> ZeroGraphBreaks:
    """Compile the model with DeepSpeed (``engine.compile``) under each ZeRO stage and count its
    graphs and graph breaks on every rank.

    ZeRO-3 gathers and releases each parameter around its module through hooks, so the compiler
    sees parameter communication inside the model; stages 1 and 2 only partition optimizer state
    and gradients, outside the forward. How much of the model ends up in one graph is the point
    of the comparison. Rank 0's reports are kept in ``.reports`` (stage -> GraphReport).
    """
    import pandas as pd

    bad = [s for s in stages if s not in (1, 2, 3)]
    if bad or not stages:
        raise NbtUsageError(f"stages must be among 1, 2, 3, got {list(stages)}")
    rows, reports = [], {}
    for stage in stages:
        config = zero_config(micro_batch_size=micro_batch_size, stage=stage)
        per_rank = cluster.run(
            lambda config=config: graph_breaks_one_on_rank(
                model_fn, batch_fn, config, backend=backend, steps=steps, lr=lr, loss_fn=loss_fn
            )
        )
        report = per_rank[0]
        reasons = report.break_summary()
        rows.append(
            {
                "stage": stage,
                "graphs": len(report.graphs),
                "graph_breaks": len(report.breaks),
                "distinct_breaks": len(reasons),
                "recompiles": len(report.recompiles),
                "compile_time_s": round(float(report.compile_time_s), 3),
                "top_break": str(reasons.iloc[0]["gb_type"]) if len(reasons) else "",
                "same_on_all_ranks": all(len(r.breaks) == len(report.breaks) for r in per_rank),
            }
        )
        reports[stage] = report
    return ZeroGraphBreaks(table=pd.DataFrame(rows), reports=reports)
