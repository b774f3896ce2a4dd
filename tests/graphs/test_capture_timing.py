"""The capture's times add up: first call = compiling + running, recompiles in timed steps noted, eager
and compiled steps interleaved, a speed-up claimed only beyond the measured spread."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from torch._dynamo.utils import counters

import nbtoolkit as nbt
from nbtoolkit.compile.report import GraphReport
from nbtoolkit.compile.schema import ADDED_COLUMNS


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _is_eager_stance() -> bool:
    return torch._dynamo.eval_frame._stance.stance == "force_eager"


def test_eager_and_compiled_steps_interleave_and_a_recompile_in_a_timed_step_is_left_out() -> None:
    """steps=3: call 1 compiles, 2 is the eager warm-up, 3-8 alternate eager/compiled, 9-12 are profiled."""
    compiled = torch.compile(lambda x, n: torch.relu(x) * n, backend="eager", dynamic=False)
    stances: list[bool] = []
    frames_compiled: list[int] = []  # Dynamo's own count of frames it compiled, per call

    def step(x: torch.Tensor) -> torch.Tensor:
        stances.append(_is_eager_stance())
        n = 1 if len(stances) < 4 else 2  # call 4, the first timed compiled step, recompiles
        before = counters["frames"]["total"]
        out = compiled(x, n)
        frames_compiled.append(counters["frames"]["total"] - before)
        return out

    report = nbt.capture_graphs(step, torch.randn(4), steps=3)
    assert stances == [False, True, True, False, True, False, True, False, False, False, False, False]
    assert len(report.step_times_s) == len(report.eager_step_times_s) == 3
    timed_compiled_calls = [3, 5, 7]  # 0-based indices of calls 4, 6, 8
    assert report.timed_step_compiles == [frames_compiled[i] for i in timed_compiled_calls] == [1, 0, 0]
    # the median leaves the recompiling step out
    assert report.step_time_s == pytest.approx(
        sorted(report.step_times_s[1:])[0] / 2 + sorted(report.step_times_s[1:])[1] / 2
    )
    text = repr(report)
    assert "step time compiled (median of 2 of 3; 1 compiled, so it is left out)" in text
    assert len(report.recompiles) == 1 and "n == 1" in report.recompiles["failed_guard"].iloc[0]


def test_every_timed_step_recompiling_is_said_in_the_headline() -> None:
    compiled = torch.compile(lambda x, n: x * n, backend="eager", dynamic=False)
    calls: list[int] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return compiled(x, len(calls))  # a new constant every call: each compiled call recompiles

    report = nbt.capture_graphs(step, torch.randn(4), steps=2, eager_baseline=False, measure_cost=False)
    assert report.timed_step_compiles == [1, 1]
    assert "every timed step compiled (recompiles): compile time included" in repr(report)


def test_first_call_is_compiling_plus_running_and_compile_time_adds_up() -> None:
    compiled = torch.compile(lambda x: (x.sin() + 1).cos(), backend="eager", dynamic=False)
    shapes = iter([4, 4, 5, 5])  # the 3rd call (the second timed step) recompiles

    def step() -> torch.Tensor:
        return compiled(torch.randn(next(shapes)))

    report = nbt.capture_graphs(step, steps=3, eager_baseline=False, measure_cost=False)
    assert report.first_call_s is not None and report.first_call_compile_s is not None
    assert 0 < report.first_call_compile_s <= report.first_call_s
    first_compile = report.compiles[report.compiles["compile_id"] == "0/0"]["compile_time_s"].sum()
    assert report.first_call_compile_s == pytest.approx(first_compile)
    later = report.compile_time_s - report.first_call_compile_s
    assert later > 0  # the recompile of call 3
    assert report.timed_step_compiles == [0, 1, 0]
    headline = dict(report._headline())
    compiling = report.first_call_compile_s
    running = report.first_call_s - compiling
    assert headline["first call (compile included)"].endswith(
        f"= {nbt_seconds(compiling)} compiling + {nbt_seconds(running)} running"
    )
    assert headline["compile time"] == (
        f"{nbt_seconds(report.compile_time_s)} ({nbt_seconds(compiling)} in the first call, "
        f"{nbt_seconds(later)} in later calls)"
    )


def nbt_seconds(value: float) -> str:
    from nbtoolkit.core.units import format_seconds

    return format_seconds(value)


def _report(compiled: list[float], eager: list[float], compiles: list[int] | None = None) -> GraphReport:
    import pandas as pd

    from nbtoolkit.compile.schema import FRAME_COLUMNS

    frames = {
        name: pd.DataFrame({c: pd.Series(dtype=t) for c, t in cols.items()})
        for name, cols in FRAME_COLUMNS.items()
    }
    ordered = sorted(compiled)
    return GraphReport(
        **frames,
        first_call_s=1.0,
        step_time_s=ordered[len(ordered) // 2],
        eager_step_time_s=sorted(eager)[len(eager) // 2],
        steps=len(compiled),
        step_times_s=compiled,
        eager_step_times_s=eager,
        timed_step_compiles=compiles or [0] * len(compiled),
    )


def test_a_speed_up_is_claimed_only_beyond_the_measured_spread() -> None:
    clear = _report([0.010, 0.011, 0.012], [0.020, 0.021, 0.022])
    assert clear.speedup_within_noise is False
    assert clear.speedup == pytest.approx(0.021 / 0.011)
    assert dict(clear._headline())["compiled vs eager"] == "1.91× faster (beyond the measured spread)"
    slower = _report([0.020, 0.021, 0.022], [0.010, 0.011, 0.012])
    assert dict(slower._headline())["compiled vs eager"] == "1.91× slower (beyond the measured spread)"
    noisy = _report([0.010, 0.016, 0.030], [0.012, 0.018, 0.025])
    assert noisy.speedup_within_noise is True and noisy.speedup is None
    assert "no difference beyond the measured spread" in dict(noisy._headline())["compiled vs eager"]
    table = noisy.compare(clear).table().set_index("metric")
    assert table.loc["speedup compiled vs eager (×)", "before"] is None
    assert table.loc["speedup compiled vs eager (×)", "after"] == pytest.approx(0.021 / 0.011)


def test_steps_that_compiled_are_left_out_of_the_spread_too() -> None:
    # the 1.0 s step recompiled: without it the compiled steps are clearly faster
    report = _report([1.0, 0.010, 0.011, 0.012], [0.020, 0.021, 0.022, 0.023], compiles=[1, 0, 0, 0])
    assert report.speedup_within_noise is False


def test_new_fields_and_columns_save_load_and_old_saves_still_load(tmp_path: Path) -> None:
    compiled = torch.compile(lambda x: torch.relu(x) + 1, backend="eager")
    report = nbt.capture_graphs(compiled, torch.randn(4), steps=2)
    again = GraphReport.load(report.save(tmp_path / "new"))
    for name in ("first_call_compile_s", "step_times_s", "eager_step_times_s", "timed_step_compiles"):
        assert getattr(again, name) == getattr(report, name)
    assert repr(again) == repr(report)

    # a report saved before these fields and columns existed
    folder = report.save(tmp_path / "old")
    header = json.loads((folder / "report.json").read_text())
    for name in ("first_call_compile_s", "step_times_s", "eager_step_times_s", "timed_step_compiles"):
        del header[name]
    (folder / "report.json").write_text(json.dumps(header))
    table = pq.read_table(folder / "breaks.parquet")
    pq.write_table(
        table.drop_columns([c for c in ADDED_COLUMNS["breaks"] if c in table.schema.names]),
        folder / "breaks.parquet",
    )
    old = GraphReport.load(folder)
    assert old.step_times_s == [] and old.first_call_compile_s is None
    assert set(ADDED_COLUMNS["breaks"]) <= set(old.breaks.columns)
    assert "first call (compile included)" in repr(old)


def test_a_damaged_added_column_is_named(tmp_path: Path) -> None:
    import pyarrow as pa

    def with_a_break(x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    report = nbt.capture_graphs(torch.compile(with_a_break, backend="eager"), torch.randn(4), steps=0)
    folder = report.save(tmp_path / "r")
    table = pq.read_table(folder / "breaks.parquet")
    assert table.num_rows == 1
    bad = table.drop_columns(["call_line"]).append_column("call_line", pa.array(["x"], pa.string()))
    pq.write_table(bad, folder / "breaks.parquet")
    with pytest.raises(nbt.NbtUsageError, match="call_line"):
        GraphReport.load(folder)
