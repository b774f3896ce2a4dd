"""StepMetrics as plain data: display with units, escaping, save/load, refusals of 0/NaN,
and the helpers other summaries use (Measurement.extra, per-run frame, MFU chart)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.metrics.figures import mfu_chart
from nbtoolkit.metrics.step_metrics import (
    MODULE_COLUMNS,
    attach_step_metrics,
    measurement_extra,
    metrics_frame,
)
from nbtoolkit.recompute.comparison import Comparison, Measurement


def _metrics(**overrides: Any) -> nbt.StepMetrics:
    modules = pd.DataFrame.from_records(
        [
            ("Net", "", 0, 1_000, 2_000, 500, 3_000, 3_500, 0, 0),
            ("Net.<script>alert(1)</script>", "Net", 1, 600, 1_200, 500, 1_800, 2_300, 1_800, 2_300),
            ("Net.head", "Net", 1, 400, 800, 0, 1_200, 1_200, 1_200, 1_200),
        ],
        columns=MODULE_COLUMNS,
    )
    values: dict[str, Any] = {
        "model_flops": 3_000_000_000_000,
        "hardware_flops": 3_500_000_000_000,
        "forward_flops": 1_000_000_000_000,
        "step_times_s": [0.5, 0.4, 0.6],
        "peak_flops": 312e12,
        "peak_source": "table: NVIDIA A100 bf16 dense (312.0 TFLOP/s, NVIDIA A100 datasheet)",
        "dtype": "bfloat16",
        "device": "cuda:0",
        "device_name": "NVIDIA A100-SXM4-80GB",
        "by_module": modules,
        "tokens_per_step": 8192,
    }
    values.update(overrides)
    return nbt.StepMetrics(**values)


def test_derived_numbers() -> None:
    m = _metrics()
    assert m.step_time_s == 0.5
    assert m.flops_per_s == pytest.approx(6e12)
    assert m.mfu == pytest.approx(6e12 / 312e12)
    assert m.hfu == pytest.approx(7e12 / 312e12)
    assert m.recompute_flops == 500_000_000_000
    assert m.tokens_per_s == pytest.approx(16384)
    assert m.samples_per_s is None
    assert m.tokens_or_samples_per_s == (pytest.approx(16384), "tokens/s")
    assert m.mfu_range == (pytest.approx(3e12 / 0.6 / 312e12), pytest.approx(3e12 / 0.4 / 312e12))
    assert m.peak_kind == "table"


def test_text_carries_units_and_names_the_peak_source() -> None:
    text = repr(_metrics())
    assert text.startswith("StepMetrics: MFU 1.92% · HFU 2.24% · 6.00 TFLOP/s model · 16,384 tokens/s")
    assert "3.00 TFLOP (forward 1.00 TFLOP + backward 2.00 TFLOP)" in text
    assert "500.0 ms median of 3" in text
    assert "table: NVIDIA A100 bf16 dense" in text
    assert "nan" not in text.lower()


def test_html_escapes_module_names() -> None:
    html = _metrics()._repr_html_()
    assert html is not None
    assert "<script>" not in html and "&lt;script&gt;" in html
    bundle = _metrics()._repr_mimebundle_()
    assert bundle["text/plain"].startswith("StepMetrics:")


def test_top_level_modules_skip_nested_ones() -> None:
    top = _metrics().top_level_modules()
    assert list(top["module"]) == ["Net.<script>alert(1)</script>", "Net.head"]


def test_compares_by_identity_without_touching_the_frames() -> None:
    m = _metrics()
    assert m == m
    assert m != _metrics()
    assert m in [_metrics(), m]


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    m = _metrics(notes=["a note"])
    loaded = nbt.StepMetrics.load(m.save(tmp_path / "m.json"))
    assert loaded.to_dict() == m.to_dict()
    assert repr(loaded) == repr(m)


def test_load_of_a_wrong_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(nbt.NbtUsageError, match="cannot read saved StepMetrics"):
        nbt.StepMetrics.load(bad)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"model_flops": 0, "hardware_flops": 0}, "no FLOP-counted operation"),
        ({"step_times_s": []}, "no step was timed"),
        ({"step_times_s": [0.0]}, "positive finite seconds"),
        ({"step_times_s": [math.nan]}, "positive finite seconds"),
        ({"peak_flops": 0.0}, "peak FLOP/s must be a positive finite number"),
        ({"peak_flops": math.inf}, "peak FLOP/s must be a positive finite number"),
        ({"hardware_flops": 1}, "below model FLOPs"),
    ],
)
def test_values_that_would_divide_by_zero_or_show_nan_are_refused(overrides: dict[str, Any],
                                                                  match: str) -> None:
    with pytest.raises(nbt.MetricsError, match=match):
        _metrics(**overrides)


def test_attach_to_a_measurement_shows_in_the_comparison() -> None:
    before = attach_step_metrics(Measurement(label="before", step_time_s=0.5, step_time_spread_s=0.01),
                                 _metrics())
    after = attach_step_metrics(Measurement(label="after", step_time_s=0.25, step_time_spread_s=0.01),
                                _metrics(step_times_s=[0.25]))
    assert before.extra["MFU (%)"] == pytest.approx(100 * _metrics().mfu)
    assert before.config["peak FLOP/s source"].startswith("table:")
    table = Comparison(before=before, after=after).table().set_index("metric")
    assert table.loc["MFU (%)", "change"] == "2.00×"  # twice as fast, same model FLOPs
    assert table.loc["model GFLOP / step", "change"] == "1.00×"
    assert set(measurement_extra(_metrics())) >= {"MFU (%)", "HFU (%)", "tokens/s", "achieved model TFLOP/s"}


def test_attach_to_something_without_extra_is_a_usage_error() -> None:
    with pytest.raises(nbt.NbtUsageError, match="no `extra` mapping"):
        attach_step_metrics(object(), _metrics())


def test_metrics_frame_per_rank_and_per_run() -> None:
    ranks = metrics_frame([_metrics(), _metrics(step_times_s=[1.0])], label="rank")
    assert list(ranks["rank"]) == [0, 1]
    assert ranks["mfu"].iloc[0] == pytest.approx(2 * ranks["mfu"].iloc[1])
    runs = metrics_frame({"baseline": _metrics(), "compiled": _metrics(step_times_s=[0.25])})
    assert list(runs["run"]) == ["baseline", "compiled"]
    with pytest.raises(nbt.NbtUsageError, match="no step metrics given"):
        metrics_frame([])
    with pytest.raises(nbt.NbtUsageError, match="not a StepMetrics"):
        metrics_frame([("a", 1)])  # type: ignore[list-item]


def test_mfu_chart_has_one_bar_per_run_with_its_range() -> None:
    fig = mfu_chart([("baseline", _metrics()), ("compiled", _metrics(step_times_s=[0.25, 0.3]))])
    mfu, hfu = fig.data
    assert list(mfu.x) == ["baseline", "compiled"]
    assert mfu.y[1] > mfu.y[0]
    assert hfu.y[0] > mfu.y[0]  # recomputation in these runs
    assert all(v >= 0 for v in mfu.error_y.array)
    assert "table: NVIDIA A100" in fig.layout.title.text
    with pytest.raises(nbt.NbtUsageError, match="labels must differ"):
        mfu_chart([("a", _metrics()), ("a", _metrics())])
    with pytest.raises(nbt.NbtUsageError, match="got a int"):
        mfu_chart(5)  # type: ignore[arg-type]
