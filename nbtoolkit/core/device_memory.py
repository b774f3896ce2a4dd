"""Which device a model's memory lives on, and a memory budget in that device's bytes.

A budget is compared with the device's whole peak (``memory_profile.device_total_peak``):
on a GPU, what ``torch.cuda.max_memory_allocated`` reports; on the CPU, the total torch's
memory profiler classifies. A share of the device (``"90%"``) is a share of
``torch.cuda.get_device_properties(device).total_memory``; the CPU has no such size
(the process shares the machine's memory with everything else), so there a share is
refused with a request for bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.units import DeviceShare, format_bytes, parse_budget

if TYPE_CHECKING:
    import torch

__all__ = ["budget_bytes_for", "device_total_memory", "model_device", "model_gpu", "plan_budget"]


def model_device(module: Any) -> torch.device:
    """The device of the module's first parameter (or buffer); the CPU for a module with neither."""
    import torch

    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def model_gpu(module: Any) -> torch.device | None:
    """The module's GPU, or None when it is on the CPU (what the memory profiler's ``device=`` takes:
    a GPU's series counts only that GPU's allocator, a CPU series counts every allocation)."""
    device = model_device(module)
    return device if device.type == "cuda" else None


def device_total_memory(device: Any) -> int | None:
    """The GPU's memory size in bytes, None for the CPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def budget_bytes_for(budget: Any, device: Any) -> int:
    """``budget`` (bytes, text such as ``"70GB"``, or a share such as ``"90%"``) in bytes of ``device``."""
    parsed = parse_budget(budget)
    if not isinstance(parsed, DeviceShare):
        return parsed
    size = device_total_memory(device)
    if size is None:
        raise NbtUsageError(
            f"a budget of {parsed} needs a GPU to take the share of, but the model is on {device}: "
            "give the budget in bytes instead, e.g. budget_bytes='2GB'"
        )
    budget_bytes = int(size * parsed.fraction)
    if budget_bytes <= 0:  # pragma: no cover - a GPU always has memory
        raise NbtUsageError(f"{parsed} of {format_bytes(size)} is no memory at all: give a larger share")
    return budget_bytes


def plan_budget(device: Any, total: Any, step_only: Any) -> tuple[int | None, str]:
    """A plan's budget: (bytes or None, what it counts: ``"total"``, the device's whole peak, or
    ``"step"``, what the step allocates above what was live before it). One of the two is given."""
    if total is not None and step_only is not None:
        raise NbtUsageError(
            "give budget_bytes (the device's total peak) or step_budget_bytes (the step's own peak), not both"
        )
    if step_only is not None:
        from nbtoolkit.core.units import parse_bytes

        return parse_bytes(step_only, what="step_budget_bytes"), "step"
    if total is None:
        return None, "total"
    return budget_bytes_for(total, device), "total"
