"""The lean per-rank summarizer (numpy, no pandas) gives the pandas path's records, exactly.

``summarize_rank_file(f)`` against ``summarize_trace(load_rank_file(f)).to_records()`` on every rank
trace the session records (a gloo DDP job, a one-process CPU step, a scale set written from the
gloo job), on every Kineto trace of ``$NBT_DATA/traces``, with the last ProfilerStep left out and
kept; and the worker path (``_summarize_one``) gives the same outcome whichever path it takes,
without importing pandas in the process that runs it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from nbtoolkit.core.errors import TraceError
from nbtoolkit.trace._kineto_json import NotATrace
from nbtoolkit.trace.kineto import load_rank_file
from nbtoolkit.trace.scale_set import write_scale_set
from nbtoolkit.trace.summarize_folder import _summarize_one
from nbtoolkit.trace.summarize_rank import summarize_trace
from nbtoolkit.trace.summarize_rank_lean import LeanUnsupported, summarize_rank_file
from tests._python import run_python


def _assert_same(got: Any, want: Any, path: str = "records") -> None:
    """Same keys in the same order, same types, same values (floats within 1e-9 relative, NaN = NaN)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for key in want:
            _assert_same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert isinstance(got, float), f"{path}: {got!r} is not a float ({want!r})"
        same = (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=1e-9, abs_tol=0.0)
        assert same, f"{path}: {got!r} != {want!r}"
    else:
        assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


def _check_file(file: Path) -> list[dict[str, Any]]:
    """Lean == pandas for both last-step settings; the pandas records (or [] for a file both refuse)."""
    records = []
    for include_last_step in (False, True):
        refused: Exception | None = None
        try:
            want = summarize_trace(load_rank_file(file), include_last_step=include_last_step).to_records()
        except (NotATrace, TraceError) as exc:
            refused = exc
        if refused is not None:
            # the lean path raises the same error, or hands the file to the pandas path
            with pytest.raises((type(refused), LeanUnsupported)) as lean_exc:
                summarize_rank_file(file, include_last_step=include_last_step)
            if lean_exc.type is not LeanUnsupported:
                assert str(lean_exc.value) == str(refused)
            return []
        try:
            got = summarize_rank_file(file, include_last_step=include_last_step)
        except LeanUnsupported:
            continue  # the worker falls back: tested in test_worker_outcome_is_the_pandas_paths
        _assert_same(got, want)
        records.append(want)
    return records


def test_recorded_gloo_job(gloo_trace_folder: Path) -> None:
    files = sorted(gloo_trace_folder.glob("rank*.json"))
    assert len(files) == 2
    for file in files:
        records = _check_file(file)
        assert len(records) == 2, f"{file.name}: the lean path did not summarize it"
        # the case the test claims: gloo communication, by step
        assert records[0]["overlap"]["data"]["method"] == ["cpu-gloo"]
        assert records[0]["overlap"]["data"]["comm_time_us"][0] > 0
        assert len(records[0]["overlap_by_step"]["data"]["step"]) >= 1


def test_recorded_cpu_step_has_no_communication(cpu_trace_file: Path) -> None:
    records = _check_file(cpu_trace_file)
    assert len(records) == 2
    assert records[0]["overlap"]["data"]["comm_time_us"] == [0.0]
    assert math.isnan(records[0]["overlap"]["data"]["overlap_pct"][0])
    assert records[0]["info"][0]["notes"], "rank 0 taken from nowhere: the note the pandas path writes"


def test_trace_without_profiler_steps(cpu_trace_file: Path, tmp_path: Path) -> None:
    doc = json.loads(cpu_trace_file.read_text())
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")
    ]
    file = tmp_path / "rank0.json"
    file.write_text(json.dumps(doc))
    records = _check_file(file)
    assert len(records) == 2
    assert records[0]["step_labels"] == [] and records[0]["steps"]["data"]["step"] == []


def test_scale_set_written_from_the_gloo_job(gloo_trace_folder: Path, tmp_path: Path) -> None:
    """The files load_trace(folder) reads at scale (rank ids rewritten, one straggler, one truncated)."""
    write_scale_set(gloo_trace_folder, tmp_path, ranks=4, corrupt=[2])
    files = sorted(tmp_path.glob("rank*.json"))
    assert len(files) == 4
    summarized = [file for file in files if _check_file(file)]
    assert len(summarized) == 3  # the truncated rank: the same TraceError from both paths


_TRACE_SUFFIXES = (".json", ".json.gz")


def _data_traces() -> list[Path]:
    """Every trace of the first local data folder that has them (the locator's: NBT_DATA, then
    ../shared/fixtures); never downloaded, at collection time."""
    from nbtoolkit.core.datasets import data_folders

    for folder in data_folders():
        root = folder / "traces"
        if root.is_dir():
            return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(_TRACE_SUFFIXES))
    return []


@pytest.mark.skipif(
    not _data_traces(), reason="needs the real traces/ of a data folder (no NBT_DATA, no ../shared/fixtures)"
)
@pytest.mark.parametrize("file", _data_traces(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces(file: Path) -> None:
    _check_file(file)


def test_worker_outcome_is_the_pandas_paths(gloo_trace_folder: Path, tmp_path: Path) -> None:
    """``_summarize_one`` (what a worker runs): the lean outcome, and the fallback for what it refuses."""
    not_gzip = tmp_path / "rank0.json.gz"  # named .gz, not gzip: only the whole-file decode reads it
    not_gzip.write_bytes((gloo_trace_folder / "rank0.json").read_bytes())
    with pytest.raises(LeanUnsupported):
        summarize_rank_file(not_gzip)
    outcome = _summarize_one(str(not_gzip), None, False)
    assert outcome.kind == "corrupt" and "not gzip-compressed" in outcome.reason
    file = gloo_trace_folder / "rank1.json"
    lean = _summarize_one(str(file), None, True)
    assert lean.records is not None
    _assert_same(lean.records, summarize_trace(load_rank_file(file), include_last_step=True).to_records())


WORKER_WITHOUT_PANDAS = """
import sys
from nbtoolkit.trace.summarize_folder import _lean_worker, _summarize_chunk

_lean_worker(False)
outcomes = _summarize_chunk([(f, None, False, False) for f in sys.argv[1:]])
assert all(o.records is not None for o in outcomes), outcomes
assert "pyarrow" not in sys.modules or sys.modules["pyarrow"] is not None, "pyarrow blocked in a lean worker"
print("pandas imported:", "pandas" in sys.modules)
"""


def test_a_lean_worker_never_imports_pandas(gloo_trace_folder: Path) -> None:
    files = [str(p) for p in sorted(gloo_trace_folder.glob("rank*.json"))]
    done = run_python("-c", WORKER_WITHOUT_PANDAS, *files)
    assert "pandas imported: False" in done.stdout, done.stdout + done.stderr
