"""load_compile_log agrees with tlparse 0.4.3 on tlparse's own test inputs.

References: ../shared/fixtures/reference/tlparse/<set>/{compile_directory.json, index.html,
failures_and_restarts.html}, written by tlparse 0.4.3 from the logs in
../shared/fixtures/compile_logs/tlparse_inputs.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.compile.log_reader import CompileLogWarning

REFERENCE_SETS = ["simple", "comp_metrics", "comp_failure"]


@pytest.fixture(scope="module")
def logs(real_data: Callable[[str], Path]) -> Path:
    return real_data("compile_logs/tlparse_inputs")


@pytest.fixture(scope="module")
def refs(real_data: Callable[[str], Path]) -> Path:
    return real_data("reference/tlparse")


def _tlparse_failures(page: str) -> list[tuple[str, str, str, str | None]]:
    """Rows of tlparse's failures_and_restarts.html: (compile id, type, description, source)."""
    rows = []
    for row in re.findall(r"<tr> <td> <a href='[^']*'>\[(.*?)\]</a>\s*</td>(.*?)</tr>", page, re.S):
        cid, rest = row
        cells = [
            html.unescape(re.sub(r"</?pre>", "", c)).strip()
            for c in re.findall(r"<td>(.*?)</td>", rest, re.S)
        ]
        kind, description, source = cells[0], cells[1], cells[2]
        rows.append((cid, kind, description, None if kind == "RestartAnalysis" else source))
    return rows


@pytest.mark.parametrize("name", REFERENCE_SETS)
def test_compile_ids_match_tlparse_compile_directory(logs: Path, refs: Path, name: str) -> None:
    report = nbt.load_compile_log(logs / f"{name}.log")
    directory = json.loads((refs / f"tlparse_tests_inputs_{name}" / "compile_directory.json").read_text())
    assert report.compile_ids == [key.strip("[]") for key in directory]


@pytest.mark.parametrize("name", REFERENCE_SETS)
def test_failures_and_restarts_match_tlparse(logs: Path, refs: Path, name: str) -> None:
    report = nbt.load_compile_log(logs / f"{name}.log")
    folder = refs / f"tlparse_tests_inputs_{name}"
    expected = _tlparse_failures((folder / "failures_and_restarts.html").read_text())
    got = [
        (r.compile_id, r.failure_type, r.description, r.source)
        for r in report.failures.itertuples(index=False)
    ]
    assert got == expected
    index = (folder / "index.html").read_text()
    m = re.search(r"(\d+) restart\(s\) and/or compilation failure\(s\)", index)
    # tlparse writes the count only when there is something to count
    assert (int(m.group(1)) if m else 0) == len(report.failures)


@pytest.mark.parametrize("name", REFERENCE_SETS)
def test_compile_status_matches_tlparse_stack_trie(logs: Path, refs: Path, name: str) -> None:
    """tlparse colours each frame compile: error > empty graph > restart (break) > ok."""
    report = nbt.load_compile_log(logs / f"{name}.log")
    index = (refs / f"tlparse_tests_inputs_{name}" / "index.html").read_text()
    expected = dict(re.findall(r"<a href='#\[([^\]]+)\]' class='status-(\w+)'>", index))
    order = ["error", "empty", "break", "ok"]
    got: dict[str, str] = {}
    for row in report.compiles.itertuples(index=False):
        key = f"{row.frame_id}/{row.frame_compile_id}"
        previous = got.get(key, "ok")
        got[key] = min(previous, row.status, key=order.index)
    assert expected, "reference has no stack trie entries"
    assert {k: got.get(k, "missing") for k in expected} == expected


def test_restart_reasons_and_graph_count_of_comp_metrics(logs: Path) -> None:
    report = nbt.load_compile_log(logs / "comp_metrics.log")
    assert len(report.graphs) == 3
    assert report.restarts == 2
    assert list(report.graphs["function"]) == [
        "fn",
        "torch_dynamo_resume_in_fn_at_9551",
        "torch_dynamo_resume_in_fn_at_9553",
    ]
    assert "x.cos()" in report.graphs["fx_code"].iloc[0]


def test_backend_failure_is_reported_with_its_error(logs: Path) -> None:
    report = nbt.load_compile_log(logs / "comp_failure.log")
    failures = report.compile_failures
    assert list(failures["failure_type"]) == ["BackendCompilerFailed"]
    assert "broken backend" in failures["description"].iloc[0]
    assert "BackendCompilerFailed" in repr(report)


def test_recompile_reasons_of_multi_rank_logs(logs: Path) -> None:
    folder = logs / "multi_rank_logs"
    report = nbt.load_compile_log(folder)
    assert report.ranks == [0, 1, 2, 3]
    # independent count: compilation_metrics records carrying a recompile_reason, per rank file
    expected = {}
    for file in folder.glob("*.log"):
        rank = int(re.search(r"rank_(\d+)", file.name).group(1))
        n = 0
        for line in file.read_text().splitlines():
            if '{"compilation_metrics"' in line:
                metrics = json.loads(line[line.index("{") :])["compilation_metrics"]
                n += bool(metrics.get("recompile_reason"))
        expected[rank] = n
    got = report.recompiles.groupby("rank").size().to_dict()
    assert {r: got.get(r, 0) for r in expected} == expected
    assert expected[1] == 14
    rank1 = report.recompiles[report.recompiles["rank"] == 1]
    assert list(rank1["compile_id"]) == [f"0/{i}" for i in range(1, 15)]
    assert list(rank1["previous_compile_id"]) == [f"0/{i}" for i in range(14)]
    assert rank1["failed_guard"].iloc[0] == "tensor 'x' size mismatch at index 0. expected 2, actual 3"
    # ranks 0 and 2 failed in the backend
    assert sorted(report.compile_failures["rank"].tolist()) == [0, 2]


