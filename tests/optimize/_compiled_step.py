"""The small transformer the compiled recomputation tests train (issue 36), and its compiled peak."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nbtoolkit.recompute.apply_compile import compile_model
from nbtoolkit.recompute.measure import profile_memory_series
from nbtoolkit.recompute.plan import RecomputePlan

BACKEND = {"backend": "aot_eager_decomp_partition"}


class Block(nn.Module):
    def __init__(self, dim: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make() -> tuple[Tiny, Any]:
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(8, 128, 32)
    target = torch.randn(8, 128, 8)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


def compiled_peak(model: nn.Module, step: Any, plan: RecomputePlan | None = None) -> int:
    """The device total of one step with ``plan`` applied and the model compiled (measured here, not
    by the planner)."""
    handles = [plan.apply(model)] if plan is not None else []
    handles.append(compile_model(model, **BACKEND))
    try:
        step()
        step()
        peak = profile_memory_series(step, total=True)[0].total_peak_bytes
    finally:
        for handle in reversed(handles):
            handle.undo()
        torch._dynamo.reset()
    assert peak is not None
    return int(peak)


def prime_torch_logging() -> None:
    """torch's first compiled checkpoint in a process lets its idle LazyTraceHandler remove itself
    from the torch.__trace logger (a one-time init, not something nbtoolkit leaves behind): run one
    before the per-test "no handler left" check takes its snapshot."""
    from nbtoolkit.recompute.selective import apply_choices

    model, step = make()
    blocks = dict(model.blocks.named_children())
    with apply_choices(blocks, {"0": "selective", "1": "full"}), compile_model(model, **BACKEND):
        step()
    torch._dynamo.reset()
