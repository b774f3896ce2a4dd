"""Property-based fuzzing of saved results: a tampered folder ends in an NbtError or the right result.

The test saves, in a fresh process, what each ``save`` writes (a ``Trace`` with a collective, a
``MemorySnapshot``, a ``GraphReport`` with a graph break, a ``MemoryTimeline``) and the two
caches (``summarize_traces(cache=True)``'s summaries and events, ``load_memory_snapshot(cache=True)``'s
Parquet folder). hypothesis then tampers with a copy: a column dropped, renamed or of another type
(strings for numbers, nulls, unsigned or huge integers), one value made NaN, infinite, negative or
huge, a Parquet file truncated, with bytes flipped, deleted or given other schema metadata; the
JSON metadata edited (a value of another type, a key deleted, a list where the object is, an extra
key), truncated, flipped or deleted; extra files.

Each load must return a result or raise an :class:`~nbtoolkit.core.errors.NbtError`; a result must then
be usable: its text and HTML, and its analyses (``stats()``, ``by_category()``, the trace analyses,
``break_summary()``...) return or raise an NbtError, never another exception later in an analysis.
A damaged cache is no error at all: the load reads the source again, and when the tampering only
removed or broke something the result equals the untampered one.

Fresh process, address-space limit (the interpreter after imports plus 1.5 GiB) and a per-example
alarm, as for the reader fuzz (test_hardening_fuzz.py). About 25 s on 2 cores; set
``NBT_FUZZ_EXAMPLES`` for a longer run (examples per kind, default 50).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._python import run_module_function

_PER_EXAMPLE_S = 20  # a load and its analyses take well under a second here: this long is a hang
_KINDS = ("trace", "snapshot", "graphs", "timeline", "summary_cache", "snapshot_cache")


# ------------------------------------------------------------------ recorded in a fresh process
def record() -> None:
    """Save every kind of result (and fill both caches) into NBT_FUZZ_OUT."""
    import torch

    import nbtoolkit as nbt

    out = Path(os.environ["NBT_FUZZ_OUT"])
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)

    def step() -> float:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.item()

    traces = out / "traces"
    traces.mkdir()
    nbt.profile(step, steps=2, warmup=1, trace_path=traces / "rank0.json")
    _add_a_collective(traces / "rank0.json")
    trace = nbt.load_trace(traces / "rank0.json")
    assert len(trace.collectives[0]), "the collective is kept"
    trace.save(out / "trace")
    nbt.summarize_traces(traces, cache=True, workers=1)  # fills traces/.nbt-cache

    timeline = nbt.memory_timeline(step, 1, model=model, optimizer=opt)
    timeline.save(out / "timeline.parquet")
    snapshots = out / "snapshots"
    snapshots.mkdir()
    nbt.export_memory_snapshot(timeline, snapshots / "snap.pickle")
    nbt.load_memory_snapshot(snapshots / "snap.pickle").save(out / "snapshot")
    nbt.load_memory_snapshot(snapshots / "snap.pickle", cache=True)  # fills snapshots/.nbt-cache

    def with_break(t: torch.Tensor) -> torch.Tensor:
        t = t * 2
        print("graph break")  # the break is the point
        return t + 1

    torch.compile(with_break, backend="eager")(torch.randn(4))  # TORCH_TRACE is set by the test
    report = nbt.load_compile_log(out / "compile")
    assert len(report.breaks) and len(report.graphs)
    report.save(out / "graphs")


def _add_a_collective(path: Path) -> None:
    """A record_param_comms event with collective metadata, as a distributed run writes it."""
    doc = json.loads(path.read_text())
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    doc["traceEvents"].append(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 1,
            "ts": first + 1,
            "dur": 2,
            "args": {
                "Collective name": "allreduce",
                "In msg nelems": 1024,
                "Out msg nelems": 1024,
                "Group size": 2,
                "dtype": "Float",
                "Process Group Name": "0",
                "Process Group Description": "default_pg",
                "Process Group Ranks": "[0, 1]",
            },
        }
    )
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("saved_fuzz_inputs")
    run_module_function(
        Path(__file__), "record", env={"NBT_FUZZ_OUT": str(out), "TORCH_TRACE": str(out / "compile")}
    )
    for name in ("trace/trace.json", "snapshot/snapshot.json", "graphs/report.json", "timeline.parquet"):
        assert (out / name).is_file(), name
    assert list((out / "traces" / ".nbt-cache").glob("*.summary.json"))
    assert list((out / "snapshots" / ".nbt-cache").glob("*/snapshot.json"))
    return out


def test_tampered_saved_results_give_an_nbt_error_or_a_usable_result(recorded: Path) -> None:
    done = run_module_function(
        Path(__file__), "fuzz", env={"NBT_FUZZ_IN": str(recorded), "NBT_DATA_DOWNLOAD": "0"}, timeout=240
    )
    line = next((s for s in done.stdout.splitlines() if s.startswith("fuzzed")), "")
    assert line, done.stdout[-2000:]
    counts = json.loads(line.split(": ", 1)[1])
    assert set(counts) == set(_KINDS)
    for kind in ("trace", "snapshot", "graphs", "timeline"):
        # both outcomes happen: the fuzz reaches the checks, and leaves some folders loadable
        assert counts[kind]["NbtError"] > 0 and counts[kind]["result"] > 0, counts
    for kind in ("summary_cache", "snapshot_cache"):
        assert counts[kind]["NbtError"] == 0 and counts[kind]["result"] > 0, counts  # a cache is no error


# ------------------------------------------------------------------ tampering
_JSON_SWAPS: list[Any] = [
    None,
    "x",
    "",
    -1,
    0,
    2**70,
    1.5e308,
    float("nan"),
    float("-inf"),
    True,
    [],
    {},
    [[[]]],
    {"a": None},
    ["x", 1],
]


def _swap(value: Any, path: list[int], replacement: Any) -> Any:
    """``value`` with the node at ``path`` (child indices, taken modulo) replaced."""
    if not path or not isinstance(value, (dict, list)) or not value:
        return replacement
    if isinstance(value, dict):
        keys = list(value)
        key = keys[path[0] % len(keys)]
        return {**value, key: _swap(value[key], path[1:], replacement)}
    index = path[0] % len(value)
    return [*value[:index], _swap(value[index], path[1:], replacement), *value[index + 1 :]]


def _delete_key(value: Any, path: list[int]) -> Any:
    """``value`` with one key of an object (found along ``path``) removed."""
    if isinstance(value, dict) and value:
        keys = list(value)
        key = keys[path[0] % len(keys)] if path else keys[0]
        if len(path) <= 1 or not isinstance(value[key], (dict, list)):
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: _delete_key(value[key], path[1:])}
    if isinstance(value, list) and value and path:
        index = path[0] % len(value)
        return [*value[:index], _delete_key(value[index], path[1:]), *value[index + 1 :]]
    return value


def _edit_json(draw: Any, data: Any) -> tuple[str, Any]:
    from hypothesis import strategies as st

    how = draw(st.sampled_from(["swap", "swap", "delete-key", "list", "extra-key"]))
    path = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=6))
    if how == "swap":
        return how, _swap(data, path, draw(st.sampled_from(_JSON_SWAPS)))
    if how == "delete-key":
        return how, _delete_key(data, path)
    if how == "list":
        return how, [data]
    return how, {**data, "unexpected": draw(st.sampled_from(_JSON_SWAPS))} if isinstance(data, dict) else data


def _bytes_damage(draw: Any, data: bytes) -> tuple[str, bytes]:
    from hypothesis import strategies as st

    how = draw(st.sampled_from(["truncate", "flip"]))
    if how == "truncate":
        return how, data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        if out:
            out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    return how, bytes(out)


def _new_column(draw: Any, column: Any) -> Any:
    """Another column of the same length: another type, or one value made special."""
    import pyarrow as pa
    from hypothesis import strategies as st

    n = len(column)
    values = column.to_pylist()
    how = draw(
        st.sampled_from(
            [
                "strings",
                "floats-nan",
                "huge",
                "negative",
                "nulls",
                "bools",
                "uint64",
                "int32",
                "one-value",
                "one-value",
                "dictionary",
            ]
        )
    )
    if how == "strings":
        return pa.array([str(v) for v in values], pa.string())
    if how == "floats-nan":
        return pa.array([float("nan")] * n, pa.float64())
    if how == "huge":
        return pa.array([2**63 - 1] * n, pa.int64())
    if how == "negative":
        return pa.array([-(2**62)] * n, pa.int64())
    if how == "nulls":
        return pa.nulls(n)
    if how == "bools":
        return pa.array([True] * n, pa.bool_())
    if how == "uint64":
        return pa.array([2**64 - 1] * n, pa.uint64())
    if how == "int32":
        try:
            return pa.array(values, pa.int32())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return pa.array([1] * n, pa.int32())
    if how == "dictionary":
        return pa.array([str(v) for v in values], pa.string()).dictionary_encode()
    if not n:
        return column
    special = draw(
        st.sampled_from(
            [
                float("nan"),
                float("inf"),
                -1,
                0,
                2**63 - 1,
                -(2**63),
                1e300,
                "",
                "<script>x</script>",
                "\x00",
                "x" * 10_000,
                None,
            ]
        )
    )
    values[draw(st.integers(0, n - 1))] = special
    try:
        return pa.array(values, column.type if not pa.types.is_dictionary(column.type) else None)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
        return column


def _tamper_parquet(draw: Any, path: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from hypothesis import strategies as st

    how = draw(st.sampled_from(["drop", "rename", "retype", "retype", "bytes", "delete", "metadata"]))
    if how == "delete":
        path.unlink()
        return how
    if how == "bytes":
        how, data = _bytes_damage(draw, path.read_bytes())
        path.write_bytes(data)
        return how
    table = pq.read_table(path)
    names = table.schema.names
    if how == "metadata":  # a newer writer's extra metadata, or damaged pandas / nbtoolkit metadata
        meta = dict(table.schema.metadata or {})
        key = draw(st.sampled_from([b"pandas", b"nbtoolkit", b"ARROW:schema", b"org.apache.newer"]))
        meta[key] = draw(
            st.sampled_from([b"{", b"[]", b"null", b'{"format": 1}', b'{"columns": 5}', b"\xff"])
        )
        pq.write_table(table.replace_schema_metadata(meta), path)
        return f"metadata {key!r}"
    if not names:
        return "no columns"
    index = draw(st.integers(0, len(names) - 1))
    if how == "drop":
        table = table.remove_column(index)
    elif how == "rename":
        table = table.rename_columns(
            [*names[:index], draw(st.sampled_from(["x", names[index - 1]])), *names[index + 1 :]]
        )
    else:
        new = _new_column(draw, table.column(index).combine_chunks())
        table = table.set_column(index, pa.field(names[index], new.type), new)
    pq.write_table(table, path)
    return f"{how} {names[index]}"


def _tamper_json(draw: Any, path: Path) -> str:
    from hypothesis import strategies as st

    how = draw(st.sampled_from(["edit", "edit", "edit", "bytes", "delete"]))
    if how == "delete":
        path.unlink()
        return how
    if how == "bytes":
        how, data = _bytes_damage(draw, path.read_bytes())
        path.write_bytes(data)
        return how
    how, edited = _edit_json(draw, json.loads(path.read_text()))
    path.write_text(json.dumps(edited))
    return how


def _tamper_timeline_meta(draw: Any, path: Path) -> str:
    """The MemoryTimeline keeps its metadata in the Parquet schema: edit that JSON."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = dict(table.schema.metadata or {})
    how, edited = _edit_json(draw, json.loads(meta[b"nbtoolkit"]))
    meta[b"nbtoolkit"] = json.dumps(edited).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)
    return f"metadata {how}"


