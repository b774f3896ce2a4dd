"""Bytes, seconds, FLOPs and shares as people read them, and byte sizes as people write them.

One module for every quantity nbtoolkit prints, so that the same number reads the same in a
memory timeline, a recompute plan, a comparison and a magic's output. Formats:

- bytes in binary units with three significant decimals: ``512 B``, ``1.50 KiB``, ``75.80 MiB``;
- seconds in the unit that reads best: ``2.50 s``, ``12.3 ms``, ``85 µs``;
- FLOPs and FLOP/s with SI prefixes: ``1.23 GFLOP``, ``312.00 TFLOP/s``;
- shares as percentages with about three significant digits: ``41.2%``, ``4.12%``, ``0.041%``.

``memory_viz_size`` is the one deliberate exception: it reproduces ``torch.cuda._memory_viz``'s
own text exactly (``4.1GiB``), for output that is compared line by line with memory_viz.

Missing values (``None``, NaN) print as ``-`` everywhere, so a table of optional measurements
never shows ``nan``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = [
    "DeviceShare",
    "format_bytes",
    "format_flop_rate",
    "format_flops",
    "format_percent",
    "format_seconds",
    "memory_viz_size",
    "parse_budget",
    "parse_bytes",
]

MISSING = "-"


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_bytes(n: float | None) -> str:
    """Bytes in binary units with the unit named: ``512 B``, ``1.50 MiB``, ``-1.25 GiB``."""
    if _missing(n):
        return MISSING
    assert n is not None
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value < 1024:
        return f"{sign}{value:,.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:,.2f} {unit}"
    raise AssertionError("unreachable: the loop returns at TiB")  # pragma: no cover


def format_seconds(s: float | None) -> str:
    """Seconds with the unit that reads best: ``1.20 s``, ``12.3 ms``, ``85 µs``."""
    if _missing(s):
        return MISSING
    assert s is not None
    magnitude = abs(s)
    if magnitude >= 1:
        return f"{s:,.2f} s"
    if magnitude >= 1e-3:
        return f"{s * 1e3:,.1f} ms"
    return f"{s * 1e6:,.0f} µs"


_SI_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_flops(n: float, unit: str = "FLOP") -> str:
    """A FLOP count with an SI prefix and its unit: ``1.23 GFLOP``."""
    value = float(n)
    for scale, prefix in _SI_PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def format_flop_rate(n: float) -> str:
    """FLOP/s with an SI prefix: ``312.00 TFLOP/s``."""
    return format_flops(n, "FLOP/s")


def format_percent(share: float | None) -> str:
    """A share (0.412) as a percentage with about three significant digits: 41.2%, 4.12%, 0.041%."""
    if _missing(share):
        return MISSING
    assert share is not None
    pct = 100 * share
    if abs(pct) >= 10:
        return f"{pct:.1f}%"
    if abs(pct) >= 1:
        return f"{pct:.2f}%"
    return f"{pct:.2g}%"


def memory_viz_size(num: float) -> str:
    """A size formatted exactly as ``torch.cuda._memory_viz`` prints it (``4.1GiB``, ``333.5KiB``)."""
    value = float(num)
    for unit in ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"):
        if abs(value) < 1024.0:
            return f"{value:3.1f}{unit}B"
        value /= 1024.0
    return f"{value:.1f}YiB"


_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: Any, *, what: str = "budget") -> int:
    """Bytes from an int, a float, or text like ``"1.5GB"``, ``"512 MiB"``, ``"2e9"``.

    kB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024 (as in the SI/IEC
    standards); the unit is case-insensitive. Anything else is a usage error naming the value.
    """
    if isinstance(value, bool):
        raise NbtUsageError(f"{what} must be a number of bytes or text like '1.5GB', got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _BYTES_RE.match(value)
        unit = match.group(3).lower() if match else None
        if match is None or unit not in _BYTE_UNITS:
            raise NbtUsageError(
                f"cannot read {what} {value!r}: write a number of bytes with an optional unit, "
                "e.g. 1500000000, '1.5GB', '1400MiB' (kB/MB/GB = 1000^n, KiB/MiB/GiB = 1024^n)"
            )
        number = float(match.group(1)) * (10 ** int(match.group(2) or 0)) * _BYTE_UNITS[unit or ""]
    else:
        raise NbtUsageError(
            f"{what} must be a number of bytes or text like '1.5GB', got {type(value).__name__}"
        )
    if not math.isfinite(number) or number <= 0:
        raise NbtUsageError(f"{what} must be a positive number of bytes, got {value!r}")
    return int(number)


@dataclass(frozen=True)
class DeviceShare:
    """A memory budget written as a share of the device's memory, e.g. ``"90%"``.

    Only a GPU has a memory size to take a share of; turning it into bytes needs the device
    (``nbtoolkit.core.device_memory.budget_bytes_for``).
    """

    fraction: float

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}% of the device's memory"


def parse_budget(value: Any, *, what: str = "budget") -> int | DeviceShare:
    """A memory budget: bytes as :func:`parse_bytes` reads them, or a share of the device (``"90%"``)."""
    if isinstance(value, DeviceShare):
        return value
    if isinstance(value, str) and value.strip().endswith("%"):
        text = value.strip()[:-1].strip()
        try:
            percent = float(text)
        except ValueError:
            percent = math.nan
        if not 0 < percent <= 100:
            raise NbtUsageError(
                f"cannot read {what} {value!r}: a share of the device is a percentage in (0, 100], e.g. '90%'"
            )
        return DeviceShare(percent / 100)
    return parse_bytes(value, what=what)
