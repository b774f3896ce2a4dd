"""A model's own activation checkpointing (Hugging Face's, timm's), turned off while a plan of
nbtoolkit's is applied and turned back on when it is undone.

Hugging Face models checkpoint their decoder layers themselves after
``model.gradient_checkpointing_enable()`` (``activation_checkpointing_enable()`` in 5.x): every
module that carries a ``gradient_checkpointing`` attribute gets it set to True, and a
``GradientCheckpointingLayer`` checkpoints its ``forward`` while the flag is on and the module is
training. timm models do the same for their block sequence with ``grad_checkpointing`` (set by
``model.set_grad_checkpointing()``). Both are plain boolean attributes on the modules, so they
are found here by name without importing either library.

Which wins: **nbtoolkit's plan, while it is applied.** A plan says exactly which blocks are
checkpointed, and its predicted peak and overhead are for exactly that set; the model's own
checkpointing on top would checkpoint the other blocks too (a peak and a step time the plan did
not predict) and nest a second checkpoint inside each chosen block. So applying a plan turns the
model's flags off, and undoing it puts every flag back as it was
(``model.is_gradient_checkpointing`` reads as before). The planner measures its candidates with
the flags off as well, and the step as the user runs it (flags on) once, for the plan's notes.
"""

from __future__ import annotations

from typing import Any

from nbtoolkit.recompute.handle import Applied

__all__ = ["CHECKPOINTING_FLAGS", "describe", "framework_checkpointing", "suspend_framework_checkpointing"]

#: Module attributes that switch a library's own activation checkpointing on: attribute -> library.
CHECKPOINTING_FLAGS = {"gradient_checkpointing": "Hugging Face", "grad_checkpointing": "timm"}

_MISSING = object()


def framework_checkpointing(model: Any) -> dict[str, list[str]]:
    """Library -> names of the modules whose own checkpointing flag is on (empty when none is)."""
    found: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        for flag, library in CHECKPOINTING_FLAGS.items():
            if getattr(module, flag, None) is True:
                found.setdefault(library, []).append(name or "(the model)")
    return found


def describe(found: dict[str, list[str]]) -> str:
    """``Hugging Face gradient checkpointing (3 modules: model, model.layers.0, ...)``."""
    parts = []
    for library, names in found.items():
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{library} gradient checkpointing ({len(names)} module(s): {shown})")
    return " and ".join(parts)


def suspend_framework_checkpointing(model: Any) -> Applied:
    """Turn every library checkpointing flag of ``model`` off; the handle's ``undo()`` restores each
    exactly (an instance attribute put back, or removed when the value came from the class).

    The handle records nothing (no ``changes``) when no flag was on."""
    applied = Applied()
    found = framework_checkpointing(model)
    if not found:
        return applied
    previous: list[tuple[Any, str, Any]] = []
    for module in model.modules():
        for flag in CHECKPOINTING_FLAGS:
            if getattr(module, flag, None) is True:
                previous.append((module, flag, module.__dict__.get(flag, _MISSING)))
                setattr(module, flag, False)

    def restore() -> None:
        for module, flag, value in reversed(previous):
            if value is _MISSING:
                module.__dict__.pop(flag, None)
            else:
                setattr(module, flag, value)

    applied.add(f"{describe(found)} turned off while nbtoolkit's checkpointing is applied", restore)
    return applied
