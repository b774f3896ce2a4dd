"""export_memory_snapshot: a CPU timeline written in torch's allocator-snapshot format.

The snapshot is recorded in this session (tests/memory/conftest.py), so these tests run on
any clone: torch's own memory_viz reads what we write, and nbtoolkit's reader gets back the
allocations, the bytes and the stacks of the timeline.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError, SnapshotError
from nbtoolkit.memory.snapshot_export import BLOCK_ROUNDING, allocator_snapshot


def _rounded(size: int) -> int:
    return max(BLOCK_ROUNDING, -(-size // BLOCK_ROUNDING) * BLOCK_ROUNDING)


def _expected_bytes(timeline: Any) -> tuple[int, int]:
    """(peak, end) of the timeline replayed as the allocator sees it: allocations rounded to blocks.

    Memory that existed before recording keeps its exact size (a real snapshot reports its
    requested bytes), and recategorize rows allocate nothing.
    """
    held: dict[int, int] = {}
    current = peak = 0
    events = timeline.events
    for action, delta, tensor in zip(
        events["action"].astype(str), events["delta_bytes"], events["tensor"], strict=True
    ):
        if action in ("alloc", "preexisting"):
            held[int(tensor)] = _rounded(int(delta)) if action == "alloc" else int(delta)
            current += held[int(tensor)]
        elif action == "free" and int(tensor) in held:
            current -= held.pop(int(tensor))
        peak = max(peak, current)
    return peak, current


def test_reader_gets_back_the_timelines_bytes(recorded_memory: Any) -> None:
    timeline = recorded_memory.timeline
    snapshot = nbt.load_memory_snapshot(recorded_memory.snapshot)
    again = snapshot.timeline()
    peak, end = _expected_bytes(timeline)
    assert again.peak_bytes == peak
    assert int(again.events["delta_bytes"].sum()) == end
    allocs = int((timeline.events["action"] == "alloc").sum())
    assert int((snapshot.trace["action"] == "alloc").sum()) == allocs
    assert int((again.events["action"] == "alloc").sum()) == allocs
    # Blocks still alive: exactly the allocations the timeline never freed, with their exact bytes.
    live = snapshot.blocks[snapshot.blocks["state"] == "active_allocated"]
    assert int(live["requested_size"].sum()) == int(timeline.events["delta_bytes"].sum())
    assert (live["size"] % BLOCK_ROUNDING == 0).all() and (live["size"] >= live["requested_size"]).all()


def test_torch_memory_viz_reads_the_file(recorded_memory: Any, tmp_path: Any) -> None:
    """torch's own command line prints the same totals as MemorySnapshot.stats(); its plots build."""
    from torch.cuda import _memory_viz

    result = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(recorded_memory.snapshot)],
        capture_output=True,
        text=True,
        check=True,
    )
    theirs = [line for line in result.stdout.splitlines() if re.match(r"^(segments|total_\w+): ", line)]
    assert nbt.load_memory_snapshot(recorded_memory.snapshot).stats().lines() == theirs
    data = pickle.loads(recorded_memory.snapshot.read_bytes())
    assert "<html" in _memory_viz.trace_plot(data).lower()
    assert "<html" in _memory_viz.segment_plot(data).lower()


def test_stacks_and_the_optimizer_phase_survive(recorded_memory: Any) -> None:
    snapshot = nbt.load_memory_snapshot(recorded_memory.snapshot)
    # The step lives in tests/memory/conftest.py: the user's own line is found in the frames.
    assert any(source.startswith("memory/conftest.py:") for source in snapshot.stack_sources)
    stages = list(snapshot.annotations["stage"])
    assert stages and stages[0] == "START" and stages.count("START") == stages.count("END")
    assert set(snapshot.annotations["name"]) == {"Optimizer.step"}
    phases = set(snapshot.timeline().events["phase"].astype(str))
    assert {"forward", "backward", "optimizer"} <= phases


def test_device_index_and_bad_arguments(recorded_memory: Any, tmp_path: Any) -> None:
    data = allocator_snapshot(recorded_memory.timeline, device=2)
    assert [len(t) > 0 for t in data["device_traces"]] == [False, False, True]
    assert {s["device"] for s in data["segments"]} == {2}
    with pytest.raises(NbtUsageError, match=r"needs a MemoryTimeline .* got str"):
        nbt.export_memory_snapshot("timeline", tmp_path / "x.pickle")
    with pytest.raises(NbtUsageError, match="device must be a CUDA device index >= 0, got -1"):
        allocator_snapshot(recorded_memory.timeline, device=-1)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SnapshotError, match="cannot write the snapshot to"):
        nbt.export_memory_snapshot(recorded_memory.timeline, blocker / "x.pickle")


def test_figures_report_and_magic_on_the_recorded_snapshot(
    recorded_memory: Any, shell: InteractiveShell, tmp_path: Any
) -> None:
    from nbtoolkit.memory.figures import segment_figure

    snapshot = nbt.load_memory_snapshot(recorded_memory.snapshot)
    segments = segment_figure(snapshot)
    assert len(segments.data) == 3 and len(segments.data[0].y) == min(200, len(snapshot.segments))
    names = {t.name for t in snapshot.timeline().figure().data}
    assert {"phase: optimizer", "reserved (segments)"} <= names
    path = tmp_path / "memory.html"
    nbt.report(snapshot, snapshot.timeline(), path=path)
    assert path.read_text().count("plotly-graph-div") >= 3
    result = shell.run_line_magic("nbt", f"snapshot {recorded_memory.snapshot}")
    assert isinstance(result, nbt.MemorySnapshot)
    assert result.stats().lines() == snapshot.stats().lines()
