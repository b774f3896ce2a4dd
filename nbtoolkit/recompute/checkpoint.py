"""Activation checkpointing of chosen blocks, reversibly.

Each chosen module's ``forward`` is wrapped so that it runs under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the forward keeps only
the block's inputs for backward, and the backward runs the block's forward again to
rebuild what it needs. The non-reentrant variant is the one PyTorch recommends: it works
with keyword arguments, with inputs that do not require grad, with ``torch.compile`` and
with nested checkpoints, and it restores the RNG state so dropout gives the same result.

The planner measures a block's recompute through the same wrapper: ``rerun=`` runs every
re-run of the forward (each call after the first within one checkpointed call, which is
when backward rebuilds the activations) through a function of the caller's, which times it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.recompute.blocks import check_module, resolve_blocks
from nbtoolkit.recompute.framework_checkpointing import suspend_framework_checkpointing
from nbtoolkit.recompute.handle import Applied, replace_forward

if TYPE_CHECKING:
    import torch

__all__ = ["checkpoint_blocks", "checkpoint_modules"]


#: Runs one re-run of a checkpointed forward (the thunk) and returns what it returns.
Rerun = Callable[[Callable[[], Any]], Any]


def _checkpointed(forward: Callable[..., Any], *, rerun: Rerun | None = None) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    if rerun is None:

        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        return run

    @functools.wraps(forward)
    def observed(*args: Any, **kwargs: Any) -> Any:
        calls = 0  # per checkpointed call: its first run is the forward, any later one a re-run

        def counted(*a: Any, **k: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                return forward(*a, **k)
            return rerun(lambda: forward(*a, **k))

        return checkpoint(counted, *args, use_reentrant=False, **kwargs)

    return observed


def checkpoint_blocks(model: torch.nn.Module, names: Sequence[str]) -> Applied:
    """Wrap each named block of ``model`` in activation checkpointing; ``.undo()`` restores it.

    The model's own checkpointing (Hugging Face's ``gradient_checkpointing``, timm's
    ``grad_checkpointing``) is turned off meanwhile and back on by ``.undo()``: exactly the named
    blocks are checkpointed, once (``nbtoolkit.recompute.framework_checkpointing`` says why)."""
    check_module(model)
    names = [names] if isinstance(names, str) else list(names)
    blocks = dict(zip(names, resolve_blocks(model, names), strict=True))
    applied = suspend_framework_checkpointing(model)
    try:
        applied.extend(checkpoint_modules(blocks))
    except BaseException:
        applied.undo()
        raise
    return applied


def checkpoint_modules(
    blocks: dict[str, torch.nn.Module], *, rerun: Callable[[str], Rerun] | None = None
) -> Applied:
    """Wrap each block (name -> module, already resolved) in activation checkpointing; ``.undo()``
    restores them. The planner, which resolved its candidates once, checkpoints them by module.

    ``rerun``: block name -> the function each re-run of that block's forward goes through
    (see the module docstring); None runs them plainly.
    """
    applied = Applied()
    try:
        for name, block in blocks.items():
            wrap = functools.partial(_checkpointed, rerun=rerun(name) if rerun is not None else None)
            applied.add(f"checkpoint {name}", replace_forward(block, wrap))
    except BaseException:
        applied.undo()
        raise
    return applied
