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

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.recompute.handle import Applied, replace_forward

if TYPE_CHECKING:
    import torch

__all__ = ["check_module", "checkpoint_blocks", "resolve_blocks"]


def check_module(model: Any) -> torch.nn.Module:
    """The model, if it is a torch.nn.Module; a usage error naming what it got otherwise."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise NbtUsageError(
            f"model must be a torch.nn.Module, got {type(model).__name__}: pass the module whose "
            "blocks should be recomputed (e.g. your GPT, not its output or its state_dict)"
        )
    return model


def resolve_blocks(model: torch.nn.Module, names: Sequence[str]) -> list[torch.nn.Module]:
    """The submodules named (dotted paths as in ``model.named_modules()``); clear error if unknown."""
    if isinstance(names, str):
        names = [names]
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules or n == ""]
    if missing:
        sample = ", ".join([n for n in modules if n][:8])
        raise NbtUsageError(
            f"no submodule named {', '.join(map(repr, missing))} in {type(model).__name__}; "
            f"names are dotted paths as in model.named_modules(), e.g. {sample}"
        )
    if len(set(names)) != len(names):
        raise NbtUsageError(f"a block is named twice in {list(names)}: name each block once")
    return [modules[n] for n in names]


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
    blocks = resolve_blocks(model, names)
    applied = Applied()
    try:
        for name, block in zip(names, blocks, strict=True):
            applied.add(f"checkpoint {name}", replace_forward(block, _checkpointed))
    except BaseException:
        applied.undo()
        raise
    return applied
