"""A small random-weight Hugging Face Llama for the graph tests, or a skip naming what is missing."""

from __future__ import annotations

from typing import Any

import pytest


def small_llama(hidden_size: int = 32) -> Any:
    """A 2-layer LlamaForCausalLM (vocabulary 128) in training mode; skips when transformers cannot load."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    # not installed, or installed but unusable (e.g. beside a torchvision built for another torch)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc)[:160]}"
        pytest.skip(f"transformers cannot be imported ({reason}): pip install transformers")
    import torch

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).train()
