"""Choose which blocks to recompute from measured costs: the exact solver behind ``nbt.plan_recompute``.

Pure: it takes a :class:`~nbtoolkit.recompute.costs.RecomputeCosts` (or the bare
arrays) and a budget, runs nothing, and returns a
:class:`~nbtoolkit.recompute.plan.RecomputePlan` (or the chosen positions).

* **Model.** Checkpointing a set S gives the peak
  ``fixed + max_p (P_p - sum_{i in S ∩ A_p} s_i)``: each phase keeps its measured level
  ``P_p`` minus the savings ``s_i`` of the checkpointed blocks alive in it (``A_p``), plus
  ``fixed`` bytes no checkpointing changes (``fixed_bytes``, 0 by default). The peak is *not*
  the baseline peak minus the sum of savings: a block saves nothing in phases where it is
  not alive, and the peak can move to another phase.
* **Solver: an exact integer linear program** (PuLP with the CBC solver it ships): binary
  ``x_i``; minimise ``sum t_i x_i``; subject to, for every phase with ``fixed + P_p > budget``,
  ``sum_{i in A_p} s_i x_i >= fixed + P_p - budget``. An ILP rather than dynamic programming
  because the savings are byte counts (a DP over them needs rounding to a grid, which loses
  exactness or explodes the table), and because the alive sets need not be nested prefixes
  (blocks named by the user may run in any order). With a few dozen candidates CBC answers
  in milliseconds.
* **Trade-off front.** Solving again with the budget 1 KiB below the last plan's predicted
  peak walks the exact Pareto front, from no checkpointing to the lowest reachable peak.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import PlanError
from nbtoolkit.core.units import format_bytes

if TYPE_CHECKING:
    from nbtoolkit.recompute.costs import RecomputeCosts
    from nbtoolkit.recompute.plan import RecomputePlan

__all__ = [
    "BUDGET_KINDS",
    "SOLVER",
    "cheapest_blocks",
    "costs_of_plan",
    "plan_for_budget",
    "predict_peak",
    "solve_plan",
    "solve_recompute",
    "tradeoff_front",
]

SOLVER = "integer linear program (PuLP + CBC)"

#: The front's step: the next plan must peak at least this much lower (smaller gains are noise).
FRONT_STEP_BYTES = 1024


def predict_peak(
    levels: Sequence[int],
    alive: Sequence[frozenset[int]],
    saved: Sequence[int],
    chosen: Collection[int],
    *,
    fixed_bytes: int = 0,
) -> int:
    """The model's peak when the blocks at positions ``chosen`` are checkpointed."""
    return fixed_bytes + max(
        (level - sum(saved[i] for i in a if i in chosen) for level, a in zip(levels, alive, strict=True)),
        default=0,
    )


def solve_plan(
    levels: Sequence[int],
    alive: Sequence[frozenset[int]],
    saved: Sequence[int],
    cost: Sequence[float],
    budget: int,
    *,
    fixed_bytes: int = 0,
) -> set[int] | None:
    """The cheapest set of positions whose predicted peak fits ``budget``, by ILP; None if none fits."""
    import pulp

    room = budget - fixed_bytes  # what the phases' own levels may reach
    demands = [(level - room, a) for level, a in zip(levels, alive, strict=True) if level > room]
    if not demands:
        return set()
    helpful = {i for _, a in demands for i in a if saved[i] > 0}
    for need, a in demands:  # cheap infeasibility check before calling the solver
        if sum(saved[i] for i in a if saved[i] > 0) < need:
            return None
    problem = pulp.LpProblem("nbtoolkit_recompute", pulp.LpMinimize)
    x = {i: problem.add_variable(f"x{i}", cat="Binary") for i in sorted(helpful)}
    # seconds in microseconds and bytes in KiB keep CBC's coefficients well scaled;
    # the tiny per-block term prefers fewer blocks among equally fast plans.
    problem += pulp.lpSum((cost[i] * 1e6 + 1e-3) * x[i] for i in x)
    for k, (need, a) in enumerate(demands):
        problem += (pulp.lpSum(saved[i] / 1024 * x[i] for i in a if i in x) >= need / 1024, f"phase{k}")
    status = problem.solve(_cbc())
    if pulp.LpStatus[status] != "Optimal":
        return None
    chosen = {i for i, var in x.items() if (var.value() or 0) > 0.5}
    # CBC works in floating point: confirm the plan in exact integers, round up if needed.
    while predict_peak(levels, alive, saved, chosen, fixed_bytes=fixed_bytes) > budget:
        rest = list(helpful - chosen)
        if not rest:
            return None
        chosen.add(min(rest, key=lambda i: cost[i] / max(saved[i], 1)))
    return chosen


