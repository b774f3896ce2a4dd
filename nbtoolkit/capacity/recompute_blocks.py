"""The repeated blocks of a model: the unit ZeRO-3 and FSDP2 gather, and what ``recompute="all"``
checkpoints. Found as the recompute planner and FSDP2's wrapper find them, so the prediction
shards and checkpoints exactly what the real run does.

``recompute="auto"`` checkpoints the first k blocks, k the fewest that make the row fit the card
(chosen in :mod:`nbtoolkit.capacity.api`): the first blocks' activations are the ones held longest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["RECOMPUTE", "apply_recompute", "block_modules", "checkpointed_model_fn"]

#: recompute settings nbt.fit knows: nothing checkpointed, the fewest blocks that fit, every block
RECOMPUTE = ("none", "auto", "all")


def block_modules(model: Any, names: Sequence[str] | None) -> list[Any]:
    """The repeated blocks (``model.layers.N`` of HF decoders, ``blocks.N`` of a stack), or ``names``."""
    from nbtoolkit.recompute.blocks import find_repeated_blocks, resolve_blocks

    found = list(names) if names is not None else find_repeated_blocks(model)
    return resolve_blocks(model, found) if found else []


def apply_recompute(modules: Sequence[Any]) -> None:
    """Checkpoint each block (non-reentrant ``torch.utils.checkpoint``), as the recompute planner does."""
    from nbtoolkit.recompute.checkpoint import checkpoint_modules

    if not modules:
        raise NbtUsageError(
            "recompute='all' checkpoints the model's repeated blocks, and this model has none "
            "(no two same-class submodules or ModuleList entries): use recompute=('none',) or name the "
            "blocks with blocks=[...]"
        )
    checkpoint_modules({str(i): m for i, m in enumerate(modules)})


def _build_checkpointed(model_fn: Callable[[], Any], blocks: Sequence[str] | None, count: int | None) -> Any:
    model = model_fn()
    modules = block_modules(model, blocks)
    apply_recompute(modules if count is None else modules[:count])
    return model


def checkpointed_model_fn(
    model_fn: Callable[[], Any], blocks: Sequence[str] | None, count: int | None = None
) -> Callable[[], Any]:
    """A model function for the ranks that builds the model with its first ``count`` repeated blocks
    checkpointed (every one when None)."""
    import functools

    return functools.partial(_build_checkpointed, model_fn, blocks, count)
