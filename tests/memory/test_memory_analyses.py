"""Mosaic-level analyses: the peak and its stacks, memory by annotation / context / pattern,
diffs of two runs, imbalance across ranks; their figures and JSON / Markdown exports."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.memory.timeline import MemoryTimeline, normalize_events
from nbtoolkit.recompute.comparison import Comparison, Measurement

from .test_snapshot import PICKLES, RECORDED

FULLSTEP = "memory/kk_memory_files_memory_ctx128_fullstep.pickle"  # optimizer annotations
FORWARD = "memory/kk_memory_files_memory_ctx128_forward.pickle"
ANNOTATED = "memory/bcraf_memory_snapshot.pickle"  # compile_context, user_metadata, Optimizer.step
SNAPSHOTS = [*PICKLES, RECORDED]  # every real snapshot (each skips, named, if missing), the recorded one
_COLUMNS = ["time_us", "action", "delta_bytes", "category", "tensor", "stack_id"]


def _timeline(activation: int, *, extra_stack: bool = False) -> MemoryTimeline:
    rows = [
        (0.0, "preexisting", 1000, "parameter", 0, 0),
        (1.0, "alloc", activation, "activation", 1, 1),
        (2.0, "alloc", 500, "gradient", 2, 2),
        (3.0, "free", -500, "gradient", 2, 2),
    ]
    if extra_stack:
        rows.insert(2, (1.5, "alloc", 300, "temporary", 3, 3))
    stacks = [
        "model.py:3 in __init__",
        "model.py:9 in forward\ntrain.py:20 in step",
        "<b>x</b>.py:1 in backward",
        "attn.py:7 in softmax\nmodel.py:9 in forward\ntrain.py:20 in step",
    ]
    return MemoryTimeline(events=normalize_events(pd.DataFrame(rows, columns=_COLUMNS)), stacks=stacks)


def test_peak_stack_of_a_hand_made_timeline() -> None:
    peak = _timeline(4000).peak_stack()
    assert peak.peak_bytes == 5500
    assert list(peak.by_stack["bytes"]) == [4000, 1000, 500]
    assert peak.stack == "model.py:9 in forward\ntrain.py:20 in step"  # the largest live allocation's
    assert json.loads(peak.to_json())["peak_bytes"] == 5500
    markdown = peak.to_markdown()
    assert "5.37 KiB" in markdown and "| stack | bytes | allocations |" in markdown


def test_icicle_nodes_sum_up_and_escape(real_data: Callable[[str], Path]) -> None:
    from nbtoolkit.memory.report_figures import icicle_nodes

    peak = _timeline(4000, extra_stack=True).peak_stack()
    nodes = icicle_nodes(peak.by_stack)
    values = dict(zip(nodes["labels"], nodes["values"], strict=True))
    assert nodes["values"][0] == peak.peak_bytes
    # train.py:20 in step (outermost) holds the activation and the temporary below it.
    assert values["train.py:20 in step"] == 4000 + 300
    parents = dict(zip(nodes["ids"], nodes["parents"], strict=True))
    for node, parent in parents.items():  # branchvalues="total": children never exceed the parent
        if parent:
            assert nodes["values"][nodes["ids"].index(node)] <= nodes["values"][nodes["ids"].index(parent)]
    figure = peak.figure()
    assert figure.data[0].type == "icicle" and "<b>" not in json.dumps(list(figure.data[0].labels))
    snap = nbt.load_memory_snapshot(real_data(FULLSTEP))
    real = snap.peak_stack()
    assert real.peak_bytes == snap.timeline().peak_bytes
    assert int(real.by_stack["bytes"].sum()) == real.peak_bytes
    assert real.figure().data[0].values[0] == real.peak_bytes


def test_memory_by_groups_sum_to_the_peak(real_data: Callable[[str], Path]) -> None:
    snap = nbt.load_memory_snapshot(real_data(FULLSTEP))
    peak = snap.timeline().peak_bytes
    for by in ("category", "phase", "annotation", "compile_context", "user_metadata", "stack"):
        table = snap.memory_by(by)
        assert int(table["at_peak_bytes"].sum()) == peak, by
        assert list(table.columns) == ["group", "allocations", "allocated_bytes", "at_peak_bytes"]
    annotated = snap.memory_by("annotation")
    assert "Optimizer.step#AdamW.step" in set(annotated["group"])
    # Everything allocated inside the optimizer step is optimizer-phase memory.
    step = annotated.set_index("group").loc["Optimizer.step#AdamW.step", "allocated_bytes"]
    phases = snap.memory_by("phase").set_index("group")
    assert step == phases.loc["optimizer", "allocated_bytes"]
    by_file = snap.memory_by("pattern", pattern=r"(\w+\.py):\d+")
    assert int(by_file["at_peak_bytes"].sum()) == peak
    assert "optimizers.py" in set(by_file["group"])
    with pytest.raises(nbt.NbtUsageError, match="pattern="):
        snap.memory_by("pattern")
    with pytest.raises(nbt.NbtUsageError, match="one of"):
        snap.memory_by("colour")
    with pytest.raises(nbt.NbtUsageError, match="needs a MemorySnapshot"):
        snap.timeline().memory_by("annotation")


def test_memory_by_compile_context_and_user_metadata(real_data: Callable[[str], Path]) -> None:
    snap = nbt.load_memory_snapshot(real_data(ANNOTATED))
    contexts = snap.memory_by("compile_context")
    recorded = set(snap.trace.loc[snap.trace["action"] == "alloc", "compile_context"].astype(str))
    assert set(contexts["group"]) <= {*recorded, "(none)"}
    assert int(contexts["allocations"].sum()) == len(snap.timeline().events.query("action != 'free'"))


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_diff_of_a_snapshot_with_itself_is_empty(name: str, snapshot_file: Callable[[str], Path]) -> None:
    """Each real snapshot (skipped, naming it, where the data is missing) and the recorded one."""
    snap = nbt.load_memory_snapshot(snapshot_file(name))
    diff = nbt.memory_diff(snap, snap)
    assert diff.empty, name
    assert diff.by_stack.empty and (diff.by_category["delta_bytes"] == 0).all()
    assert json.loads(diff.to_json())["empty"] is True
    assert snap.timeline().diff(snap.timeline()).empty


def test_diff_of_a_timeline_with_a_copy_loaded_again_is_empty() -> None:
    timeline = _timeline(4000)
    assert nbt.memory_diff(timeline, _timeline(4000)).empty


def test_diff_says_what_grew_by_category_and_stack() -> None:
    diff = nbt.memory_diff(_timeline(4000), _timeline(6000, extra_stack=True), labels=("small", "large"))
    assert not diff.empty
    assert diff.peak_delta_bytes == 2300
    grew = diff.grew()
    assert list(grew["category"]) == ["activation", "temporary"]
    assert list(grew["delta_bytes"]) == [2000, 300]
    assert list(diff.by_stack["delta_bytes"]) == [2000, 300]
    assert "grew by 2.25 KiB" in diff.reading() and "activation" in diff.reading()
    exported = json.loads(diff.to_json())
    assert exported["labels"] == ["small", "large"]
    assert {row["category"]: row["delta_bytes"] for row in exported["by_category"]}["activation"] == 2000
    markdown = diff.to_markdown()
    assert markdown.startswith("### Memory diff: small → large") and "| activation |" in markdown
    figure = diff.figure()
    assert [trace.type for trace in figure.data] == ["bar", "bar"]
    assert "<b>" not in json.dumps(list(figure.data[1].y))
    assert "MemoryDiff small -> large" in repr(diff) and "<table" in diff._repr_html_()


def test_diff_of_two_real_snapshots(real_data: Callable[[str], Path]) -> None:
    forward = nbt.load_memory_snapshot(real_data(FORWARD))
    full = nbt.load_memory_snapshot(real_data(FULLSTEP))
    diff = nbt.memory_diff(forward, full, labels=("forward", "fullstep"))
    totals = diff.totals.set_index("total")
    assert (
        totals.loc["reserved", "delta_bytes"] == full.stats().total_reserved - forward.stats().total_reserved
    )
    assert totals.loc["peak", "delta_bytes"] == full.timeline().peak_bytes - forward.timeline().peak_bytes
    # Only a full step has optimizer state: that is what grew most.
    assert diff.grew()["category"].iloc[0] == "optimizer_state"
    assert full.diff(forward).peak_delta_bytes == -diff.peak_delta_bytes


def test_optimize_comparison_carries_the_memory_diff() -> None:
    before = Measurement(
        label="before",
        step_time_s=1.0,
        step_time_spread_s=0.0,
        peak_bytes=100,
        total_peak_bytes=300,
        peak_by_category={"activation": 200, "parameter": 100},
    )
    after = Measurement(
        label="after",
        step_time_s=1.0,
        step_time_spread_s=0.0,
        peak_bytes=40,
        total_peak_bytes=160,
        peak_by_category={"activation": 60, "parameter": 100},
    )
    diff = Comparison(before=before, after=after).memory_diff()
    assert diff is not None and diff.labels == ("before", "after")
    assert diff.peak_delta_bytes == -140 and list(diff.by_category["delta_bytes"]) == [-140, 0]
    # shown with the comparison, without a call: what optimize() displays
    shown = repr(Comparison(before=before, after=after))
    assert "memory: the peak shrank by 140 B from before to after; most in activation" in shown
    assert "memory: the peak shrank" in Comparison(before=before, after=after)._repr_html_()
    unmeasured = Measurement(label="after", step_time_s=1.0, step_time_spread_s=0.0)
    assert Comparison(before=before, after=unmeasured).memory_diff() is None
    assert "memory:" not in repr(Comparison(before=before, after=unmeasured))


def test_optimize_fills_the_diff_from_its_own_measurements() -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)

    def step() -> float:
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(loss.item())

    result = nbt.optimize(model, step, amp="bfloat16", steps=2,
        config=nbt.MeasureConfig(warmup=1, metrics=False))
    diff = result.memory_diff()
    assert diff is not None
    before, after = result.before.peak_by_category, result.after.peak_by_category
    for row in diff.by_category.itertuples():
        assert row.a_bytes == before.get(row.category, 0) and row.b_bytes == after.get(row.category, 0)
    assert set(diff.by_category["category"]) == {
        k for k in {*before, *after} if before.get(k) or after.get(k)
    }


def test_imbalance_names_the_rank_the_category_and_the_stack() -> None:
    ranks = {0: _timeline(1000), 1: _timeline(9000, extra_stack=True), 2: _timeline(1200)}
    report = nbt.memory_imbalance(ranks)
    assert report.top_rank == 1 and report.baseline_rank == 2
    assert report.category == "activation" and report.category_delta_bytes == 7800
    assert report.by_stack["stack"].iloc[0] == "model.py:9 in forward\ntrain.py:20 in step"
    assert "rank 1 peaks highest" in report.reading()
    assert list(report.peaks["rank"]) == [0, 1, 2]
    assert json.loads(report.to_json())["top_rank"] == 1
    assert "### Memory imbalance across 3 ranks" in report.to_markdown()
    figure = report.figure()
    assert {trace.name for trace in figure.data} >= {"activation (differs most)", "parameter"}
    from nbtoolkit.memory.rank_memory import RankMemory

    assert RankMemory(timelines=ranks).imbalance_report().top_rank == 1
    even = nbt.memory_imbalance([_timeline(1000), _timeline(1000)])
    assert "all 2 ranks peak at" in even.reading()
    with pytest.raises(nbt.NbtUsageError, match="RankMemory"):
        nbt.memory_imbalance(42)


def test_a_folder_of_per_rank_snapshots(real_data: Callable[[str], Path], tmp_path: Path) -> None:
    from nbtoolkit.memory.snapshot_ranks import rank_of

    assert [rank_of(n) for n in ("snapshot_rank3", "rank_12", "mem-r2", "step7_node1", "x")] == [
        3,
        12,
        2,
        1,
        None,
    ]
    for rank, name in enumerate((FORWARD, FULLSTEP, FORWARD)):
        (tmp_path / f"snapshot_rank{rank}.pickle").write_bytes(real_data(name).read_bytes())
    ranks = nbt.load_rank_snapshots(tmp_path)
    assert ranks.ranks == [0, 1, 2]
    assert ranks.timeline(1).allocator_snapshot.source.endswith("snapshot_rank1.pickle")
    report = nbt.memory_imbalance(tmp_path)
    assert report.top_rank == 1 and report.category == "optimizer_state"
    (tmp_path / "rank_1.pkl").write_bytes(pickle.dumps({"segments": []}))
    with pytest.raises(nbt.SnapshotError, match="both look like rank 1"):
        nbt.load_rank_snapshots(tmp_path)
    with pytest.raises(nbt.SnapshotError, match="not a folder"):
        nbt.load_rank_snapshots(tmp_path / "snapshot_rank0.pickle")


def test_exports_are_plain_json(real_data: Callable[[str], Path]) -> None:
    snap = nbt.load_memory_snapshot(real_data(FULLSTEP))
    for result in (snap.peak_stack(), snap.diff(snap), nbt.memory_imbalance([snap, snap])):
        data: Any = json.loads(result.to_json())
        assert data["kind"].startswith("nbtoolkit.")
        assert isinstance(result.to_markdown(), str)


def _frames(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"name": name, "filename": file, "line": 1} for name, file in pairs]


def test_mosaic_rules_in_their_published_order() -> None:
    from nbtoolkit.memory.snapshot_mosaic import mosaic_category

    forward = ("forward", "/m/model.py")
    assert mosaic_category(_frames(forward, ("step", "/torch/optim/adamw.py"))) == "activation"  # rule order
    assert mosaic_category(_frames(forward, ("f", "/x/fully_sharded_data_parallel.py"))) == "fsdp"
    assert mosaic_category(_frames(("reset_parameters", "/m/linear.py"))) == "parameter"
    assert mosaic_category(_frames(("torch::autograd::Engine::evaluate_function(...)", ""))) == "backward"
    assert mosaic_category(_frames(("step", "/t/train.py"))) == "optimizer"
    assert mosaic_category(_frames(("zero_grad", "/torch/optim/optimizer.py"))) == "optimizer"
    assert mosaic_category(_frames(("dist_mean", "/x.py"))) == "net"
    assert mosaic_category(_frames(("c10d::Reducer::all_reduce_bucket(x)", ""), forward)) == "net"
    assert mosaic_category(_frames(("call", "/tmp/torchinductor_u/ab/cabc123.py"))) == "activation"
    assert mosaic_category(_frames(("compute_grad_stats", "/x.py"))) == "stats"
    assert mosaic_category(_frames(("main", "/t/train.py"))) == "unknown"
    assert mosaic_category([]) == "unknown"


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_mosaic_categories_of_real_snapshots(name: str, snapshot_file: Callable[[str], Path]) -> None:
    """Per stack as Mosaic classifies the raw frames, and Mosaic's peak (the trace from zero)."""
    from nbtoolkit.memory.snapshot_mosaic import mosaic_category
    from nbtoolkit.memory.snapshot_reader import restricted_loads

    path = snapshot_file(name)
    raw = restricted_loads(path.read_bytes())
    snap = nbt.load_memory_snapshot(path)
    if isinstance(raw, list) or not any(raw.get("device_traces") or []):
        # a legacy bare list of segments, or empty traces: no allocation to classify, and none read
        assert not len(snap.trace), name
        return
    for device, entries in enumerate(raw.get("device_traces") or []):
        trace = snap.trace[snap.trace["device"] == device]
        for entry, stack_id in zip(entries, trace["stack_id"], strict=True):
            expected = mosaic_category(entry.get("frames"))
            assert (snap.stack_mosaic[stack_id] if stack_id >= 0 else "unknown") == expected, name
    table = snap.mosaic_peak().set_index("category")["at_peak_bytes"]
    # Mosaic's peak: the highest running sum of alloc/free_completed sizes from zero.
    device = int(snap.timeline().device.split(":")[1])
    trace = snap.trace[snap.trace["device"] == device]
    sign = trace["action"].map({"alloc": 1, "free_completed": -1, "free": -1}).fillna(0)
    assert table["total"] == max(int((sign * trace["size"]).cumsum().max()), 0), name
    assert table.drop("total").sum() <= table["total"]


