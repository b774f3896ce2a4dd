"""Recomputation planned and verified under the compiler that runs it (issue 36): real
torch.compile with the ``aot_eager_decomp_partition`` backend (torch's min-cut partitioner, the
one Inductor uses, without Inductor's code generation, which takes minutes on 2 CPU cores).

Both routes: the plan of keep / selective / full per block that ``optimize`` applies, and torch's
partitioner, its activation_memory_budget searched by bisection against the measured peak."""

from __future__ import annotations

import pytest

from nbtoolkit import MeasureConfig
from nbtoolkit.recompute.config import OptimizeConfig
from nbtoolkit.recompute.optimize import optimize
from nbtoolkit.recompute.planner import plan_recompute
from tests.optimize._compiled_step import BACKEND, compiled_peak, make, prime_torch_logging


@pytest.fixture(scope="module", autouse=True)
def _torch_compile_initialised() -> None:
    prime_torch_logging()


@pytest.fixture(scope="module")
def compiled_baseline() -> int:
    """The device total of one compiled step of the model ``make`` builds (it is deterministic)."""
    model, step = make()
    step()
    return compiled_peak(model, step)


@pytest.fixture(autouse=True)
def fewer_partitioner_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two halvings of torch's budget (0.5, then 0.25 or 0.75) instead of three: each probe compiles."""
    from nbtoolkit.recompute import backend_planner

    monkeypatch.setattr(backend_planner, "BISECTION_STEPS", 2)


@pytest.mark.slow
def test_optimize_compile_auto_meets_its_budget_measured_under_compile(compiled_baseline: int) -> None:
    model, step = make()
    step()
    baseline = compiled_baseline
    budget = int(baseline * 0.9)  # activations are about a third of it: recomputation must reach this
    config = OptimizeConfig(
        compile=BACKEND, recompute="auto", budget_bytes=budget,
        measure=MeasureConfig(steps=2, warmup=1, metrics=False, categories=False),
    )
    assert baseline > budget
    comparison = optimize(model, step, config=config)
    plan = comparison.plan
    assert plan is not None
    assert plan.backend.startswith("torch.compile(") and "aot_eager_decomp_partition" in plan.backend
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget
    after = comparison.after.total_peak_bytes
    assert after is not None and after <= budget, (after, budget, plan)
    # the plan says per block what it does and why, and which route won
    text = plan._text()
    for name in plan.choices:
        assert name in text
    if plan.route == "blocks":
        assert any(c != "keep" for c in plan.choices.values())
        assert "saves" in text
    else:
        assert plan.activation_memory_budget is not None and "partitioner" in text
    assert any("offload" in note and "GPU" in note for note in plan.notes)  # CPU: offload not offered


@pytest.mark.slow
def test_optimize_measures_the_compiled_sides_peak_with_flop_metrics_on(compiled_baseline: int) -> None:
    """The after side's memory is that of the compiled step also when its FLOPs are counted: a compiled
    forward called under torch's FlopCounterMode runs eagerly from then on, so the memory step comes
    first (it came after, and a partitioner plan that fit when planned measured the eager baseline)."""
    from nbtoolkit.recompute.measure import profile_memory_series

    model, step = make()
    step()
    eager = profile_memory_series(step, total=True)[0].total_peak_bytes
    assert eager is not None and eager != compiled_baseline  # else the two could not be told apart
    config = OptimizeConfig(
        compile=BACKEND, measure=MeasureConfig(steps=2, warmup=1, metrics=True, categories=False),
    )
    comparison = optimize(model, step, config=config)
    assert "model GFLOP / step" in comparison.after.extra  # the FLOPs were counted on the after side too
    assert comparison.before.total_peak_bytes == eager
    assert comparison.after.total_peak_bytes == compiled_baseline


@pytest.mark.slow
def test_partitioner_route_searches_torchs_budget_against_the_measured_peak(compiled_baseline: int) -> None:
    model, step = make()
    step()
    baseline = compiled_baseline
    budget = int(baseline * 0.93)
    plan = plan_recompute(model, step, budget, compile=BACKEND, route="partitioner", steps=1)
    assert plan.route == "partitioner"
    assert plan.activation_memory_budget is not None and 0.0 <= plan.activation_memory_budget < 1.0
    assert not any(c != "keep" for c in plan.choices.values())  # no block wrapped on this route
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget
    # measured again here, independently: torch's budget set by plan.apply is in effect when it compiles
    assert compiled_peak(model, step, plan) <= budget
    import torch._functorch.config as functorch_config

    assert functorch_config.activation_memory_budget == 1.0  # apply's undo put torch's default back


def test_unknown_route_is_a_usage_error() -> None:
    from nbtoolkit.core.errors import NbtUsageError

    model, step = make()
    with pytest.raises(NbtUsageError, match="route must be one of"):
        plan_recompute(model, step, 10**9, compile=BACKEND, route="fastest")
