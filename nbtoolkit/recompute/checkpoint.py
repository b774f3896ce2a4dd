"""Activation checkpointing of chosen blocks, reversibly.

Each chosen module's ``forward`` is wrapped so that it runs under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the forward keeps only
the block's inputs for backward, and the backward runs the block's forward again to
rebuild what it needs. The non-reentrant variant is the one PyTorch recommends: it works
with keyword arguments, with inputs that do not require grad, with ``torch.compile`` and
with nested checkpoints, and it restores the RNG state so dropout gives the same result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.recompute.blocks import check_module, resolve_blocks
from nbtoolkit.recompute.handle import Applied, replace_forward

if TYPE_CHECKING:
    import torch

__all__ = ["checkpoint_blocks", "checkpoint_modules"]


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def checkpoint_blocks(model: torch.nn.Module, names: Sequence[str]) -> Applied:
    """Wrap each named block of ``model`` in activation checkpointing; ``.undo()`` restores it."""
    check_module(model)
    names = [names] if isinstance(names, str) else list(names)
    return checkpoint_modules(dict(zip(names, resolve_blocks(model, names), strict=True)))


def checkpoint_modules(blocks: dict[str, torch.nn.Module]) -> Applied:
    """Wrap each block (name -> module, already resolved) in activation checkpointing; ``.undo()``
    restores them. The planner, which resolved its candidates once, checkpoints them by module."""
    applied = Applied()
    try:
        for name, block in blocks.items():
            applied.add(f"checkpoint {name}", replace_forward(block, _checkpointed))
    except BaseException:
        applied.undo()
        raise
    return applied