def tamper(draw: Any, root: Path, kind: str) -> tuple[str, bool]:
    """Damage one thing under ``root``; ``(what was done, whether it only removed or broke something)``."""
    from hypothesis import strategies as st

    if kind == "timeline":
        target = root
        if draw(st.booleans()):
            return _tamper_timeline_meta(draw, target), False
        return _tamper_parquet(draw, target), False
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".parquet"))
    if kind in ("summary_cache", "snapshot_cache"):
        files = [p for p in files if ".nbt-cache" in p.parts]
    if draw(st.integers(0, 9)) == 0:  # extra files: a stray note, a Parquet of another rank
        folder = files[0].parent
        (
            folder / draw(st.sampled_from(["notes.txt", "rank7.events.parquet", "snapshot.json.bak"]))
        ).write_text("x")
        return "extra file", False
    target = draw(st.sampled_from(files))
    done = _tamper_parquet(draw, target) if target.suffix == ".parquet" else _tamper_json(draw, target)
    structural = done.split(" ")[0] in ("delete", "drop", "truncate")
    return f"{target.relative_to(root)}: {done}", structural


# ------------------------------------------------------------------ loading and using
def _show(result: Any) -> None:
    """What a notebook does with a result: its MIME bundle (text and HTML), else its repr."""
    if hasattr(result, "_repr_mimebundle_"):
        result._repr_mimebundle_()
    else:
        repr(result)


