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


def tiny_vit() -> Any:
    """A small ViT in plain torch (timm is not installable here): 4x4 patches of a 32x32 image
    embedded by a strided convolution, a class token, four pre-norm encoder blocks
    (``scaled_dot_product_attention``), a linear head on the class token."""
    import torch

    width, heads = 128, 4

    class EncoderBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = torch.nn.LayerNorm(width)
            self.qkv = torch.nn.Linear(width, 3 * width)
            self.proj = torch.nn.Linear(width, width)
            self.norm2 = torch.nn.LayerNorm(width)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))

        def forward(self, x: Any) -> Any:
            b, n, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            attended = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            x = x + self.proj(attended.transpose(1, 2).reshape(b, n, width))
            return x + self.mlp(self.norm2(x))

    class ViT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = torch.nn.Conv2d(3, width, kernel_size=4, stride=4)
            self.cls = torch.nn.Parameter(torch.zeros(1, 1, width))
            self.position = torch.nn.Parameter(torch.zeros(1, 65, width))
            self.blocks = torch.nn.ModuleList(EncoderBlock() for _ in range(4))
            self.norm = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, 10)

        def forward(self, images: Any) -> Any:
            x = self.patch(images).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.position
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x[:, 0]))

    return ViT()


def vit_batch(micro_batch: int) -> Any:
    import torch

    return torch.randn(micro_batch, 3, 32, 32), torch.randn(micro_batch, 10)
