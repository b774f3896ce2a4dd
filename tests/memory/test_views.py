"""Analysis functions on hand-made events, figures, comparison, and the two magics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.memory import timeline_analysis as analysis
from nbtoolkit.memory.figures import (
    alive_at_peak_html,
    comparison_figure,
    module_figure,
    segment_figure,
    timeline_figure,
)
from nbtoolkit.memory.timeline import MemoryTimeline, normalize_events


def _events(rows: list[tuple]) -> pd.DataFrame:
    columns = ["time_us", "action", "delta_bytes", "category", "tensor", "module", "phase"]
    return normalize_events(pd.DataFrame(rows, columns=columns))


HAND_MADE = [
    (0.0, "preexisting", 100, "parameter", 0, "lin", "before"),
    (1.0, "alloc", 50, "activation", 1, "lin", "forward"),
    (2.0, "alloc", 30, "temporary", 2, "act", "forward"),
    (2.0, "free", -30, "temporary", 2, "act", "forward"),
    (3.0, "alloc", 100, "gradient", 3, "lin", "backward"),  # peak: 100 + 50 + 100 = 250
    (4.0, "free", -50, "activation", 1, "lin", "backward"),
    (5.0, "recategorize", -100, "gradient", 3, "", "optimizer"),
    (5.0, "recategorize", 100, "optimizer_state", 3, "", "optimizer"),
]


def test_peak_and_category_peaks() -> None:
    events = _events(HAND_MADE)
    assert analysis.peak(events) == (4, 250)
    peaks = analysis.category_peaks(events).set_index("category")
    assert peaks.loc["temporary", "peak_bytes"] == 30 and peaks.loc["temporary", "at_peak_bytes"] == 0
    assert peaks.loc["gradient", "at_peak_bytes"] == 100
    assert peaks.loc["optimizer_state", "peak_bytes"] == 100
    assert peaks.loc["optimizer_state", "at_peak_bytes"] == 0
    assert peaks.loc["total", "peak_bytes"] == 250


def test_category_series_coalesces_equal_times() -> None:
    events = _events(HAND_MADE)
    series = analysis.category_series(events)
    assert list(series["time_us"]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert list(series["total"]) == [100, 150, 150, 250, 200, 200]
    assert list(series["optimizer_state"]) == [0, 0, 0, 0, 0, 100]
    assert len(analysis.category_series(events, coalesce=False)) == len(events)


def test_alive_at_peak_and_after_recategorize() -> None:
    events = _events(HAND_MADE)
    alive = analysis.alive_at_peak(events)
    assert list(alive["tensor"]) == [0, 3, 1]  # largest first, ties by time
    assert list(alive["bytes"]) == [100, 100, 50]
    at_end = analysis.alive_at_peak(events, at_index=len(events) - 1)
    categories = dict(zip(at_end["tensor"], at_end["category"], strict=True))
    assert categories == {0: "parameter", 3: "optimizer_state"}


def test_module_and_phase_attribution() -> None:
    events = _events(HAND_MADE)
    modules = analysis.module_attribution(events).set_index("module")
    assert modules.loc["lin", "allocated_bytes"] == 250 and modules.loc["lin", "at_peak_bytes"] == 250
    assert modules.loc["act", "at_peak_bytes"] == 0
    phases = analysis.phase_attribution(events).set_index("phase")
    assert phases.loc["forward", "allocated_bytes"] == 80 and phases.loc["forward", "freed_bytes"] == 30
    assert phases.loc["backward", "peak_bytes"] == 250
    spans = analysis.phase_spans(events)
    assert list(spans["phase"]) == ["before", "forward", "backward", "optimizer"]


def test_decimate_keeps_the_peak() -> None:
    rng = np.random.default_rng(1)
    n = 200_000
    values = np.cumsum(rng.integers(-100, 101, n))
    values[123_457] = values.max() + 10_000  # a one-event spike
    series = pd.DataFrame({"time_us": np.arange(n, dtype=float), "total": values})
    small = analysis.decimate(series, max_points=2000)
    assert len(small) <= 2002
    assert small["total"].max() == values.max() and small["total"].min() == values.min()
    assert small["time_us"].is_monotonic_increasing


def test_compare_and_its_display() -> None:
    before = MemoryTimeline(events=_events(HAND_MADE))
    smaller = [r if r[3] != "gradient" else (*r[:2], r[2] // 2, *r[3:]) for r in HAND_MADE]
    after = MemoryTimeline(events=_events(smaller))
    comparison = before.compare(after)
    table = comparison.table.set_index("category")
    assert table.loc["total", "before_bytes"] == 250 and table.loc["total", "after_bytes"] == 200
    assert table.loc["total", "change_pct"] == pytest.approx(-20.0)
    assert "-20.0%" in repr(comparison) and "<table" in comparison._html()
    figure = comparison_figure(before, after)
    assert {t.name for t in figure.data} >= {"before", "after"}


def test_figures_and_escaping() -> None:
    rows = [(*r[:5], "<script>alert(1)</script>" if r[5] == "lin" else r[5], r[6]) for r in HAND_MADE]
    timeline = MemoryTimeline(events=_events(rows), device="<b>dev</b>")
    html = timeline._html() + alive_at_peak_html(timeline)
    assert "<script>" not in html and "&lt;script&gt;" in html
    figure = timeline_figure(timeline)
    names = {t.name for t in figure.data}
    assert {"parameter", "activation", "gradient"} <= names
    assert "<b>" not in figure.layout.title.text
    bars = {t.name: dict(zip(t.y, t.x, strict=True)) for t in module_figure(timeline).data}
    assert bars["parameter"]["<script>alert(1)</script>"] == 100  # bytes axis: plain B at this size
    assert bars["gradient"]["<script>alert(1)</script>"] == 100


def test_figures_of_a_real_gpu_snapshot(real_data: Callable[[str], Path]) -> None:
    snapshot = nbt.load_memory_snapshot(real_data("memory/kk_memory_files_memory_ctx128_fullstep.pickle"))
    segments = segment_figure(snapshot)
    assert len(segments.data) == 3 and len(segments.data[0].y) == 200  # the 200 largest of 1010
    full = snapshot.timeline().figure()
    assert {"phase: optimizer", "reserved (segments)"} <= {t.name for t in full.data}


def test_large_timeline_is_decimated_and_small() -> None:
    n = 300_000
    rng = np.random.default_rng(0)
    sizes = rng.integers(256, 1 << 20, n // 2)
    order = rng.permutation(n // 2)
    events = pd.DataFrame(
        {
            "time_us": np.arange(n, dtype=float),
            "action": np.repeat(["alloc", "free"], n // 2),
            "delta_bytes": np.r_[sizes, -sizes[order]],
            "category": "activation",
            "tensor": np.r_[np.arange(n // 2), order],
            "module": np.array([f"layers.{i}" for i in range(12)])[np.arange(n) * 12 // n],
            "phase": np.where(np.arange(n) < n // 2, "forward", "backward"),
        }
    )
    timeline = MemoryTimeline(events=events)
    figure = timeline.figure(max_points=4000)
    area = next(t for t in figure.data if t.name == "activation")
    assert len(area.x) <= 4002
    assert max(area.y) * 1024**3 == pytest.approx(timeline.peak_bytes, rel=1e-9)  # GiB axis, peak kept
    assert len(figure.to_json()) < 2 * 1024**2


# -- magics -------------------------------------------------------------------------------


def test_memory_cell_magic(shell: InteractiveShell) -> None:
    # Adam allocates its state in step(): the optimizer phase has allocations to show.
    shell.run_cell("import torch\nnet = torch.nn.Linear(8, 4)\nopt = torch.optim.Adam(net.parameters())")
    result = shell.run_cell_magic(
        "nbt",
        "memory --steps 2 --model net --optimizer opt --name mem --no-figure",
        "loss = net(torch.randn(16, 8)).sum()\nloss.backward()\nopt.step()\nloss.item()",
    )
    assert isinstance(result, nbt.MemoryTimeline)
    assert shell.user_ns["mem"] is result
    assert isinstance(result.value, float)
    assert {"forward", "backward", "optimizer"} <= set(result.events["phase"])


def test_snapshot_line_magic(shell: InteractiveShell, real_data: Callable[[str], Path]) -> None:
    path = real_data("memory/shrey_profile_grad.pkl")
    result = shell.run_line_magic("nbt", f"snapshot {path}")
    assert isinstance(result, nbt.MemorySnapshot)
    assert shell.user_ns["_nbt"] is result
    assert result.stats().lines()[0] == "segments: 7"


def test_report_embeds_memory_figures(tmp_path: Path, real_data: Callable[[str], Path]) -> None:
    snapshot = nbt.load_memory_snapshot(real_data("memory/shrey_profile_grad.pkl"))
    path = tmp_path / "memory.html"
    nbt.report(snapshot, snapshot.timeline(), path=path)
    text = path.read_text()
    assert "total_reserved" in text or "reserved" in text
    assert text.count("plotly-graph-div") >= 3  # segments + the snapshot's timeline + the timeline


def test_magic_errors_are_clear(shell: InteractiveShell, tmp_path: Path) -> None:
    from nbtoolkit.core.errors import NbtUsageError, SnapshotError

    with pytest.raises(NbtUsageError, match="no model named 'missing_model'"):
        shell.run_cell_magic("nbt", "memory --model missing_model", "1 + 1")
    with pytest.raises(NbtUsageError, match="steps must be >= 1 and warmup >= 0, got steps=0"):
        shell.run_cell_magic("nbt", "memory --steps 0", "1 + 1")
    with pytest.raises(SnapshotError, match="no memory snapshot at"):
        shell.run_line_magic("nbt", f"snapshot {tmp_path / 'missing.pickle'}")
