"""The planner's time costs: identical blocks costed alike (also on a loaded machine), with a spread
the plan shows; the statistics and the pooling rule on their own."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.recompute import recompute_timing
from nbtoolkit.recompute.blocks import candidate_blocks
from nbtoolkit.recompute.costs import RecomputeCosts
from nbtoolkit.recompute.plan import RecomputePlan
from nbtoolkit.recompute.planner import plan_recompute
from nbtoolkit.recompute.recompute_timing import (
    Rounds,
    Stopwatch,
    block_costs,
    identical_groups,
    quantile,
    time_recompute,
)
from nbtoolkit.recompute.solver import solve_recompute
from tests.optimize._models import make_gpt

#: Identical blocks' costs, each measured on its own: the largest at most this many times the smallest.
TOLERANCE = 1.5
SIX = [128] * 6


def _timed_costs(model: nn.Module, step: Callable[[], Any], *, pool: bool, limit_s: float) -> list[float]:
    """Each candidate's cost from the planner's timing rounds (memory is not measured here)."""
    candidates = candidate_blocks(model, None)
    step()  # warm-up: optimizer state
    rounds = time_recompute(
        candidates, step, Stopwatch(None), forward_marks=lambda _: [None] * len(candidates.blocks),
        steps=3, time_limit_s=limit_s, tick=lambda _: None,
    )
    blocks = list(candidates.blocks.values())
    return block_costs(rounds, identical_groups(blocks, [None] * len(blocks)), pool=pool).cost_s


@pytest.fixture
def busy_thread() -> Iterator[Callable[[float], None]]:
    """``load(seconds)``: a thread multiplies matrices for that long (torch lets go of the GIL
    meanwhile, so it takes a core), as another job on the machine would."""
    stop = threading.Event()

    def spin() -> None:
        a = torch.randn(256, 256)
        while not stop.is_set():
            a @ a

    thread = threading.Thread(target=spin, daemon=True)
    timer = threading.Timer(0.0, stop.set)

    def load(seconds: float) -> None:
        nonlocal timer
        thread.start()
        timer = threading.Timer(seconds, stop.set)
        timer.start()

    yield load
    timer.cancel()
    stop.set()
    if thread.is_alive():
        thread.join()


def test_identical_blocks_cost_alike_while_a_busy_thread_loads_part_of_the_measurement(
    busy_thread: Callable[[float], None],
) -> None:
    model, step = make_gpt(hidden=SIX, batch=8)
    busy_thread(1.0)  # about the first half of the timing rounds
    costs = _timed_costs(model, step, pool=False, limit_s=2.0)
    assert min(costs) > 0
    assert max(costs) / min(costs) <= TOLERANCE, [f"{c * 1e3:.3f} ms" for c in costs]


def test_identical_timm_vit_blocks_cost_alike() -> None:
    try:
        from timm.models.vision_transformer import VisionTransformer
    except Exception as exc:  # a broken torchvision makes it a RuntimeError
        pytest.skip(f"timm is not importable here ({type(exc).__name__}: {exc})")
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=4, num_heads=2, num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()

    assert candidate_blocks(model, None).names == [f"blocks.{i}" for i in range(4)]
    costs = _timed_costs(model, step, pool=False, limit_s=2.0)
    assert min(costs) > 0
    assert max(costs) / min(costs) <= TOLERANCE, [f"{c * 1e3:.3f} ms" for c in costs]


@pytest.fixture(scope="module")
def four_blocks_plan() -> RecomputePlan:
    model, step = make_gpt(hidden=[128] * 4, batch=8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recompute_timing, "TIME_LIMIT_S", 2.0)  # module scope: conftest's cap is per test
        plan = plan_recompute(model, step, None, steps=3, verify=False)
    return plan.with_blocks(["blocks.0", "blocks.2", "blocks.3"])


def test_plan_pools_identical_blocks_and_shows_each_cost_with_its_spread(
    four_blocks_plan: RecomputePlan,
) -> None:
    plan = four_blocks_plan
    table = plan.candidates
    # pooled: one cost and one spread for the four identical blocks, which holds more than one value
    assert table["recompute_time_s"].nunique() == 1 and table["recompute_time_s"].iloc[0] > 0
    assert (table["recompute_time_p25_s"] <= table["recompute_time_s"]).all()
    assert (table["recompute_time_s"] <= table["recompute_time_p75_s"]).all()
    assert (table["recompute_time_p75_s"] > table["recompute_time_p25_s"]).all()
    assert any("4 identical Block blocks" in note for note in plan.notes)
    assert any("overhead factor" in note for note in plan.notes)
    # the plan's prediction carries the chosen blocks' spread
    assert plan.predicted_overhead_s == pytest.approx(3 * table["recompute_time_s"].iloc[0])
    assert plan.predicted_overhead_p25_s == pytest.approx(3 * table["recompute_time_p25_s"].iloc[0])
    assert plan.predicted_overhead_p75_s == pytest.approx(3 * table["recompute_time_p75_s"].iloc[0])
    text = repr(plan)
    assert f"per step predicted (p25-p75 {_range_text(plan)}" in text
    assert "(cost: median, p25-p75)" in text
    html = plan._repr_html_()
    assert "<th>p25-p75</th>" in html and _range_text(plan) in html


def _range_text(plan: RecomputePlan) -> str:
    from nbtoolkit.recompute.plan import _range

    assert plan.predicted_overhead_p25_s is not None and plan.predicted_overhead_p75_s is not None
    return _range(plan.predicted_overhead_p25_s, plan.predicted_overhead_p75_s)


def test_saved_plan_keeps_the_spread(four_blocks_plan: RecomputePlan, tmp_path: Any) -> None:
    loaded = RecomputePlan.load(four_blocks_plan.save(tmp_path / "plan.json"))
    assert loaded.predicted_overhead_p25_s == pytest.approx(four_blocks_plan.predicted_overhead_p25_s)
    one = ["blocks.1"]
    assert loaded.predict_overhead_spread(one) == four_blocks_plan.predict_overhead_spread(one)


def test_several_ranks_run_exactly_the_rounds_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # ranks pair their steps up in collectives: one that went on alone would wait forever
    monkeypatch.setattr(recompute_timing, "_several_ranks", lambda: True)
    model, step = make_gpt(hidden=[64] * 2, batch=2, seq=8)
    candidates = candidate_blocks(model, None)
    ticks: list[str] = []
    rounds = time_recompute(
        candidates, step, Stopwatch(None), forward_marks=lambda _: [None, None], steps=2,
        time_limit_s=60.0, tick=ticks.append,
    )
    assert rounds.lockstep and len(rounds.plain_s) == len(rounds.checkpointed_s) == 2
    assert len(ticks) == 4 and all(all(r > 0 for r in row) for row in rounds.reruns)


K = 1024


def _costs(low: list[float], cost: list[float], high: list[float]) -> RecomputeCosts:
    return RecomputeCosts(
        blocks=["a", "b"], saved_bytes=[300 * K, 200 * K], recompute_time_s=cost,
        recompute_time_p25_s=low, recompute_time_p75_s=high,
        phase_bytes=[1000 * K, 600 * K], phase_alive=[{"a", "b"}, set()],
    )


def test_a_wide_spread_makes_the_prediction_uncertain() -> None:
    steady = solve_recompute(_costs([0.9e-3, 1.9e-3], [1e-3, 2e-3], [1.1e-3, 2.1e-3]), 750 * K)
    assert steady.blocks == ["a"] and not steady.overhead_uncertain
    assert "uncertain" not in repr(steady)
    shaky = solve_recompute(_costs([0.2e-3, 1.9e-3], [1e-3, 2e-3], [2.5e-3, 2.1e-3]), 750 * K)
    assert shaky.overhead_uncertain
    assert "p25-p75 200 µs-2.5 ms; uncertain: the spread is 2.3x the cost" in repr(shaky)
    # choosing other blocks recomputes the spread, and with it the verdict
    both = shaky.with_blocks(["a", "b"])
    assert (both.predicted_overhead_p25_s, both.predicted_overhead_p75_s) == pytest.approx((2.1e-3, 4.6e-3))
    assert both.overhead_uncertain  # 2.5 ms of spread on 3 ms
    assert not shaky.with_blocks(["b"]).overhead_uncertain


def test_costs_refuse_a_cost_outside_its_quartiles() -> None:
    with pytest.raises(NbtUsageError, match=r"recompute_time_s of \['b'\] is outside"):
        _costs([1e-3, 3e-3], [1e-3, 2e-3], [1e-3, 4e-3])
    with pytest.raises(NbtUsageError, match="recompute_time_p75_s has 0 entries for 2 blocks"):
        RecomputeCosts(blocks=["a", "b"], saved_bytes=[1, 1], recompute_time_s=[1.0, 1.0],
                       recompute_time_p25_s=[1.0, 1.0], phase_bytes=[2], phase_alive=[{"a"}])


def test_block_costs_scale_reruns_by_each_rounds_overhead_factor() -> None:
    # round k: plain step, step with both checkpointed, re-run times of the two blocks
    rounds = Rounds(
        reruns=[[1.0, 3.0], [1.0, 3.0], [2.0, 2.0]],
        plain_s=[10.0, 10.0, 10.0],
        checkpointed_s=[14.0, 18.0, 14.0],  # factors 1.0, 2.0, 1.0
        forward_s=[[], []],
    )
    alone = block_costs(rounds, [[0], [1]])
    assert alone.factor == pytest.approx((1.0, 1.0, 1.5))
    assert alone.cost_s == pytest.approx([2.0, 3.0])  # medians of [1, 2, 2] and [3, 6, 2]
    assert alone.p25_s == pytest.approx([1.5, 2.5]) and alone.p75_s == pytest.approx([2.0, 4.5])
    pooled = block_costs(rounds, [[0, 1]])
    assert pooled.cost_s == pytest.approx([2.0, 2.0])  # median of 1, 3, 2, 6, 2, 2
    assert pooled.groups == [[0, 1]]
    # a step that got faster with checkpointing costs nothing, never less
    faster = Rounds(reruns=[[1.0]] * 3, plain_s=[10.0] * 3, checkpointed_s=[9.0] * 3, forward_s=[[]])
    assert block_costs(faster, [[0]]).cost_s == [0.0]


def test_identical_means_same_class_shapes_and_inputs() -> None:
    blocks = [nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 8), nn.Conv1d(4, 4, 1), nn.Linear(4, 4)]
    same = ("tensor", (2, 4))
    inputs = [same, same, same, same, ("tensor", (2, 16))]
    assert identical_groups(blocks, inputs) == [[0, 1], [2], [3], [4]]


def test_quantile_interpolates() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert [quantile(values, q) for q in (0.0, 0.25, 0.5, 1.0)] == pytest.approx([1.0, 1.75, 2.5, 4.0])
    assert quantile([5.0], 0.75) == 5.0
    assert statistics.median(values) == quantile(values, 0.5)
