"""A CPU's peak FLOP/s, measured so that the same machine gives the same number.

A CPU has no datasheet figure torch can look up, so MFU on a CPU divides by a measured peak:
the best FLOP/s of large square matrix products. Measured once and naively, it depends on
what else ran at that moment: on a shared machine it came out at half the idle figure
(97.6 against about 200 GFLOP/s) and the same step's MFU moved from 8.6% to 62.5% between
runs. So:

- **best of several trials**: up to ``MATMUL_RUNS`` products per dtype per attempt; the
  fastest counts (a peak is what the hardware reaches, contention only slows it);
- **measured again when the machine was busy**: each attempt is watched
  (:class:`~nbtoolkit.metrics.cpu_load.CpuWatch`: other processes' CPU time on our cores);
  when they took more than ``BUSY_SHARE`` of them, the attempt is repeated after a pause,
  for at most ``PEAK_PATIENCE_S`` seconds; the best of all attempts is kept, with the
  conditions of the attempt that gave it;
- **both dtypes at the same moment**: float32 and bfloat16 (and the dtype asked for, if
  another) are measured together, their trials interleaved, so that MFUs of an fp32 and a
  bf16 configuration (``nbt.optimize`` with and without autocast) divide by peaks taken
  under the same conditions;
- **cached with its conditions** per process, dtype and thread count
  (:class:`MeasuredPeak`): threads, matrix size, trials, attempts, the others' share of the
  cores, the load average and the time. A later request with ``refresh=True`` (a step beat
  the peak) measures again and keeps the higher figure.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nbtoolkit.metrics.cpu_load import MIN_WINDOW_S, CpuWatch, CpuWindow

__all__ = [
    "DTYPES_TOGETHER",
    "MeasuredPeak",
    "clear_cpu_peaks",
    "cpu_peak",
    "cpu_peaks",
]

MATMUL_START = 256
MATMUL_SIZE = 2048
MATMUL_RUNS = 5
MATMUL_GROW_S = 0.5  # stop doubling the matrix once one product takes this long (an emulated dtype)
MATMUL_BUDGET_S = 2.0  # at most about this long for one attempt's timed products of one dtype
PEAK_PATIENCE_S = 8.0  # how long to keep re-measuring while the machine is busy
BUSY_PAUSE_S = 1.0  # wait between a busy attempt and the next
MAX_ATTEMPTS = 4

#: Measured together whenever any CPU peak is measured: what training steps run in.
DTYPES_TOGETHER = ("float32", "bfloat16")

# (dtype name, torch threads) -> the best measurement so far in this process
_CACHE: dict[tuple[str, int], MeasuredPeak] = {}


@dataclass(frozen=True)
class MeasuredPeak:
    """One dtype's measured CPU peak and the conditions it was measured under.

    Attributes:
        dtype: torch dtype name (``"float32"``).
        flops: FLOP/s of the fastest product.
        size: side of the square matrices.
        trials: products timed for this dtype, over all attempts.
        attempts: attempts made (more than one: the machine was busy).
        threads: torch's intra-op threads.
        window: the CPU conditions of the attempt that gave the best product.
        measured_at: ``time.time()`` of that attempt.
        together_with: the other dtypes measured in the same trials.
        spent_s: seconds from the first attempt to the end of the last.
    """

    dtype: str
    flops: float
    size: int
    trials: int
    attempts: int
    threads: int
    window: CpuWindow
    measured_at: float
    together_with: tuple[str, ...] = ()
    spent_s: float = 0.0

    @property
    def busy(self) -> bool:
        """Other processes competed for the cores during the best attempt: the peak is low."""
        return self.window.busy(saturating=True)

    def source(self, where: str) -> str:
        """The ``peak_source`` text: starts with ``"measured: "``, says how and under what load."""
        clock = time.strftime("%H:%M:%S", time.localtime(self.measured_at))
        text = (
            f"measured: {self.size}x{self.size} {self.dtype} matmul on {where}, best of {self.trials} "
            f"trials in {self.attempts} attempt{'s' if self.attempts != 1 else ''}, {self.threads} "
            f"thread{'s' if self.threads != 1 else ''}, at {clock}"
        )
        if self.together_with:
            text += f" together with {', '.join(self.together_with)}"
        text += f"; {self.window.describe()}"
        if self.busy:
            plural = "s" if self.attempts != 1 else ""
            text += (
                f"; the machine stayed busy through {self.attempts} attempt{plural} over "
                f"{self.spent_s:.1f} s, so this peak is low and MFU high"
            )
        return text


def clear_cpu_peaks() -> None:
    """Forget every cached CPU peak (the next request measures again)."""
    _CACHE.clear()


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


@dataclass
class _Operands:
    """The matrices of one dtype, sized so that one product is long enough to time."""

    dtype: str
    a: Any
    b: Any
    out: Any
    size: int


def _operands(dtype_name: str) -> _Operands:
    """Matrices doubling from 256 to ``MATMUL_SIZE`` while one product takes under
    ``MATMUL_GROW_S``: large enough to keep every core busy, without minutes on a dtype the
    CPU emulates slowly (float8, float64 on some). Raises what torch raises for a dtype no
    CPU kernel multiplies."""
    import torch

    dtype = getattr(torch, dtype_name)
    size = MATMUL_START
    with torch.no_grad():
        while True:
            a = torch.randn(size, size).to(dtype)
            b = torch.randn(size, size).to(dtype)
            start = time.perf_counter()
            out = torch.mm(a, b)  # also the untimed warm-up of the final size
            once = time.perf_counter() - start
            if size >= MATMUL_SIZE or once > MATMUL_GROW_S:
                return _Operands(dtype_name, a, b, out, size)
            size *= 2


def _attempt(operands: list[_Operands], threads: int) -> tuple[dict[str, float], dict[str, int], CpuWindow]:
    """One attempt: rounds of one product per dtype, interleaved; the fastest time per dtype.
    ``MATMUL_RUNS`` rounds, more while the attempt is too short for the load to be seen
    (``MIN_WINDOW_S``), fewer when they would take longer than ``MATMUL_BUDGET_S`` per dtype."""
    import torch

    best: dict[str, float] = {o.dtype: float("inf") for o in operands}
    trials: dict[str, int] = {o.dtype: 0 for o in operands}
    with torch.no_grad(), CpuWatch(threads) as watch:
        spent = 0.0
        rounds = 0
        while rounds < MATMUL_RUNS or spent < 2 * MIN_WINDOW_S:
            rounds += 1
            for o in operands:
                start = time.perf_counter()
                torch.mm(o.a, o.b, out=o.out)
                elapsed = time.perf_counter() - start
                best[o.dtype] = min(best[o.dtype], elapsed)
                trials[o.dtype] += 1
                spent += elapsed
            if spent > MATMUL_BUDGET_S * len(operands):
                break
    assert watch.window is not None
    return best, trials, watch.window


def _measure(dtypes: Iterable[str], *, patience_s: float) -> dict[str, MeasuredPeak]:
    """Measure ``dtypes`` together (see the module docstring). The first dtype is the one asked
    for: its failure raises; another that cannot be multiplied on this CPU is left out."""
    names = list(dict.fromkeys(dtypes))
    operands: list[_Operands] = []
    for index, name in enumerate(names):
        try:
            operands.append(_operands(name))
        except Exception:
            if index == 0:
                raise
    threads = _threads()
    started = time.perf_counter()
    best: dict[str, tuple[float, CpuWindow, float]] = {}
    trials = dict.fromkeys((o.dtype for o in operands), 0)
    attempts = 0
    while True:
        attempt_start = time.time()
        fastest, counted, window = _attempt(operands, threads)
        attempts += 1
        for o in operands:
            trials[o.dtype] += counted[o.dtype]
            if o.dtype not in best or fastest[o.dtype] < best[o.dtype][0]:
                best[o.dtype] = (fastest[o.dtype], window, attempt_start)
        if not window.busy(saturating=True) or attempts >= MAX_ATTEMPTS:
            break
        if time.perf_counter() - started + BUSY_PAUSE_S + window.wall_s > patience_s:
            break
        time.sleep(BUSY_PAUSE_S)
    spent = time.perf_counter() - started
    measured = {}
    for o in operands:
        seconds, window, at = best[o.dtype]
        measured[o.dtype] = MeasuredPeak(
            dtype=o.dtype,
            flops=2.0 * o.size**3 / seconds,  # torch's mm formula: 2 FLOPs per multiply-add
            size=o.size,
            trials=trials[o.dtype],
            attempts=attempts,
            threads=threads,
            window=window,
            measured_at=at,
            together_with=tuple(other.dtype for other in operands if other.dtype != o.dtype),
            spent_s=spent,
        )
    return measured


def cpu_peaks(dtypes: Iterable[str] = DTYPES_TOGETHER, *, refresh: bool = False,
              patience_s: float = PEAK_PATIENCE_S) -> dict[str, MeasuredPeak]:
    """The measured peaks of this CPU in ``dtypes`` (torch dtype names), all at one moment.

    Cached peaks are returned as they are; the missing ones (all of them with ``refresh``)
    are measured together with ``DTYPES_TOGETHER``. On ``refresh`` a new measurement replaces
    a cached one only when it is higher. A dtype this CPU cannot multiply raises (the first
    of ``dtypes``) or is left out (the others, and ``DTYPES_TOGETHER``).

    ``nbt.optimize`` and the like call this once before measuring configurations in several
    dtypes, so that every configuration's MFU divides by a peak taken at the same moment.
    """
    wanted = [str(d).removeprefix("torch.") for d in dtypes]
    threads = _threads()
    missing = [d for d in wanted if refresh or (d, threads) not in _CACHE]
    if missing:
        for name, peak in _measure([*missing, *DTYPES_TOGETHER], patience_s=patience_s).items():
            cached = _CACHE.get((name, threads))
            if cached is None or peak.flops > cached.flops:
                _CACHE[(name, threads)] = peak
    return {d: _CACHE[(d, threads)] for d in wanted if (d, threads) in _CACHE}


def cpu_peak(dtype: str, *, refresh: bool = False, patience_s: float = PEAK_PATIENCE_S) -> MeasuredPeak:
    """This CPU's measured peak in one dtype (see :func:`cpu_peaks`)."""
    name = str(dtype).removeprefix("torch.")
    found = cpu_peaks([name], refresh=refresh, patience_s=patience_s)
    return found[name]
