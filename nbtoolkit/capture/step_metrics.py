"""``nbt.step_metrics(step)``: model and hardware FLOPs, step time, achieved FLOP/s, MFU and HFU.

How it measures (the definitions are in :mod:`nbtoolkit.model.metrics`):

1. ``warmup`` untimed calls of ``step`` (compilation, allocator and cache warm-up).
2. One call under torch's ``FlopCounterMode`` (a ``TorchDispatchMode`` that sees every aten
   op and applies torch's FLOP formulas to matrix products, convolutions and attention).
   Each counted op is put in one phase:

   - *forward*: the op ran outside the autograd engine (``torch._C._current_graph_task_id()``
     is -1);
   - *backward*: it ran inside the engine with grad mode off, which is how the engine runs
     gradient formulas (``backward(create_graph=False)``);
   - *recompute*: it ran inside the engine with grad mode ON. Only a forward re-run inside
     backward does that: ``torch.utils.checkpoint`` (reentrant and non-reentrant) re-runs the
     forward under ``torch.enable_grad()`` to rebuild the graph it frees.

   ``model_flops = forward + backward``; ``hardware_flops = forward + backward + recompute``.
   The same split is kept per module (torch's ``ModuleTracker`` names) and per aten op.
   Limitation: a step that calls ``backward(create_graph=True)`` (double backward, gradient
   penalties) runs gradient formulas with grad mode on; they are counted as recomputation.
3. ``steps`` timed calls WITHOUT the counter (it slows ops down), each synchronised with
   the device; the median is the step time.
4. The peak: ``peak_flops`` when given; else the datasheet table
   (:mod:`nbtoolkit.analysis.device_peaks`) for a known accelerator in the dtype that carried
   most FLOPs; else measured once per process and device/dtype with a large matrix product
   (what CPUs get) and cached.

CPU attention: torch's counter has no formula for the CPU flash-attention kernels
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), so
``F.scaled_dot_product_attention`` on CPU would count 0. We register torch's own SDPA
formulas (``sdpa_flop_count`` / ``sdpa_backward_flop_count``, the ones it applies to the CUDA
kernels) for them, so CPU and GPU runs of one model count the same FLOPs.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.errors import MetricsError, NbtUsageError
from nbtoolkit.model.metrics import (
    MODULE_COLUMNS,
    OP_COLUMNS,
    StepMetrics,
    attach_step_metrics,
    measurement_extra,
    metrics_frame,
)

if TYPE_CHECKING:
    import pandas as pd
    import torch

__all__ = [
    "FlopCounts",
    "add_step_metrics",
    "attach_step_metrics",
    "count_step_flops",
    "measure_matmul_peak",
    "measurement_extra",
    "metrics_frame",
    "resolve_peak",
    "step_metrics",
    "step_metrics_from_times",
    "step_metrics_note",
    "time_steps",
]

PHASES = ("forward", "backward", "recompute")
MATMUL_SIZE = 2048
MATMUL_RUNS = 5
MATMUL_GROW_S = 0.25  # stop doubling the matrix once one product takes this long
MATMUL_BUDGET_S = 2.0  # at most about this long for the timed products

# (device string, dtype name, CPU threads) -> (peak FLOP/s, source). One measurement per process
# and setting: torch.set_num_threads changes what a CPU can reach.
_MEASURED_PEAKS: dict[tuple[str, str, int], tuple[float, str]] = {}


@dataclass
class FlopCounts:
    """FLOPs of one counted step, split by phase, module and op, and by (device, dtype)."""

    # phase -> module name -> op name -> FLOPs; "Global" is the whole step.
    by_phase: dict[str, dict[str, dict[str, int]]] = field(
        default_factory=lambda: {p: defaultdict(lambda: defaultdict(int)) for p in PHASES}
    )
    # (device string, dtype name) -> FLOPs
    by_device_dtype: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    def total(self, phase: str) -> int:
        return int(sum(self.by_phase[phase].get("Global", {}).values()))

    @property
    def model_flops(self) -> int:
        return self.total("forward") + self.total("backward")

    @property
    def hardware_flops(self) -> int:
        return self.model_flops + self.total("recompute")

    def dominant(self) -> tuple[str, str] | None:
        """The (device, dtype) that carried the most FLOPs, or None when nothing was counted."""
        if not self.by_device_dtype:
            return None
        return max(self.by_device_dtype.items(), key=lambda kv: kv[1])[0]

    def _frame(self, keys: list[str], key_name: str, select: Callable[[dict[str, dict[str, int]], str], int],
               columns: list[str]) -> pd.DataFrame:
        import pandas as pd

        records = []
        for key in keys:
            flops = {p: int(select(self.by_phase[p], key)) for p in PHASES}
            record: dict[str, Any] = {key_name: key}
            if "depth" in columns:
                record["depth"] = key.count(".")
            record.update({
                "forward_flops": flops["forward"],
                "backward_flops": flops["backward"],
                "recompute_flops": flops["recompute"],
                "model_flops": flops["forward"] + flops["backward"],
                "hardware_flops": flops["forward"] + flops["backward"] + flops["recompute"],
            })
            records.append(record)
        return pd.DataFrame.from_records(records, columns=columns)

    def module_frame(self) -> pd.DataFrame:
        names = sorted({m for p in PHASES for m in self.by_phase[p] if m != "Global"})
        return self._frame(names, "module", lambda counts, m: sum(counts.get(m, {}).values()), MODULE_COLUMNS)

    def op_frame(self) -> pd.DataFrame:
        ops = sorted({op for p in PHASES for op in self.by_phase[p].get("Global", {})})
        frame = self._frame(ops, "op", lambda counts, op: counts.get("Global", {}).get(op, 0), OP_COLUMNS)
        return frame.sort_values(["hardware_flops", "op"], ascending=[False, True]).reset_index(drop=True)


def _cpu_attention_formulas() -> dict[Any, Any]:
    """torch's SDPA FLOP formulas applied to the CPU flash-attention kernels it has no entry for."""
    import torch
    from torch.utils import flop_counter

    def forward_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                      **kwargs: Any) -> int:
        return int(flop_counter.sdpa_flop_count(query, key, value))

    def backward_flops(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                       **kwargs: Any) -> int:
        return int(flop_counter.sdpa_backward_flop_count(grad_out, query, key, value))

    formulas: dict[Any, Any] = {}
    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", forward_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", backward_flops),
    ):
        try:
            packet = getattr(torch.ops.aten, name)
        except (AttributeError, RuntimeError):  # an older/newer torch without this kernel
            continue
        if packet not in flop_counter.flop_registry:  # torch's own formula wins once it has one
            formulas[packet] = formula
    return formulas


