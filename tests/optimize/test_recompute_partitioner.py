"""Torch's partitioner as the other route under compile (issue 36): its activation_memory_budget
searched by bisection against the measured peak, with real torch.compile
(``aot_eager_decomp_partition``, the min-cut partitioner Inductor uses)."""

from __future__ import annotations

import pytest

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
