"""CUDA allocator snapshots: safe loading, memory_viz totals, the timeline built from them."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.core.datasets import default_registry
from nbtoolkit.core.errors import SnapshotError
from nbtoolkit.memory.snapshot import MemorySnapshot
from nbtoolkit.memory.snapshot_reader import load_memory_snapshot, load_memory_timeline, restricted_loads

# The snapshot tests/memory/conftest.py records in this session (beside the real ones).
RECORDED = "recorded"

PICKLES = [
    "bcraf_memory_snapshot.pickle",  # newest format: compile_context, user_metadata, optimizer annotations
    "cran_memory_snapshot.pickle",  # older format: no time_us
    "kk_cs336_systems_memory_logs_memory_ctx128_forward.pickle",  # torch.compile annotations
    "kk_memory_files_memory_ctx128_forward.pickle",
    "kk_memory_files_memory_ctx128_fullstep.pickle",  # full training step, optimizer annotations
    "kk_memory_files_memory_ctx256_forward_.pickle",  # segment_free events
    "mud_dump_snapshot.pickle",  # empty traces
    "mud_memory_snapshot.pkl",  # legacy bare list of segments
    "shrey_profile_grad.pkl",
    "shrey_profile_no_grad.pkl",
]
# The snapshots memory_viz was run on: named by the registry, so the list is the same on a
# machine without the data (those tests then skip naming the artifact).
REFERENCED = sorted(
    a.name.rsplit("/", 1)[-1].removesuffix(".stats.txt")
    for a in default_registry().artifacts("reference/memory_viz_stats")
)


def _total_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^(segments|total_\w+): ", line)]


@pytest.mark.parametrize("name", REFERENCED)
def test_stats_equal_memory_viz_reference(real_data: Callable[[str], Path], name: str) -> None:
    reference = real_data(f"reference/memory_viz_stats/{name}.stats.txt").read_text()
    snap = load_memory_snapshot(real_data(f"memory/{name}"))
    assert snap.stats().lines() == _total_lines(reference)
    assert len(_total_lines(reference)) == 4


@pytest.mark.parametrize("name", [*PICKLES, RECORDED])
def test_stats_equal_torch_segsum_on_every_fixture(snapshot_file: Callable[[str], Path], name: str) -> None:
    """Every pickle, also those without a stored reference: torch's own segsum on the same data."""
    from torch.cuda import _memory_viz

    path = snapshot_file(name)
    data = restricted_loads(path.read_bytes())
    if isinstance(data, list):
        data = {"segments": data, "traces": []}
    with redirect_stdout(io.StringIO()):
        expected = _total_lines(_memory_viz.segsum(data))
    stats = load_memory_snapshot(path).stats()
    assert stats.lines() == expected
    # The totals also add up exactly in bytes (what memory_viz asserts internally).
    assert stats.total_allocated + stats.total_free == stats.total_reserved


@pytest.mark.parametrize("name", [*PICKLES, RECORDED])
def test_timeline_ends_at_the_snapshot_state(snapshot_file: Callable[[str], Path], name: str) -> None:
    """Replaying the trace from the pre-existing blocks ends exactly at the live blocks of the snapshot."""
    snap = load_memory_snapshot(snapshot_file(name))
    timeline = snap.timeline()
    device = int(timeline.device.split(":")[1])
    blocks = snap.blocks
    live = blocks[(blocks["device"] == device) & (blocks["state"] == "active_allocated")]
    assert int(timeline.events["delta_bytes"].sum()) == int(live["requested_size"].sum())
    assert timeline.peak_bytes >= int(live["requested_size"].sum())
    by_category = timeline.by_category()
    assert int(by_category["total"].max()) == timeline.peak_bytes
    assert (by_category["total"] >= 0).all()
    # Allocated bytes never exceed the bytes reserved in segments at the same moment.
    reserved = snap.reserved_series(device)
    assert int(reserved["reserved_bytes"].iloc[-1]) == int(
        snap.segments.loc[snap.segments["device"] == device, "total_size"].sum()
    )
    reserved = reserved.groupby("time_us", as_index=False).last()
    both = pd.merge_asof(by_category[["time_us", "total"]], reserved, on="time_us")
    assert (both["total"] <= both["reserved_bytes"]).all()


