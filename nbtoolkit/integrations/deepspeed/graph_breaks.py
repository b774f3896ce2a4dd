"""Graphs and graph breaks of a model compiled by DeepSpeed (``engine.compile``) under each ZeRO stage."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.result import Result, html_table
from nbtoolkit.integrations.deepspeed.config import zero_config
from nbtoolkit.integrations.deepspeed.rank import graph_breaks_one_on_rank

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.cluster.cluster import Cluster

__all__ = ["ZeroGraphBreaks", "zero_graph_breaks"]


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
    steps: int | None = None,
    micro_batch_size: int = 8,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    config: MeasureConfig | None = None,
) -> ZeroGraphBreaks:
    """Compile the model with DeepSpeed (``engine.compile``) under each ZeRO stage and count its
    graphs and graph breaks on every rank.

    ZeRO-3 gathers and releases each parameter around its module through hooks, so the compiler
    sees parameter communication inside the model; stages 1 and 2 only partition optimizer state
    and gradients, outside the forward. How much of the model ends up in one graph is the point
    of the comparison. Rank 0's reports are kept in ``.reports`` (stage -> GraphReport).

    ``steps``, ``config``: the training steps captured per stage (a :class:`~nbtoolkit.MeasureConfig`;
    ``steps=`` given as well wins; default ``MeasureConfig()``'s). The first, compiling step is
    the warm-up, so a ``warmup`` is not used (as in :func:`nbtoolkit.capture_graphs`).
    """
    import pandas as pd

    bad = [s for s in stages if s not in (1, 2, 3)]
    if bad or not stages:
        raise NbtUsageError(f"stages must be among 1, 2, 3, got {list(stages)}")
    measure = measure_config(config, steps=steps)
    rows, reports = [], {}
    for stage in stages:
        ds_config = zero_config(micro_batch_size=micro_batch_size, stage=stage)
        per_rank = cluster.run(
            lambda ds_config=ds_config: graph_breaks_one_on_rank(
                model_fn, batch_fn, ds_config, backend=backend, measure=measure, lr=lr, loss_fn=loss_fn
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
