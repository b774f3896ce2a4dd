"""Which blocks to recompute under FSDP2, measured on every rank: one plan for all ranks.

    result = fsdp2_plan_recompute(cluster, make_model, make_batch, budget=["40MB", "30MB"])
    result.table
    # or, beside ZeRO: nbt.plan_recompute_on(cluster, make_model, make_batch, strategy="fsdp2", budget="30MB")

The method is the ZeRO planner's (:mod:`nbtoolkit.integrations.recompute_rank`): on every rank,
inside the model sharded with ``fully_shard`` per repeated block (``build_sharded``), each candidate
block is measured; the plan is solved once on the worst case over ranks, applied on every rank
and every rank's device total measured (re-planned lower while the largest rank is over). The
budget counts the whole device: this rank's parameter shards, its gradient and AdamW state shards,
the gathered blocks FSDP2 holds during the step, activations and temporaries.

Recomputing a block under FSDP2 runs its forward again inside backward, after FSDP2 has gathered
the block's parameters for its backward (the checkpoint wraps the block's ``forward``; FSDP2's
hooks sit outside it), so recomputation costs no extra all-gather.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes
from nbtoolkit.integrations.fsdp2.sweep_rank import recompute_one_on_rank
from nbtoolkit.integrations.fsdp2.wrap import ShardSettings
from nbtoolkit.integrations.recompute_table import (
    PLAN_COLUMNS,
    no_budget_lines,
    parse_budgets,
    plan_rows,
    shown_plans,
)

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.cluster.cluster import Cluster

__all__ = ["Fsdp2Recompute", "fsdp2_plan_recompute"]


@dataclass(repr=False)
class Fsdp2Recompute(Result):
    """Recompute plans under FSDP2 configurations and budgets, measured on every rank.

    Attributes:
        table: one row per (config, budget): ``config`` (the ShardSettings' label), then the
            columns of :data:`~nbtoolkit.integrations.recompute_table.PLAN_COLUMNS` (blocks chosen,
            predicted and measured peak of the largest rank, ``fits``, step times, ``error``).
        ranks: one row per (config, rank): ``fixed_bytes`` (what the rank holds outside the step:
            its parameter and optimizer-state shards, inputs), ``peak_none_bytes``,
            ``peak_all_bytes`` (checkpointing nothing / every block).
        blocks: the candidate blocks.
    """

    table: pd.DataFrame
    ranks: pd.DataFrame
    blocks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def figure(self) -> Any:
        """Blocks chosen against the budget, one line per FSDP2 configuration; measured peaks against
        the budget."""
        from nbtoolkit.core.static_figure import static_figure
        from nbtoolkit.recompute.panel import sharded_recompute_figure

        return static_figure(
            sharded_recompute_figure(
                self.table, "config", str, "Recompute plans under FSDP2, one plan for all ranks"
            )
        )

    def _text(self) -> str:
        lines = [f"FSDP2 recompute plans: {len(self.table)} (config, budget) pairs; peaks: largest rank"]
        if len(self.table):
            lines.append(shown_plans(self.table, ["config"]).to_string(index=False))
        lines.extend(no_budget_lines(self.table, self.ranks, "config"))
        lines.extend(f"{r.config}, budget {format_bytes(r.budget_bytes)}: {r.error}"
                     for r in self.table.itertuples() if r.error)  # fmt: skip
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _html(self) -> str:
        errors = "".join(
            f"<p><i>{escape(r.config)}, budget {escape(format_bytes(r.budget_bytes))}: "
            f"{escape(r.error)}</i></p>"
            for r in self.table.itertuples() if r.error
        )  # fmt: skip
        return (
            "<div class='nbt-fsdp2-recompute'><b>FSDP2 recompute plans</b> (peaks: the largest rank's "
            "device total)"
            + (html_table(shown_plans(self.table, ["config"])) if len(self.table) else "")
            + errors
            + "".join(f"<p>{escape(line)}</p>" for line in no_budget_lines(self.table, self.ranks, "config"))
            + "</div>"
        )


def fsdp2_plan_recompute(
    cluster: Cluster,
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    *,
    budget: Any = None,
    settings: ShardSettings | dict[str, Any] | Iterable[ShardSettings | dict[str, Any]] | None = None,
    blocks: Sequence[str] | None = None,
    steps: int = 2,
    lr: float = 1e-3,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    config: MeasureConfig | None = None,
) -> Fsdp2Recompute:
    """Choose, per FSDP2 configuration and budget, one set of blocks to recompute that keeps every
    rank's device total under the budget.

    Args:
        cluster: the ranks (``nbt.Cluster``); FSDP2 runs over its process group.
        model_fn: builds the model on each rank (seeded alike); it is sharded there with
            ``shard_model`` unless it comes back already wrapped by ``fully_shard``.
        batch_fn: ``batch_fn(rank)`` -> ``inputs`` or ``(inputs, targets)``.
        budget: the device's total peak per rank (bytes or text such as ``"30MB"``), or a list;
            None measures only (the ranks table, no plans).
        settings: one :class:`ShardSettings` (or dict of its fields), or several; default FSDP2's
            defaults.
        blocks: the repeated blocks (each sharded on its own and a recompute candidate); default
            the model's repeated blocks.
        steps: timing rounds of the candidate measurement; config: how each plan's step is timed.
    The method is in the module docstring.
    """
    import pandas as pd

    from nbtoolkit.integrations.fsdp2.sweep import as_settings
    from nbtoolkit.integrations.model_fn import check_model_fn

    check_model_fn(model_fn, "fsdp2")
    if settings is None:
        chosen = [ShardSettings()]
    elif isinstance(settings, (ShardSettings, dict)):
        chosen = [as_settings(settings)]
    else:
        chosen = [as_settings(s) for s in settings]
    if not chosen:
        raise NbtUsageError(
            "no FSDP2 configuration was given: pass settings=ShardSettings(...) or leave it out"
        )
    budgets = parse_budgets(budget)
    measure = measure_config(config)
    rows, rank_rows = [], []
    names: list[str] = []
    for setting in chosen:
        results = cluster.run(
            lambda setting=setting: recompute_one_on_rank(
                model_fn, batch_fn, setting, budgets=budgets, blocks=blocks, steps=steps, timing=measure,
                lr=lr, loss_fn=loss_fn,
            )
        )  # fmt: skip
        names = results[0]["blocks"]
        plans, ranks = plan_rows(results, {"config": setting.label()})
        rows += plans
        rank_rows += ranks
    return Fsdp2Recompute(
        table=pd.DataFrame(rows, columns=["config", *PLAN_COLUMNS]), ranks=pd.DataFrame(rank_rows),
        blocks=names,
        notes=[
            f"{cluster.world_size} ranks; budgets count each rank's device total",
            *(f"{s.label()}: {dataclasses.asdict(s)}" for s in chosen),
        ],
    )  # fmt: skip
