"""Step metrics: model and hardware FLOPs of one training step, step time, achieved FLOP/s, MFU, HFU.

Definitions (the same as PaLM's, Chowdhery et al. 2022, appendix B, which the field quotes):

``model_flops``
    floating-point operations of one training step as the model defines it: forward plus
    backward, each matrix product / convolution / attention counted once, recomputation
    NOT counted. Counted by torch's own ``torch.utils.flop_counter.FlopCounterMode``
    (2 FLOPs per multiply-add; element-wise ops, norms and the optimizer are not counted,
    as in torch and in the published MFU numbers).
``hardware_flops``
    the same operations as actually executed: ``model_flops`` plus the forward
    recomputed by activation checkpointing (``torch.utils.checkpoint``) during backward.
``mfu`` (model FLOPs utilization)
    ``model_flops / step_time_s / peak_flops``.
``hfu`` (hardware FLOPs utilization)
    ``hardware_flops / step_time_s / peak_flops``. ``hfu >= mfu``; they differ only by
    the recomputed share.
``peak_flops``
    the device's dense peak FLOP/s in the dtype the matrix products ran in, from a
    datasheet table (``nbtoolkit.metrics.device_peaks``), measured with large matrix
    products (a CPU: ``nbtoolkit.metrics.cpu_peak``), or given by the user;
    ``peak_source`` says which, and every display says "measured" for a measured one.

A utilization above 100% is impossible: when any timed step executed more FLOP/s than the
peak, the peak is wrong (a CPU peak measured while the machine was busy, a wrong
``peak_flops``), and ``mfu``/``hfu`` are None with the reason in ``mfu_unavailable``: never
a number above 100%.

The object is plain data (pandas frames and numbers); it never holds NaN: a metric that
cannot be computed raises :class:`~nbtoolkit.core.errors.MetricsError` when the object is made,
or (MFU, HFU) is None with its reason.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import MetricsError, NbtUsageError
from nbtoolkit.core.result import Result, escape
from nbtoolkit.core.units import format_flop_rate, format_flops, format_percent, format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MODULE_COLUMNS",
    "OP_COLUMNS",
    "StepMetrics",
    "attach_step_metrics",
    "format_flop_rate",
    "format_flops",
    "measurement_extra",
    "metrics_frame",
]

# Inclusive columns (the module and every module it called) carry the plain names, as torch's
# and the profilers' tables do; the exclusive ones (the module's own ops) are prefixed ``self_``.
MODULE_COLUMNS = [
    "module", "parent", "depth", "forward_flops", "backward_flops", "recompute_flops", "model_flops",
    "hardware_flops", "self_model_flops", "self_hardware_flops",
]
OP_COLUMNS = ["op", "forward_flops", "backward_flops", "recompute_flops", "model_flops", "hardware_flops"]

def _empty_frame(columns: list[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({c: [] for c in columns})


# repr: the Result mixin's summary, not a dump of the frames; eq: identity (frames have no truth value)
@dataclass(repr=False, eq=False)
class StepMetrics(Result):
    """FLOPs, time and utilization of one training step (see the module docstring for definitions).

    Attributes:
        model_flops: FLOPs of one step without recomputation (forward + backward).
        hardware_flops: FLOPs actually executed in one step (model + recomputation).
        forward_flops: the forward part of ``model_flops`` (ops run outside backward).
        step_times_s: wall time of each timed step (seconds), measured without the FLOP
            counter (which slows ops down), after ``warmup`` untimed steps.
        peak_flops: the device's dense peak in FLOP/s for ``dtype``.
        peak_source: where ``peak_flops`` came from: ``"table: ..."``, ``"measured: ..."``
            or ``"given: ..."``.
        dtype: torch dtype name carrying the most FLOPs in the step (``"bfloat16"``, ...).
        device: torch device the FLOPs ran on (``"cpu"``, ``"cuda:0"``).
        device_name: the device's model name (``"NVIDIA A100-SXM4-80GB"``, a CPU's model name).
        by_module: one row per module that ran (named by attribute path from the model:
            ``GPT.blocks.0.attn``); columns ``module``, ``parent`` (the module that called it,
            "" for the model), ``depth``; INCLUSIVE ``forward_flops``, ``backward_flops``,
            ``recompute_flops``, ``model_flops``, ``hardware_flops`` (the module and every
            module it called); EXCLUSIVE ``self_model_flops``, ``self_hardware_flops`` (its own
            ops only). Each op is billed once, backward included, to the module whose forward
            created it (:mod:`nbtoolkit.metrics.module_flops`): the ``self_`` columns add up to
            at most the step's FLOPs, and so do the inclusive ones of siblings.
        by_op: one row per counted aten op with the same FLOP columns.
        tokens_per_step / samples_per_step: as the user stated them, else None.
        parameters: parameter count of ``model`` when one was given, else None.
        warmup: untimed steps run before timing.
        notes: caveats found while measuring.
        mfu_unavailable: why MFU and HFU are not given (a timed step went faster than the
            peak), else None. Set when the object is made if the caller did not.
    """

    model_flops: int
    hardware_flops: int
    step_times_s: list[float]
    peak_flops: float
    peak_source: str
    dtype: str
    device: str = "cpu"
    device_name: str = ""
    forward_flops: int = 0
    by_module: pd.DataFrame = field(default_factory=lambda: _empty_frame(MODULE_COLUMNS))
    by_op: pd.DataFrame = field(default_factory=lambda: _empty_frame(OP_COLUMNS))
    tokens_per_step: int | None = None
    samples_per_step: int | None = None
    parameters: int | None = None
    warmup: int = 0
    notes: list[str] = field(default_factory=list)
    mfu_unavailable: str | None = None
    loop: Any = None  # step_metrics(loop=True): the training loop's LoopOutcome (not saved)

    def __post_init__(self) -> None:
        # Every derived number is a ratio: refuse what would make one 0/0, inf or NaN here, once.
        if not self.model_flops or self.model_flops <= 0:
            raise MetricsError(
                "the step ran no FLOP-counted operation (matrix product, convolution or attention), so "
                "model FLOPs are 0 and MFU is undefined: pass a step that runs the model's forward and "
                "backward"
            )
        if self.hardware_flops < self.model_flops:
            raise MetricsError(
                f"hardware FLOPs ({self.hardware_flops:,}) are below model FLOPs ({self.model_flops:,}): "
                "the counts are inconsistent"
            )
        if not self.step_times_s:
            raise MetricsError("no step was timed: use steps >= 1")
        bad = [t for t in self.step_times_s
               if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0)]
        if bad:
            raise MetricsError(
                f"step times must be positive finite seconds, got {bad[:3]!r}: the clock or the step "
                "is broken"
            )
        if not (isinstance(self.peak_flops, (int, float)) and math.isfinite(self.peak_flops)
                and self.peak_flops > 0):
            raise MetricsError(
                f"peak FLOP/s must be a positive finite number, got {self.peak_flops!r} "
                f"({self.peak_source}): pass peak_flops=<FLOP/s of your device>"
            )
        if self.mfu_unavailable is None and self.peak_beaten:
            self.mfu_unavailable = peak_beaten_reason(self)

    # ---- derived numbers -------------------------------------------------------------
    @property
    def step_time_s(self) -> float:
        """Median step time in seconds."""
        return float(statistics.median(self.step_times_s))

    @property
    def step_time_spread_s(self) -> float:
        """Interquartile range of the step times (75th minus 25th percentile), seconds; 0 for one step."""
        if len(self.step_times_s) < 2:
            return 0.0
        q = statistics.quantiles(self.step_times_s, n=4, method="inclusive")
        return float(q[2] - q[0])

    @property
    def steps(self) -> int:
        return len(self.step_times_s)

    @property
    def recompute_flops(self) -> int:
        """FLOPs executed again by activation recomputation (``hardware_flops - model_flops``)."""
        return self.hardware_flops - self.model_flops

    @property
    def backward_flops(self) -> int:
        return self.model_flops - self.forward_flops

    @property
    def flops_per_s(self) -> float:
        """Achieved model FLOP/s: ``model_flops / step_time_s``."""
        return self.model_flops / self.step_time_s

    @property
    def hardware_flops_per_s(self) -> float:
        """Achieved hardware FLOP/s: ``hardware_flops / step_time_s``."""
        return self.hardware_flops / self.step_time_s

    @property
    def fastest_hardware_flops_per_s(self) -> float:
        """Hardware FLOP/s of the fastest timed step: what the device demonstrably reached."""
        return self.hardware_flops / min(self.step_times_s)

    @property
    def peak_beaten(self) -> bool:
        """A timed step executed more FLOP/s than ``peak_flops``: the peak cannot be right."""
        return self.fastest_hardware_flops_per_s > self.peak_flops

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization, a fraction (0.41 means 41%); None when the peak was beaten
        (``mfu_unavailable`` says why): never above 1."""
        if self.mfu_unavailable is not None:
            return None
        return self.flops_per_s / self.peak_flops

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilization, a fraction; None like ``mfu``."""
        if self.mfu_unavailable is not None:
            return None
        return self.hardware_flops_per_s / self.peak_flops

    @property
    def mfu_range(self) -> tuple[float, float] | None:
        """MFU at the slowest and at the fastest timed step (the spread of ``mfu``); None like ``mfu``."""
        if self.mfu_unavailable is not None:
            return None
        return (
            self.model_flops / max(self.step_times_s) / self.peak_flops,
            self.model_flops / min(self.step_times_s) / self.peak_flops,
        )

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens_per_step is None else self.tokens_per_step / self.step_time_s

    @property
    def samples_per_s(self) -> float | None:
        return None if self.samples_per_step is None else self.samples_per_step / self.step_time_s

    @property
    def tokens_or_samples_per_s(self) -> tuple[float, str] | None:
        """(rate, unit): tokens/s when tokens per step were given, else samples/s, else None."""
        if self.tokens_per_s is not None:
            return self.tokens_per_s, "tokens/s"
        if self.samples_per_s is not None:
            return self.samples_per_s, "samples/s"
        return None

    @property
    def peak_kind(self) -> str:
        """``"table"``, ``"measured"`` or ``"given"``: the first word of ``peak_source``."""
        return self.peak_source.split(":", 1)[0]

    @property
    def peak_label(self) -> str:
        """How displays name the peak: ``"measured peak"``, ``"datasheet peak"``, ``"given peak"``."""
        return {"table": "datasheet peak", "measured": "measured peak", "given": "given peak"}.get(
            self.peak_kind, "peak"
        )

    # ---- display ---------------------------------------------------------------------
    def summary_line(self) -> str:
        """One line for other summaries (profile, comparison, cluster):
        ``MFU 12.3% · HFU 15.0% · 1.23 TFLOP/s model · 8,000 tokens/s (peak 10.00 TFLOP/s, table)``."""
        if self.mfu is None or self.hfu is None:
            parts = [f"MFU not available ({self.peak_label} below the achieved rate)"]
        else:
            parts = [f"MFU {format_percent(self.mfu)}", f"HFU {format_percent(self.hfu)}"]
        parts.append(f"{format_flop_rate(self.flops_per_s)} model")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if self.samples_per_s is not None:
            parts.append(f"{self.samples_per_s:,.1f} samples/s")
        return " · ".join(parts) + f" (peak {format_flop_rate(self.peak_flops)}, {self.peak_kind})"

    def _rows(self) -> list[tuple[str, str]]:
        times = self.step_times_s
        fmt = format_seconds
        model = (f"{format_flops(self.model_flops)} (forward {format_flops(self.forward_flops)}"
                 f" + backward {format_flops(self.backward_flops)})")
        hardware = f"{format_flops(self.hardware_flops)} (recomputation {format_flops(self.recompute_flops)})"
        step_time = (f"{fmt(self.step_time_s)} median of {len(times)} (IQR {fmt(self.step_time_spread_s)}, "
                     f"min {fmt(min(times))}, max {fmt(max(times))}; {self.warmup} warm-up)")
        achieved = (f"{format_flop_rate(self.flops_per_s)} model, "
                    f"{format_flop_rate(self.hardware_flops_per_s)} hardware")
        rows = [
            ("model FLOPs / step", model),
            ("hardware FLOPs / step", hardware),
            ("step time", step_time),
            ("achieved", achieved),
        ]
        if self.mfu is None or self.hfu is None or self.mfu_range is None:
            rows.append(("MFU", f"not available: {self.mfu_unavailable}"))
            rows.append(("HFU", "not available (as MFU)"))
        else:
            low, high = self.mfu_range
            spread = f"range {format_percent(low)} to {format_percent(high)} over the timed steps"
            of = f"of the {self.peak_label}"
            rows.append(("MFU", f"{format_percent(self.mfu)} {of} ({spread})"))
            rows.append(("HFU", f"{format_percent(self.hfu)} {of}"))
        if self.tokens_per_s is not None:
            rows.append(("tokens/s", f"{self.tokens_per_s:,.0f} ({self.tokens_per_step:,} tokens/step)"))
        if self.samples_per_s is not None:
            rows.append(("samples/s", f"{self.samples_per_s:,.1f} ({self.samples_per_step:,} samples/step)"))
        rows.append((self.peak_label, f"{format_flop_rate(self.peak_flops)} — {self.peak_source}"))
        device = self.device + (f" ({self.device_name})" if self.device_name else "")
        rows.append(("device, dtype", f"{device}, {self.dtype}"))
        if self.parameters is not None:
            rows.append(("parameters", f"{self.parameters:,}"))
        return rows

    def top_modules(self, n: int = 8, *, depth: int | None = None) -> pd.DataFrame:
        """The ``n`` modules with the most inclusive model FLOPs (optionally only at one
        ``depth``), with ``model_pct`` (inclusive) and ``self_model_pct`` (own ops), their
        shares of the step's model FLOPs in percent."""
        from nbtoolkit.metrics.module_table import top_modules

        return top_modules(self.by_module, self.model_flops, n, depth=depth)

    def top_level_modules(self) -> pd.DataFrame:
        """The model's direct parts (modules a root module called), by inclusive model FLOPs,
        with ``model_pct`` and ``self_model_pct``: their inclusive shares add up to at most 100%."""
        from nbtoolkit.metrics.module_table import top_level_modules

        return top_level_modules(self.by_module, self.model_flops)

    def _text(self) -> str:
        from nbtoolkit.metrics.module_table import module_lines

        lines = [f"StepMetrics: {self.summary_line()}"]
        width = max(len(name) for name, _ in self._rows())
        lines += [f"  {name:<{width}}  {value}" for name, value in self._rows()]
        if len(self.by_module):
            lines += module_lines(self.by_module, self.model_flops)
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _html(self) -> str:
        from nbtoolkit.metrics.module_table import module_html

        body = "".join(
            f"<tr><th style='text-align:left'>{escape(name)}</th><td>{escape(value)}</td></tr>"
            for name, value in self._rows()
        )
        parts = [
            "<div class='nbt-step-metrics'>",
            f"<p><b>StepMetrics</b>: {escape(self.summary_line())}</p>",
            f"<table class='nbt-table'>{body}</table>",
        ]
        if len(self.by_module):
            parts.append(module_html(self.by_module, self.model_flops))
        parts += [f"<p><i>note: {escape(n)}</i></p>" for n in self.notes]
        parts.append("</div>")
        return "".join(parts)

    # ---- save / load -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "model_flops": int(self.model_flops),
            "hardware_flops": int(self.hardware_flops),
            "forward_flops": int(self.forward_flops),
            "step_times_s": [float(t) for t in self.step_times_s],
            "peak_flops": float(self.peak_flops),
            "peak_source": self.peak_source,
            "dtype": self.dtype,
            "device": self.device,
            "device_name": self.device_name,
            "by_module": self.by_module.to_dict(orient="records"),
            "by_op": self.by_op.to_dict(orient="records"),
            "tokens_per_step": self.tokens_per_step,
            "samples_per_step": self.samples_per_step,
            "parameters": self.parameters,
            "warmup": self.warmup,
            "notes": list(self.notes),
            "mfu_unavailable": self.mfu_unavailable,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepMetrics:
        import pandas as pd

        values = dict(data)
        modules = values.get("by_module") or []
        if modules and not all(set(MODULE_COLUMNS) <= set(row) for row in modules):
            # written before each op was billed once: its per-module figures double-count
            modules = []
            values["notes"] = [*values.get("notes", []), (
                "per-module FLOPs not shown: this file was saved by an nbtoolkit that billed some "
                "modules twice (torch's ModuleTracker); measure again for them"
            )]
        values["by_module"] = pd.DataFrame.from_records(modules, columns=MODULE_COLUMNS)
        values["by_op"] = pd.DataFrame.from_records(values.get("by_op") or [], columns=OP_COLUMNS)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in values.items() if k in known})

    def save(self, path: str | Path) -> Path:
        """Write the metrics as JSON (per-module and per-op frames included)."""
        from nbtoolkit.core.errors import SaveError
        from nbtoolkit.core.paths import path_errors
        from nbtoolkit.core.saved import file_to_save

        target = file_to_save(path, what="StepMetrics")
        text = json.dumps(self.to_dict(), indent=1)
        with path_errors(target, "save the StepMetrics to", error=SaveError):
            target.write_text(text)
        return target

    @classmethod
    def load(cls, path: str | Path) -> StepMetrics:
        from nbtoolkit.core.paths import user_path

        source = user_path(path)
        try:
            data = json.loads(source.read_text())
            return cls.from_dict(data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NbtUsageError(
                f"cannot read saved StepMetrics from {str(source)!r}: {exc}; pass a file written by "
                "StepMetrics.save()"
            ) from None


def peak_beaten_reason(metrics: StepMetrics, *, measured_again: bool = False) -> str:
    """Why MFU is not given when a timed step went faster than the peak, by the peak's kind."""
    peak = format_flop_rate(metrics.peak_flops)
    achieved = f"{format_flop_rate(metrics.fastest_hardware_flops_per_s)} in its fastest step"
    if metrics.peak_kind == "measured":
        what = "CPU peak" if metrics.device.startswith("cpu") else "peak"
        again = ", also when measured again" if measured_again else ""
        return (
            f"the measured {what} ({peak}) is below what this step achieved ({achieved}){again}: the machine "
            "was busy when the peak was measured. Measure again on an idle machine, or pass "
            "peak_flops=<the device's peak FLOP/s>"
        )
    if metrics.peak_kind == "table":
        return (
            f"the datasheet peak ({peak}) is below what this step achieved ({achieved}): the FLOP count or "
            "the device's identification is wrong. Pass peak_flops=<the device's dense peak FLOP/s>"
        )
    return (
        f"the peak ({peak}; {metrics.peak_source}) is below what this step achieved ({achieved}): pass "
        "peak_flops=<the device's dense peak FLOP/s>"
    )


# ---- helpers for other summaries ---------------------------------------------------------

def measurement_extra(metrics: StepMetrics) -> dict[str, float | str]:
    """The metrics as ``Measurement.extra`` rows: names carry the units, values are numbers
    (so that a Comparison shows the after/before ratio of each), or ``"not available: ..."``
    for MFU and HFU when the peak was beaten. The peak row names its kind
    (``peak TFLOP/s (measured)``)."""
    unavailable = f"not available: {metrics.mfu_unavailable}"
    extra: dict[str, float | str] = {
        "model GFLOP / step": metrics.model_flops / 1e9,
        "hardware GFLOP / step": metrics.hardware_flops / 1e9,
        "achieved model TFLOP/s": metrics.flops_per_s / 1e12,
        "MFU (%)": unavailable if metrics.mfu is None else 100 * metrics.mfu,
        "HFU (%)": "not available (as MFU)" if metrics.hfu is None else 100 * metrics.hfu,
    }
    if metrics.tokens_per_s is not None:
        extra["tokens/s"] = metrics.tokens_per_s
    if metrics.samples_per_s is not None:
        extra["samples/s"] = metrics.samples_per_s
    extra[f"peak TFLOP/s ({metrics.peak_kind})"] = metrics.peak_flops / 1e12
    return extra


def attach_step_metrics(measurement: Any, metrics: StepMetrics) -> Any:
    """Add ``metrics`` to a :class:`~nbtoolkit.recompute.comparison.Measurement` (its ``extra``
    mapping) and return the measurement. The peak's source goes into ``measurement.config``."""
    extra = getattr(measurement, "extra", None)
    if not isinstance(extra, MutableMapping):
        raise NbtUsageError(
            f"cannot attach step metrics to {type(measurement).__name__}: it has no `extra` mapping; "
            "pass a nbtoolkit Measurement"
        )
    extra.update(measurement_extra(metrics))
    config = getattr(measurement, "config", None)
    if isinstance(config, MutableMapping):
        config["peak FLOP/s source"] = metrics.peak_source
    return measurement


def _labelled(
    runs: Mapping[str, StepMetrics] | Iterable[StepMetrics | tuple[str, StepMetrics]],
) -> list[tuple[Any, StepMetrics]]:
    if isinstance(runs, Mapping):
        items: Iterable[Any] = runs.items()
    elif isinstance(runs, Iterable) and not isinstance(runs, (str, bytes)):
        items = runs
    else:
        raise NbtUsageError(
            f"expected step metrics, got a {type(runs).__name__}: pass a StepMetrics, a list of them, "
            "(label, StepMetrics) pairs or a mapping label -> StepMetrics (results of nbt.step_metrics)"
        )
    labelled: list[tuple[Any, StepMetrics]] = []
    for position, item in enumerate(items):
        if isinstance(item, StepMetrics):
            labelled.append((position, item))
        elif (isinstance(item, Sequence) and len(item) == 2 and isinstance(item[1], StepMetrics)):
            labelled.append((item[0], item[1]))
        else:
            raise NbtUsageError(
                f"entry {position} is a {type(item).__name__}, not a StepMetrics or a (label, StepMetrics) "
                "pair: pass results of nbt.step_metrics"
            )
    return labelled


def metrics_frame(
    runs: Mapping[str, StepMetrics] | Iterable[StepMetrics | tuple[str, StepMetrics]],
    *,
    label: str = "run",
) -> pd.DataFrame:
    """One row per run (or per rank: pass the per-rank list and ``label="rank"``).

    ``runs`` is a mapping label -> StepMetrics, a list of (label, StepMetrics) pairs, or a
    plain list (labelled 0, 1, ... in order, as cluster results come in rank order).
    Columns: ``<label>``, ``step_time_s``, ``step_time_spread_s``, ``model_flops``,
    ``hardware_flops``, ``flops_per_s``, ``mfu``, ``mfu_low``, ``mfu_high``, ``hfu`` (None where
    ``mfu_unavailable`` says why), ``mfu_unavailable``, ``tokens_per_s``, ``samples_per_s`` (None
    where not stated), ``peak_flops``, ``peak_kind``, ``peak_source``.
    """
    import pandas as pd

    records = []
    for name, m in _labelled(runs):
        low, high = m.mfu_range or (None, None)
        records.append({
            label: name,
            "step_time_s": m.step_time_s,
            "step_time_spread_s": m.step_time_spread_s,
            "model_flops": m.model_flops,
            "hardware_flops": m.hardware_flops,
            "flops_per_s": m.flops_per_s,
            "mfu": m.mfu,
            "mfu_low": low,
            "mfu_high": high,
            "hfu": m.hfu,
            "mfu_unavailable": m.mfu_unavailable,
            "tokens_per_s": m.tokens_per_s,
            "samples_per_s": m.samples_per_s,
            "peak_flops": m.peak_flops,
            "peak_kind": m.peak_kind,
            "peak_source": m.peak_source,
        })
    if not records:
        raise NbtUsageError("no step metrics given: pass at least one result of nbt.step_metrics")
    return pd.DataFrame.from_records(records)
