"""Running the user's training step: a clear error when it raises, and its wall time.

Used by :func:`nbtoolkit.capture.step_metrics.step_metrics` for the warm-up and timed calls
(steps 1 and 3 there), by the FLOP counter (:mod:`nbtoolkit.capture.flop_count`) and by the
peak measurement (:mod:`nbtoolkit.capture.peak_flops`), which synchronises the device the
same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nbtoolkit.errors import MetricsError

__all__ = ["call_step", "synchronize", "time_steps"]


def call_step(step: Callable[[], Any], what: str) -> Any:
    """``step()``; what it raises becomes a MetricsError naming ``what`` was being done."""
    try:
        return step()
    except (KeyboardInterrupt, MetricsError):
        raise
    except Exception as exc:
        raise MetricsError(
            f"the step raised {type(exc).__name__} during {what}: {exc}. Step metrics need a step that "
            "runs: fix it (run `step()` alone to see the full traceback) and measure again"
        ) from exc


def synchronize(device: str) -> None:
    """Wait for the work queued on ``device`` (a no-op on CPU): a timer must not stop before it ends."""
    import torch

    kind = device.split(":", 1)[0]
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif kind not in ("cpu", "meta"):
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "synchronize"):
            accelerator.synchronize()


def time_steps(step: Callable[[], Any], *, steps: int, device: str) -> list[float]:
    """Wall time of ``steps`` calls of ``step`` (seconds), each bracketed by a device synchronisation."""
    times = []
    synchronize(device)
    for index in range(steps):
        start = time.perf_counter()
        call_step(step, f"timed step {index + 1} of {steps}")
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times
