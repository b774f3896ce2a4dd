"""Small models for the optimize tests: a GPT-like transformer and a net without repeated blocks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, heads: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyGPT(nn.Module):
    def __init__(
        self, vocab: int = 64, dim: int = 32, hidden: list[int] | None = None, seq: int = 32,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        hidden = hidden or [128] * 4
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList([Block(dim, h, dropout=dropout) for h in hidden])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_gpt(seed: int = 0, *, batch: int = 8, seq: int = 32, hidden: list[int] | None = None,
             dim: int = 32, dropout: float = 0.0) -> tuple[TinyGPT, Callable[[], Any]]:
    """A fresh model and its training step (AdamW), deterministic for a seed."""
    torch.manual_seed(seed)
    model = TinyGPT(dim=dim, hidden=hidden, seq=seq, dropout=dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 64, (batch, seq + 1), generator=gen)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        logits = model(data[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


class NoRepeats(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))