def _cbc() -> Any:
    """CBC: a system install if there is one, else the binary that ships inside PuLP.

    (PuLP 3 deprecates its PULP_CBC_CMD wrapper in favour of COIN_CMD; pointing COIN_CMD at
    the bundled binary is the same solver without the deprecation warning.)
    """
    import pulp
    from pulp.apis import coin_api

    system = pulp.COIN_CMD(msg=False)
    if system.available():
        return system
    return pulp.COIN_CMD(msg=False, path=coin_api.pulp_cbc_path)


def tradeoff_front(
    levels: Sequence[int],
    alive: Sequence[frozenset[int]],
    saved: Sequence[int],
    cost: Sequence[float],
    *,
    fixed_bytes: int = 0,
    limit: int = 48,
) -> tuple[list[set[int]], bool]:
    """The exact Pareto front: plans from no checkpointing to the lowest peak; True if cut at ``limit``."""
    plans: list[set[int]] = [set()]
    budget = predict_peak(levels, alive, saved, set(), fixed_bytes=fixed_bytes) - FRONT_STEP_BYTES
    truncated = False
    while budget > fixed_bytes:
        if len(plans) >= limit:
            truncated = True
            break
        chosen = solve_plan(levels, alive, saved, cost, budget, fixed_bytes=fixed_bytes)
        if chosen is None:
            break
        plans.append(chosen)
        budget = predict_peak(levels, alive, saved, chosen, fixed_bytes=fixed_bytes) - FRONT_STEP_BYTES
    return plans, truncated


def _arrays(costs: RecomputeCosts) -> tuple[list[int], list[frozenset[int]], list[int], list[float]]:
    return list(costs.phase_bytes), costs.alive_indices, list(costs.saved_bytes), list(costs.recompute_time_s)


def cheapest_blocks(
    costs: RecomputeCosts, budget_bytes: int, *, fixed_bytes: int | None = None
) -> list[str] | None:
    """Names of the cheapest blocks to checkpoint so the predicted peak fits; None if none fits.

    ``fixed_bytes`` None: the costs' own ``fixed_bytes`` (a budget of the device's total).
    """
    levels, alive, saved, cost = _arrays(costs)
    fixed = costs.fixed_bytes if fixed_bytes is None else fixed_bytes
    chosen = solve_plan(levels, alive, saved, cost, budget_bytes, fixed_bytes=fixed)
    return None if chosen is None else [costs.blocks[i] for i in sorted(chosen)]


#: What a plan's budget counts: the device's whole peak, or only what the step allocates.
BUDGET_KINDS = {
    "total": "the device's total peak (parameters, gradients, optimizer state, activations, temporaries)",
    "step": "the step's own peak (what it allocates above what was live before it)",
}


def solve_recompute(
    costs: RecomputeCosts,
    budget_bytes: int | None = None,
    *,
    fixed_bytes: int | None = None,
    budget_kind: str = "total",
) -> RecomputePlan:
    """The cheapest plan whose predicted peak fits ``budget_bytes``, with the whole trade-off front.

    ``budget_bytes`` None: checkpoint nothing (the budget is the baseline peak plus
    ``fixed_bytes``) but still give the front. ``fixed_bytes``: bytes no checkpointing changes,
    added to every predicted peak and counted against the budget; None takes the costs'
    ``fixed_bytes`` when ``budget_kind`` is ``"total"`` and 0 when it is ``"step"``.

    Raises:
        PlanError: no set of blocks reaches the budget; the message gives the lowest reachable
            peak, what of it is fixed, and what would lower that.
    """
    if budget_kind not in BUDGET_KINDS:
        raise ValueError(f"budget_kind must be one of {sorted(BUDGET_KINDS)}, got {budget_kind!r}")
    if fixed_bytes is None:
        fixed_bytes = costs.fixed_bytes if budget_kind == "total" else 0
    levels, alive, saved, cost = _arrays(costs)
    baseline_peak = int(costs.baseline_peak_bytes or 0)
    front, truncated = tradeoff_front(levels, alive, saved, cost, fixed_bytes=fixed_bytes)
    target = fixed_bytes + baseline_peak if budget_bytes is None else int(budget_bytes)
    chosen = _chosen(costs, target, fixed_bytes=fixed_bytes, budget_kind=budget_kind)
    notes = list(costs.notes)
    if truncated:
        notes.append(f"trade-off front cut at {len(front)} plans")
    return _plan(
        costs, front, chosen, budget=target, fixed_bytes=fixed_bytes, notes=notes, budget_kind=budget_kind
    )


