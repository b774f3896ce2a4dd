"""DeepSpeed ZeRO configs and the settings a sweep tries: plain dicts, built in the notebook."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["KNOBS", "default_settings", "grid_settings", "label", "short_count", "zero_config"]

# The communication knobs a sweep varies (DeepSpeed config keys under zero_optimization).
KNOBS = (
    "stage",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "overlap_comm",
)


def zero_config(
    *,
    stage: int = 1,
    micro_batch_size: int = 8,
    reduce_bucket_size: int | None = None,
    allgather_bucket_size: int | None = None,
    stage3_prefetch_bucket_size: int | None = None,
    overlap_comm: bool | None = None,
    gradient_accumulation_steps: int = 1,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A DeepSpeed config dict for ZeRO ``stage`` (1, 2 or 3); knobs left None keep DeepSpeed's defaults.

    Bucket sizes are in elements (DeepSpeed's unit), not bytes.
    """
    if stage not in (0, 1, 2, 3):
        raise NbtUsageError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    for name, value in (
        ("reduce_bucket_size", reduce_bucket_size),
        ("allgather_bucket_size", allgather_bucket_size),
        ("stage3_prefetch_bucket_size", stage3_prefetch_bucket_size),
    ):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise NbtUsageError(f"{name} must be a positive number of elements, got {value!r}")
    zero: dict[str, Any] = {"stage": stage}
    knobs = {
        "reduce_bucket_size": reduce_bucket_size,
        "allgather_bucket_size": allgather_bucket_size,
        "stage3_prefetch_bucket_size": stage3_prefetch_bucket_size,
        "overlap_comm": overlap_comm,
    }
    zero.update({key: value for key, value in knobs.items() if value is not None})
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # keep DeepSpeed's periodic log lines out of the notebook
        "wall_clock_breakdown": False,
    }
    if extra:
        config.update(extra)
    return config


def default_settings(parameter_count: int) -> list[dict[str, Any]]:
    """Stages 1, 2, 3 with DeepSpeed's default buckets, then small buckets for stages 2 and 3.

    "Small" is an eighth of the model's parameters, so that each collective carries a
    fraction of the model: more, smaller collectives than the defaults (which hold a
    small model in one bucket).
    """
    small = max(1024, parameter_count // 8)
    return [
        {"stage": 1},
        {"stage": 2},
        {"stage": 2, "reduce_bucket_size": small, "allgather_bucket_size": small},
        {"stage": 2, "reduce_bucket_size": small, "allgather_bucket_size": small, "overlap_comm": True},
        {"stage": 3},
        {"stage": 3, "reduce_bucket_size": small, "stage3_prefetch_bucket_size": small},
    ]


def grid_settings(grid: dict[str, Iterable[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values in ``grid`` (keys from :data:`KNOBS`)."""
    unknown = sorted(set(grid) - set(KNOBS))
    if unknown:
        raise NbtUsageError(f"unknown ZeRO knob(s) {unknown}: use {', '.join(KNOBS)}")
    keys = list(grid)
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(list(grid[k]) for k in keys))
    ]


def label(setting: dict[str, Any]) -> str:
    """A short name for a configuration: ``z2 rb=25k ag=25k overlap``."""
    short = {"reduce_bucket_size": "rb", "allgather_bucket_size": "ag", "stage3_prefetch_bucket_size": "pf"}
    parts = [f"z{setting.get('stage', 1)}"]
    for key, tag in short.items():
        if setting.get(key) is not None:
            parts.append(f"{tag}={short_count(setting[key])}")
    if setting.get("overlap_comm"):
        parts.append("overlap")
    return " ".join(parts)


def short_count(n: float) -> str:
    """A count in three digits and a unit: ``25k``, ``1.5M``, ``500``."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"
