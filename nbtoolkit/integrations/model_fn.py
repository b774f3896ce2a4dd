"""What the ZeRO and FSDP2 entries ask of ``model_fn``: a function that builds the model on each rank."""

from __future__ import annotations

from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["check_model_fn"]


def check_model_fn(model_fn: Any, strategy: str) -> None:
    """One clear error where ``model_fn`` is a model built in the notebook (or not a function): a
    model built here cannot be wrapped on the ranks, each rank builds its own. ``strategy`` is the
    wrapper (``"fsdp2"``, ``"zero1"``, ...), named in the message."""
    import torch

    if isinstance(model_fn, torch.nn.Module):
        if strategy == "fsdp2":
            from nbtoolkit.integrations.fsdp2.wrap import is_fully_sharded

            state = "is wrapped by FSDP2 in this process only" if is_fully_sharded(model_fn) else (
                "is not wrapped by FSDP2 (fully_shard)")
            raise NbtUsageError(
                f"strategy='fsdp2' got a {type(model_fn).__name__} built in the notebook, which {state}: "
                "pass a function that builds the model on each rank, either unwrapped "
                "(model_fn=lambda: MyModel(...); nbtoolkit shards it there with shard_model) or already "
                "sharded (a function that calls fully_shard / shard_model before returning it)"
            )
        raise NbtUsageError(
            f"strategy={strategy!r} got a {type(model_fn).__name__} built in the notebook: pass a function "
            "that builds the model on each rank (model_fn=lambda: MyModel(...)); DeepSpeed wraps it there"
        )
    if not callable(model_fn):
        raise NbtUsageError(
            f"model_fn must be a function that builds the model, got {type(model_fn).__name__}"
        )
