"""A tiny GPT, its batches and loss for the recompute plans under ZeRO and FSDP2 (built on each rank)."""

from __future__ import annotations

from typing import Any


def tiny_gpt() -> Any:
    """Activations (tokens x MLP width) dominate the parameters, as in real training."""
    from tests.optimize._models import TinyGPT

    return TinyGPT(dim=32, hidden=[128, 512, 256], seq=64)


def gpt_batch(rank: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(rank)
    return torch.randint(0, 64, (16, 64), generator=g), torch.randint(0, 64, (16, 64), generator=g)


def gpt_loss(out: Any, targets: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(out.reshape(-1, 64), targets.reshape(-1))
