"""Which modules a recomputation plan may checkpoint: the model checked, its repeated blocks found,
names resolved to submodules, once.

The planner resolves its candidates here once and then works with the modules themselves
(:class:`Candidates`), so measuring, checkpointing and verifying never look the model up again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError, PlanError

if TYPE_CHECKING:
    import torch

__all__ = [
    "Candidates", "candidate_blocks", "check_module", "find_repeated_blocks", "model_and_step",
    "resolve_blocks",
]


@dataclass(frozen=True)
class Candidates:
    """The blocks a plan chooses from: name -> submodule in model order, and what the model holds
    whatever is recomputed (its gradients' bytes)."""

    blocks: dict[str, torch.nn.Module]
    gradient_bytes: int

    @property
    def names(self) -> list[str]:
        return list(self.blocks)


def check_module(model: Any) -> torch.nn.Module:
    """The model, if it is a torch.nn.Module; a usage error naming what it got otherwise."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise NbtUsageError(
            f"model must be a torch.nn.Module, got {type(model).__name__}: pass the module whose "
            "blocks should be recomputed (e.g. your GPT, not its output or its state_dict)"
        )
    return model


def model_and_step(model: Any, step: Any, what: str) -> tuple[Any, Any]:
    """``(model, step)`` as given, or both from a training loop's step given alone:
    ``plan_recompute(nbt.train_step(trainer))`` plans for the model the trainer trains."""
    from nbtoolkit.core.training_loop import LoopSteps

    if isinstance(model, LoopSteps) and step is not None and not callable(step):
        raise NbtUsageError(
            f"{what}({model.__name__}, {step!r}): with a training loop's step alone, pass the rest by name, "
            f"e.g. {what}(step, budget_bytes=...)"
        )
    if step is not None:
        return model, step
    if isinstance(model, LoopSteps):
        if model.model is None:
            raise NbtUsageError(
                f"{what}() cannot tell which model {model.__name__} trains: pass it, {what}(model, step)"
            )
        return model.model, model
    raise NbtUsageError(
        f"{what}(model, step) needs the step too: a zero-argument callable running one training step, "
        f"or nbt.train_step(trainer) alone ({what}(nbt.train_step(trainer)) takes the trainer's model)"
    )


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


def find_repeated_blocks(model: torch.nn.Module) -> list[str]:
    """Names of the model's repeated blocks, in model order.

    Among every module's direct children, the groups of two or more non-leaf children of the same
    class; the non-leaf children of a ``ModuleList`` form one group whatever their classes (a
    hybrid stack such as Jamba's ``model.layers``, Mamba and attention layers alternating, is one
    stack of layers). The group holding the most parameters wins (then the larger group).

    What it finds in common families: ``model.layers.N`` of Hugging Face decoders (Llama, Qwen2,
    Mistral; the layers sit under the ``model`` attribute of ``*ForCausalLM``, and the rotary
    embedding, a leaf module, is never a candidate), ``transformer.h.N`` of GPT-2, ``blocks.N`` of
    a timm ViT (tests/frameworks/test_hf_recompute.py checks each).
    """
    import torch

    best: tuple[int, int, list[str]] | None = None
    for parent_name, parent in model.named_modules():
        groups: dict[Any, list[tuple[str, Any]]] = {}
        stack = isinstance(parent, torch.nn.ModuleList)
        for child_name, child in parent.named_children():
            if next(child.children(), None) is None:  # leaf modules (Linear, LayerNorm) are not blocks
                continue
            groups.setdefault("stack" if stack else type(child), []).append((child_name, child))
        for members in groups.values():
            if len(members) < 2:
                continue
            params = sum(p.numel() for _, child in members for p in child.parameters())
            names = [f"{parent_name}.{n}" if parent_name else n for n, _ in members]
            key = (params, len(names))
            if best is None or key > best[:2]:
                best = (params, len(names), names)
    return best[2] if best else []


def candidate_blocks(module: torch.nn.Module, names: Sequence[str] | None) -> Candidates:
    """The named blocks of ``module`` (a checked module), or its repeated blocks when ``names`` is None."""
    if names is None:
        names = find_repeated_blocks(module)
        if not names:
            raise PlanError(
                f"{type(module).__name__} has no repeated blocks (no two non-leaf children of the same class "
                "under one parent) to choose from: name the modules to consider with blocks=['layer1', ...]"
            )
    names = [names] if isinstance(names, str) else list(names)
    modules = resolve_blocks(module, names)
    gradient = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return Candidates(dict(zip(names, modules, strict=True)), gradient)
