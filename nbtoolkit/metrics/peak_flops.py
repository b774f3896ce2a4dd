"""The peak FLOP/s that MFU and HFU divide by: given, from the datasheet table, or measured.

Step 4 of :func:`nbtoolkit.metrics.measure.step_metrics`: ``peak_flops`` when the user
gives it; else the datasheet table (:mod:`nbtoolkit.metrics.device_peaks`) for a known
accelerator in the dtype that carried most FLOPs; else measured: on a CPU robustly, fp32 and
bf16 together, re-measured while the machine is busy, cached with its conditions
(:mod:`nbtoolkit.metrics.cpu_peak`); on an accelerator not in the table, the best of a few
large matrix products, cached per process.

Every source text starts with its kind: ``"given: "``, ``"table: "`` or ``"measured: "``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import MetricsError, NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.step_runner import run_steps

if TYPE_CHECKING:
    import torch

__all__ = ["device_name", "given_peak", "measure_matmul_peak", "resolve_peak"]

MATMUL_SIZE = 2048
MATMUL_RUNS = 5
MATMUL_GROW_S = 0.25  # stop doubling the matrix once one product takes this long
MATMUL_BUDGET_S = 2.0  # at most about this long for the timed products

#: One timed product, no warm-up: the size is chosen from it.
_ONCE = MeasureConfig(steps=1, warmup=0)

# (device string, dtype name) -> (peak FLOP/s, source): accelerators missing from the table.
# CPUs have their own cache, with the conditions of each measurement (cpu_peak.py).
_MEASURED_PEAKS: dict[tuple[str, str], tuple[float, str]] = {}


def device_name(device: str) -> str:
    """The accelerator's or CPU's model name (what the datasheet table is keyed by), "" if unknown."""
    import torch

    kind = device.split(":", 1)[0]
    if kind == "cuda" and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(device))
    if kind == "cpu":
        return _cpu_name()
    return ""


def _cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _tf32_enabled() -> bool:
    """Whether FP32 matmuls on CUDA may use TF32 tensor cores (then the tf32 peak applies)."""
    import torch

    with warnings.catch_warnings():  # the legacy flags warn about their successor on some versions
        warnings.simplefilter("ignore")
        try:
            precision = str(torch.backends.cuda.matmul.fp32_precision)
        except AttributeError:
            precision = ""
        try:
            legacy = bool(torch.backends.cuda.matmul.allow_tf32)
        except (AttributeError, RuntimeError):
            legacy = False
    return precision == "tf32" or legacy


def _measure_matmul(device: torch.device, dtype: torch.dtype) -> tuple[float, int, int]:
    """(FLOP/s, size, runs) of the fastest of a few square matrix products on ``device`` in ``dtype``.

    The size doubles from 256 up to ``MATMUL_SIZE`` (2048) while one product takes under
    ``MATMUL_GROW_S``: big enough to saturate the device, without spending minutes on a dtype
    the device emulates slowly (float8 on a CPU). Then up to ``MATMUL_RUNS`` timed products,
    fewer if they would exceed ``MATMUL_BUDGET_S``. ``2 * size**3`` FLOPs per product (torch's
    formula for mm). The best run, not the median: a peak is what the hardware can reach.
    """
    import torch

    with torch.no_grad():
        size = 256
        while True:
            a = torch.randn(size, size, device=device).to(dtype)
            b = torch.randn(size, size, device=device).to(dtype)
            first = run_steps(functools.partial(torch.mm, a, b), _ONCE, device=device)
            out = first.value  # also the untimed warm-up of the final size
            once = first.times_s[0]
            if size >= MATMUL_SIZE or once > MATMUL_GROW_S:
                break
            size *= 2
        runs = max(1, min(MATMUL_RUNS, int(MATMUL_BUDGET_S / max(once, 1e-9))))
        timed = run_steps(lambda: torch.mm(a, b, out=out), MeasureConfig(steps=runs, warmup=0), device=device)
        best = min(timed.times_s)
    return 2.0 * size**3 / best, size, runs


def measure_matmul_peak(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of the fastest of a few large matrix products on ``device`` in ``dtype``: on a CPU
    the robust, cached measurement of :func:`nbtoolkit.metrics.cpu_peak.cpu_peak`, elsewhere
    ``_measure_matmul``. What :func:`step_metrics` uses when no ``measure_peak`` is given."""
    if str(device).startswith("cpu"):
        from nbtoolkit.metrics.cpu_peak import cpu_peak

        return cpu_peak(str(dtype).removeprefix("torch.")).flops
    return _measure_matmul(device, dtype)[0]


