"""plan_recompute on a real model: peak under budget on a sweep, training unchanged, exact solver, errors."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch

from nbtoolkit.core.errors import NbtUsageError, PlanError, StepError
from nbtoolkit.core.units import parse_bytes
from nbtoolkit.recompute.blocks import find_repeated_blocks
from nbtoolkit.recompute.measure import profile_memory_series
from nbtoolkit.recompute.plan import RecomputePlan
from nbtoolkit.recompute.planner import plan_recompute
from nbtoolkit.recompute.solver import predict_peak, solve_plan
from tests.optimize._models import NoRepeats, make_gpt

HIDDEN = [64, 256, 128, 384]


def _untouched(model: torch.nn.Module) -> bool:
    """No instance forward override and no hooks anywhere: the model is as constructed."""
    for module in model.modules():
        if "forward" in module.__dict__:
            return False
        if module._forward_hooks or module._forward_pre_hooks:
            return False
    return True


@pytest.fixture(scope="module")
def planned() -> tuple[Any, Any, RecomputePlan]:
    model, step = make_gpt(hidden=HIDDEN, batch=8)
    return model, step, plan_recompute(model, step, None, steps=1)


def test_finds_the_transformer_blocks() -> None:
    model, _ = make_gpt(hidden=HIDDEN)
    assert find_repeated_blocks(model) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert find_repeated_blocks(NoRepeats()) == []


def test_plan_without_budget_measures_candidates_and_front(planned: Any) -> None:
    model, _, plan = planned
    assert plan.blocks == []
    assert plan.predicted_peak_bytes == plan.baseline_peak_bytes
    assert list(plan.candidates["block"]) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert (plan.candidates["recompute_time_s"] >= 0).all()
    assert (plan.candidates["forward_time_s"] > 0).all()
    # wider MLPs keep more activations: the measured savings follow the hidden sizes of blocks 0-2
    saved = dict(zip(plan.candidates["block"], plan.candidates["saved_bytes"], strict=True))
    assert saved["blocks.1"] > saved["blocks.2"] > saved["blocks.0"] > 0
    front = plan.tradeoff
    assert len(front) >= 3
    # a Pareto front: peaks strictly fall while overhead rises
    assert list(front["predicted_peak_bytes"]) == sorted(front["predicted_peak_bytes"], reverse=True)
    assert front["predicted_overhead_s"].is_monotonic_increasing
    assert plan.min_peak_bytes < plan.baseline_peak_bytes
    assert _untouched(model)


@pytest.mark.slow
def test_budget_sweep_measured_peak_under_budget(planned: Any) -> None:
    model, step, base = planned
    low, high = base.min_peak_bytes, base.baseline_peak_bytes
    budgets = [int(low + (high - low) * f) for f in (0.02, 0.3, 0.6, 0.9)]
    chosen_sizes = []
    for budget in budgets:
        plan = plan_recompute(model, step, budget, steps=1)
        assert plan.predicted_peak_bytes <= budget
        with plan.apply(model):
            series, _, _ = profile_memory_series(step, total=True)
        assert series.total_peak_bytes is not None
        assert series.total_peak_bytes <= budget, (budget, plan.blocks, series.total_peak_bytes)
        assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget
        chosen_sizes.append(len(plan.blocks))
        assert _untouched(model)
    assert chosen_sizes[0] >= 2  # just above the lowest peak: nearly every helpful block is needed


@pytest.mark.slow
def test_loss_unchanged_with_plan_applied() -> None:
    from nbtoolkit.recompute.checkpoint import checkpoint_blocks

    model, step = make_gpt(seed=3, hidden=HIDDEN, dropout=0.1)
    probe = plan_recompute(model, step, None, steps=1)
    best = probe.best_for((probe.min_peak_bytes + probe.baseline_peak_bytes) // 2)
    assert best is not None and best["blocks"]

    def losses(blocks: list[str]) -> list[float]:
        model, step = make_gpt(seed=3, hidden=HIDDEN, dropout=0.1)
        with checkpoint_blocks(model, blocks):
            return [float(step()) for _ in range(4)]

    reference, checkpointed = losses([]), losses(best["blocks"])
    assert checkpointed == pytest.approx(reference, rel=1e-5, abs=1e-6)
    assert reference[-1] < reference[0]  # it did train


def test_undo_restores_the_model_exactly(planned: Any) -> None:
    model, _, plan = planned
    names = list(plan.candidates["block"][:2])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    forwards = [m.forward for m in model.modules()]
    from nbtoolkit.recompute.checkpoint import checkpoint_blocks

    handle = checkpoint_blocks(model, names)
    assert "forward" in model.get_submodule(names[0]).__dict__
    handle.undo()
    handle.undo()  # idempotent
    assert _untouched(model)
    assert [m.forward.__func__ for m in model.modules()] == [f.__func__ for f in forwards]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_ilp_matches_brute_force_on_random_instances() -> None:
    rng = random.Random(7)
    for _ in range(25):
        n = rng.randint(2, 7)
        saved = [rng.randint(0, 5000) for _ in range(n)]
        cost = [rng.uniform(1e-4, 5e-3) for _ in range(n)]
        # phases as a real step has them: forward prefixes then backward prefixes
        alive = [frozenset(range(k)) for k in range(n + 1)] + [frozenset(range(k)) for k in range(n)]
        levels = [rng.randint(10_000, 40_000) for _ in alive]
        budget = rng.randint(5_000, 40_000)
        best = None
        for size in range(n + 1):
            for subset in itertools.combinations(range(n), size):
                if predict_peak(levels, alive, saved, set(subset)) <= budget:
                    c = sum(cost[i] for i in subset)
                    best = c if best is None or c < best else best
        got = solve_plan(levels, alive, saved, cost, budget)
        if best is None:
            assert got is None
        else:
            assert got is not None
            assert predict_peak(levels, alive, saved, got) <= budget
            assert sum(cost[i] for i in got) == pytest.approx(best, rel=1e-6, abs=1e-9)


def test_budget_below_any_plan_is_a_plan_error(planned: Any) -> None:
    model, step, base = planned
    with pytest.raises(PlanError, match=r"no recomputation plan fits a budget of .*at least"):
        plan_recompute(model, step, base.min_peak_bytes // 2, steps=1)
    assert _untouched(model)


def test_no_repeated_blocks_is_a_plan_error() -> None:
    model = NoRepeats()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(PlanError, match="no repeated blocks"):
        plan_recompute(model, step, 10**6)
    assert _untouched(model)


def test_step_that_raises_is_one_usage_error(planned: Any) -> None:
    model, _, _ = planned

    def broken_step() -> None:
        raise RuntimeError("shapes do not match")

    expected = r"'broken_step' raised RuntimeError during the warm-up step: shapes do not match"
    with pytest.raises(StepError, match=expected) as info:
        plan_recompute(model, broken_step, 10**6)
    assert isinstance(info.value.__cause__, RuntimeError) and info.value.step == "broken_step"
    assert _untouched(model)


def test_non_module_and_bad_names(planned: Any) -> None:
    model, step, _ = planned
    with pytest.raises(NbtUsageError, match=r"must be a torch\.nn\.Module, got dict"):
        plan_recompute({"w": 1}, step, 10**6)
    with pytest.raises(NbtUsageError, match="must be a zero-argument callable"):
        plan_recompute(model, 3, 10**6)
    with pytest.raises(NbtUsageError, match=r"no submodule named 'blocks\.9'"):
        plan_recompute(model, step, 10**6, blocks=["blocks.9"])
    with pytest.raises(NbtUsageError, match="cannot read budget 'lots'"):
        plan_recompute(model, step, "lots")
    assert _untouched(model)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1500", 1500), ("1.5GB", 1_500_000_000), ("1.5 gb", 1_500_000_000), ("512MiB", 512 * 2**20),
     ("2e3 kB", 2_000_000), (2048, 2048), (1.5e9, 1_500_000_000), ("64 KiB", 65536)],
)
def test_parse_bytes(text: Any, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "GB", "1.5 GBB", "-3MB", "1,5GB", "0", True, None, "nan"])
def test_parse_bytes_rejects_garbage(bad: Any) -> None:
    with pytest.raises(NbtUsageError):
        parse_bytes(bad)


def test_plan_display_and_save_load(planned: Any, tmp_path: Any) -> None:
    _, _, plan = planned
    text = repr(plan)
    assert "RecomputePlan: checkpoint 0 of 4 blocks" in text and "MiB" in text
    loaded = RecomputePlan.load(plan.save(tmp_path / "plan.json"))
    assert loaded.predict_peak(["blocks.1"]) == plan.predict_peak(["blocks.1"])
    best = plan.best_for(plan.min_peak_bytes)
    assert best is not None and loaded.best_for(plan.min_peak_bytes) == best
    assert plan.best_for(plan.min_peak_bytes - 1) is None
    evil = RecomputePlan.load(tmp_path / "plan.json")
    evil.candidates.loc[0, "block"] = "<script>alert(1)</script>"
    evil.blocks = ["<script>alert(1)</script>"]
    html = evil._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