def test_formats_are_recognized(real_data: Callable[[str], Path]) -> None:
    legacy = load_memory_snapshot(real_data("memory/mud_memory_snapshot.pkl"))
    assert legacy.legacy_segment_list and len(legacy.trace) == 0 and len(legacy.segments) == 255

    empty = load_memory_snapshot(real_data("memory/mud_dump_snapshot.pickle"))
    assert len(empty.trace) == 0 and not empty.legacy_segment_list
    assert set(empty.timeline().events["action"]) == {"preexisting"}

    old = load_memory_snapshot(real_data("memory/cran_memory_snapshot.pickle"))
    assert old.trace["time_us"].isna().all()
    assert any("no time_us" in note for note in old.timeline().notes)

    newest = load_memory_snapshot(real_data("memory/bcraf_memory_snapshot.pickle"))
    assert set(newest.trace["compile_context"]) == {"N/A"}
    assert "Optimizer.step#AdamW.step" in set(newest.annotations["name"])

    freed_segments = load_memory_snapshot(real_data("memory/kk_memory_files_memory_ctx256_forward_.pickle"))
    assert (freed_segments.trace["action"] == "segment_free").sum() == 287

    compiled_name = "memory/kk_cs336_systems_memory_logs_memory_ctx128_forward.pickle"
    compiled = load_memory_snapshot(real_data(compiled_name))
    assert compiled.annotations["name"].str.contains("dynamo_timed").any()


def test_full_step_has_phases_and_categories(real_data: Callable[[str], Path]) -> None:
    snap = load_memory_snapshot(real_data("memory/kk_memory_files_memory_ctx128_fullstep.pickle"))
    timeline = snap.timeline()
    phases = set(timeline.events["phase"])
    assert {"forward", "backward", "optimizer", "before"} <= phases
    peaks = timeline.category_peaks().set_index("category")["peak_bytes"]
    assert peaks["activation"] > 0 and peaks["gradient"] > 0 and peaks["optimizer_state"] > 0
    alive = timeline.alive_at_peak(top=None)
    assert list(alive["bytes"]) == sorted(alive["bytes"], reverse=True)
    assert int(alive["bytes"].sum()) == timeline.peak_bytes  # the live allocations make up the peak
    # Allocations made during the recorded step carry the stack that made them.
    recorded = alive[alive["phase"] != "before"]
    assert len(recorded) and (recorded["stack"] != "").all()
    # Python frames where there are any; the autograd thread's stacks are C++ only.
    assert recorded["stack"].str.contains(r"\.py:\d+ in ").any()
    # Segment view: every byte of every segment is accounted for.
    summary = snap.segment_summary()
    parts = summary["allocated"] + summary["free_internal"] + summary["free_external"]
    assert (parts == summary["reserved"]).all()
    assert 0.0 <= snap.fragmentation() <= 1.0


def test_public_api_and_display(real_data: Callable[[str], Path]) -> None:
    snap = nbt.load_memory_snapshot(real_data("memory/shrey_profile_grad.pkl"))
    assert isinstance(snap, nbt.MemorySnapshot)
    text = repr(snap)
    assert "total_reserved: 4.1GiB" in text and "7 segments" in text
    bundle = snap._repr_mimebundle_()
    assert "text/plain" in bundle and "<table" in bundle["text/html"]


def test_html_escapes_frame_names() -> None:
    frames = [{"name": "<script>alert(1)</script>", "filename": "/home/u/train.py", "line": 3}]
    snap = MemorySnapshot.from_dict(
        {
            "segments": [
                {
                    "device": 0,
                    "address": 4096,
                    "total_size": 2048,
                    "stream": 0,
                    "blocks": [
                        {
                            "address": 4096,
                            "size": 2048,
                            "requested_size": 2000,
                            "state": "active_allocated",
                            "frames": frames,
                        }
                    ],
                }
            ],
            "device_traces": [
                [{"action": "alloc", "addr": 4096, "size": 2000, "time_us": 5, "frames": frames}]
            ],
        },
        source="<script>src</script>",
    )
    timeline = snap.timeline()
    assert "<script>" in timeline.alive_at_peak()["source"].iloc[0]
    for html in (timeline._html(), snap._html()):
        assert "<script>" not in html
    assert "&lt;script&gt;" in timeline._html()


# -- safety and bad input ---------------------------------------------------------------


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [_RunsCode(marker)]}))
    refused = r"refused: the pickle tries to load (posix|os|nt)\.system"
    with pytest.raises(SnapshotError, match=refused) as info:
        load_memory_snapshot(evil)
    assert str(evil) in str(info.value)
    assert not marker.exists()


