"""Measurement / Comparison: plain data, side-by-side table, escaping, save/load."""

from __future__ import annotations

import pytest

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.recompute.comparison import Comparison, Measurement


def _m(label: str, t: float, peak: int, **kw: object) -> Measurement:
    return Measurement(label=label, step_time_s=t, step_time_spread_s=t / 10, step_times_s=[t] * 3,
                       peak_bytes=peak, losses=[2.0, 1.5], **kw)  # type: ignore[arg-type]


def test_table_side_by_side_with_extra_rows() -> None:
    before = _m("before", 0.02, 4 * 2**20, extra={"mfu": 0.25})
    after = _m("after", 0.025, 2 * 2**20, extra={"mfu": 0.2}, graph_breaks=1, graph_count=2)
    cmp = Comparison(before, after, changes=["checkpoint 2 blocks"])
    table = cmp.table()
    assert list(table.columns) == ["metric", "before", "after", "change"]
    peak = table.set_index("metric").loc["peak memory"]
    assert peak["before"] == "4.00 MiB"
    assert peak["after"] == "2.00 MiB"
    assert peak["change"] == "0.50×"
    assert "mfu" in set(table["metric"])
    assert cmp.speedup == pytest.approx(0.8)
    text = repr(cmp)
    assert "20.0 ms" in text
    assert "checkpoint 2 blocks" in text


def test_category_rows_line_up() -> None:
    before = _m("before", 1.0, 10, peak_by_category={"ACTIVATION": 8, "PARAMETER": 2})
    after = _m("after", 1.0, 10, peak_by_category={"TEMPORARY": 3, "PARAMETER": 2})
    metrics = list(Comparison(before, after).table()["metric"])
    rows = [m for m in metrics if m.startswith("  at peak:")]
    assert rows == ["  at peak: ACTIVATION", "  at peak: PARAMETER", "  at peak: TEMPORARY"]
    assert metrics.index(rows[-1]) < metrics.index("compile time")


def test_html_escapes_foreign_text() -> None:
    cmp = Comparison(_m("before", 1.0, 10), _m("after", 1.0, 10), changes=["<script>alert(1)</script>"],
                     notes=["<script>x</script>"])
    html = cmp._repr_html_()
    assert html is not None
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert "text/plain" in cmp._repr_mimebundle_()


def test_save_load_round_trip(tmp_path) -> None:
    cmp = Comparison(_m("before", 0.5, 100, peak_by_category={"ACTIVATION": 60}), _m("after", 0.4, 80))
    loaded = Comparison.load(cmp.save(tmp_path / "c.json"))
    assert loaded.before.peak_by_category == {"ACTIVATION": 60}
    assert loaded.after.step_time_s == 0.4
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(NbtUsageError, match=r"bad\.json"):
        Comparison.load(tmp_path / "bad.json")


def test_formatting_units() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_seconds(2.5) == "2.50 s"
    assert format_seconds(0.0001) == "100 µs"
    assert format_seconds(None) == "-"
