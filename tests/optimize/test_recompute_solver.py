"""The recompute solver on hand-made costs: no torch run, every expected number worked out by hand.

Three blocks a, b, c (K = 1 KiB). Checkpointing saves a: 300K, b: 200K, c: 100K and costs
a: 0.30 s, b: 0.10 s, c: 0.05 s. The step's phases (level, blocks alive):

    1000K {a, b, c}   end of the forward: everything alive
     900K {a, b}      backward of c done
     700K {a}         backward of b done
     400K {}          optimizer step

peak(S) = max over phases of (level - savings of the blocks of S alive there).
"""

from __future__ import annotations

import dataclasses

import pytest

from nbtoolkit.core.errors import NbtUsageError, PlanError
from nbtoolkit.core.units import format_bytes
from nbtoolkit.recompute.costs import RecomputeCosts
from nbtoolkit.recompute.solver import cheapest_blocks, predict_peak, solve_recompute

K = 1024


def _costs() -> RecomputeCosts:
    return RecomputeCosts(
        blocks=["a", "b", "c"],
        saved_bytes=[300 * K, 200 * K, 100 * K],
        recompute_time_s=[0.30, 0.10, 0.05],
        phase_bytes=[1000 * K, 900 * K, 700 * K, 400 * K],
        phase_alive=[{"a", "b", "c"}, {"a", "b"}, {"a"}, set()],
        baseline_step_time_s=2.0,
    )


@pytest.mark.parametrize(
    ("budget_k", "blocks", "peak_k", "overhead_s"),
    [
        # nothing needed: the baseline peak fits
        (1000, [], 1000, 0.0),
        # b alone: 1000-200 = 800, 900-200 = 700, 700, 400 -> 800; c alone leaves 900 (too high), a costs more
        (800, ["b"], 800, 0.10),
        # 700 in the third phase needs a (only a is alive there); then the first phase needs 50K more:
        # c (0.05 s) is cheaper than b (0.10 s): 1000-400 = 600, 900-300 = 600, 700-300 = 400
        (650, ["a", "c"], 600, 0.35),
        # everything: 1000-600, 900-500, 700-300, 400 -> 400, the lowest reachable peak
        (400, ["a", "b", "c"], 400, 0.45),
    ],
)
def test_cheapest_plan_for_a_budget(budget_k: int, blocks: list[str], peak_k: int, overhead_s: float) -> None:
    plan = solve_recompute(_costs(), budget_k * K)
    assert plan.blocks == blocks
    assert plan.predicted_peak_bytes == peak_k * K
    assert plan.predicted_overhead_s == pytest.approx(overhead_s)
    assert plan.budget_bytes == budget_k * K
    assert plan.baseline_peak_bytes == 1000 * K
    assert plan.baseline_step_time_s == 2.0
    assert list(plan.candidates["chosen"]) == [b in blocks for b in ("a", "b", "c")]
    assert plan.measured_peak_bytes is None  # the solver runs nothing
    # the plan's own model agrees with the solver's
    assert plan.predict_peak(blocks) == plan.predicted_peak_bytes


def test_tradeoff_front_is_every_pareto_optimal_plan() -> None:
    plan = solve_recompute(_costs())
    front = plan.tradeoff
    # worked out by lowering the budget 1 KiB below each plan's peak in turn
    assert list(front["blocks"]) == ["", "c", "b", "b,c", "a,c", "a,b", "a,b,c"]
    assert list(front["predicted_peak_bytes"]) == [k * K for k in (1000, 900, 800, 700, 600, 500, 400)]
    assert list(front["predicted_overhead_s"]) == pytest.approx([0.0, 0.05, 0.10, 0.15, 0.35, 0.40, 0.45])
    assert plan.min_peak_bytes == 400 * K
    # no budget: nothing chosen, the budget is the baseline peak
    assert plan.blocks == [] and plan.budget_bytes == 1000 * K
    assert plan.best_for(650 * K) == {"blocks": ["a", "c"], "predicted_peak_bytes": 600 * K,
                                      "predicted_overhead_s": pytest.approx(0.35)}


def test_no_plan_fits_names_the_lowest_reachable_peak() -> None:
    with pytest.raises(PlanError) as caught:
        solve_recompute(_costs(), 400 * K - 1)
    message = str(caught.value)
    assert f"({400 * K - 1:,} bytes)" in message
    assert f"still peaks at {format_bytes(400 * K)} ({400 * K:,} bytes)" in message
    assert f"without recomputation it is {format_bytes(1000 * K)}" in message
    assert cheapest_blocks(_costs(), 400 * K - 1) is None


def test_fixed_bytes_count_against_the_budget() -> None:
    fixed = 100 * K
    # 900K of budget with 100K fixed leaves 800K for the step: the same choice as a budget of 800K
    plan = solve_recompute(_costs(), 900 * K, fixed_bytes=fixed)
    assert plan.blocks == ["b"]
    assert plan.predicted_peak_bytes == 900 * K
    assert plan.fixed_bytes == fixed
    assert plan.baseline_peak_bytes == 1100 * K
    assert plan.min_peak_bytes == 500 * K
    assert plan.predict_peak(["a", "b", "c"]) == 500 * K
    with pytest.raises(PlanError, match=f"still peaks at {format_bytes(500 * K)} \\({500 * K:,} bytes\\)"):
        solve_recompute(_costs(), 450 * K, fixed_bytes=fixed)


