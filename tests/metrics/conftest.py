"""A small GPT-style transformer and its training step, shared by the step-metrics tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(attn)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, recompute: str | None) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.recompute = recompute

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            if self.recompute is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.recompute == "reentrant")
        return self.head(self.ln(x))


@dataclass
class Setup:
    model: TinyGPT
    step: Callable[[], Any]
    batch: int
    seq: int
    d: int
    layers: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def analytic_model_flops(self) -> int:
        """6 x (matmul parameters) x tokens, plus attention, in torch's FLOP conventions.

        Matmul parameters: the weights of every Linear (biases, norms and the embedding lookup
        do no matrix product). Attention per layer: forward QK^T and AV, 2 x 2·B·S²·d; backward,
        as torch's SDPA backward formula counts it, 5 products of the same size (the flash kernel
        recomputes the scores), so 14·B·S²·d per layer in all. Causal masking is not discounted,
        as in torch and in PaLM's appendix B.
        """
        linear = sum(m.weight.numel() for m in self.model.modules() if isinstance(m, nn.Linear))
        attention = self.layers * 14 * self.batch * self.seq**2 * self.d
        return 6 * linear * self.tokens + attention


@pytest.fixture
def make_gpt() -> Callable[..., Setup]:
    def make(*, recompute: str | None = None, vocab: int = 256, d: int = 64, layers: int = 2, heads: int = 4,
             batch: int = 4, seq: int = 32, amp: torch.dtype | None = None) -> Setup:
        torch.manual_seed(0)
        model = TinyGPT(vocab, d, layers, heads, recompute)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        idx = torch.randint(0, vocab, (batch, seq))

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                logits = model(idx)
            loss = F.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
            loss.backward()
            optimizer.step()
            return loss

        return Setup(model, step, batch, seq, d, layers)

    return make
