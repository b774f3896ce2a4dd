"""Tiny real trainers for the loop tests: a transformers Trainer, a Lightning Trainer, a plain loop.

Each is a random-weight model from its config and a few in-memory samples: seconds on a CPU.
A framework that cannot be imported skips the test, naming what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

SEQ = 16
VOCAB = 128


def _import_or_skip(module: str, install: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except Exception as exc:  # not installed, or installed but unusable
        reason = f"{type(exc).__name__}: {str(exc)[:120]}"
        pytest.skip(f"{module} cannot be imported ({reason}): pip install {install}")


def tiny_llama() -> Any:
    transformers = _import_or_skip("transformers", "transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


class TokenSamples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``n`` random token sequences, labels = inputs (causal LM), the same on every run."""

    def __init__(self, n: int = 64) -> None:
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def hf_trainer(tmp_path: Path, max_steps: int, *, batch: int = 4) -> Any:
    """A transformers Trainer on CPU: no logging, no saving, no progress bar."""
    transformers = _import_or_skip("transformers", "transformers")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        max_steps=max_steps, disable_tqdm=True, per_device_train_batch_size=batch, dataloader_num_workers=0,
    )  # fmt: skip
    return transformers.Trainer(model=tiny_llama(), args=args, train_dataset=TokenSamples())


def lightning_parts(max_steps: int) -> tuple[Any, Any, Any]:
    """(trainer, module, datamodule) of Lightning on CPU, quiet."""
    pl = _import_or_skip("lightning.pytorch", "lightning")

    class TinyLM(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama()

        def training_step(self, batch: dict[str, torch.Tensor], _index: int) -> torch.Tensor:
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Tokens(pl.LightningDataModule):  # type: ignore[misc,name-defined]
        def train_dataloader(self) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
            return torch.utils.data.DataLoader(TokenSamples(), batch_size=4)

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    return trainer, TinyLM(), Tokens()


class PlainLoop:
    """A hand-written loop over batches; ``steps_taken`` counts optimizer steps that completed."""

    def __init__(self, max_steps: int) -> None:
        self.model = tiny_llama()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.max_steps = max_steps
        self.steps_taken = 0

    @staticmethod
    def loader() -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
        return torch.utils.data.DataLoader(TokenSamples(), batch_size=4)

    def __call__(self) -> str:
        while True:
            for batch in self.loader():
                if self.steps_taken >= self.max_steps:
                    return "trained"
                self.model(**batch).loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()
                self.steps_taken += 1