def _chosen(costs: RecomputeCosts, target: int, *, fixed_bytes: int, budget_kind: str) -> set[int]:
    """The positions the ILP chooses for ``target``; PlanError (the floor, what no recomputation
    changes, what would lower it) when no set fits. The one choice both ``plan_recompute`` and the
    optimize panel's budget (:func:`plan_for_budget`) make, so they pick the same blocks."""
    levels, alive, saved, cost = _arrays(costs)
    chosen = solve_plan(levels, alive, saved, cost, target, fixed_bytes=fixed_bytes)
    if chosen is None:
        everything = {i for i in range(len(saved)) if saved[i] > 0}
        lowest = predict_peak(levels, alive, saved, everything, fixed_bytes=fixed_bytes)
        baseline = fixed_bytes + int(costs.baseline_peak_bytes or 0)
        raise PlanError(_unreachable(costs, target, lowest, baseline, budget_kind))
    return chosen


def costs_of_plan(plan: RecomputePlan) -> RecomputeCosts:
    """The measured table a plan was solved from, read back from the plan (its candidates and phases)."""
    from nbtoolkit.recompute.costs import RecomputeCosts

    candidates = plan.candidates
    return RecomputeCosts(
        blocks=tuple(str(v) for v in candidates["block"]),
        saved_bytes=tuple(int(v) for v in candidates["saved_bytes"]),
        recompute_time_s=tuple(float(v) for v in candidates["recompute_time_s"]),
        forward_time_s=tuple(float(v) for v in candidates["forward_time_s"]),
        modules=tuple(str(v) for v in candidates["module"]),
        phase_bytes=tuple(int(v) for v in plan.phases["baseline_bytes"]),
        phase_alive=tuple(frozenset(str(b) for b in a) for a in plan.phases["alive"]),
        baseline_peak_bytes=int(plan.baseline_peak_bytes) - int(plan.fixed_bytes),
        baseline_step_time_s=float(plan.baseline_step_time_s),
        notes=tuple(plan.notes),
        fixed_bytes=int(plan.fixed_bytes),
        fixed_by_category=dict(plan.fixed_by_category),
    )


def plan_for_budget(plan: RecomputePlan, budget_bytes: int) -> RecomputePlan:
    """``plan`` re-chosen for another budget (same measurements and front), by the very solver call
    :func:`solve_recompute` makes, so the blocks are the ones ``plan_recompute`` would choose from
    these measurements (before its verification step). No step runs; one ILP solve (milliseconds).

    Raises:
        PlanError: no set of blocks reaches ``budget_bytes`` (the message gives the floor).
    """
    import dataclasses

    costs = costs_of_plan(plan)
    fixed = int(plan.fixed_bytes)
    chosen = _chosen(costs, int(budget_bytes), fixed_bytes=fixed, budget_kind=plan.budget_kind)
    names = list(costs.blocks)
    return dataclasses.replace(
        plan.with_blocks([names[i] for i in sorted(chosen)]), budget_bytes=int(budget_bytes),
        measured_peak_bytes=None,
    )