def test_peak_stack_views_show_the_python_frames_first() -> None:
    """A stack recorded with context="all" starts with allocator frames: the views show the user's
    Python lines and count the native ones; .stack keeps everything; a native-only stack is kept."""
    import pandas as pd

    from nbtoolkit.memory.reports import PeakStack

    stack = "\n".join([
        "CUDACachingAllocator.cpp:0 in malloc",
        "??:0 in at::detail::empty_cuda",
        "/home/me/train.py:42 in forward",
        "/home/me/train.py:90 in <module>",
    ])
    empty = pd.DataFrame({"stack": [], "bytes": [], "allocations": []})
    peak = PeakStack(peak_bytes=1024, peak_time_us=5.0, alive=empty, by_stack=empty, stack=stack)
    assert peak.python_stack.splitlines() == [
        "/home/me/train.py:42 in forward",
        "/home/me/train.py:90 in <module>",
        "(2 native frames left out; .stack has them all)",
    ]
    assert "train.py:42" in repr(peak) and "CUDACachingAllocator" not in repr(peak)
    assert "CUDACachingAllocator" not in peak.to_markdown() and "CUDACachingAllocator" in peak.to_json()
    native = PeakStack(peak_bytes=1, peak_time_us=0.0, alive=empty, by_stack=empty, stack="a.cpp:0 in f")
    assert native.python_stack == "a.cpp:0 in f"
