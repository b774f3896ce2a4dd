"""Before/after timed interleaved: machine load that hits one half of a measurement is not a result.

The load tests run a real nbt.optimize on a real model while a busy thread and a busy process
load this machine during the first half of the measurement only. Measured one after the other,
that half would be the "before" side and the change would look like a speed-up.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

import nbtoolkit as nbt
from nbtoolkit.core.interleaved import (
    FASTER,
    SAME,
    SLOWER,
    UNCLEAR,
    median_interval,
    time_interleaved,
    verdict,
)
from nbtoolkit.recompute.comparison import Comparison


def test_median_interval_is_the_binomial_order_statistics() -> None:
    values = list(range(1, 21))  # n=20: 95% interval of the median is the 6th to the 15th value
    assert median_interval(values) == (6, 15)
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)  # n=5: smallest to largest
    low, high = median_interval([1.0])
    assert low == high == 1.0
    assert all(math.isnan(v) for v in median_interval([]))


def test_verdict_needs_the_whole_interval_outside_the_band() -> None:
    assert verdict(0.60, 0.70, 10) == FASTER
    assert verdict(1.30, 1.60, 10) == SLOWER
    assert verdict(0.99, 1.01, 10) == SAME
    assert verdict(0.90, 1.10, 10) == UNCLEAR
    assert verdict(0.60, 0.70, 4) == UNCLEAR  # too few rounds for any verdict


def _sleeper(seconds: float) -> Any:
    def run() -> tuple[float, float]:
        start = time.perf_counter()
        time.sleep(seconds)
        return time.perf_counter() - start, 0.0

    return run


def test_rounds_stop_when_clear_and_grow_until_the_time_limit_when_not() -> None:
    clear = time_interleaved(_sleeper(0.002), _sleeper(0.004), min_rounds=3, time_limit_s=5)
    assert clear.verdict == SLOWER and clear.stopped == "clear" and clear.rounds >= 5
    assert len(clear.quiet) >= 5
    assert 1.6 < clear.ratio < 2.4 and "slower" in clear.reading()
    jitter = random.Random(0)

    def noisy() -> tuple[float, float]:  # 0.5 to 3.5 ms around the other side's 2 ms: no clear difference
        seconds = jitter.uniform(0.0005, 0.0035)
        time.sleep(seconds)
        return seconds, 0.0

    unclear = time_interleaved(_sleeper(0.002), noisy, min_rounds=3, time_limit_s=0.3)
    assert unclear.verdict == UNCLEAR and unclear.stopped == "time limit" and unclear.rounds > 5
    assert unclear.reading().startswith("no measurable change") and "time limit" in unclear.reading()


class _Heavy(nn.Module):
    """Matmuls against fixed weights: the forward costs as much as the backward (input grads only)."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(dim, dim) / dim**0.5, requires_grad=False)
                                        for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for weight in self.weights:
            x = torch.tanh(x @ weight)
        return x


class _Net(nn.Module):
    def __init__(self, dim: int = 192, depth: int = 6) -> None:
        super().__init__()
        self.first = nn.Linear(dim, dim)
        self.heavy = _Heavy(dim, depth)
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.heavy(self.first(x))).mean()


def _model_and_step() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = _Net()
    data = torch.randn(256, 192)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(data)
        loss.backward()
        opt.step()
        return loss

    return model, step


@contextmanager
def _load_during_first_half() -> Iterator[Any]:
    """A progress callback that loads the machine (a busy thread and a busy process) from the
    start until half the minimum interleaved rounds have run, then stops the load."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(10_000))

    thread = threading.Thread(target=spin, daemon=True)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    thread.start()

    def progress(done: int, total: int, what: str) -> None:
        if what.startswith("measuring: round ") and int(what.split()[2]) >= 5:
            stop.set()
            if busy.poll() is None:
                busy.kill()

    try:
        yield progress
    finally:
        stop.set()
        busy.kill()
        busy.wait()
        thread.join()


def _optimize(recompute: list[str], progress: Any) -> Comparison:
    model, step = _model_and_step()
    config = nbt.MeasureConfig(steps=3, warmup=1, memory=False, metrics=False, time_limit_s=20)
    return nbt.optimize(model, step, recompute=recompute, config=config, progress=progress)


def test_a_no_op_change_under_load_in_the_first_half_is_no_speed_up() -> None:
    # nothing asked for: the same step on both sides, the purest no-op change
    model, step = _model_and_step()
    config = nbt.MeasureConfig(steps=3, warmup=1, memory=False, metrics=False, time_limit_s=20)
    with _load_during_first_half() as progress:
        comparison = nbt.optimize(model, step, config=config, progress=progress)
    timing = comparison.timing
    assert timing is not None and timing.verdict in (SAME, UNCLEAR), timing.reading()
    assert comparison.time_within_noise and comparison.nothing_applied
    assert "faster" not in repr(comparison) and "× speed" not in repr(comparison)
    assert 0.9 < comparison.speedup < 1.1


def test_a_real_one_and_a_half_times_change_under_load_is_found() -> None:
    # checkpointing the heavy block re-runs its forward in the backward: forward + backward of a
    # step that is mostly this block become forward + forward + backward, about 1.5x the time
    with _load_during_first_half() as progress:
        comparison = _optimize(["heavy"], progress)
    timing = comparison.timing
    assert timing is not None and timing.verdict == SLOWER, timing.reading()
    assert 1.3 < timing.ratio < 1.8
    assert not comparison.time_within_noise
    assert "slower than before" in repr(comparison)


def test_timing_survives_save_and_load(tmp_path: Any) -> None:
    comparison = _optimize(["out"], None)
    loaded = Comparison.load(comparison.save(tmp_path / "c.json"))
    assert loaded.timing is not None and loaded.timing.ratios == comparison.timing.ratios
    assert loaded.time_within_noise == comparison.time_within_noise
    assert loaded.speedup == pytest.approx(comparison.speedup)
