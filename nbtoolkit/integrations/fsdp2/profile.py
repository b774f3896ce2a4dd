"""An FSDP2 model on the cluster's ranks, measured: per-rank memory, communication overlap, graph breaks.

    from nbtoolkit.integrations.fsdp2.profile import fsdp2_graph_breaks, fsdp2_memory, fsdp2_overlap
    mem = fsdp2_memory(cluster, make_model, make_batch)        # Fsdp2Memory: mem.table, mem.memory
    ov = fsdp2_overlap(cluster, make_model, make_batch)        # Fsdp2Overlap: ov.overlap, ov.per_collective
    gb = fsdp2_graph_breaks(cluster, make_model, make_batch)   # Fsdp2GraphBreaks: gb.reports[rank]

Each builds the model on every rank with the same seed, shards it with
:func:`~nbtoolkit.integrations.fsdp2.wrap.shard_model` (``settings``: a ShardSettings, ``blocks``:
the modules that get their own ``fully_shard``, default the repeated blocks), takes a
``torch.optim.AdamW`` and runs training steps on ``batch_fn(rank)`` (see
:func:`~nbtoolkit.integrations.fsdp2.rank.make_step` for the step and the default loss).

What is measured:

- **memory** (:func:`fsdp2_memory`): :func:`nbtoolkit.memory_timeline` of ``steps`` steps on every
  rank after ``warmup`` unrecorded ones (so AdamW's state exists), as a RankMemory. The
  parameters, gradients and optimizer state are this rank's shards; FSDP2's gathered
  parameters and full-size gradients are the categories ``unsharded_parameter`` and
  ``unsharded_gradient`` (:mod:`nbtoolkit.memory.sharded` says how and why). The table gives
  each category's peak per rank beside the unsharded model's size divided by the world size.
- **overlap** (:func:`fsdp2_overlap`): a torch.profiler trace of ``steps`` steps per rank,
  :func:`nbtoolkit.comm_comp_overlap` per rank, per step and per collective call (all profiled
  steps kept). On GPUs this is HTA's definition; on CPU ranks (gloo) nbtoolkit's, where HTA
  has none (it counts GPU kernels only and gives NaN). FSDP2's all-gathers read as
  ``all_gather`` and its reduce-scatters as ``reduce_scatter`` (gloo runs them as all-reduces).
- **graph breaks** (:func:`fsdp2_graph_breaks`): each block compiled with ``block.compile``
  before ``fully_shard``, as torchtitan does, and :func:`nbtoolkit.capture_graphs` of
  ``steps`` training steps on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes
from nbtoolkit.integrations.fsdp2.rank import graph_breaks_on_rank, memory_on_rank, profile_on_rank
from nbtoolkit.integrations.fsdp2.wrap import ShardSettings

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from nbtoolkit.cluster.cluster import Cluster
    from nbtoolkit.memory.rank_memory import RankMemory
    from nbtoolkit.trace.trace import Trace

__all__ = [
    "Fsdp2GraphBreaks", "Fsdp2Memory", "Fsdp2Overlap", "fsdp2_graph_breaks", "fsdp2_memory", "fsdp2_overlap",
]

#: the categories of the memory table, in its column order
SHARD_CATEGORIES = ("parameter", "gradient", "optimizer_state", "unsharded_parameter", "unsharded_gradient")


def _check(model_fn: Any, batch_fn: Any, settings: Any, steps: int, warmup: int) -> None:
    if not callable(model_fn) or not callable(batch_fn):
        raise NbtUsageError(
            "model_fn and batch_fn must be functions: model_fn() -> model, batch_fn(rank) -> batch"
        )
    if settings is not None and not isinstance(settings, ShardSettings):
        raise NbtUsageError(
            "settings must be a ShardSettings (nbtoolkit.integrations.fsdp2.wrap), "
            f"got {type(settings).__name__}"
        )
    if steps < 1 or warmup < 0:
        raise NbtUsageError(
            f"steps must be at least 1 and warmup at least 0, got steps={steps}, warmup={warmup}"
        )


@dataclass(repr=False)  # the repr is Result's (the text summary)
class Fsdp2Memory(Result):
    """Per-rank memory of an FSDP2 model: ``memory`` (a RankMemory) and ``table`` (one row per rank:
    each shard category's peak, the unsharded model's bytes and its share per rank)."""

    memory: RankMemory
    table: pd.DataFrame
    settings: ShardSettings = field(default_factory=ShardSettings)

    def figure(self, **options: Any) -> Any:
        """Each rank's total over time and its peak by category (RankMemory's figure)."""
        return self.memory.figure(**options)

    def _shown(self) -> pd.DataFrame:
        shown = self.table[["rank"]].copy()
        for column in ("unsharded_model_bytes", "per_rank_share_bytes", *SHARD_CATEGORIES, "peak_bytes"):
            shown[column.removesuffix("_bytes")] = [format_bytes(int(v)) for v in self.table[column]]
        return shown

    def reading(self) -> str:
        row = self.table.iloc[0]
        share = float(row["per_rank_share_bytes"]) or 1.0
        ranks = len(self.table)
        gathered = format_bytes(int(self.table["unsharded_parameter"].max()))
        # every recording missed a free on a backend thread (rank.memory_on_rank): say so
        unreliable = [r for r, t in self.memory.timelines.items() if t.reused_storages]
        warning = (
            f"; rank(s) {', '.join(map(str, unreliable))}: torch's profiler missed a free on a backend "
            "thread in every recording, so the unsharded peaks may be a little high (the timelines' notes)"
            if unreliable else ""
        )
        return (
            f"each of {ranks} ranks holds parameters {row['parameter'] / share:.2f}x, gradients "
            f"{row['gradient'] / share:.2f}x and optimizer state {row['optimizer_state'] / share:.2f}x "
            f"of its 1/{ranks} share of the model ({format_bytes(int(share))}); FSDP2's gathered "
            f"parameters peak at {gathered} ({self.settings.label()}){warning}"
        )

    def _text(self) -> str:
        return f"FSDP2 memory per rank\n{self._shown().to_string(index=False)}\n{self.reading()}"

    def _html(self) -> str:
        return (
            "<div class='nbt-fsdp2-memory'><b>FSDP2 memory per rank</b> (each category's peak)"
            f"{html_table(self._shown())}<p>{escape(self.reading())}</p></div>"
        )


def fsdp2_memory(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    settings: ShardSettings | None = None,
    blocks: Sequence[str] | None = None,
    steps: int = 1,
    warmup: int = 1,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
) -> Fsdp2Memory:
    """Memory timelines of an FSDP2 training step on every rank (module docstring: what is measured)."""
    import pandas as pd

    from nbtoolkit.memory.rank_memory import RankMemory

    _check(model_fn, batch_fn, settings, steps, warmup)
    results = cluster.run(
        lambda: memory_on_rank(
            model_fn, batch_fn, settings, blocks=blocks, warmup=warmup, steps=steps, lr=lr, loss_fn=loss_fn
        )
    )
    memory = RankMemory(timelines={rank: r["timeline"] for rank, r in enumerate(results)})
    rows = []
    for rank, result in enumerate(results):
        peaks = result["timeline"].category_peaks().set_index("category")["peak_bytes"]
        rows.append({
            "rank": rank,
            "unsharded_model_bytes": result["unsharded_bytes"],
            "per_rank_share_bytes": result["unsharded_bytes"] / len(results),
            "local_shard_bytes": result["local_bytes"],
            **{c: int(peaks.get(c, 0)) for c in SHARD_CATEGORIES},
            "peak_bytes": result["timeline"].peak_bytes,
        })
    return Fsdp2Memory(memory=memory, table=pd.DataFrame(rows), settings=settings or ShardSettings())


@dataclass(repr=False)  # the repr is Result's (the text summary)
class Fsdp2Overlap(Result):
    """Communication of an FSDP2 step and how much of it computation hides, per rank, step and call."""

    trace: Trace
    overlap: pd.DataFrame
    per_step: pd.DataFrame
    per_collective: pd.DataFrame
    steps: int

    def collectives(self) -> pd.DataFrame:
        """Per rank and collective: calls per step, time and exposed time per step (µs)."""
        calls = self.per_collective.assign(
            exposed_us=lambda f: f["dur_us"] - f["overlap_time_us"], collective=self._collective_names()
        )
        grouped = calls.groupby(["rank", "collective"], as_index=False).agg(
            calls=("dur_us", "size"), time_us=("dur_us", "sum"), exposed_us=("exposed_us", "sum")
        )
        for column in ("calls", "time_us", "exposed_us"):
            grouped[column] = grouped[column] / self.steps
        return grouped.rename(columns={"calls": "calls_per_step", "time_us": "time_us_per_step",
                                       "exposed_us": "exposed_us_per_step"})

    def _collective_names(self) -> list[str]:
        """One name per call whatever recorded it: NCCL's metadata (``_allgather_base``) and gloo's
        (``all_gather``) both read ``all_gather`` (nccl-tests' names)."""
        from nbtoolkit.trace.collective_bandwidth import normalize_collective

        return [normalize_collective(str(name)) for name in self.per_collective["collective"]]

    def reading(self) -> str:
        exposed = float(self.overlap["exposed_comm_us"].mean()) / self.steps / 1e3
        total = float(self.overlap["comm_time_us"].mean()) / self.steps / 1e3
        pct = float(self.overlap["overlap_pct"].mean())
        kinds = ", ".join(sorted(set(self._collective_names())))
        return (
            f"per step {total:.1f} ms of communication ({kinds}), {pct:.0f}% hidden behind computation: "
            f"{exposed:.1f} ms exposed (mean over {len(self.overlap)} ranks)"
        )

    def _text(self) -> str:
        return (
            f"FSDP2 communication overlap\n{self.overlap.to_string(index=False)}\n"
            f"{self.collectives().to_string(index=False)}\n{self.reading()}"
        )

    def _html(self) -> str:
        return (
            "<div class='nbt-fsdp2-overlap'><b>FSDP2 communication overlap</b>"
            f"{html_table(self.overlap)}{html_table(self.collectives())}<p>{escape(self.reading())}</p></div>"
        )


def fsdp2_overlap(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    settings: ShardSettings | None = None,
    blocks: Sequence[str] | None = None,
    steps: int = 3,
    warmup: int = 1,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    save_dir: str | Path | None = None,
) -> Fsdp2Overlap:
    """Profile ``steps`` FSDP2 training steps on every rank and measure their communication overlap.

    ``save_dir`` keeps the ranks' traces (``rank<N>.json.gz``, as ``Cluster.profile`` does).
    """
    from nbtoolkit.cluster.running import traces_of
    from nbtoolkit.cluster.state import RemoteRun
    from nbtoolkit.trace.overlap import comm_comp_overlap

    _check(model_fn, batch_fn, settings, steps, warmup)
    run: RemoteRun = cluster.execute(
        lambda: profile_on_rank(
            model_fn, batch_fn, settings, blocks=blocks, warmup=warmup, steps=steps, lr=lr, loss_fn=loss_fn
        )
    )
    run.raise_for_errors()
    trace = traces_of(run, save_dir)
    return Fsdp2Overlap(
        trace=trace,
        overlap=comm_comp_overlap(trace, include_last_step=True),
        per_step=comm_comp_overlap(trace, by="iteration", include_last_step=True),
        per_collective=comm_comp_overlap(trace, by="collective", include_last_step=True),
        steps=steps,
    )


@dataclass(repr=False)  # the repr is Result's (the text summary)
class Fsdp2GraphBreaks(Result):
    """Graphs and graph breaks of an FSDP2 model compiled per block: ``reports`` (rank -> GraphReport)
    and ``table`` (one row per rank)."""

    reports: dict[int, Any]
    table: pd.DataFrame

    def _text(self) -> str:
        return "Graph breaks of the FSDP2 model, compiled per block:\n" + self.table.to_string(index=False)

    def _html(self) -> str:
        return "<p><b>Graph breaks of the FSDP2 model, compiled per block</b></p>" + html_table(self.table)


def fsdp2_graph_breaks(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    settings: ShardSettings | None = None,
    blocks: Sequence[str] | None = None,
    backend: str = "eager",
    steps: int = 1,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
) -> Fsdp2GraphBreaks:
    """Compile each block, shard with FSDP2, and report the graphs and breaks of ``steps`` training
    steps on every rank (the first, compiling step is captured too)."""
    import pandas as pd

    _check(model_fn, batch_fn, settings, steps, 0)
    reports = cluster.run(
        lambda: graph_breaks_on_rank(
            model_fn, batch_fn, settings, blocks=blocks, backend=backend, steps=steps, lr=lr, loss_fn=loss_fn
        )
    )
    rows = []
    for rank, report in enumerate(reports):
        reasons = report.break_summary()
        rows.append({
            "rank": rank,
            "graphs": len(report.graphs),
            "graph_breaks": len(report.breaks),
            "distinct_breaks": len(reasons),
            "recompiles": len(report.recompiles),
            "top_break": str(reasons.iloc[0]["gb_type"]) if len(reasons) else "",
            "error": str(report.error or ""),
        })
    return Fsdp2GraphBreaks(reports=dict(enumerate(reports)), table=pd.DataFrame(rows))
