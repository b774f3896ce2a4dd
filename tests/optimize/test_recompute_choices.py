"""Per-block choices keep / selective / full (issue 36): the solver against brute force, what
selective checkpointing saves, monotone peaks over five budgets, the plan's per-block table.
Eager mode (the backend planner without compiling): fast, and the same code paths as under compile."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn

from nbtoolkit.recompute.choice_solver import choice_front, predict_choice_peak, solve_choices
from nbtoolkit.recompute.plan import RecomputePlan
from nbtoolkit.recompute.planner import plan_recompute, plan_recompute_budgets
from nbtoolkit.recompute.selective import apply_choices


class Block(nn.Module):
    def __init__(self, dim: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))


def make(hidden: tuple[int, ...] = (128, 256, 64)) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(hidden=h) for h in hidden], nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data, target = torch.randn(16, 64, 32), torch.randn(16, 64, 4)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


def test_choice_ilp_equals_brute_force_over_every_combination() -> None:
    saved = [
        {"selective": 30.0, "full": 100.0},
        {"selective": 50.0, "full": 70.0},
        {"selective": 10.0, "full": 90.0},
    ]
    cost = [{"selective": 1.0, "full": 5.0}, {"selective": 2.0, "full": 3.0}, {"selective": 0.5, "full": 6.0}]
    baseline = 1000
    for budget in range(740, 1001, 10):
        best = None
        for combo in itertools.product(("keep", "selective", "full"), repeat=3):
            if predict_choice_peak(baseline, saved, combo) <= budget:
                time = sum(cost[i].get(c, 0.0) for i, c in enumerate(combo))
                best = time if best is None else min(best, time)
        chosen = solve_choices(baseline, saved, cost, budget)
        if best is None:
            assert chosen is None
            continue
        assert chosen is not None and predict_choice_peak(baseline, saved, chosen) <= budget
        assert sum(cost[i].get(c, 0.0) for i, c in enumerate(chosen)) == pytest.approx(best)
    front = choice_front(baseline, saved, cost, step_bytes=1)
    peaks = [predict_choice_peak(baseline, saved, f) for f in front]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] == baseline - 260


def test_selective_saves_the_matmul_outputs_and_recomputes_the_rest() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        """Counts the aten ops run (here: during backward, where recomputation happens)."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    model, _ = make((128,))
    block = model[0]
    x = torch.randn(4, 16, 32, requires_grad=True)

    def backward_ops(choice: str) -> tuple[list[str], torch.Tensor]:
        with apply_choices({"b": block}, {"b": choice}):
            out = block(x)
        with Count() as count:
            grad = torch.autograd.grad(out.sum(), x)[0]
        return count.ops, grad

    kept, grad_keep = backward_ops("keep")
    selective, grad_selective = backward_ops("selective")
    full, grad_full = backward_ops("full")
    matmuls = ("addmm", "mm")
    # full re-runs the forward's matmuls in backward; selective saved them and re-runs only the rest
    assert sum(op in matmuls for op in full) > sum(op in matmuls for op in selective)
    assert sum(op in matmuls for op in selective) == sum(op in matmuls for op in kept)
    assert "gelu" in selective and "gelu" not in kept and "native_layer_norm" in selective
    torch.testing.assert_close(grad_selective, grad_keep)
    torch.testing.assert_close(grad_full, grad_keep)


def test_offload_is_refused_without_a_gpu() -> None:
    from nbtoolkit.core.errors import NbtUsageError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: offload is allowed (the GPU truth script checks it)")
    model, _ = make((128,))
    with pytest.raises(NbtUsageError, match="needs CUDA"):
        apply_choices({"b": model[0]}, {"b": "offload"})


def test_five_budgets_measured_peaks_never_rise_as_the_budget_falls(tmp_path: Any) -> None:
    model, step = make()
    probe = plan_recompute(model, step, None, selective=True, steps=1)
    low = int(probe.tradeoff["predicted_peak_bytes"].min())
    high = probe.baseline_peak_bytes
    budgets = [int(low + (high - low) * f) for f in (0.95, 0.75, 0.5, 0.3, 0.1)]
    plans = plan_recompute_budgets(model, step, budgets, steps=1)
    peaks = [p.measured_peak_bytes for p in plans]
    assert all(p is not None for p in peaks)
    for plan, budget in zip(plans, budgets, strict=True):
        assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget
    assert peaks == sorted(peaks, reverse=True), peaks  # type: ignore[type-var]
    # the choices show up per block, and survive saving
    last = plans[-1]
    assert any(c != "keep" for c in last.choices.values())
    text = last._text()
    assert all(name in text for name in last.choices) and "saves" in text
    loaded = RecomputePlan.load(last.save(tmp_path / "plan.json"))
    assert loaded.choices == last.choices and loaded.backend == "eager"
    with loaded.apply(model) as handle:
        assert len(handle.changes) == sum(c != "keep" for c in last.choices.values())
    assert all("forward" not in m.__dict__ for m in model.modules())
