"""The measured CPU peak: fp32 and bf16 at one moment, cached with its conditions, measured
again while a real competing process keeps the machine busy, and said so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from nbtoolkit.metrics import cpu_peak as peaks
from nbtoolkit.metrics.cpu_load import CpuWatch
from nbtoolkit.metrics.peak_flops import resolve_peak


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    peaks.clear_cpu_peaks()
    yield
    peaks.clear_cpu_peaks()


def test_fp32_and_bf16_are_measured_together_once(monkeypatch: pytest.MonkeyPatch) -> None:
    measurements: list[list[str]] = []
    real = peaks._measure

    def counted(dtypes: Any, **kwargs: Any) -> Any:
        measurements.append(list(dtypes))
        return real(dtypes, **kwargs)

    monkeypatch.setattr(peaks, "_measure", counted)
    fp32, fp32_source = resolve_peak("cpu", torch.float32)  # an fp32 configuration of nbt.optimize
    bf16, bf16_source = resolve_peak("cpu", torch.bfloat16)  # its autocast configuration, later
    assert len(measurements) == 1  # the bf16 peak came from the same measurement, not a later one
    assert set(measurements[0]) == {"float32", "bfloat16"}
    assert fp32 > 0 and bf16 > 0
    measured = peaks.cpu_peaks()
    assert measured["float32"].together_with == ("bfloat16",)
    assert measured["bfloat16"].together_with == ("float32",)
    assert measured["float32"].attempts == measured["bfloat16"].attempts  # interleaved trials
    assert abs(measured["float32"].measured_at - measured["bfloat16"].measured_at) <= peaks.PEAK_PATIENCE_S
    for source, dtype in ((fp32_source, "float32"), (bf16_source, "bfloat16")):
        assert re.match(rf"measured: \d+x\d+ {dtype} matmul on this CPU", source), source
        assert f"{torch.get_num_threads()} thread" in source and " at " in source


def _fake(flops: float) -> Any:
    def measure(dtypes: Any, **kwargs: Any) -> dict[str, peaks.MeasuredPeak]:
        with CpuWatch(1) as watch:
            pass
        assert watch.window is not None
        return {d: peaks.MeasuredPeak(dtype=d, flops=flops, size=64, trials=1, attempts=1, threads=1,
                                      window=watch.window, measured_at=time.time()) for d in dtypes}

    return measure


def test_a_cached_peak_is_kept_with_its_conditions_and_replaced_only_by_a_higher_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peaks, "_measure", _fake(100e9))
    first = peaks.cpu_peak("float32")
    assert peaks.cpu_peak("float32") is first  # cached: the same measurement, conditions and all
    monkeypatch.setattr(peaks, "_measure", _fake(50e9))  # a busier moment
    assert peaks.cpu_peak("float32", refresh=True).flops == 100e9
    monkeypatch.setattr(peaks, "_measure", _fake(200e9))  # a quieter one
    assert peaks.cpu_peak("float32", refresh=True).flops == 200e9
    assert peaks.cpu_peak("bfloat16").flops == 200e9  # measured alongside


@pytest.fixture
def competing_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Real CPU-bound processes, one per CPU this process may use, for the test's duration."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    time.sleep(0.5)  # let them start spinning
    try:
        yield burners
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc/stat to see the others")
def test_a_busy_machine_is_measured_again_and_said_so(competing_processes: list[Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    a = torch.randn(512, 512)
    with CpuWatch(torch.get_num_threads()) as watch:
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:
            torch.mm(a, a)
    window = watch.window
    assert window is not None and window.others_share is not None
    assert window.busy(saturating=True), window
    assert window.others_share > 0.3
    assert "other processes used" in window.describe()

    # short attempts (about 0.2 s of products each), so that more than one fits in the patience
    # even when the machine is loaded beyond the two burners
    monkeypatch.setattr(peaks, "MATMUL_SIZE", 256)
    measured = peaks.cpu_peak("float32", patience_s=5.0)
    assert measured.attempts > 1  # busy: measured again after a pause, within the patience
    assert measured.busy
    source = measured.source("this CPU")
    assert "other processes used" in source and "stayed busy" in source and "MFU high" in source
