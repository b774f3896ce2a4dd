"""A :class:`~nbtoolkit.recompute.plan.RecomputePlan` with per-block choices, made by the backend
planner (``nbtoolkit.recompute.backend_planner``): built from its measurements, applied to a model,
and written out per block (what is saved, recomputed or offloaded, and why).

The plan keeps the fields every plan has, so the panel, ``best_for`` and saving work as before:
``blocks`` are the fully recomputed blocks, ``candidates.saved_bytes`` / ``recompute_time_s`` what
full recomputation of each saves and costs; the extra columns ``selective_saved_bytes``,
``selective_time_s``, ``choice`` and ``why`` carry the rest. The memory model is one phase with every
block alive (the additive model of ``nbtoolkit.recompute.choice_solver``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.recompute.choice_solver import predict_choice_peak
from nbtoolkit.recompute.selective import SAVED_OP_NAMES

if TYPE_CHECKING:
    from nbtoolkit.recompute.backend_planner import BackendPlanner, Measured
    from nbtoolkit.recompute.handle import Applied
    from nbtoolkit.recompute.plan import RecomputePlan

__all__ = ["apply_backend_plan", "build_plan", "choice_lines", "summary_lines"]

_WHAT = {
    "keep": "kept (every activation saved)",
    "selective": "selective (saves matmul/attention outputs, recomputes the rest)",
    "full": "recomputed (only its inputs kept)",
    "offload": "offloaded (saved activations in host memory)",
}


def build_plan(
    planner: BackendPlanner,
    choices: list[str],
    *,
    measured: Measured,
    budget: int,
    base: Measured,
    notes: list[str],
    route: str,
    fraction: float | None,
    front: list[list[str]],
) -> RecomputePlan:
    import pandas as pd

    from nbtoolkit.recompute.plan import RecomputePlan

    saved, cost = planner.measured_table()
    names = planner.candidates.names
    modules = [type(m).__name__ for m in planner.candidates.blocks.values()]
    why = [_why(choices[i], saved[i], cost[i], route, fraction) for i in range(len(names))]
    candidates = pd.DataFrame({
        "block": names,
        "module": modules,
        "saved_bytes": [round(s.get("full", 0)) for s in saved],
        "recompute_time_s": [float(c.get("full", 0.0)) for c in cost],
        "recompute_time_p25_s": [float(c.get("full", 0.0)) for c in cost],
        "recompute_time_p75_s": [float(c.get("full", 0.0)) for c in cost],
        "forward_time_s": [0.0] * len(names),
        "chosen": [c == "full" for c in choices],
        "selective_saved_bytes": [round(s.get("selective", 0)) for s in saved],
        "selective_time_s": [float(c.get("selective", 0.0)) for c in cost],
        "choice": list(choices),
        "why": why,
    })
    rows = [
        {
            "predicted_peak_bytes": predict_choice_peak(base.peak_bytes, saved, plan),
            "predicted_overhead_s": _overhead(cost, plan),
            "predicted_overhead_p25_s": _overhead(cost, plan),
            "predicted_overhead_p75_s": _overhead(cost, plan),
            "n_blocks": sum(c != "keep" for c in plan),
            "blocks": ",".join(n for n, c in zip(names, plan, strict=True) if c == "full"),
            "choices": ",".join(f"{n}:{c}" for n, c in zip(names, plan, strict=True) if c != "keep"),
        }
        for plan in front
    ]
    if route == "partitioner":
        predicted_peak = measured.peak_bytes
        overhead = max(0.0, measured.step_time_s - base.step_time_s)
    else:
        predicted_peak = predict_choice_peak(base.peak_bytes, saved, choices)
        overhead = _overhead(cost, choices)
    return RecomputePlan(
        blocks=[n for n, c in zip(names, choices, strict=True) if c == "full"],
        budget_bytes=int(budget),
        predicted_peak_bytes=int(predicted_peak),
        predicted_overhead_s=overhead,
        predicted_overhead_p25_s=overhead,
        predicted_overhead_p75_s=overhead,
        baseline_peak_bytes=int(base.peak_bytes),
        baseline_step_time_s=float(base.step_time_s),
        candidates=candidates,
        tradeoff=pd.DataFrame(rows),
        phases=pd.DataFrame(
            {"phase": [0], "baseline_bytes": [int(base.peak_bytes)], "alive": [tuple(names)]}
        ),
        measured_peak_bytes=int(measured.peak_bytes),
        solver=f"per-block choice ILP (PuLP + CBC), every setting measured under {planner.backend}",
        notes=list(notes),
        fixed_bytes=0,
        budget_kind="total" if planner.total else "step",
        choices=dict(zip(names, choices, strict=True)),
        backend=planner.backend,
        route=route,
        activation_memory_budget=fraction,
        measured_step_time_s=float(measured.step_time_s),
    )


def _overhead(cost: list[dict[str, float]], choices: list[str]) -> float:
    return float(sum(cost[i].get(c, 0.0) for i, c in enumerate(choices)))


def _why(
    choice: str, saved: dict[str, float], cost: dict[str, float], route: str, fraction: float | None
) -> str:
    """One block's line: what it does and what that saves and costs (measured), against the others."""
    if route == "partitioner":
        return f"torch's partitioner decides what to save (activation_memory_budget={fraction:.3f})"
    options = "; ".join(
        f"{c} saves {format_bytes(round(saved[c]))} for +{format_seconds(cost.get(c, 0.0))}"
        for c in saved if c != choice
    )
    if choice == "keep":
        return f"the budget is met without it ({options})"
    return (
        f"saves {format_bytes(round(saved.get(choice, 0)))} for +{format_seconds(cost.get(choice, 0.0))}"
        + (f" ({options})" if options else "")
    )


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
