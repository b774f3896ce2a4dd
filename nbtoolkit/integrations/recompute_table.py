"""The notebook side every wrapper's recompute plan shares: budgets parsed, and the table rows built
from every rank's :func:`~nbtoolkit.integrations.recompute_rank.plan_on_rank` result.

Rows are keyed by what the caller varies (``{"stage": 2}`` for ZeRO, ``{"config": "reshard"}``
for FSDP2); the columns after the key are :data:`PLAN_COLUMNS` and :data:`RANK_COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nbtoolkit.core.units import parse_bytes

__all__ = ["PLAN_COLUMNS", "RANK_COLUMNS", "no_budget_lines", "parse_budgets", "plan_rows"]

PLAN_COLUMNS = ["budget_bytes", "blocks", "n_blocks", "predicted_peak_bytes", "measured_peak_bytes", "fits",
                "step_time_s", "step_time_none_s", "step_time_all_s", "error", "notes"]  # fmt: skip
RANK_COLUMNS = ["rank", "fixed_bytes", "parameter", "optimizer_state", "peak_none_bytes", "peak_all_bytes"]


def parse_budgets(budget: Any) -> list[int]:
    """One budget or a list of them (bytes or text such as ``"30MB"``) as bytes; None -> none."""
    if budget is None:
        return []
    values = list(budget) if isinstance(budget, (list, tuple)) else [budget]
    return [parse_bytes(v) for v in values]


def plan_rows(results: Sequence[dict[str, Any]], key: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """(plan rows, per-rank rows) of one wrapper configuration from every rank's result.

    A plan ``fits`` when it was solved and the largest rank measured under its budget; its step
    time is the slowest rank's median.
    """
    reference = results[0]["reference"]  # gathered: the same on every rank
    rank_rows = []
    for rank, result in enumerate(results):
        costs = result["costs"]
        rank_rows.append({
            **key, "rank": rank, "fixed_bytes": costs.fixed_bytes,
            "parameter": costs.fixed_by_category.get("parameter", 0),
            "optimizer_state": costs.fixed_by_category.get("optimizer_state", 0),
            "peak_none_bytes": reference["none"]["peak"][rank],
            "peak_all_bytes": reference["all"]["peak"][rank],
        })  # fmt: skip
    rows = []
    for plan in results[0]["plans"]:
        measured = plan.get("measured", {"peak": [0], "step_time_s": [float("nan")]})
        peak = max(measured["peak"])
        rows.append({
            **key, "budget_bytes": plan["budget_bytes"], "blocks": ",".join(plan.get("blocks", [])),
            "n_blocks": len(plan.get("blocks", [])), "predicted_peak_bytes": plan.get("predicted", 0),
            "measured_peak_bytes": peak, "fits": "error" not in plan and peak <= plan["budget_bytes"],
            "step_time_s": max(measured["step_time_s"]),
            "step_time_none_s": max(reference["none"]["step_time_s"]),
            "step_time_all_s": max(reference["all"]["step_time_s"]),
            "error": plan.get("error", ""), "notes": "; ".join(plan["notes"]),
        })  # fmt: skip
    return rows, rank_rows


def shown_plans(table: Any, keys: Sequence[str]) -> Any:
    """The plan table as people read it (sizes and times in units, "(none)" for no blocks, fits as
    yes/NO), with the ``keys`` columns first."""
    from nbtoolkit.core.units import format_bytes, format_seconds

    frame = table.copy()
    frame["budget"] = [format_bytes(v) for v in frame["budget_bytes"]]
    frame["predicted peak"] = [format_bytes(v) for v in frame["predicted_peak_bytes"]]
    frame["measured peak"] = [format_bytes(v) for v in frame["measured_peak_bytes"]]
    frame["step"] = [format_seconds(v) for v in frame["step_time_s"]]
    frame["step, all blocks"] = [format_seconds(v) for v in frame["step_time_all_s"]]
    pairs = zip(frame["blocks"], frame["error"], strict=True)
    frame["blocks"] = [b if b or e else "(none)" for b, e in pairs]
    frame["fits"] = ["yes" if f else "NO" for f in frame["fits"]]
    shown = ["budget", "blocks", "predicted peak", "measured peak", "fits", "step", "step, all blocks"]
    return frame[[*keys, *shown]]


def no_budget_lines(table: Any, ranks: Any, key: str, name: Any = str) -> list[str]:
    """Without a budget there is no plan to show: per configuration (``key``, named by ``name``),
    the range a budget can take, from the largest rank's peaks checkpointing nothing and every
    block. Empty when the table holds plans."""
    from nbtoolkit.core.units import format_bytes

    if len(table) or not len(ranks):
        return []
    lines = []
    for value, rows in ranks.groupby(key, sort=False):
        none, every = int(rows["peak_none_bytes"].max()), int(rows["peak_all_bytes"].max())
        lines.append(
            f"{name(value)}: no budget given; the largest rank peaks at {format_bytes(none)} recomputing "
            f"nothing and {format_bytes(every)} recomputing every block: pass budget= between them "
            "(a list gives one plan each)"
        )
    return lines
