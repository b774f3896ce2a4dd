"""Caches never follow a symbolic link they did not make, and never write outside their folder.

A folder of traces may come from someone else, with a ``.nbt-cache`` inside it; a ``cache_dir``
may be a link. Each case here plants links where the caches read and write (the cache folder
itself, the exact file and folder names a cache entry takes, a FIFO behind a summary's name)
and checks that the place the links point to is untouched, that nothing hangs, and that the
result equals the uncached one. The traces are the 2-rank gloo run this session records.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.core.cache_folder import read_cached_file, usable_cache_folder, write_cached_file
from nbtoolkit.trace.trace_cache import cache_key
from tests.conftest import folder_state


@pytest.fixture
def traces(tmp_path: Path, gloo_trace_folder: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    for rank_file in sorted(gloo_trace_folder.glob("*.json")):
        shutil.copy2(rank_file, folder / rank_file.name)
    return folder


def test_a_shipped_cache_link_is_not_followed(traces: Path, victim: Path) -> None:
    before = folder_state(victim)
    (traces / ".nbt-cache").symlink_to(victim, target_is_directory=True)
    summary = nbt.summarize_traces(traces, cache=True, workers=1)
    assert folder_state(victim) == before
    assert any("symbolic link" in note for note in summary.notes)
    assert summary.cache_dir is None
    pd.testing.assert_frame_equal(summary.overlap, nbt.summarize_traces(traces, workers=1).overlap)


def test_an_explicit_cache_dir_that_is_a_link_is_not_followed(
    traces: Path, victim: Path, tmp_path: Path
) -> None:
    before = folder_state(victim)
    link = tmp_path / "cache_link"
    link.symlink_to(victim, target_is_directory=True)
    summary = nbt.summarize_traces(traces, cache_dir=link, workers=1)
    assert folder_state(victim) == before
    assert any("symbolic link" in note and "cache_dir=" in note for note in summary.notes)


def test_links_planted_at_the_entry_names_are_replaced_not_written_through(
    traces: Path, victim: Path, tmp_path: Path
) -> None:
    """A real cache folder whose entry names are links to the victim: writes land in the cache only."""
    cache = tmp_path / "cache"
    cache.mkdir()
    before = folder_state(victim)
    for rank_file in sorted(traces.glob("*.json")):
        key = cache_key(rank_file)
        (cache / f"{key}.summary.json").symlink_to(victim / "passwd")
        (cache / key).symlink_to(victim, target_is_directory=True)
    first = nbt.summarize_traces(traces, cache_dir=cache, workers=1)
    assert folder_state(victim) == before
    for rank_file in sorted(traces.glob("*.json")):
        key = cache_key(rank_file)
        assert not (cache / key).is_symlink() and (cache / key / "trace.json").is_file()
        assert not (cache / f"{key}.summary.json").is_symlink()
    second = nbt.summarize_traces(traces, cache_dir=cache, workers=1)  # read back from the real entries
    pd.testing.assert_frame_equal(first.overlap, second.overlap)
    assert len(second.load_ranks([0]).events) > 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_fifo_behind_a_summary_name_neither_hangs_nor_is_read(traces: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for rank_file in sorted(traces.glob("*.json")):
        (cache / f"{cache_key(rank_file)}.summary.json").symlink_to(fifo)
    start = time.perf_counter()
    summary = nbt.summarize_traces(traces, cache_dir=cache, workers=1)
    assert time.perf_counter() - start < 60
    assert len(summary.overlap) == 2
    os.mkfifo(cache / "direct.summary.json")
    assert read_cached_file(cache, "direct.summary.json") is None  # a FIFO itself, opened non-blocking


def test_cache_file_names_cannot_leave_the_folder(tmp_path: Path) -> None:
    cache, _ = usable_cache_folder(tmp_path / "cache")
    assert cache is not None
    for name in ("../escape", "a/b", "..", ".", ""):
        with pytest.raises(OSError):
            write_cached_file(cache, name, b"x")
        assert read_cached_file(cache, name) is None
    assert not (tmp_path / "escape").exists()