def given_peak(peak_flops: Any) -> tuple[float, str]:
    """(peak, source) of a user-given ``peak_flops``; a usage error unless it is a positive number."""
    if isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float)) \
            or not math.isfinite(peak_flops) or peak_flops <= 0:
        raise NbtUsageError(
            f"peak_flops={peak_flops!r} is not a positive number of FLOP/s: pass e.g. 312e12 for an "
            "A100 in bf16"
        )
    return float(peak_flops), f"given: peak_flops={float(peak_flops):.4g} FLOP/s"


def resolve_peak(
    device: str,
    dtype: torch.dtype,
    *,
    peak_flops: float | None = None,
    measure_peak: Callable[[torch.device, torch.dtype], float] | None = None,
    refresh: bool = False,
) -> tuple[float, str]:
    """(peak FLOP/s, source): given > datasheet table > measured (cached per process).

    ``refresh``: measure again instead of taking the cached figure (a step went faster than
    the peak); a cached CPU peak is replaced only by a higher one.
    """
    import torch

    from nbtoolkit.metrics.device_peaks import lookup_peak, precision_of

    dtype_name = str(dtype).removeprefix("torch.")
    if peak_flops is not None:
        return given_peak(peak_flops)
    name = device_name(device)
    on_cpu = device.startswith("cpu")
    if not on_cpu:
        precision = precision_of(dtype_name, tf32=_tf32_enabled())
        found = lookup_peak(name, precision) if (name and precision) else None
        if found is not None:
            return found
    where = f"this CPU ({name})" if on_cpu else f"{device} ({name or 'unknown device'})"
    key = (device, dtype_name)
    if measure_peak is None and not on_cpu and not refresh and key in _MEASURED_PEAKS:
        return _MEASURED_PEAKS[key]
    source = ""
    try:
        if measure_peak is not None:
            value: Any = measure_peak(torch.device(device), dtype)
        elif on_cpu:
            from nbtoolkit.metrics.cpu_peak import cpu_peak

            measured = cpu_peak(dtype_name, refresh=refresh)
            value, source = measured.flops, measured.source(where)
        else:
            value, size, runs = _measure_matmul(torch.device(device), dtype)
            source = f"measured: {size}x{size} {dtype_name} matmul on {where}, best of {runs} runs"
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        raise MetricsError(
            f"the peak FLOP/s of {where} in {dtype_name} is not in nbtoolkit's table of known devices and "
            f"measuring it failed ({type(exc).__name__}: {exc}). Pass peak_flops=<dense peak FLOP/s of the "
            f"device in {dtype_name}> (from its datasheet)"
        ) from exc
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise MetricsError(
            f"measuring the peak FLOP/s of {where} in {dtype_name} gave {value!r}, not a positive number: "
            "pass peak_flops=<dense peak FLOP/s of the device>"
        )
    if measure_peak is not None:
        source = f"measured: {getattr(measure_peak, '__name__', 'measure_peak')} on {where} in {dtype_name}"
    elif not on_cpu:
        previous = _MEASURED_PEAKS.get(key)
        if previous is None or value > previous[0]:
            _MEASURED_PEAKS[key] = (float(value), source)
        value, source = _MEASURED_PEAKS[key]
    return float(value), source
