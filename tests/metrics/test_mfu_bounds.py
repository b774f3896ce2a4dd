"""An MFU above 100% is never shown: a peak below what a step achieved is measured again once,
and if still below, MFU and HFU are "not available" with the reason, in every display."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.metrics import cpu_peak as peaks
from nbtoolkit.metrics.cpu_load import CpuWatch
from nbtoolkit.metrics.figures import mfu_chart
from nbtoolkit.metrics.step_metrics import measurement_extra, metrics_frame


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    peaks.clear_cpu_peaks()
    yield
    peaks.clear_cpu_peaks()


def _percentages(text: str) -> list[float]:
    return [float(v.replace(",", "")) for v in re.findall(r"([\d,]+(?:\.\d+)?)\s*%", text)]


def _assert_nothing_above_100_percent(m: nbt.StepMetrics) -> None:
    shown = [m.summary_line(), repr(m), m._repr_html_() or ""]
    for text in shown:
        assert all(p <= 100.0 for p in _percentages(text)), text
    extra = measurement_extra(m)
    assert all(not isinstance(v, float) or v <= 100 for k, v in extra.items() if "%" in k), extra
    frame = metrics_frame([m])
    assert frame["mfu"].isna().all() and frame["hfu"].isna().all()
    figure = mfu_chart([("step", m)])
    assert all(v is None for v in figure.data[0].y)
    assert "n/a" in figure.data[0].text[0]


def test_a_cpu_peak_below_the_achieved_rate_is_measured_again_then_unavailable(
        make_gpt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []

    def too_low(dtypes: Any, **kwargs: Any) -> dict[str, peaks.MeasuredPeak]:
        # what a peak measured under heavy load looks like: far below what the step reaches
        calls.append(True)
        with CpuWatch(1) as watch:
            pass
        assert watch.window is not None
        return {d: peaks.MeasuredPeak(dtype=d, flops=1e6, size=2048, trials=5, attempts=1, threads=1,
                                      window=watch.window, measured_at=time.time()) for d in dtypes}

    monkeypatch.setattr(peaks, "_measure", too_low)
    setup = make_gpt()
    m = nbt.step_metrics(setup.step, steps=2, warmup=0)
    assert len(calls) == 2  # measured, then measured again once when the step beat it
    assert m.peak_kind == "measured" and m.peak_flops == 1e6
    assert m.mfu is None and m.hfu is None and m.mfu_range is None
    assert m.mfu_unavailable is not None
    assert "measured CPU peak" in m.mfu_unavailable and "below what this step achieved" in m.mfu_unavailable
    assert "busy" in m.mfu_unavailable and "also when measured again" in m.mfu_unavailable
    assert "MFU not available" in m.summary_line()
    assert any("measured again" in note for note in m.notes)
    _assert_nothing_above_100_percent(m)
    assert str(measurement_extra(m)["MFU (%)"]).startswith("not available: the measured CPU peak")


def test_a_peak_beaten_once_and_higher_when_measured_again_gives_an_mfu(make_gpt: Any) -> None:
    values = iter([1e6, 1e15])
    calls: list[float] = []

    def probe(device: torch.device, dtype: torch.dtype) -> float:
        calls.append(value := next(values))
        return value

    setup = make_gpt()
    m = nbt.step_metrics(setup.step, steps=2, warmup=0, measure_peak=probe)
    assert calls == [1e6, 1e15]
    assert m.peak_flops == 1e15 and m.mfu is not None and 0 < m.mfu <= 1
    assert any("measured again" in note for note in m.notes)


def test_a_given_peak_below_the_achieved_rate_is_unavailable_not_above_100(make_gpt: Any) -> None:
    setup = make_gpt()
    m = nbt.step_metrics(setup.step, steps=2, warmup=0, peak_flops=1e3)
    assert m.mfu is None and m.mfu_unavailable is not None
    assert m.mfu_unavailable.startswith("the peak (") and "peak_flops=" in m.mfu_unavailable
    _assert_nothing_above_100_percent(m)


def test_the_data_class_itself_refuses_to_show_more_than_100_percent(tmp_path: Any) -> None:
    m = nbt.StepMetrics(model_flops=10**12, hardware_flops=10**12, step_times_s=[0.5, 1.0], peak_flops=1.5e12,
                        peak_source="table: NVIDIA A100 bf16 dense (312.0 TFLOP/s, NVIDIA A100 datasheet)",
                        dtype="bfloat16", device="cuda:0")
    # the median step reaches 1.33 TFLOP/s (89%), the fastest 2 TFLOP/s: above the peak
    assert m.mfu is None and m.mfu_unavailable is not None and "datasheet peak" in m.mfu_unavailable
    assert nbt.StepMetrics.load(m.save(tmp_path / "m.json")).mfu is None
    _assert_nothing_above_100_percent(m)
    fine = nbt.StepMetrics(model_flops=10**12, hardware_flops=10**12, step_times_s=[1.0], peak_flops=2e12,
                           peak_source="given: peak_flops=2e12 FLOP/s", dtype="float32")
    assert fine.mfu == pytest.approx(0.5) and fine.mfu_unavailable is None
