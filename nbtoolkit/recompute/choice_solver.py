"""The per-block choice solver: each block is kept, selectively recomputed, fully recomputed (or
offloaded), whichever set of choices is fastest with its predicted peak under the budget.

Pure (numbers in, choices out), so tests write the table by hand. The memory model is the one
measured under a compiler (``nbtoolkit.recompute.compiled_planner``): a compiled step is one
graph whose inside no hook can see, so there are no phases to measure; the peak with a set of
choices is predicted as

    peak = baseline_peak - sum over blocks i of saved[i][choice_i]

(for a stack of blocks the peak is where every block's activations are alive, the end of the
forward, so the savings add up there; the planner verifies the chosen plan by measuring it and
re-plans with a tighter budget when the measured peak is over).

Exact: a multiple-choice knapsack as an integer linear program (PuLP + CBC, as
``nbtoolkit.recompute.solver``): binaries ``y[i][c]``, ``sum_c y[i][c] = 1`` per block, minimise
``sum cost[i][c] y[i][c]`` subject to ``sum saved[i][c] y[i][c] >= baseline_peak - budget``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["choice_front", "predict_choice_peak", "solve_choices"]

#: Per block: choice -> bytes it saves (baseline minus peak with only that block so chosen).
Table = Sequence[Mapping[str, float]]


def predict_choice_peak(baseline_peak: int, saved: Table, choices: Sequence[str]) -> int:
    """The additive model's peak for one choice per block (``keep`` saves nothing)."""
    return int(baseline_peak - sum(saved[i].get(c, 0) for i, c in enumerate(choices)))


def solve_choices(
    baseline_peak: int, saved: Table, cost: Table, budget: int
) -> list[str] | None:
    """The cheapest choice per block whose predicted peak fits ``budget``; None if none fits.

    ``saved[i]`` and ``cost[i]`` map the choices offered for block ``i`` (``keep`` is always
    offered, saving and costing nothing) to bytes saved and seconds added."""
    import pulp

    from nbtoolkit.recompute.solver import _cbc

    n = len(saved)
    need = baseline_peak - budget
    if need <= 0:
        return ["keep"] * n
    offered = [["keep", *(c for c in saved[i] if c != "keep")] for i in range(n)]
    best = sum(max(0, *(saved[i].get(c, 0) for c in offered[i])) for i in range(n))
    if best < need:
        return None
    problem = pulp.LpProblem("nbtoolkit_choices", pulp.LpMinimize)
    y = {
        (i, c): problem.add_variable(f"y{i}_{k}", cat="Binary")
        for i in range(n) for k, c in enumerate(offered[i])
    }
    # microseconds and KiB keep CBC's coefficients well scaled; the tiny term per changed block
    # prefers touching fewer blocks among equally fast plans
    problem += pulp.lpSum(
        (max(0.0, cost[i].get(c, 0.0)) * 1e6 + (1e-3 if c != "keep" else 0.0)) * y[i, c] for i, c in y
    )
    for i in range(n):
        problem += (pulp.lpSum(y[i, c] for c in offered[i]) == 1, f"one_choice_{i}")
    problem += (pulp.lpSum(saved[i].get(c, 0) / 1024 * y[i, c] for i, c in y) >= need / 1024, "budget")
    status = problem.solve(_cbc())
    if pulp.LpStatus[status] != "Optimal":
        return None
    choices = [next((c for c in offered[i] if (y[i, c].value() or 0) > 0.5), "keep") for i in range(n)]
    # CBC works in floating point: confirm in exact integers, moving the block whose most saving
    # choice gains the most per second up to that choice until it fits
    while predict_choice_peak(baseline_peak, saved, choices) > budget:
        gains = [
            (saved[i].get(c, 0) - saved[i].get(choices[i], 0), i, c)
            for i in range(n) for c in offered[i]
            if saved[i].get(c, 0) > saved[i].get(choices[i], 0)
        ]
        if not gains:
            return None
        _, i, c = max(gains)
        choices[i] = c
    return choices


def choice_front(
    baseline_peak: int, saved: Table, cost: Table, *, step_bytes: int = 1024, limit: int = 48
) -> list[list[str]]:
    """The exact Pareto front of choices, from keeping everything to the lowest predicted peak."""
    n = len(saved)
    front = [["keep"] * n]
    budget = baseline_peak - step_bytes
    while len(front) < limit:
        choices = solve_choices(baseline_peak, saved, cost, budget)
        if choices is None:
            break
        front.append(choices)
        budget = predict_choice_peak(baseline_peak, saved, choices) - step_bytes
    return front