def _first_tensor(args: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_flatten

    for leaf in tree_flatten(args)[0]:
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def _make_counter() -> Any:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    if not hasattr(FlopCounterMode, "_count_flops"):
        raise MetricsError(
            f"torch {torch.__version__}'s FlopCounterMode has no _count_flops hook, which nbtoolkit uses to "
            "split FLOPs by phase: use torch 2.4 or newer"
        )

    class PhaseFlopCounter(FlopCounterMode):
        """FlopCounterMode that also files each op's FLOPs under forward/backward/recompute."""

        def __init__(self) -> None:
            super().__init__(display=False, custom_mapping=_cpu_attention_formulas())
            self.counts = FlopCounts()

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            if func_packet in self.flop_registry:
                flops = int(self.flop_registry[func_packet](*args, **kwargs, out_val=out))
                if torch._C._current_graph_task_id() == -1:
                    phase = "forward"
                elif torch.is_grad_enabled():
                    phase = "recompute"
                else:
                    phase = "backward"
                op = str(func_packet)
                by_module = self.counts.by_phase[phase]
                for parent in set(self.mod_tracker.parents):
                    by_module[parent][op] += flops
                tensor = _first_tensor(args)
                if tensor is not None:
                    key = (str(tensor.device), str(tensor.dtype).removeprefix("torch."))
                    self.counts.by_device_dtype[key] += flops
            return out

    return PhaseFlopCounter()


def _call(step: Callable[[], Any], what: str) -> Any:
    try:
        return step()
    except (KeyboardInterrupt, MetricsError):
        raise
    except Exception as exc:
        raise MetricsError(
            f"the step raised {type(exc).__name__} during {what}: {exc}. Step metrics need a step that "
            "runs: fix it (run `step()` alone to see the full traceback) and measure again"
        ) from exc


def count_step_flops(step: Callable[[], Any]) -> FlopCounts:
    """Run ``step`` once under torch's FlopCounterMode and return its FLOPs by phase, module and op.

    The counter and its module hooks are removed when the step returns or raises.
    """
    counter = _make_counter()
    with warnings.catch_warnings():
        # The counter's module tracker installs global module hooks; torch.compile warns that they
        # fire once more for the OptimizedModule wrapper. Ours, harmless for counting: not the user's.
        warnings.filterwarnings(
            "ignore", message=r"Using `torch.compile\(module\)` when there are global hooks"
        )
        with counter:
            _call(step, "FLOP counting")
    counts: FlopCounts = counter.counts
    return counts


def _synchronize(device: str) -> None:
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
    _synchronize(device)
    for index in range(steps):
        start = time.perf_counter()
        _call(step, f"timed step {index + 1} of {steps}")
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def _device_name(device: str) -> str:
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


def _dtype_of(dtype: Any) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise NbtUsageError(f"dtype={dtype!r} is not a torch dtype: pass e.g. torch.bfloat16 or 'float32'")
    return value


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
            _synchronize(str(device))
            start = time.perf_counter()
            out = torch.mm(a, b)  # also the untimed warm-up of the final size
            _synchronize(str(device))
            once = time.perf_counter() - start
            if size >= MATMUL_SIZE or once > MATMUL_GROW_S:
                break
            size *= 2
        runs = max(1, min(MATMUL_RUNS, int(MATMUL_BUDGET_S / max(once, 1e-9))))
        best = math.inf
        for _ in range(runs):
            _synchronize(str(device))
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            _synchronize(str(device))
            best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best, size, runs


def measure_matmul_peak(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of the fastest of a few large matrix products on ``device`` in ``dtype``
    (see ``_measure_matmul``); the default ``measure_peak`` of :func:`step_metrics`."""
    return _measure_matmul(device, dtype)[0]


def _given_peak(peak_flops: Any) -> tuple[float, str]:
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
) -> tuple[float, str]:
    """(peak FLOP/s, source): given > datasheet table > measured (cached per process)."""
    import torch

    from nbtoolkit.analysis.device_peaks import lookup_peak, precision_of

    dtype_name = str(dtype).removeprefix("torch.")
    if peak_flops is not None:
        return _given_peak(peak_flops)
    name = _device_name(device)
    if not device.startswith("cpu"):
        precision = precision_of(dtype_name, tf32=_tf32_enabled())
        found = lookup_peak(name, precision) if (name and precision) else None
        if found is not None:
            return found
    where = f"this CPU ({name})" if device.startswith("cpu") else f"{device} ({name or 'unknown device'})"
    key = (device, dtype_name, torch.get_num_threads() if device.startswith("cpu") else 0)
    if measure_peak is None and key in _MEASURED_PEAKS:
        return _MEASURED_PEAKS[key]
    size = runs = 0
    try:
        if measure_peak is None:
            value, size, runs = _measure_matmul(torch.device(device), dtype)
        else:
            value = measure_peak(torch.device(device), dtype)
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
    if measure_peak is None:
        source = f"measured: {size}x{size} {dtype_name} matmul on {where}, best of {runs} runs"
        _MEASURED_PEAKS[key] = (float(value), source)
    else:
        source = f"measured: {getattr(measure_peak, '__name__', 'measure_peak')} on {where} in {dtype_name}"
    return float(value), source


def _positive_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NbtUsageError(f"{name}={value!r}: pass an integer >= {minimum}")
    return value


def step_metrics(
    step: Callable[[], Any],
    *,
    model: Any = None,
    steps: int = 3,
    warmup: int = 1,
    tokens_per_step: int | None = None,
    samples_per_step: int | None = None,
    dtype: Any = None,
    peak_flops: float | None = None,
    measure_peak: Callable[[torch.device, torch.dtype], float] | None = None,
) -> StepMetrics:
    """Model FLOPs, hardware FLOPs, step time, achieved FLOP/s, MFU and HFU of one training step.

    Args:
        step: a zero-argument callable running one training step (forward, backward, optimizer).
            It is called ``warmup + 1 + steps`` times.
        model: the model (optional): its parameter count is reported, and its parameters'
            device/dtype are used when the step runs no counted op on a device.
        steps: timed steps; the median is the step time.
        warmup: untimed steps first (compilation, caches).
        tokens_per_step / samples_per_step: how many tokens / samples one step processes, for
            tokens/s and samples/s.
        dtype: the dtype whose peak applies (default: the dtype that carried most FLOPs, so
            autocast to bf16 picks the bf16 peak).
        peak_flops: the device's peak FLOP/s, to override the table and the measurement.
        measure_peak: ``(torch.device, torch.dtype) -> FLOP/s`` used for devices not in the
            table (default: the best of a few timed matrix products up to 2048x2048, cached
            per process).

    Raises:
        MetricsError: the step raised, ran no FLOP-counted op, or the peak is unknown and
            cannot be measured.
        NbtUsageError: bad arguments.
    """
    steps_n = _positive_int("steps", steps, minimum=1)
    warmup_n = _positive_int("warmup", warmup, minimum=0)
    assert steps_n is not None and warmup_n is not None
    options = _Options.check(step, model=model, tokens_per_step=tokens_per_step,
                             samples_per_step=samples_per_step, dtype=dtype, peak_flops=peak_flops,
                             measure_peak=measure_peak)
    for index in range(warmup_n):
        _call(step, f"warm-up step {index + 1} of {warmup_n}")
    counted = _count_and_peak(step, options)
    times = time_steps(step, steps=steps_n, device=counted.device)
    return _build(counted, times, options, warmup=warmup_n)


def step_metrics_from_times(
    step: Callable[[], Any],
    step_times_s: Sequence[float],
    *,
    times_note: str | None = None,
    model: Any = None,
    tokens_per_step: int | None = None,
    samples_per_step: int | None = None,
    dtype: Any = None,
    peak_flops: float | None = None,
    measure_peak: Callable[[torch.device, torch.dtype], float] | None = None,
) -> StepMetrics:
    """Like :func:`step_metrics`, with step times measured elsewhere (by ``nbt.optimize``'s
    measurement or a profiled run): ``step`` runs once, under the FLOP counter, and nothing is timed.

    ``times_note`` says where the times come from; it becomes a note of the result (e.g.
    ``"step times measured under torch.profiler: MFU is a lower bound"``).
    """
    options = _Options.check(step, model=model, tokens_per_step=tokens_per_step,
                             samples_per_step=samples_per_step, dtype=dtype, peak_flops=peak_flops,
                             measure_peak=measure_peak)
    times = [float(t) for t in step_times_s]
    if not times:
        raise NbtUsageError("step_times_s is empty: pass the seconds of at least one timed step")
    counted = _count_and_peak(step, options)
    notes = [times_note] if times_note else []
    return _build(counted, times, options, warmup=0, notes=notes)


def add_step_metrics(measurement: Any, step: Callable[[], Any], *, errors: str = "note",
                     **options: Any) -> StepMetrics | None:
    """Count the FLOPs of ``step`` once and attach FLOPs, FLOP/s, MFU, HFU (and tokens/s with
    ``tokens_per_step=``) to a :class:`~nbtoolkit.model.comparison.Measurement`, using the step
    times it already holds. For ``nbt.optimize``: one line per measured configuration.

    ``errors="note"`` (default): when the metrics cannot be computed (no FLOP-counted op, an
    unknown peak that cannot be measured, the step raised), the measurement gets one row
    ``step metrics: not available: <why>`` instead, and None is returned; ``"raise"`` raises.
    ``options`` are those of :func:`step_metrics_from_times`.
    """
    if errors not in ("note", "raise"):
        raise NbtUsageError(f"errors={errors!r}: pass 'note' or 'raise'")
    extra = getattr(measurement, "extra", None)
    times = getattr(measurement, "step_times_s", None)
    if not isinstance(extra, MutableMapping) or not times:
        raise NbtUsageError(
            f"cannot add step metrics to {type(measurement).__name__}: it needs an `extra` mapping and "
            "`step_times_s`; pass a nbtoolkit Measurement with timed steps"
        )
    try:
        metrics = step_metrics_from_times(step, times, **options)
    except MetricsError as exc:
        if errors == "raise":
            raise
        extra["step metrics"] = f"not available: {exc}"
        return None
    attach_step_metrics(measurement, metrics)
    return metrics


def step_metrics_note(step: Callable[[], Any], step_times_s: Sequence[float], **options: Any) -> str:
    """One line for a profile summary: ``"step metrics: MFU 12.3% · HFU ... (peak ..., measured)"``,
    or ``"step metrics not available: <why>"``. Runs ``step`` once under the FLOP counter."""
    try:
        metrics = step_metrics_from_times(step, step_times_s, **options)
    except MetricsError as exc:
        return f"step metrics not available: {exc}"
    return f"step metrics: {metrics.summary_line()}"


@dataclass(frozen=True)
class _Options:
    """Validated arguments shared by the entry points."""

    model: Any
    tokens: int | None
    samples: int | None
    dtype: Any
    peak_flops: float | None
    measure_peak: Callable[[torch.device, torch.dtype], float] | None

    @classmethod
    def check(cls, step: Any, *, model: Any, tokens_per_step: Any, samples_per_step: Any, dtype: Any,
              peak_flops: Any, measure_peak: Any) -> _Options:
        if not callable(step):
            raise NbtUsageError(
                f"step must be a zero-argument callable running one training step, got {type(step).__name__}"
            )
        tokens = _positive_int("tokens_per_step", tokens_per_step, minimum=1, optional=True)
        samples = _positive_int("samples_per_step", samples_per_step, minimum=1, optional=True)
        wanted = _dtype_of(dtype) if dtype is not None else None
        if peak_flops is not None:
            _given_peak(peak_flops)  # a bad value fails before any step runs
        if measure_peak is not None and not callable(measure_peak):
            raise NbtUsageError("measure_peak must be a function (torch.device, torch.dtype) -> FLOP/s")
        return cls(model, tokens, samples, wanted, peak_flops, measure_peak)


@dataclass(frozen=True)
class _Counted:
    """One counted step and the peak that applies to it."""

    counts: FlopCounts
    device: str
    dtype: Any
    peak: float
    source: str


def _count_and_peak(step: Callable[[], Any], options: _Options) -> _Counted:
    counts = count_step_flops(step)
    if counts.model_flops <= 0:
        raise MetricsError(
            "the step ran no FLOP-counted operation (matrix product, convolution or attention; torch's "
            "FlopCounterMode counts only those), so model FLOPs are 0 and MFU is undefined. Pass a step "
            "that runs the model's forward and backward"
        )
    device, dtype_name = counts.dominant() or _model_device_dtype(options.model)
    run_dtype = options.dtype or _dtype_of(dtype_name)
    # the peak before any timing: when it cannot be had, no timed step is wasted
    peak, source = resolve_peak(device, run_dtype, peak_flops=options.peak_flops,
                                measure_peak=options.measure_peak)
    return _Counted(counts, device, run_dtype, peak, source)


def _build(counted: _Counted, times: list[float], options: _Options, *, warmup: int,
           notes: list[str] | None = None) -> StepMetrics:
    counts = counted.counts
    notes = list(notes or [])
    if counts.total("backward") == 0:
        notes.append("no backward FLOPs were counted: the step looks like a forward pass only")
    if counts.total("recompute"):
        share = counts.total("recompute") / counts.hardware_flops
        notes.append(f"{100 * share:.1f}% of the executed FLOPs are recomputation (activation checkpointing)")
    parameters = None
    if options.model is not None and hasattr(options.model, "parameters"):
        parameters = int(sum(p.numel() for p in options.model.parameters()))
    return StepMetrics(
        model_flops=counts.model_flops,
        hardware_flops=counts.hardware_flops,
        forward_flops=counts.total("forward"),
        step_times_s=times,
        peak_flops=counted.peak,
        peak_source=counted.source,
        dtype=str(counted.dtype).removeprefix("torch."),
        device=counted.device,
        device_name=_device_name(counted.device),
        by_module=counts.module_frame(),
        by_op=counts.op_frame(),
        tokens_per_step=options.tokens,
        samples_per_step=options.samples,
        parameters=parameters,
        warmup=warmup,
        notes=notes,
    )


def _model_device_dtype(model: Any) -> tuple[str, str]:
    if model is not None and hasattr(model, "parameters"):
        for p in model.parameters():
            if p.is_floating_point():
                return str(p.device), str(p.dtype).removeprefix("torch.")
    return "cpu", "float32"
