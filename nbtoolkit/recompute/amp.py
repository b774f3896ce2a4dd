"""Automatic mixed precision (autocast) around a model's forward, reversibly.

The forward runs under ``torch.autocast(device_type, dtype)``, where the device type is
the one the model's parameters live on. Matmuls and convolutions then run in bf16/fp16
while reductions stay in float32; the backward follows the dtypes of the forward.
With fp16 your step should use a ``torch.amp.GradScaler`` (nbtoolkit does not change
your step): small gradients underflow in fp16. bf16 needs no scaler.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.recompute.blocks import check_module
from nbtoolkit.recompute.handle import Applied, replace_forward

if TYPE_CHECKING:
    import torch

__all__ = ["AMP_DTYPES", "autocast_model"]

AMP_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def autocast_model(model: torch.nn.Module, amp: str) -> Applied:
    """Run ``model.forward`` under autocast with ``amp`` ("bf16" or "fp16"); ``.undo()`` restores it."""
    import torch

    check_module(model)
    if amp not in AMP_DTYPES:
        raise NbtUsageError(f"amp must be None, 'bf16' or 'fp16', got {amp!r}")
    dtype = getattr(torch, AMP_DTYPES[amp])
    first = next(model.parameters(), None)
    device_type = first.device.type if first is not None else "cpu"

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type=device_type, dtype=dtype):
                return forward(*args, **kwargs)

        return run

    applied = Applied()
    applied.add(f"autocast {amp} on {device_type}", replace_forward(model, wrap))
    return applied
