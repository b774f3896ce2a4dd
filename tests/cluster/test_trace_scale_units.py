"""The cluster path's file assignment (no Ray needed): each file read once, by a rank of a node holding it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbtoolkit.cluster.summarize_traces import _assign, list_trace_files_on_rank


def test_each_file_goes_to_one_rank_of_a_node_that_has_it() -> None:
    listings = {
        0: {"node": "a", "files": [("/a/r0.json", 10), ("/a/r1.json", 10), ("/shared/s.json", 5)]},
        1: {"node": "a", "files": [("/a/r0.json", 10), ("/a/r1.json", 10), ("/shared/s.json", 5)]},
        2: {"node": "b", "files": [("/b/r2.json", 10), ("/shared/s.json", 5)]},
    }
    assignment, owners = _assign(listings)
    assert sorted(owners) == ["/a/r0.json", "/a/r1.json", "/b/r2.json", "/shared/s.json"]
    assert owners["/b/r2.json"] == 2  # only node b has it
    assert owners["/shared/s.json"] in (0, 1)  # seen by both nodes, read once, on the first
    assert {owners["/a/r0.json"], owners["/a/r1.json"]} == {0, 1}  # spread over node a's ranks
    assert sorted(f for files in assignment.values() for f in files) == sorted(owners)
    only, _ = _assign(listings, only={"/b/r2.json"})
    assert only == {2: ["/b/r2.json"]}


def test_a_rank_lists_a_folder_or_a_pattern_with_its_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rank3.json").write_text("{}")
    (tmp_path / "rank4.json.gz").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / ".hidden.json").write_text("{}")
    listed = list_trace_files_on_rank(str(tmp_path))
    assert [Path(p).name for p, _ in listed["files"]] == ["rank3.json", "rank4.json.gz"]
    monkeypatch.setenv("RANK", "3")
    mine = list_trace_files_on_rank(str(tmp_path / "rank{rank}.json"))
    assert [Path(p).name for p, _ in mine["files"]] == ["rank3.json"] and mine["node"]