def test_pickle_naming_eval_or_a_class_is_refused(tmp_path: Path) -> None:
    # Hand-written protocol-0 pickle: builtins.eval("...") via GLOBAL + REDUCE.
    payload = b"cbuiltins\neval\n(S'__import__(\"os\").getcwd()'\ntR."
    path = tmp_path / "eval.pkl"
    path.write_bytes(payload)
    with pytest.raises(SnapshotError, match=r"refused: the pickle tries to load builtins\.eval"):
        load_memory_snapshot(path)
    with pytest.raises(SnapshotError, match=r"refused: the pickle tries to load collections\.OrderedDict"):
        restricted_loads(pickle.dumps(__import__("collections").OrderedDict(a=1)))


def test_corrupt_truncated_missing_and_wrong_files(tmp_path: Path, recorded_memory: Any) -> None:
    good = recorded_memory.snapshot.read_bytes()
    truncated = tmp_path / "truncated.pkl"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(SnapshotError, match=r"truncated\.pkl.*corrupt or truncated"):
        load_memory_snapshot(truncated)
    garbage = tmp_path / "garbage.pickle"
    garbage.write_bytes(b"\x80\x04not a pickle at all" * 10)
    with pytest.raises(SnapshotError, match=r"garbage\.pickle"):
        load_memory_snapshot(garbage)
    with pytest.raises(SnapshotError, match=r"no memory snapshot at .*missing\.pkl"):
        load_memory_snapshot(tmp_path / "missing.pkl")
    with pytest.raises(SnapshotError, match="is a folder"):
        load_memory_snapshot(tmp_path)
    not_snapshot = tmp_path / "dict.pkl"
    not_snapshot.write_bytes(pickle.dumps({"weights": [1, 2]}))
    with pytest.raises(SnapshotError, match="not a CUDA allocator snapshot"):
        load_memory_snapshot(not_snapshot)
    with pytest.raises(SnapshotError, match="load_memory_timeline"):
        load_memory_snapshot(recorded_memory.raw_export)


# -- torch.profiler export_memory_timeline raw output ----------------------------------


@pytest.mark.parametrize("source", ["real", "recorded"])
def test_raw_memory_timeline_export(
    real_data: Callable[[str], Path], recorded_memory: Any, source: str
) -> None:
    """A real GPU export, and one torch writes for this session's CPU step."""
    if source == "real":
        path = real_data("memory/hta_export_memory_timeline.raw.gz")
    else:
        path = recorded_memory.raw_export
    rows = json.loads(gzip.decompress(path.read_bytes()))
    timeline = load_memory_timeline(path)
    assert len(timeline.events) == len(rows)
    # Final bytes per category equal the plain sums of the raw rows (torch's category indices).
    names = [
        "parameter",
        "optimizer_state",
        "input",
        "temporary",
        "activation",
        "gradient",
        "autograd_detail",
        "unknown",
    ]
    expected = dict.fromkeys(names, 0)
    for _, _, size, category in rows:
        expected[names[category]] += size
    final = timeline.by_category().iloc[-1]
    assert {name: int(final[name]) for name in names} == expected
    # One coalesced point per distinct timestamp; pre-existing memory joins the first one.
    distinct = len({t for t, *_ in rows if t >= 0})
    assert len(timeline.by_category()) == distinct
    assert timeline.peak_bytes == int(timeline.by_category(coalesce=False)["total"].max())
    # Identities rebuilt by matching frees to allocations: every free closes something,
    # and the allocations live at the peak add up to the peak.
    net = timeline.events.groupby("tensor")["delta_bytes"].sum()
    assert (net >= 0).all()
    assert int(timeline.alive_at_peak(top=None)["bytes"].sum()) == timeline.peak_bytes


@pytest.mark.parametrize("name", ["bcraf_memory_snapshot.pickle", RECORDED])
def test_timeline_save_load_roundtrip(
    tmp_path: Path, snapshot_file: Callable[[str], Path], name: str
) -> None:
    timeline = load_memory_snapshot(snapshot_file(name)).timeline()
    path = timeline.save(tmp_path / "t.parquet")
    again = load_memory_timeline(path)
    assert again.peak_bytes == timeline.peak_bytes
    assert again.stacks == timeline.stacks
    assert again.notes == timeline.notes and again.device == timeline.device
    assert again.category_peaks().equals(timeline.category_peaks())
    with pytest.raises(SnapshotError, match="not a saved memory timeline"):
        nbt.MemoryTimeline.load(snapshot_file(name))


def _frames(*names: tuple[str, str]) -> list[dict[str, object]]:
    return [{"name": name, "filename": filename, "line": 1} for name, filename in names]