def _use_trace(trace: Any) -> None:
    import nbtoolkit as nbt
    from nbtoolkit.trace.summarize_rank import summarize_trace

    trace._repr_mimebundle_()
    trace.steps
    summarize_trace(trace)
    for analysis in (
        nbt.comm_comp_overlap,
        nbt.temporal_breakdown,
        nbt.kernel_breakdown,
        nbt.idle_breakdown,
        nbt.stragglers,
    ):
        _show(analysis(trace))


def _use_snapshot(snapshot: Any) -> None:
    snapshot._repr_mimebundle_()
    _show(snapshot.stats())
    if len(snapshot.trace):
        _use_timeline(snapshot.timeline())


def _use_graphs(report: Any) -> None:
    report._repr_mimebundle_()
    report.break_summary()
    report.compile_time_s
    report.frames_given_up
    report.compile_failures


def _use_timeline(timeline: Any) -> None:
    timeline._repr_mimebundle_()
    timeline.by_category()
    timeline.category_peaks()
    timeline.peak_bytes


def _use_summary(summary: Any) -> None:
    summary._repr_mimebundle_()
    _show(summary.stragglers())
    _use_trace(summary.load_ranks(summary.ranks))


def _kinds(inputs: Path) -> dict[str, tuple[Path, Callable[[Path], Any], Callable[[Any], None]]]:
    """kind -> (what to copy, its load given the copy, the use of what it loaded)."""
    import nbtoolkit as nbt

    return {
        "trace": (inputs / "trace", nbt.Trace.load, _use_trace),
        "snapshot": (inputs / "snapshot", nbt.MemorySnapshot.load, _use_snapshot),
        "graphs": (inputs / "graphs", nbt.GraphReport.load, _use_graphs),
        "timeline": (inputs / "timeline.parquet", nbt.MemoryTimeline.load, _use_timeline),
        "summary_cache": (
            inputs / "traces",
            lambda p: nbt.summarize_traces(p, cache=True, workers=1),
            _use_summary,
        ),
        "snapshot_cache": (
            inputs / "snapshots",
            lambda p: nbt.load_memory_snapshot(p / "snap.pickle", cache=True),
            _use_snapshot,
        ),
    }


