"""``MeasureConfig``: how a user's training step is measured, with the one set of defaults.

Every measuring API (``nbt.profile``, ``nbt.step_metrics``, ``nbt.capture_graphs``,
``nbt.memory_timeline``, ``nbt.optimize``, ``nbt.plan_recompute``, the DeepSpeed sweeps)
takes ``config=MeasureConfig(...)``; their ``steps=``/``warmup=`` keywords still work and are
merged into it by :func:`measure_config`, the one place that also reads the environment:

``NBTOOLKIT_MEASURE_STEPS``
    timed steps of each measurement (``MeasureConfig.steps``), a whole number >= 1.
``NBTOOLKIT_MEASURE_WARMUP``
    warm-up steps before the timed ones (``MeasureConfig.warmup``), a whole number >= 0.
``NBTOOLKIT_MEASURE_TIME_LIMIT``
    seconds a before/after comparison may spend adding interleaved rounds while its answer is
    unclear (``MeasureConfig.time_limit_s``), a number > 0.

Arguments given in code always win over the environment. This module imports no torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = [
    "DEFAULT_STEPS",
    "DEFAULT_TIME_LIMIT_S",
    "DEFAULT_WARMUP",
    "ENV_STEPS",
    "ENV_TIME_LIMIT",
    "ENV_WARMUP",
    "MeasureConfig",
    "measure_config",
]

ENV_STEPS = "NBTOOLKIT_MEASURE_STEPS"
ENV_WARMUP = "NBTOOLKIT_MEASURE_WARMUP"
ENV_TIME_LIMIT = "NBTOOLKIT_MEASURE_TIME_LIMIT"

#: The defaults every measuring API uses (one timed median of 3 after one warm-up step: the
#: first call pays for compilation, allocator growth and lazy state such as Adam's moments).
DEFAULT_STEPS = 3
DEFAULT_WARMUP = 1

#: Seconds a comparison may add interleaved rounds while unclear: long enough for ~25 rounds of a
#: 200 ms step, short enough that a no-op change does not hold a notebook for minutes.
DEFAULT_TIME_LIMIT_S = 10.0


def _whole(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NbtUsageError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def _env_whole(environ: Mapping[str, str], variable: str, *, minimum: int) -> int | None:
    raw = environ.get(variable, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < minimum:
        raise NbtUsageError(f"{variable}={raw!r} is not understood: set it to a whole number >= {minimum}")
    return value


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """How a step is measured; every field is checked when the object is made.

    Attributes:
        steps: measured steps (their median is the step time), >= 1.
        warmup: steps run first and not measured (compilation happens there), >= 0.
        synchronize: wait for the device (CUDA, XPU, MPS) around every timed step, so a
            timer never stops before the step's device work ends. Turn off only to see the
            host-side time of an asynchronous step.
        memory: also measure the peak memory (``nbt.optimize``: one more step
            under the memory profiler).
        categories: in that step, also split the peak by torch's memory categories.
        metrics: also count FLOPs (MFU, HFU) where the API offers it (``nbt.optimize``).
        tokens_per_step: tokens one step processes, for tokens/s (with ``metrics``).
        time_limit_s: a before/after comparison (``nbt.optimize``) runs ``steps`` interleaved
            rounds at least, then more while its answer is unclear, until this many seconds of
            rounds have passed (``nbtoolkit.core.interleaved``).
    """

    steps: int = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP
    synchronize: bool = True
    memory: bool = True
    categories: bool = True
    metrics: bool = True
    tokens_per_step: int | None = None
    time_limit_s: float = DEFAULT_TIME_LIMIT_S

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1 or (
            isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0
        ):
            raise NbtUsageError(
                f"steps must be >= 1 and warmup >= 0, got steps={self.steps!r}, warmup={self.warmup!r}"
            )
        for name in ("synchronize", "memory", "categories", "metrics"):
            if not isinstance(getattr(self, name), bool):
                raise NbtUsageError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.tokens_per_step is not None:
            _whole("tokens_per_step", self.tokens_per_step, minimum=1)
        limit = self.time_limit_s
        number = isinstance(limit, (int, float)) and not isinstance(limit, bool)
        if not number or not 0 < limit < float("inf"):
            raise NbtUsageError(f"time_limit_s must be a number of seconds > 0, got {limit!r}")

    @classmethod
    def from_env(cls, *, environ: Mapping[str, str] | None = None, **given: Any) -> MeasureConfig:
        """Fields ``given`` (not None) win; ``steps``/``warmup`` left out or None come from
        ``NBTOOLKIT_MEASURE_STEPS``/``NBTOOLKIT_MEASURE_WARMUP`` when set; the rest are defaults.
        ``environ`` defaults to ``os.environ``."""
        env = os.environ if environ is None else environ
        fields = {k: v for k, v in given.items() if v is not None}
        for name, variable, minimum in (("steps", ENV_STEPS, 1), ("warmup", ENV_WARMUP, 0)):
            if name not in fields:
                value = _env_whole(env, variable, minimum=minimum)
                if value is not None:
                    fields[name] = value
        raw_limit = env.get(ENV_TIME_LIMIT, "").strip()
        if "time_limit_s" not in fields and raw_limit:
            try:
                fields["time_limit_s"] = float(raw_limit)
            except ValueError:
                fields["time_limit_s"] = -1.0
            if not 0 < fields["time_limit_s"] < float("inf"):
                raise NbtUsageError(
                    f"{ENV_TIME_LIMIT}={raw_limit!r} is not understood: set it to a number of seconds > 0"
                )
        return cls(**fields)


def measure_config(config: Any = None, *, what: str = "config", **given: Any) -> MeasureConfig:
    """The one merge of a measuring API's ``config=`` and its keyword arguments.

    ``config`` None: a :meth:`MeasureConfig.from_env` (the environment fills ``steps``/``warmup``
    that the arguments leave None); a MeasureConfig: the arguments that are not None replace its
    fields (``steps=`` in a call wins over the config it passes). Anything else is a usage error.
    """
    fields = {k: v for k, v in given.items() if v is not None}
    if config is None:
        return MeasureConfig.from_env(**fields)
    if not isinstance(config, MeasureConfig):
        raise NbtUsageError(
            f"{what} must be a nbtoolkit.MeasureConfig, got {type(config).__name__}: "
            "pass config=nbt.MeasureConfig(steps=..., warmup=...)"
        )
    return dataclasses.replace(config, **fields) if fields else config
