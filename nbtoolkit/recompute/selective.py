"""Per-block recomputation choices beyond "checkpoint the whole block", applied reversibly.

A block of a recomputation plan is in one of these states (:data:`CHOICES`):

* ``keep``: untouched, every activation saved for backward;
* ``selective``: op-level selective checkpointing (``torch.utils.checkpoint``'s
  ``create_selective_checkpoint_contexts``): the outputs of the operators in
  :data:`SAVED_OPS` (matrix multiplies and attention, the expensive ones) are saved, everything
  else the block computes (norms, activations, pointwise ops, reshapes) is recomputed in
  backward. It saves less memory than ``full`` and costs far less time: what backward re-runs
  is cheap, the matmuls are not run again;
* ``full``: the whole block checkpointed (only its inputs kept, its forward re-run in backward);
* ``offload``: every tensor the block saves for backward goes to pinned host memory
  (``torch.autograd.graph.save_on_cpu``) and comes back for backward. Only where CUDA exists:
  on the CPU there is no slower memory to move to.

:func:`partitioner_budget` is the other route under torch.compile: it sets torch's own
``torch._functorch.config.activation_memory_budget`` (a fraction of the activation memory the
min-cut partitioner may keep), which the partitioner reads when the graph compiles; undo puts
the previous value back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.recompute.handle import Applied, replace_forward

if TYPE_CHECKING:
    import torch

__all__ = ["CHOICES", "SAVED_OP_NAMES", "apply_choices", "partitioner_budget", "saved_ops"]

CHOICES = ("keep", "selective", "full", "offload")

#: The aten operators whose outputs ``selective`` saves (attr names under ``torch.ops.aten``);
#: those that this torch build lacks are skipped.
SAVED_OP_NAMES = (
    "mm", "addmm", "bmm", "baddbmm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
)


def saved_ops() -> list[Any]:
    """The ``OpOverload`` objects of :data:`SAVED_OP_NAMES` that exist in this torch."""
    import torch

    ops = []
    for name in SAVED_OP_NAMES:
        packet = getattr(torch.ops.aten, name, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is not None:
            ops.append(overload)
    return ops


def _selective(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context = functools.partial(create_selective_checkpoint_contexts, saved_ops())

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)

    return run


def _full(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def _offload(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.autograd.graph import save_on_cpu

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with save_on_cpu(pin_memory=True):
            return forward(*args, **kwargs)

    return run


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "selective": _selective, "full": _full, "offload": _offload,
}


def apply_choices(blocks: Mapping[str, torch.nn.Module], choices: Mapping[str, str]) -> Applied:
    """Wrap each block (name -> module) as ``choices[name]`` says; ``.undo()`` restores them all.

    Blocks missing from ``choices`` or marked ``keep`` are left alone. ``offload`` needs CUDA.
    """
    import torch

    unknown = sorted({c for c in choices.values() if c not in CHOICES})
    if unknown:
        raise NbtUsageError(f"unknown recomputation choice(s) {unknown}: use one of {list(CHOICES)}")
    if "offload" in choices.values() and not torch.cuda.is_available():
        raise NbtUsageError(
            "offload moves saved activations from GPU to host memory and needs CUDA, which this machine "
            "lacks: choose keep, selective or full"
        )
    applied = Applied()
    try:
        for name, choice in choices.items():
            if choice == "keep":
                continue
            applied.add(f"{choice} {name}", replace_forward(blocks[name], _WRAPPERS[choice]))
    except BaseException:
        applied.undo()
        raise
    return applied


def partitioner_budget(fraction: float) -> Applied:
    """Set torch's ``activation_memory_budget`` to ``fraction`` until ``.undo()``.

    The min-cut partitioner (torch.compile's default backend Inductor, and
    ``aot_eager_decomp_partition``) reads it when a graph compiles, so the model must compile
    (its first step) while this is applied."""
    import torch._functorch.config as functorch_config

    if not 0.0 <= fraction <= 1.0:
        raise NbtUsageError(f"activation_memory_budget must be within 0..1, got {fraction!r}")
    previous = functorch_config.activation_memory_budget
    functorch_config.activation_memory_budget = float(fraction)
    applied = Applied()

    def restore() -> None:
        functorch_config.activation_memory_budget = previous

    applied.add(f"torch activation_memory_budget={fraction:.3f}", restore)
    return applied
