"""The helpers other features call: metrics from step times measured elsewhere, attached to a
Measurement (nbt.optimize), or as one line of a profile summary."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.core.step_runner import run_steps
from nbtoolkit.metrics.measure import (
    add_step_metrics,
    step_metrics_from_times,
    step_metrics_note,
)
from nbtoolkit.recompute.comparison import Comparison, Measurement


def _idle_step() -> None:
    torch.ones(8).mul(2).sum()  # no matmul, conv or attention


def test_metrics_from_times_counts_once_and_times_nothing(make_gpt: Any) -> None:
    setup = make_gpt()
    calls = []

    def step() -> Any:
        calls.append(1)
        return setup.step()

    m = step_metrics_from_times(step, [0.2, 0.1], times_note="times from elsewhere", peak_flops=1e12)
    assert len(calls) == 1
    assert m.step_time_s == pytest.approx(0.15)
    assert m.model_flops == pytest.approx(setup.analytic_model_flops(), rel=0.05)
    assert "times from elsewhere" in m.notes
    with pytest.raises(nbt.NbtUsageError, match="step_times_s is empty"):
        step_metrics_from_times(step, [])


def test_add_step_metrics_to_measurements_of_a_comparison(make_gpt: Any) -> None:
    plain, ckpt = make_gpt(), make_gpt(recompute="non-reentrant")
    measurements = []
    for label, setup in (("before", plain), ("after", ckpt)):
        times = run_steps(setup.step, nbt.MeasureConfig(steps=2, warmup=0), device="cpu").times_s
        measurement = Measurement(label=label, step_time_s=sorted(times)[0], step_time_spread_s=0.0,
                                  step_times_s=times)
        metrics = add_step_metrics(measurement, setup.step, tokens_per_step=setup.tokens)
        assert metrics is not None and metrics.step_times_s == times
        measurements.append(measurement)
    table = Comparison(before=measurements[0], after=measurements[1]).table().set_index("metric")
    assert table.loc["model GFLOP / step", "change"] == "1.00×"  # recomputation is not model work
    hardware_change = float(table.loc["hardware GFLOP / step", "change"].rstrip("×"))
    assert hardware_change > 1.0
    assert "tokens/s" in table.index and "MFU (%)" in table.index


def test_add_step_metrics_notes_what_is_missing_instead_of_failing() -> None:
    measurement = Measurement(label="x", step_time_s=0.1, step_time_spread_s=0.0, step_times_s=[0.1])
    assert add_step_metrics(measurement, _idle_step) is None
    assert measurement.extra["step metrics"].startswith("not available: the step ran no FLOP-counted")
    with pytest.raises(nbt.MetricsError, match="no FLOP-counted"):
        add_step_metrics(measurement, _idle_step, errors="raise")
    with pytest.raises(nbt.NbtUsageError, match="needs an `extra` mapping"):
        add_step_metrics(object(), _idle_step)


def test_step_metrics_note_for_a_profile_summary(make_gpt: Any) -> None:
    setup = make_gpt()
    assert step_metrics_note(setup.step, [0.1], peak_flops=1e12).startswith("step metrics: MFU ")
    assert step_metrics_note(_idle_step, [0.1]).startswith("step metrics not available: the step ran no")
