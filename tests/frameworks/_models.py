"""Tiny real models and trainers for the framework tests (random weights, in-memory data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def tiny_hf_trainer(tmp_path: Path, *, max_steps: int = 8, accumulation: int = 1, hidden: int = 32) -> Any:
    """A real transformers.Trainer over a tiny Llama built from its config and a 64-row dataset."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (64, 16))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        max_steps=max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation,
        disable_tqdm=True,
    )
    return Trainer(model=model, args=args, train_dataset=dataset)


def tiny_lightning(
    *, max_steps: int = 8, manual_gan: bool = False, min_steps: int | None = None
) -> tuple[Any, Any, Any]:
    """(a real Lightning Trainer on CPU, a LightningModule, a LightningDataModule) with a tiny MLP.

    ``manual_gan``: the module steps two optimizers itself per batch (manual optimization).
    """
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    class Data(pl.LightningDataModule):
        def train_dataloader(self) -> Any:
            generator = torch.Generator().manual_seed(0)
            inputs = torch.randn(64, 8, generator=generator)
            data = TensorDataset(inputs, torch.randn(64, 1, generator=generator))
            return DataLoader(data, batch_size=4)

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
            self.critic = torch.nn.Linear(1, 1)
            self.automatic_optimization = not manual_gan

        def training_step(self, batch: Any, index: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if not manual_gan:
                return loss
            first, second = self.optimizers()
            first.zero_grad()
            self.manual_backward(loss)
            first.step()
            second.zero_grad()
            self.manual_backward(self.critic(self.net(x).detach()).pow(2).mean())
            second.step()
            return None

        def configure_optimizers(self) -> Any:
            first = torch.optim.SGD(self.net.parameters(), lr=0.01)
            if not manual_gan:
                return first
            return [first, torch.optim.SGD(self.critic.parameters(), lr=0.01)]

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        min_steps=min_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return trainer, Regressor(), Data()
