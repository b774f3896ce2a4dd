"""Which blocks to recompute under DeepSpeed ZeRO, measured on every rank: one plan for all ranks.

    result = zero_plan_recompute(cluster, make_model, make_batch, budget=["40MB", "30MB"], stages=(1, 2, 3))
    result.table; result.figure()
    # or: nbt.plan_recompute_on(cluster, make_model, make_batch, strategy="zero2", budget="30MB")

The question the ACS training image's CHECKPOINT_OPTIMIZATION answers by lookup, answered by
measurement: with ZeRO stage *s* on these ranks, which blocks must be recomputed so that
every rank's device stays under the budget? For each stage, on every rank inside a real
DeepSpeed engine (``deepspeed.initialize`` over the cluster's process group):

- the budget counts the device's whole peak, as ``nbt.plan_recompute`` does: parameters,
  gradients and optimizer state (which ZeRO 1/2/3 shard across ranks, so each stage leaves
  different room for activations), activations and temporaries;
- every rank measures its candidates (savings, recompute times, phases, fixed bytes); the plan
  is solved once on the worst case over ranks (smallest saving, largest time, each rank's
  own phases with its own fixed bytes), so it fits on every rank by the memory model; then it
  is applied on every rank and every rank's total peak measured (re-planned lower, at most
  three times, while the largest rank is over).

The table has one row per stage and budget: the blocks chosen, the predicted and the measured
peak of the largest rank, and the step time against checkpointing nothing and everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes
from nbtoolkit.integrations.deepspeed.config import zero_config
from nbtoolkit.integrations.deepspeed.recompute_rank import recompute_on_rank
from nbtoolkit.integrations.recompute_table import (
    PLAN_COLUMNS,
    no_budget_lines,
    parse_budgets,
    plan_rows,
    shown_plans,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ZeroRecompute", "zero_plan_recompute"]


class Cluster(Protocol):
    """What the planner uses of an ``nbt.Cluster``: its size, and running a function on every rank.

    Named here rather than imported, so that the planner asks no more of the Cluster than this.
    """

    @property
    def world_size(self) -> int: ...

    def run(self, code_or_fn: Any) -> Any: ...


@dataclass(repr=False)
class ZeroRecompute(Result):
    """Recompute plans under ZeRO stages and budgets, measured on every rank.

    Attributes:
        table: one row per (stage, budget): ``stage``, ``budget_bytes``, ``blocks``
            (comma-separated), ``n_blocks``, ``predicted_peak_bytes`` and ``measured_peak_bytes``
            (largest rank, device total), ``fits``, ``step_time_s`` (slowest rank's median),
            ``step_time_none_s``/``step_time_all_s`` (checkpointing nothing/every block),
            ``error`` (why no plan fits, else empty), ``notes``.
        ranks: one row per (stage, rank): ``fixed_bytes`` (what the rank holds outside the
            step: its shard of parameters and optimizer state, inputs), ``parameter``,
            ``optimizer_state``, ``peak_none_bytes``, ``peak_all_bytes``.
        blocks: the candidate blocks.
    """

    table: pd.DataFrame
    ranks: pd.DataFrame
    blocks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def figure(self) -> Any:
        """Blocks chosen against the budget, one line per stage; measured peaks against the budget."""
        from nbtoolkit.core.static_figure import static_figure
        from nbtoolkit.recompute.panel import zero_recompute_figure

        return static_figure(zero_recompute_figure(self.table))

    def _shown(self) -> pd.DataFrame:
        return shown_plans(self.table, ["stage"])

    def _no_budget(self) -> list[str]:
        return no_budget_lines(self.table, self.ranks, "stage", lambda stage: f"stage {stage}")

    def _text(self) -> str:
        lines = [f"ZeRO recompute plans: {len(self.table)} (stage, budget) pairs; peaks: largest rank"]
        if len(self.table):
            lines.append(self._shown().to_string(index=False))
        lines.extend(self._no_budget())
        lines.extend(f"stage {r.stage}, budget {format_bytes(r.budget_bytes)}: {r.error}"
                     for r in self.table.itertuples() if r.error)
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _html(self) -> str:
        errors = "".join(
            f"<p><i>stage {r.stage}, budget {escape(format_bytes(r.budget_bytes))}: {escape(r.error)}</i></p>"
            for r in self.table.itertuples() if r.error
        )
        return (
            "<div class='nbt-zero-recompute'><b>ZeRO recompute plans</b> (peaks: the largest rank's "
            "device total)" + (html_table(self._shown()) if len(self.table) else "") + errors
            + "".join(f"<p>{escape(line)}</p>" for line in self._no_budget())
            + "</div>"
        )


def zero_plan_recompute(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    budget: Any = None,
    stages: Iterable[int] | int = (1, 2, 3),
    stage: int | None = None,
    blocks: Sequence[str] | None = None,
    steps: int = 2,
    micro_batch_size: int = 8,
    knobs: dict[str, Any] | None = None,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    config: MeasureConfig | None = None,
) -> ZeroRecompute:
    """Choose, per ZeRO stage and budget, one set of blocks to recompute that keeps every rank under it.

    Args:
        cluster: the ranks (``nbt.Cluster``); DeepSpeed runs over its process group.
        model_fn: builds the model (on each rank, seeded alike); batch_fn: ``batch_fn(rank)``.
        budget: the device's total peak per rank (bytes or text such as ``"30MB"``), or a list of
            them; None measures only (the table's reference columns, no plans).
        stages: ZeRO stages to try (or ``stage=`` for one).
        blocks: candidate module names; default the model's repeated blocks.
        steps: timing rounds of the candidate measurement.
        config: a :class:`~nbtoolkit.MeasureConfig` for the steps timed per plan (its ``steps``,
            default ``MeasureConfig().steps``) and the synchronisation.
        knobs: further ZeRO settings for :func:`zero_config` (``reduce_bucket_size=...``). Note
            that DeepSpeed's default reduce bucket (5e8 elements) is itself 2 GB of fp32 on each
            rank, allocated during the step, and so counts against the budget.
    The method is in the module docstring.
    """
    import pandas as pd

    chosen_stages = [stage] if stage is not None else ([stages] if isinstance(stages, int) else list(stages))
    for s in chosen_stages:
        if s not in (1, 2, 3):
            raise NbtUsageError(f"ZeRO stage must be 1, 2 or 3 for a recompute plan, got {s!r}")
    budgets = parse_budgets(budget)
    measure = measure_config(config)
    rows, rank_rows = [], []
    names: list[str] = []
    for s in chosen_stages:
        ds_config = zero_config(stage=s, micro_batch_size=micro_batch_size, **(knobs or {}))
        results = cluster.run(
            lambda ds_config=ds_config: recompute_on_rank(
                model_fn, batch_fn, ds_config, budgets=budgets, blocks=blocks, steps=steps,
                timing=measure, lr=lr, loss_fn=loss_fn,
            )
        )
        names = results[0]["blocks"]
        plans, ranks = plan_rows(results, {"stage": s})
        rows += plans
        rank_rows += ranks
    columns = ["stage", *PLAN_COLUMNS]
    return ZeroRecompute(
        table=pd.DataFrame(rows, columns=columns), ranks=pd.DataFrame(rank_rows), blocks=names,
        notes=[f"{cluster.world_size} ranks; budgets count each rank's device total"],
    )