def test_with_blocks_recomputes_the_predictions() -> None:
    plan = solve_recompute(_costs(), 800 * K)
    other = plan.with_blocks(["c", "a"])
    assert other.blocks == ["a", "c"]  # model order
    assert other.predicted_peak_bytes == 600 * K
    assert other.predicted_overhead_s == pytest.approx(0.35)
    assert list(other.candidates["chosen"]) == [True, False, True]
    assert plan.blocks == ["b"]  # the original is unchanged
    with pytest.raises(NbtUsageError, match="not candidates of this plan"):
        plan.with_blocks(["z"])


def test_blocks_alive_in_no_phase_over_budget_are_never_chosen() -> None:
    # the only phase over budget has just b alive: a's large saving does not help there
    costs = RecomputeCosts(
        blocks=["a", "b"], saved_bytes=[500 * K, 50 * K], recompute_time_s=[0.0, 1.0],
        phase_bytes=[600 * K, 500 * K], phase_alive=[{"b"}, {"a", "b"}],
    )
    plan = solve_recompute(costs, 560 * K)
    assert plan.blocks == ["b"]
    assert plan.predicted_peak_bytes == 550 * K
    alive = [frozenset({1}), frozenset({0, 1})]
    assert predict_peak([600 * K, 500 * K], alive, [500 * K, 50 * K], {0}) == 600 * K  # a alone: no help


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"saved_bytes": [1, 2]}, "saved_bytes has 2 entries for 3 blocks"),
        ({"recompute_time_s": [0.1, -0.2, 0.3]}, "recompute_time_s must hold numbers >= 0"),
        ({"phase_alive": [{"a"}, {"z"}, set(), set()]}, r"phase_alive names \['z'\]"),
        ({"phase_alive": [{"a"}]}, "phase_alive has 1 entries for 4 phases"),
        ({"blocks": ["a", "a", "c"]}, "a block is named twice"),
        ({"saved_bytes": [1, float("nan"), 3]}, "saved_bytes must hold numbers >= 0"),
    ],
)
def test_costs_reject_inconsistent_tables(change: dict[str, object], match: str) -> None:
    fields = {
        "blocks": ["a", "b", "c"],
        "saved_bytes": [300, 200, 100],
        "recompute_time_s": [0.3, 0.1, 0.05],
        "phase_bytes": [1000, 900, 700, 400],
        "phase_alive": [{"a", "b", "c"}, {"a", "b"}, {"a"}, set()],
    }
    fields.update(change)
    with pytest.raises(NbtUsageError, match=match):
        RecomputeCosts(**fields)  # type: ignore[arg-type]


def test_costs_defaults_fill_from_the_phases() -> None:
    costs = _costs()
    assert costs.baseline_peak_bytes == 1000 * K
    assert costs.forward_time_s == (0.0, 0.0, 0.0)
    assert costs.modules == ("", "", "")
    assert costs.alive_indices == [frozenset({0, 1, 2}), frozenset({0, 1}), frozenset({0}), frozenset()]


def test_the_unreachable_message_says_what_is_fixed_and_what_lowers_it() -> None:
    costs = dataclasses.replace(
        _costs(), fixed_bytes=50 * K,
        fixed_by_category={"parameter": 20 * K, "optimizer_state": 30 * K, "gradient": 20 * K},
    )
    with pytest.raises(PlanError) as caught:
        solve_recompute(costs, 440 * K)  # lowest reachable: 400K + 50K fixed
    message = str(caught.value)
    assert f"still peaks at {format_bytes(450 * K)}" in message
    assert f"parameters {format_bytes(20 * K)}, optimizer state {format_bytes(30 * K)}" in message
    assert f"gradients {format_bytes(20 * K)}" in message
    assert "ZeRO" in message and "AMP" in message and "smaller batch" in message
    # a budget of the step's own memory leaves the fixed bytes out: 440K fits with a and b
    step_plan = solve_recompute(costs, 440 * K, budget_kind="step")
    assert step_plan.fixed_bytes == 0 and step_plan.budget_kind == "step"
    assert step_plan.predicted_peak_bytes <= 440 * K
    total_plan = solve_recompute(costs, 800 * K)
    assert total_plan.fixed_bytes == 50 * K and total_plan.budget_kind == "total"
    assert total_plan.predicted_peak_bytes == 50 * K + 700 * K  # b,c: the 800K-50K room needs 250K saved


def test_worst_of_keeps_every_rank_under_the_budget() -> None:
    rank0 = _costs()
    # rank 1 holds 100K more outside the step (say, an unevenly sharded parameter) and saves less on a
    rank1 = dataclasses.replace(
        _costs(), saved_bytes=[250 * K, 200 * K, 100 * K], recompute_time_s=[0.30, 0.20, 0.05],
        fixed_bytes=100 * K,
    )
    merged = RecomputeCosts.worst_of([rank0, rank1])
    assert merged.saved_bytes == (250 * K, 200 * K, 100 * K)
    assert merged.recompute_time_s == (0.30, 0.20, 0.05)
    assert merged.fixed_bytes == 0 and merged.baseline_peak_bytes == 1100 * K
    plan = solve_recompute(merged, 800 * K)
    chosen = set(plan.blocks)
    for costs in (rank0, rank1):  # the one plan fits on each rank by that rank's own model
        levels, alive, saved = list(costs.phase_bytes), costs.alive_indices, list(costs.saved_bytes)
        positions = {costs.blocks.index(b) for b in chosen}
        assert predict_peak(levels, alive, saved, positions, fixed_bytes=costs.fixed_bytes) <= 800 * K
    with pytest.raises(NbtUsageError, match="ranks measured different blocks"):
        RecomputeCosts.worst_of([rank0, dataclasses.replace(rank0, blocks=["x", "b", "c"],
                                                            phase_alive=[{"x"}, set(), set(), set()])])
