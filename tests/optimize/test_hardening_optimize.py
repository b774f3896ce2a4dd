"""optimize() that changes nothing says so; comparisons call differences inside the noise noise."""

from __future__ import annotations

import torch

import nbtoolkit as nbt
from nbtoolkit.recompute.comparison import Comparison, Measurement
from tests.optimize._models import make_gpt


def _m(label: str, times: list[float]) -> Measurement:
    ordered = sorted(times)
    return Measurement(
        label=label,
        step_time_s=ordered[len(ordered) // 2],
        step_time_spread_s=0.0,  # recomputed from the times where they are kept
        step_times_s=times,
        peak_bytes=1000,
    )


def test_overlapping_step_times_are_flagged_as_noise() -> None:
    before = _m("before", [0.010, 0.011, 0.016, 0.020, 0.021])
    after = _m("after", [0.009, 0.010, 0.010, 0.015, 0.016])  # median 1.6x lower, quartiles overlap
    comparison = Comparison(before, after, changes=["autocast bf16"])
    assert comparison.speedup > 1.5
    assert comparison.time_within_noise
    change = comparison.table().set_index("metric").loc["step time (median)", "change"]
    assert change.endswith("(noise)")
    text = repr(comparison)
    assert "within the measured noise" in text and "× speed)" not in text


def test_separated_step_times_are_a_speedup() -> None:
    before = _m("before", [0.020, 0.021, 0.022, 0.023, 0.024])
    after = _m("after", [0.010, 0.011, 0.012, 0.013, 0.014])
    comparison = Comparison(before, after, changes=["torch.compile"])
    assert not comparison.time_within_noise
    assert comparison.table().set_index("metric").loc["step time (median)", "change"] == "0.55×"
    assert "1.83× speed" in repr(comparison)


def test_noise_from_a_saved_comparison_uses_the_stored_spread(tmp_path) -> None:
    before = Measurement(label="before", step_time_s=0.020, step_time_spread_s=0.010)
    after = Measurement(label="after", step_time_s=0.017, step_time_spread_s=0.010)
    path = Comparison(before, after).save(tmp_path / "c.json")
    assert Comparison.load(path).time_within_noise
    far = Measurement(label="after", step_time_s=0.005, step_time_spread_s=0.001)
    assert not Comparison(before, far).time_within_noise


def test_optimize_with_nothing_to_apply_says_so() -> None:
    model, step = make_gpt(batch=2, seq=8, hidden=[16])
    result = nbt.optimize(model, step, steps=2,
        config=nbt.MeasureConfig(warmup=0, categories=False, metrics=False))
    assert result.changes == []
    assert result.nothing_applied is not None and "no change was asked for" in result.nothing_applied
    text = repr(result)
    assert "nothing to apply" in text and "× speed" not in text


def test_optimize_of_a_model_without_parameters_says_so(tmp_path) -> None:
    model = torch.nn.ReLU()
    x = torch.randn(16, 16)

    def step() -> None:
        model(x).sum()

    result = nbt.optimize(model, step, steps=2,
        config=nbt.MeasureConfig(warmup=0, categories=False, metrics=False))
    assert "the model has no parameters" in str(result.nothing_applied)
    loaded = Comparison.load(result.save(tmp_path / "c.json"))
    assert loaded.nothing_applied == result.nothing_applied
    assert "nothing to apply" in repr(loaded)


def test_optimize_that_applies_something_has_no_such_note() -> None:
    model, step = make_gpt(batch=2, seq=8, hidden=[16])
    result = nbt.optimize(model, step, amp="bf16", steps=2,
        config=nbt.MeasureConfig(warmup=0, categories=False, metrics=False))
    assert result.changes and result.nothing_applied is None