def test_messy_folder_skips_stray_files_with_a_note(logs: Path) -> None:
    report = nbt.load_compile_log(logs / "multi_rank_messy_input")
    assert report.ranks == [0, 1]
    assert any("some_other_file.txt" in n for n in report.notes)
    assert any("another.log" in n for n in report.notes)
    assert len(report.graphs) == 2


def test_md5_mismatch_is_noted_and_compile_ids_still_agree(logs: Path, refs: Path) -> None:
    report = nbt.load_compile_log(logs / "simple_corrupted_json.log")
    directory = json.loads((refs / "tlparse_tests_inputs_simple" / "compile_directory.json").read_text())
    assert report.compile_ids == [k.strip("[]") for k in directory]
    assert any("MD5" in n and ":13" in n for n in report.notes)


def test_corrupted_envelope_line_is_skipped_with_a_warning(logs: Path, tmp_path: Path) -> None:
    lines = (logs / "comp_metrics.log").read_text().splitlines(keepends=True)
    target = next(i for i, line in enumerate(lines) if '{"dynamo_guards"' in line)
    lines[target] = lines[target][: len(lines[target]) // 2] + "\n"  # cut the JSON envelope in half
    broken = tmp_path / "broken.log"
    broken.write_text("".join(lines))
    with pytest.warns(CompileLogWarning, match="skipped 1 damaged line"):
        report = nbt.load_compile_log(broken)
    assert any(f"broken.log:{target + 1}" in n for n in report.notes)
    assert len(report.graphs) == 3  # the rest of the log is read
    assert report.restarts == 2


def test_missing_and_empty_inputs_raise_compile_log_error(tmp_path: Path) -> None:
    with pytest.raises(nbt.CompileLogError, match="not found"):
        nbt.load_compile_log(tmp_path / "nope.log")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(nbt.CompileLogError, match=r"empty\.log"):
        nbt.load_compile_log(empty)
    with pytest.raises(nbt.CompileLogError, match="no TORCH_TRACE log"):
        nbt.load_compile_log(tmp_path)


def test_save_load_round_trip(logs: Path, tmp_path: Path) -> None:
    report = nbt.load_compile_log(logs / "multi_rank_logs")
    folder = report.save(tmp_path / "rep")
    again = nbt.GraphReport.load(folder)
    assert again.compile_ids == report.compile_ids
    assert again.ranks == report.ranks
    for name in ("graphs", "breaks", "recompiles", "failures", "compiles"):
        a, b = getattr(report, name), getattr(again, name)
        assert list(a.columns) == list(b.columns)
        assert a.astype(str).equals(b.astype(str)), name
    assert repr(again) == repr(report)


def test_html_escapes_log_text(logs: Path, tmp_path: Path) -> None:
    text = (logs / "comp_failure.log").read_text().replace("broken backend", "<script>alert(1)</script>")
    # keep the envelope valid: the reason sits in the JSON envelope, which has no digest
    path = tmp_path / "evil.log"
    shutil.copy(logs / "comp_failure.log", path)
    path.write_text(text)
    report = nbt.load_compile_log(path)
    page = report._repr_html_()
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "text/plain" in report._repr_mimebundle_()


def test_loading_a_damaged_saved_report_names_the_file(logs: Path, tmp_path: Path) -> None:
    folder = nbt.load_compile_log(logs / "comp_metrics.log").save(tmp_path / "rep")
    (folder / "breaks.parquet").write_bytes(b"not parquet")
    with pytest.raises(nbt.NbtUsageError, match=r"breaks\.parquet"):
        nbt.GraphReport.load(folder)
    with pytest.raises(nbt.NbtUsageError, match=r"report\.json"):
        nbt.GraphReport.load(tmp_path)


def test_graph_break_attempts_are_not_compile_failures() -> None:
    """torch logs a compile attempt a graph break aborted as ``Unsupported`` (tlparse lists
    it). With a restart it is only the break; without one Dynamo gave up on the frame. Neither
    is a compile failure; a backend failure is, on whichever rank."""
    import pandas as pd

    from nbtoolkit.compile.report import GraphReport

    failures = pd.DataFrame(
        [
            (0, "0/0", "RestartAnalysis", "Unsupported Tensor.item() call", None),
            (0, "0/0", "Unsupported", "Unsupported Tensor.item() call", "model.py:25"),
            (1, "0/0", "Unsupported", "a break inside a nested call", "model.py:9"),
            (1, "1/0", "BackendCompilerFailed", "broken backend", "N/A:0"),
        ],
        columns=["rank", "compile_id", "failure_type", "description", "source"],
    )
    none = pd.DataFrame()
    report = GraphReport(graphs=none, breaks=none, recompiles=none, failures=failures, compiles=none)
    assert report.restarts == 1
    assert list(report.compile_failures["failure_type"]) == ["BackendCompilerFailed"]
    given_up = report.frames_given_up
    assert list(zip(given_up["rank"], given_up["source"], strict=True)) == [(1, "model.py:9")]
    assert len(report.failures) == 4  # tlparse's table keeps every row
