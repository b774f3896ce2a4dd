"""A :class:`~nbtoolkit.recompute.plan.RecomputePlan` with per-block choices, made by the backend
planner (``nbtoolkit.recompute.backend_planner``, which builds it): applied to a model, and written
out per block (what is saved, recomputed or offloaded, and why).

The plan keeps the fields every plan has, so the panel, ``best_for`` and saving work as before:
``blocks`` are the fully recomputed blocks, ``candidates.saved_bytes`` / ``recompute_time_s`` what
full recomputation of each saves and costs; the extra columns ``selective_saved_bytes``,
``selective_time_s``, ``choice`` and ``why`` carry the rest. The memory model is one phase with every
block alive (the additive model of ``nbtoolkit.recompute.choice_solver``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.recompute.selective import SAVED_OP_NAMES

if TYPE_CHECKING:
    from nbtoolkit.recompute.handle import Applied

#: A RecomputePlan (not imported: ``nbtoolkit.recompute.plan`` imports this module).
RecomputePlan = Any

__all__ = ["apply_backend_plan", "choice_lines", "summary_lines"]

_WHAT = {
    "keep": "kept (every activation saved)",
    "selective": "selective (saves matmul/attention outputs, recomputes the rest)",
    "full": "recomputed (only its inputs kept)",
    "offload": "offloaded (saved activations in host memory)",
}


def apply_backend_plan(plan: RecomputePlan, model: Any) -> Applied:
    """Apply a plan's per-block choices (and torch's partitioner budget for the partitioner route) to
    ``model``; the model's own checkpointing is off meanwhile, as for block plans. Compile the model
    after this (``optimize(compile=...)`` does), so the partitioner budget is in effect when it compiles."""
    from nbtoolkit.recompute.blocks import check_module, resolve_blocks
    from nbtoolkit.recompute.framework_checkpointing import suspend_framework_checkpointing
    from nbtoolkit.recompute.selective import apply_choices, partitioner_budget

    module = check_module(model)
    names = list(plan.choices)
    blocks = dict(zip(names, resolve_blocks(module, names), strict=True))
    applied = suspend_framework_checkpointing(module)
    try:
        applied.extend(apply_choices(blocks, plan.choices))
        if plan.activation_memory_budget is not None:
            applied.extend(partitioner_budget(plan.activation_memory_budget))
    except BaseException:
        applied.undo()
        raise
    return applied


def summary_lines(plan: RecomputePlan, head: str, peak: str, overhead: str) -> list[str]:
    """The summary of a plan with choices: the route, the backend, the counts per choice."""
    counts = {c: sum(v == c for v in plan.choices.values()) for c in ("selective", "full", "offload")}
    if plan.route == "partitioner":
        head = (
            f"RecomputePlan: torch's partitioner with activation_memory_budget="
            f"{plan.activation_memory_budget:.3f} for a budget of {format_bytes(plan.budget_bytes)}"
        )
        shown = "  blocks none wrapped: the compiled graph's partitioner chooses what to recompute"
    else:
        changed = sum(counts.values())
        counted = "total peak" if plan.budget_kind == "total" else "step's own peak"
        head = (
            f"RecomputePlan: recompute {changed} of {len(plan.choices)} blocks for a budget of "
            f"{format_bytes(plan.budget_bytes)} ({counted})"
        )
        shown = "  blocks " + ", ".join(f"{counts[c]} {c}" for c in counts if counts[c] or c != "offload")
    measured = (
        f"  measured step {format_seconds(plan.measured_step_time_s)} "
        f"(baseline {format_seconds(plan.baseline_step_time_s)})"
        if plan.measured_step_time_s is not None else ""
    )
    lines = [head, peak, overhead, shown, f"  backend {plan.backend}; route {plan.route}"]
    if measured:
        lines.append(measured)
    lines.append(f"  solver {plan.solver}; selective saves the outputs of aten {', '.join(SAVED_OP_NAMES)}")
    return lines


def choice_lines(plan: RecomputePlan) -> list[str]:
    """One line per block: kept / selective / recomputed / offloaded, and why."""
    return [
        f"    {row.block:<24} {row.module:<16} {_WHAT.get(row.choice, row.choice)}: {row.why}"
        for row in plan.candidates.itertuples(index=False)
    ]
