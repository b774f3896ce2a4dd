"""%%nbt memory and %nbt snapshot show what memory_timeline / load_memory_snapshot return."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.memory.snapshot_reader import load_memory_snapshot

FRAMES = [{"name": "forward", "filename": "/home/u/train.py", "line": 3}]
SNAPSHOT: dict[str, Any] = {
    "segments": [
        {
            "device": 0,
            "address": 4096,
            "total_size": 8192,
            "stream": 0,
            "blocks": [
                {"address": 4096, "size": 2048, "requested_size": 2000, "state": "active_allocated",
                 "frames": FRAMES},
                {"address": 6144, "size": 6144, "requested_size": 6144, "state": "inactive", "frames": []},
            ],
        }
    ],
    "device_traces": [[{"action": "alloc", "addr": 4096, "size": 2000, "time_us": 5, "frames": FRAMES}]],
}  # fmt: skip


def test_snapshot_magic_on_a_file_shows_what_load_memory_snapshot_gives(
    shell: InteractiveShell, tmp_path: Path, assert_same_display: Callable[..., None]
) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    from_magic = shell.run_line_magic("nbt", f"snapshot {path}")
    assert_same_display(from_magic, load_memory_snapshot(path))
    assert "2 blocks" in repr(from_magic)  # a summary of this snapshot, not an empty one


def test_snapshot_magic_on_a_variable_takes_a_dict_or_a_loaded_snapshot(
    shell: InteractiveShell, assert_same_display: Callable[..., None]
) -> None:
    shell.user_ns["raw_snapshot"] = SNAPSHOT
    from_magic = shell.run_line_magic("nbt", "snapshot raw_snapshot")
    assert_same_display(from_magic, load_memory_snapshot(SNAPSHOT))
    assert from_magic.source == "" and "(in memory)" in repr(from_magic)
    shell.user_ns["loaded"] = from_magic
    assert shell.run_line_magic("nbt", "snapshot loaded") is from_magic  # as it is, not re-read


def test_memory_magic_shows_the_timeline_memory_timeline_gives(
    shell: InteractiveShell, assert_same_display: Callable[..., None]
) -> None:
    shell.run_cell(
        "import torch\n"
        "def step():  # allocates and frees the same tensors on every run\n"
        "    weight = torch.ones(64, 32, requires_grad=True)\n"
        "    (torch.ones(16, 64) @ weight).sum().backward()\n"
    ).raise_error()
    from_magic = shell.run_cell_magic("nbt", "memory", "step()\n")
    from_api = nbt.memory_timeline(shell.user_ns["step"])
    # The bytes are the same on every run; the time of the peak is not, nor the file name of
    # the outermost frame (the magic's cell, or this test).
    assert_same_display(from_magic, from_api, mask=r"at [\d,.]+ ms|&lt;(nbt-cell|string)&gt;\(\d+\)")
    assert "gradient" in repr(from_magic)


def test_the_old_no_figure_flag_still_runs(shell: InteractiveShell) -> None:
    result = shell.run_cell_magic("nbt", "memory --no-figure", "x = [0] * 10\n")
    assert isinstance(result, nbt.MemoryTimeline)


def test_snapshot_magic_reads_with_the_api_filters(
    shell: InteractiveShell, tmp_path: Path, assert_same_display: Callable[..., None]
) -> None:
    two_devices = {
        "segments": [*SNAPSHOT["segments"], {**SNAPSHOT["segments"][0], "device": 1, "address": 1 << 20}],
        "device_traces": [
            [*SNAPSHOT["device_traces"][0], {"action": "free_requested", "addr": 4096, "size": 2000,
                                            "time_us": 50, "frames": FRAMES}],
            [],
        ],
    }  # fmt: skip
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two_devices))
    line = f"snapshot {path} --device 0 --time-range 1:10"
    from_magic = shell.run_line_magic("nbt", line)
    assert_same_display(from_magic, load_memory_snapshot(path, devices=0, time_range_us=(1, 10)))
    assert set(from_magic.segments["device"]) == {0} and len(from_magic.trace) == 1
    segments_only = shell.run_line_magic("nbt", f"snapshot {path} --no-history")
    assert len(segments_only.trace) == 0 and set(segments_only.segments["device"]) == {0, 1}
    assert segments_only.stats() == load_memory_snapshot(path).stats()


def test_snapshot_magic_names_a_malformed_time_range(shell: InteractiveShell, tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    result = shell.run_cell(f"%nbt snapshot {path} --time-range 5-9")
    assert isinstance(result.error_in_exec, nbt.NbtUsageError)
    message = str(result.error_in_exec)
    assert "--time-range takes START:END" in message and "'5-9'" in message
    # the kernel goes on: an open range reads everything
    assert len(shell.run_line_magic("nbt", f"snapshot {path} --time-range :").trace) == 1