def _unreachable(costs: RecomputeCosts, target: int, lowest: int, baseline: int, kind: str) -> str:
    """The PlanError text: the lowest reachable peak, what of it is fixed, what would lower it."""
    what = "total peak" if kind == "total" else "step's own peak"
    text = (
        f"no recomputation plan fits a budget of {format_bytes(target)} ({target:,} bytes) for the {what}: "
        f"without recomputation it is {format_bytes(baseline)}, and checkpointing every candidate still "
        f"peaks at {format_bytes(lowest)} ({lowest:,} bytes)."
    )
    parts = costs.fixed_by_category
    if kind == "total" and any(parts.get(k) for k in ("parameter", "optimizer_state", "input")):
        names = {"parameter": "parameters", "optimizer_state": "optimizer state", "input": "inputs"}
        held = ", ".join(
            f"{label} {format_bytes(parts[key])}" for key, label in names.items() if parts.get(key)
        )
        grads = parts.get("gradient", 0)
        text += (
            f" Recomputation cannot lower what the step holds regardless: {held}"
            + (f", and gradients {format_bytes(grads)} made during backward" if grads else "")
            + ". To lower those: shard them across ranks with DeepSpeed ZeRO (stage 1 shards optimizer "
            "state, 2 also gradients, 3 also parameters), train in bf16/fp16 with AMP (smaller "
            "activations and temporaries), or use a smaller batch."
        )
    return text + (
        " Or raise the budget to at least the lowest peak, or name more/smaller blocks with blocks=[...]"
    )


def _plan(
    costs: RecomputeCosts,
    front: list[set[int]],
    chosen: set[int],
    *,
    budget: int,
    fixed_bytes: int,
    notes: list[str],
    budget_kind: str,
) -> RecomputePlan:
    import pandas as pd

    from nbtoolkit.recompute.plan import RecomputePlan

    levels, alive, saved, cost = _arrays(costs)
    low, high = costs.recompute_time_spread_s
    names = list(costs.blocks)
    candidates = pd.DataFrame(
        {
            "block": names,
            "module": list(costs.modules),
            "saved_bytes": [int(s) for s in saved],
            "recompute_time_s": [float(c) for c in cost],
            "recompute_time_p25_s": [float(c) for c in low],
            "recompute_time_p75_s": [float(c) for c in high],
            "forward_time_s": [float(f) for f in costs.forward_time_s],
            "chosen": [i in chosen for i in range(len(names))],
        }
    )
    rows = [
        {
            "predicted_peak_bytes": predict_peak(levels, alive, saved, plan, fixed_bytes=fixed_bytes),
            "predicted_overhead_s": float(sum(cost[i] for i in plan)),
            "predicted_overhead_p25_s": float(sum(low[i] for i in plan)),
            "predicted_overhead_p75_s": float(sum(high[i] for i in plan)),
            "n_blocks": len(plan),
            "blocks": ",".join(names[i] for i in sorted(plan)),
        }
        for plan in front
    ]
    columns = [
        "predicted_peak_bytes", "predicted_overhead_s", "predicted_overhead_p25_s",
        "predicted_overhead_p75_s", "n_blocks", "blocks",
    ]
    tradeoff = pd.DataFrame(rows, columns=columns)
    phases = pd.DataFrame(
        {
            "phase": list(range(len(levels))),
            "baseline_bytes": [int(v) for v in levels],
            "alive": [tuple(names[i] for i in sorted(a)) for a in alive],
        }
    )
    return RecomputePlan(
        blocks=[names[i] for i in sorted(chosen)],
        budget_bytes=int(budget),
        predicted_peak_bytes=predict_peak(levels, alive, saved, chosen, fixed_bytes=fixed_bytes),
        predicted_overhead_s=float(sum(cost[i] for i in chosen)),
        predicted_overhead_p25_s=float(sum(low[i] for i in chosen)),
        predicted_overhead_p75_s=float(sum(high[i] for i in chosen)),
        baseline_peak_bytes=int(fixed_bytes) + int(costs.baseline_peak_bytes or 0),
        baseline_step_time_s=float(costs.baseline_step_time_s),
        candidates=candidates,
        tradeoff=tradeoff,
        phases=phases,
        solver=SOLVER,
        notes=notes,
        fixed_bytes=int(fixed_bytes),
        budget_kind=budget_kind,
        fixed_by_category=dict(costs.fixed_by_category),
    )
