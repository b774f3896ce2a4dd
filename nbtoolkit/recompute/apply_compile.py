"""torch.compile applied to a model reversibly.

``compile_model`` replaces the model's ``forward`` (an instance attribute; the class is
untouched) by ``torch.compile(forward, mode=..., fullgraph=..., dynamic=..., backend=...)``.
Compilation itself happens lazily on the first call; :mod:`~nbtoolkit.recompute.paired_measure`
reports that time as ``compile_time_s`` (warm-up time beyond the steady step time) and
counts graphs and graph breaks from torch._dynamo's counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.recompute.blocks import check_module
from nbtoolkit.recompute.handle import Applied, replace_forward

if TYPE_CHECKING:
    import torch

__all__ = ["compile_model", "compile_options"]

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_KNOWN = {"mode", "fullgraph", "dynamic", "backend", "options"}


def compile_options(compile: Any) -> dict[str, Any] | None:
    """``False``/``None`` -> None; ``True`` -> {}; a dict of torch.compile options -> checked copy."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return {}
    if isinstance(compile, str):
        compile = {"mode": compile}
    if not isinstance(compile, dict):
        raise NbtUsageError(
            f"compile must be True, False, a mode name or a dict of torch.compile options, got {compile!r}"
        )
    unknown = sorted(set(compile) - _KNOWN)
    if unknown:
        raise NbtUsageError(f"unknown torch.compile option(s) {unknown}: use {sorted(_KNOWN)}")
    if compile.get("mode") not in MODES:
        raise NbtUsageError(f"compile mode {compile['mode']!r} is not one of {[m for m in MODES if m]}")
    return dict(compile)


def _describe(options: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(options.items()))
    return f"torch.compile({shown})"


def compile_model(model: torch.nn.Module, **options: Any) -> Applied:
    """Compile ``model.forward`` with torch.compile(**options); ``.undo()`` restores the eager forward.

    Dynamo's caches are reset first (``torch._dynamo.reset()``): graphs compiled earlier for
    the same code (another instance of the class, an earlier ``torch.compile`` of this model)
    would otherwise be reused, and the measurement would show no graphs and no compile time.
    Other compiled functions of the process recompile on their next call.
    """
    import torch

    check_module(model)
    checked = compile_options(options) or {}
    torch._dynamo.reset()
    applied = Applied()
    applied.add(_describe(checked), replace_forward(model, lambda forward: torch.compile(forward, **checked)))
    return applied