def _same(kind: str, got: Any, want: Any) -> bool:
    """The cache-read result equals the one of the untampered cache."""
    if kind == "summary_cache":
        return all(getattr(got, n).equals(getattr(want, n)) for n in ("overlap", "steps", "spans"))
    return all(getattr(got, n).equals(getattr(want, n)) for n in ("segments", "blocks", "trace"))


class _Hang(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang(f"a load and its use took more than {_PER_EXAMPLE_S} s")


def _limit_memory(extra_bytes: int) -> None:
    import resource

    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + extra_bytes, resource.RLIM_INFINITY))


def _try_once(
    kind: str,
    source: Path,
    load: Callable[[Path], Any],
    use: Callable[[Any], None],
    draw: Any,
    scratch: Path,
    pristine: Any,
) -> str:
    """Tamper with a copy, load and use it: "result" or "NbtError"; anything else fails, keeping the copy."""
    from nbtoolkit.core.errors import NbtError

    copy = scratch / f"{kind}{source.suffix}"
    if copy.is_dir():
        shutil.rmtree(copy)
    (shutil.copytree if source.is_dir() else shutil.copyfile)(source, copy)
    how, structural = tamper(draw, copy, kind)
    stage = "load"
    signal.alarm(_PER_EXAMPLE_S)
    try:
        loaded = load(copy)
        stage = "use"
        use(loaded)
        if kind.endswith("_cache") and structural:
            assert _same(kind, loaded, pristine), f"{kind}: a damaged cache ({how}) changed the result"
        return "result"
    except NbtError as exc:
        if kind.endswith("_cache"):
            message = f"{kind}: a damaged cache ({how}) is an error, not a read of the source"
            raise AssertionError(message) from exc
        return "NbtError"
    except BaseException as exc:
        keep = scratch / f"failing-{kind}"
        shutil.rmtree(keep, ignore_errors=True)
        shutil.move(copy, keep)
        raise AssertionError(
            f"{kind} ({how}, kept at {keep}): {stage} raised {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc
    finally:
        signal.alarm(0)


def fuzz() -> None:
    """Tamper with copies of every saved kind; print a summary line."""
    import tempfile
    import time
    import warnings

    import nbtoolkit as nbt

    inputs = Path(os.environ["NBT_FUZZ_IN"])
    kinds = _kinds(inputs)
    pristine = {kind: load(source) for kind, (source, load, _) in kinds.items() if kind.endswith("_cache")}
    for source, load, use in kinds.values():  # the untampered ones load, are used: imports done
        use(load(source))
    nbt.MemoryTimeline
    _limit_memory(int(1.5 * 2**30))
    signal.signal(signal.SIGALRM, _on_alarm)
    warnings.simplefilter("ignore")
    examples = int(os.environ.get("NBT_FUZZ_EXAMPLES", "50"))
    counts: dict[str, dict[str, int]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="nbt-saved-fuzz-"))
    start = time.perf_counter()
    for kind, (source, load, use) in kinds.items():
        tally = counts.setdefault(kind, {"result": 0, "NbtError": 0})
        _property(kind, source, load, use, scratch, pristine.get(kind), tally, examples)()
    print(f"fuzzed in {time.perf_counter() - start:.1f} s: {json.dumps(counts)}")  # read by the test
    sys.stdout.flush()


def _property(
    kind: str,
    source: Path,
    load: Callable[[Path], Any],
    use: Callable[[Any], None],
    scratch: Path,
    pristine: Any,
    tally: dict[str, int],
    examples: int,
) -> Callable[[], None]:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same examples every CI run; NBT_FUZZ_EXAMPLES explores further
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def tampered(data: Any) -> None:
        tally[_try_once(kind, source, load, use, data.draw, scratch, pristine)] += 1

    return tampered  # type: ignore[no-any-return]
