"""nbt.optimize: before/after measurement with recompute, compile and AMP; env switch; undo."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError, PlanError, StepError
from nbtoolkit.recompute.optimize import optimize
from tests.optimize._models import make_gpt

HIDDEN = [64, 256, 128, 384]


def _untouched(model: torch.nn.Module) -> bool:
    return all(
        "forward" not in m.__dict__ and not m._forward_hooks and not m._forward_pre_hooks
        for m in model.modules()
    )


@pytest.fixture(scope="module", autouse=True)
def _torch_compile_initialised() -> None:
    # torch's first torch.compile in a process installs its own LazyTraceHandler on the
    # torch.__trace logger (a one-time init, not something nbtoolkit leaves behind); do it
    # before the per-test "no handler left" check takes its snapshot.
    torch.compile(lambda x: x + 1, backend="eager")(torch.zeros(1))


@pytest.fixture(scope="module")
def budget() -> int:
    model, step = make_gpt(hidden=HIDDEN)
    plan = nbt.plan_recompute(model, step, None, steps=1)
    return (plan.min_peak_bytes + plan.baseline_peak_bytes) // 2


@pytest.mark.slow
def test_optimize_recompute_auto_meets_budget_and_restores(budget: int) -> None:
    model, step = make_gpt(hidden=HIDDEN)
    seen: list[tuple[int, int]] = []
    cmp = optimize(model, step, recompute="auto", budget_bytes=budget, steps=2,
                   progress=lambda d, t, w: seen.append((d, t)), config=nbt.MeasureConfig(warmup=1))
    assert cmp.plan is not None and cmp.plan.blocks
    # the budget is of the device's total peak (parameters and optimizer state count)
    assert cmp.after.total_peak_bytes is not None and cmp.before.total_peak_bytes is not None
    assert cmp.after.total_peak_bytes <= budget < cmp.before.total_peak_bytes
    assert cmp.after.total_peak_bytes > cmp.after.peak_bytes  # the step's own peak leaves them out
    assert cmp.after.config["recompute"] == cmp.plan.blocks
    assert cmp.before.peak_by_category  # torch's categories were measured
    assert "ACTIVATION" in cmp.before.peak_by_category
    assert _untouched(model) and cmp.applied is None
    assert seen and seen[-1][0] == seen[-1][1]  # progress reached the end
    assert all(d <= t for d, t in seen)
    table = cmp.table().set_index("metric")
    assert table.loc["peak memory", "change"].endswith("×")
    assert "checkpoint" in repr(cmp)


@pytest.mark.slow
def test_a_plan_is_applied_as_planned_without_planning_again(budget: int) -> None:
    """optimize(recompute=plan) applies the plan shown (recompute="auto" plans afresh from newly
    timed costs and may pick another set within noise): no planning run, the plan's blocks applied,
    its budget the one "peak under budget" reads; a plan of another model is refused first."""
    model, step = make_gpt(hidden=HIDDEN)
    plan = nbt.plan_recompute(model, step, budget, steps=1)
    assert plan.blocks
    seen: list[tuple[int, int, str]] = []
    cmp = optimize(model, step, recompute=plan, steps=2, config=nbt.MeasureConfig(warmup=1),
                   progress=lambda d, t, w: seen.append((d, t, w)))
    assert cmp.plan is plan and cmp.after.config["recompute"] == list(plan.blocks)
    assert not any("planning" in w for _, _, w in seen)
    assert cmp.after.total_peak_bytes is not None and cmp.after.total_peak_bytes <= budget
    assert f"checkpoint {len(plan.blocks)} block(s): {', '.join(plan.blocks)}" in repr(cmp)
    assert _untouched(model)
    # measured in eager mode, applied under torch.compile: said, since the partitioner decides again
    compiled = optimize(model, step, recompute=plan, compile=True, steps=1,
                        config=nbt.MeasureConfig(warmup=1, memory=False, metrics=False))
    assert any("measured under eager" in n for n in compiled.notes)
    smaller, smaller_step = make_gpt(hidden=HIDDEN[:1])  # one block: the plan's others are not in it
    missing = sorted(set(plan.blocks) - {name for name, _ in smaller.named_modules()})
    assert missing
    with pytest.raises(NbtUsageError, match=missing[0].replace(".", r"\.")):
        optimize(smaller, smaller_step, recompute=plan, steps=1)
    assert _untouched(smaller)


def test_env_switch_picks_the_plan(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    monkeypatch.setenv("NBTOOLKIT_RECOMPUTE", "auto")
    monkeypatch.setenv("NBTOOLKIT_MEMORY_BUDGET", f"{budget / 2**20:.4f}MiB")
    model, step = make_gpt(hidden=HIDDEN)
    cmp = optimize(model, step, steps=1, config=nbt.MeasureConfig(warmup=0, categories=False))
    assert cmp.plan is not None and cmp.plan.blocks
    assert cmp.after.total_peak_bytes is not None and cmp.after.total_peak_bytes <= budget
    assert _untouched(model)


@pytest.mark.parametrize(("name", "value", "match"), [
    ("NBTOOLKIT_MEMORY_BUDGET", "a lot", "cannot read NBTOOLKIT_MEMORY_BUDGET 'a lot'"),
    ("NBTOOLKIT_RECOMPUTE", "maybe", "NBTOOLKIT_RECOMPUTE='maybe' is not understood"),
])
def test_env_garbage_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, match: str
) -> None:
    monkeypatch.setenv("NBTOOLKIT_RECOMPUTE", "auto")
    monkeypatch.setenv("NBTOOLKIT_MEMORY_BUDGET", "1GB")
    monkeypatch.setenv(name, value)
    model, step = make_gpt(hidden=HIDDEN)
    with pytest.raises(NbtUsageError, match=match):
        optimize(model, step)
    assert _untouched(model)


def test_compile_reports_graphs_and_is_undone() -> None:
    model, step = make_gpt(hidden=[64, 64])
    cmp = optimize(model, step, compile={"backend": "aot_eager"}, recompute=["blocks.1"], steps=2,
        config=nbt.MeasureConfig(warmup=1, categories=False))
    assert cmp.after.graph_count is not None and cmp.after.graph_count >= 1
    assert cmp.after.compile_time_s is not None and cmp.after.compile_time_s >= 0
    assert cmp.before.graph_count is None
    assert any(c.startswith("torch.compile(backend='aot_eager')") for c in cmp.changes)
    assert cmp.changes[0] == "checkpoint 1 block(s): blocks.1"
    assert _untouched(model)


def test_amp_bf16_keep_changes_then_undo() -> None:
    model, step = make_gpt(hidden=[64, 64])
    cmp = optimize(model, step, amp="bf16", steps=1, undo=False,
        config=nbt.MeasureConfig(warmup=1, categories=False))
    try:
        assert "forward" in model.__dict__
        assert cmp.applied is not None
        with torch.no_grad():
            out = model(torch.zeros(1, 4, dtype=torch.long))
        assert out.dtype == torch.bfloat16
    finally:
        cmp.applied.undo()
    assert _untouched(model)
    assert cmp.after.final_loss is not None


def test_bad_input_leaves_model_as_it_was(budget: int) -> None:
    model, step = make_gpt(hidden=HIDDEN)
    with pytest.raises(NbtUsageError, match="needs a memory budget"):
        optimize(model, step, recompute="auto")
    with pytest.raises(NbtUsageError, match="amp must be"):
        optimize(model, step, amp="fp8")
    with pytest.raises(NbtUsageError, match="compile mode"):
        optimize(model, step, compile={"mode": "fastest"})
    with pytest.raises(NbtUsageError, match="no submodule"):
        optimize(model, step, recompute=["nope"])
    with pytest.raises(NbtUsageError, match="must be a torch"):
        optimize(step, step)
    with pytest.raises(PlanError, match="no recomputation plan fits"):
        optimize(model, step, recompute="auto", budget_bytes=1000, steps=1,
            config=nbt.MeasureConfig(warmup=0, categories=False))
    assert _untouched(model)

    calls = {"n": 0}

    def flaky() -> Any:
        calls["n"] += 1
        if calls["n"] > 2:  # fails once the "after" measurement starts
            raise ValueError("boom")
        return step()

    expected = "the step 'flaky' raised ValueError during the (timed|profiled) step.*: boom"
    with pytest.raises(StepError, match=expected) as info:
        optimize(model, flaky, recompute=["blocks.0"], steps=1,
            config=nbt.MeasureConfig(warmup=0, categories=False))
    assert isinstance(info.value, NbtUsageError) and isinstance(info.value.__cause__, ValueError)
    assert _untouched(model)


@pytest.mark.slow
def test_measurements_start_from_the_same_weights_and_leave_them_as_they_were(budget: int) -> None:
    """Same first loss before/after (the changes do not alter the math), weights restored, MFU shown."""
    model, step = make_gpt(hidden=HIDDEN)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    cmp = optimize(model, step, recompute="auto", budget_bytes=budget, steps=2,
        config=nbt.MeasureConfig(warmup=1, tokens_per_step=64))
    assert cmp.before.first_loss is not None
    assert cmp.after.first_loss == pytest.approx(cmp.before.first_loss, rel=1e-5)
    assert cmp.before.final_loss != cmp.before.first_loss  # the measured steps did train
    after = model.state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    table = cmp.table().set_index("metric")
    assert "first loss" in table.index
    assert any("MFU" in metric for metric in table.index)
    assert cmp.before.extra["hardware GFLOP / step"] < cmp.after.extra["hardware GFLOP / step"]