def test_oom_devices_and_preexisting_categories() -> None:
    """A hand-made two-device snapshot with an OOM and blocks allocated before recording."""
    weights = _frames(("__init__", "/x/torch/nn/modules/linear.py"), ("<module>", "/home/u/train.py"))
    forward = _frames(
        ("forward", "/x/torch/nn/modules/linear.py"),
        ("_call_impl", "/x/torch/nn/modules/module.py"),
        ("step", "/home/u/train.py"),
    )
    segment = {
        "device": 1,
        "address": 0,
        "total_size": 4096,
        "stream": 0,
        "blocks": [
            {
                "address": 0,
                "size": 1024,
                "requested_size": 1000,
                "state": "active_allocated",
                "frames": weights,
            },
            {
                "address": 1024,
                "size": 1024,
                "requested_size": 1024,
                "state": "active_allocated",
                "frames": [],
            },
            {"address": 2048, "size": 2048, "requested_size": 2048, "state": "inactive", "frames": []},
        ],
    }
    trace_1 = [
        {"action": "alloc", "addr": 2048, "size": 2048, "time_us": 10, "frames": forward},
        {
            "action": "free_completed",
            "addr": 1024,
            "size": 1024,
            "time_us": 11,
            "frames": forward,
        },  # pre-existing
        {"action": "alloc", "addr": 1024, "size": 1024, "time_us": 12, "frames": forward},
        {"action": "free_completed", "addr": 2048, "size": 2048, "time_us": 13, "frames": forward},
        {"action": "oom", "addr": 0, "size": 1 << 30, "device_free": 512, "time_us": 14, "frames": forward},
    ]
    snap = MemorySnapshot.from_dict({"segments": [segment], "device_traces": [[], trace_1]})
    assert snap.devices() == [1]
    ooms = snap.ooms
    assert len(ooms) == 1 and ooms["size"].iloc[0] == 1 << 30 and ooms["device_free"].iloc[0] == 512
    assert "out-of-memory events recorded: 1" in repr(snap)
    timeline = snap.timeline()  # defaults to the device with trace entries
    assert timeline.device == "cuda:1"
    assert any("out-of-memory" in note for note in timeline.notes)
    events = timeline.events
    before = events[events["action"] == "preexisting"]
    # The weight block (stack under nn.Linear.__init__) and the block freed in the trace existed before.
    assert sorted(before["delta_bytes"]) == [1000, 1024]
    assert set(before.loc[before["delta_bytes"] == 1000, "category"]) == {"parameter"}
    assert int(events["delta_bytes"].sum()) == 1000 + 1024  # what is live in the segments
    assert timeline.peak_bytes == 1000 + 1024 + 2048
    stats = snap.stats()
    assert (stats.total_allocated, stats.free_internal, stats.free_external) == (2024, 24, 2048)
    assert snap.fragmentation() == 0.0  # the only free block is one piece


def test_load_memory_timeline_errors(tmp_path: Path) -> None:
    coalesced = tmp_path / "coalesced.json"
    coalesced.write_text(json.dumps([[1, 2], [[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6, 7, 8]]]))
    with pytest.raises(SnapshotError, match=r"raw\.json\.gz"):
        load_memory_timeline(coalesced)
    broken = tmp_path / "broken.json"
    broken.write_text("[[1, 2, 3, 4], [5, 6")
    with pytest.raises(SnapshotError, match=r"broken\.json is corrupt or truncated JSON"):
        load_memory_timeline(broken)
    wrong = tmp_path / "wrong.json"
    wrong.write_text("[[1, 2, 3]]")
    with pytest.raises(SnapshotError, match="not export_memory_timeline raw output"):
        load_memory_timeline(wrong)
    with pytest.raises(SnapshotError, match="no memory timeline at"):
        load_memory_timeline(tmp_path / "nothing.json")


@pytest.mark.parametrize("name", ["kk_memory_files_memory_ctx128_fullstep.pickle", RECORDED])
def test_snapshot_save_load_roundtrip(
    tmp_path: Path, snapshot_file: Callable[[str], Path], name: str
) -> None:
    snap = load_memory_snapshot(snapshot_file(name))
    folder = snap.save(tmp_path / "saved")
    again = load_memory_snapshot(folder)
    assert again.stats().lines() == snap.stats().lines()
    assert again.timeline().category_peaks().equals(snap.timeline().category_peaks())
    assert again.annotations.equals(snap.annotations)
    (folder / "snapshot.json").write_text("{}")
    with pytest.raises(SnapshotError, match=r"not written by MemorySnapshot\.save"):
        load_memory_snapshot(folder)
