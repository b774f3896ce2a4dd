"""Models nbt.fit predicts for and verifies on CPU ranks: a plain MLP stack and a small HF decoder
(built on each rank, and under fake tensors by nbt.fit)."""

from __future__ import annotations

from typing import Any


def mlp_stack() -> Any:
    """Four residual MLP blocks: parameters and activations of the same order."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(256, 1024)
            self.down = torch.nn.Linear(1024, 256)

        def forward(self, x: Any) -> Any:
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(4))
            self.head = torch.nn.Linear(256, 256)

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Stack()


def mlp_batch(micro_batch: int) -> Any:
    import torch

    return torch.randn(micro_batch, 256), torch.randn(micro_batch, 256)


def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=512, vocab_size=1024, max_position_embeddings=256)
    return LlamaForCausalLM(config)


def llama_batch(micro_batch: int) -> Any:
    import torch

    ids = torch.randint(0, 1024, (micro_batch, 128))
    return ids, ids


def llama_loss(out: Any, targets: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())
