"""Property-based fuzzing of the readers: damaged input ends in an NbtError or a result, never worse.

The trace, compile-log, snapshot and memory-timeline readers are fed files this test records
itself (a torch.profiler trace, a TORCH_TRACE log of a compile with a graph break, an
allocator snapshot written from a memory timeline), and a few small real GPU files when the
fixture locator has them, after hypothesis has damaged them: truncated, bytes flipped, a value
of the JSON / pickle swapped for one of another type, gzipped and then damaged. Each read must
return a result or raise an :class:`~nbtoolkit.core.errors.NbtError`: any other exception, a read
that takes longer than a few seconds (a hang) or one that exhausts the memory limit fails.

It runs in a fresh process (``tests/_python.py``) under an address-space limit (``RLIMIT_AS``,
the interpreter's size after imports plus 1.5 GiB) and a small read limit, so that unbounded
memory is a failure there rather than a dead test runner. About 25 s on 2 cores; set
``NBT_FUZZ_EXAMPLES`` for a longer run (examples per reader, default 60).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._python import run_module_function

_FIXTURES = [  # small real files, fuzzed too when the locator has them (never downloaded here)
    "traces/hta_rank_non_gpu/rank_non_gpu.json.gz",
    "traces/hta_call_stack/backward_thread.json",
    "compile_logs/tlparse_inputs/simple.log",
    "compile_logs/tlparse_inputs/comp_failure.log",
    "memory/mud_dump_snapshot.pickle",
    "memory/hta_export_memory_timeline.raw.gz",
]
_PER_EXAMPLE_S = 10  # a read of these small files takes milliseconds: this long is a hang


# ------------------------------------------------------------------ recorded in a fresh process
def record() -> None:
    """Write a profiler trace, a TORCH_TRACE log and an allocator snapshot into NBT_FUZZ_OUT."""
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

    nbt.profile(step, steps=2, warmup=1, trace_path=out / "trace.json")
    nbt.export_memory_snapshot(nbt.memory_timeline(step, 1, model=model, optimizer=opt), out / "snap.pickle")

    def with_break(t: torch.Tensor) -> torch.Tensor:
        t = t * 2
        print("graph break")  # the break is the point
        return t + 1

    torch.compile(with_break, backend="eager")(torch.randn(4))  # TORCH_TRACE is set by the test


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz_inputs")
    run_module_function(
        Path(__file__), "record", env={"NBT_FUZZ_OUT": str(out), "TORCH_TRACE": str(out / "compile")}
    )
    assert (out / "trace.json").is_file() and (out / "snap.pickle").is_file()
    assert list((out / "compile").glob("*.log"))
    return out


def test_damaged_inputs_give_an_nbt_error_or_a_result(recorded: Path) -> None:
    fixtures = []
    for name in _FIXTURES:
        try:
            import nbtoolkit as nbt

            fixtures.append(str(nbt.locate_data(name)))
        except nbt.DataUnavailableError:
            pass  # recorded files alone are fuzzed; the fixture files add real GPU shapes
    done = run_module_function(
        Path(__file__),
        "fuzz",
        env={
            "NBT_FUZZ_IN": str(recorded),
            "NBT_FUZZ_FIXTURES": os.pathsep.join(fixtures),
            "NBT_MAX_READ_BYTES": "64MiB",  # a flipped gzip byte must not inflate for long
            "NBT_DATA_DOWNLOAD": "0",
        },
        timeout=150,
    )
    assert "fuzzed" in done.stdout, done.stdout[-2000:]


# ------------------------------------------------------------------ the fuzzing, in a fresh process
def _limit_memory(extra_bytes: int) -> None:
    import resource

    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + extra_bytes, resource.RLIM_INFINITY))


class _Hang(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang(f"a read took more than {_PER_EXAMPLE_S} s")


_SWAPS: list[Any] = [None, "x", "", -1, 0, 2**70, 1.5e308, True, [], {}, [[[]]], {"a": None}]


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


def _swap_in_file(kind: str, data: bytes, path: list[int], replacement: Any) -> bytes:
    """A type swap inside the file's structure (JSON document, one log envelope, the pickle)."""
    from nbtoolkit.memory.snapshot_reader import restricted_loads

    raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    if kind in ("trace", "timeline"):
        return json.dumps(_swap(json.loads(raw), path, replacement)).encode()
    if kind == "snapshot":
        return pickle.dumps(_swap(restricted_loads(raw), path, replacement))
    lines = raw.decode("utf-8", "replace").splitlines()
    envelopes = [i for i, line in enumerate(lines) if "] {" in line]
    if not envelopes:
        return raw
    i = envelopes[path[0] % len(envelopes)]
    prefix, _, body = lines[i].partition("] ")
    with contextlib.suppress(ValueError):  # a damaged envelope stays as it was
        lines[i] = f"{prefix}] {json.dumps(_swap(json.loads(body), path[1:], replacement))}"
    return "\n".join(lines).encode()


def _damage(draw: Any, kind: str, data: bytes) -> tuple[str, bytes]:
    from hypothesis import strategies as st

    how = draw(st.sampled_from(["truncate", "flip", "swap", "gzip+truncate", "gzip+flip"]))
    if how.startswith("gzip+"):
        data = gzip.compress(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        how = how[5:]
    if how == "truncate":
        return how, data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            position = draw(st.integers(0, max(len(out) - 1, 0)))
            if out:
                out[position] = draw(st.integers(0, 255))
        return how, bytes(out)
    path = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=7))
    return how, _swap_in_file(kind, data, path, draw(st.sampled_from(_SWAPS)))


def _readers() -> dict[str, tuple[str, Callable[[Path], Any]]]:
    import nbtoolkit as nbt

    return {  # kind -> (file suffix, reader)
        "trace": (".json", nbt.load_trace),
        "log": (".log", nbt.load_compile_log),
        "snapshot": (".pickle", nbt.load_memory_snapshot),
        "timeline": (".raw.json", nbt.load_memory_timeline),
    }


def _inputs() -> dict[str, list[bytes]]:
    folder = Path(os.environ["NBT_FUZZ_IN"])
    inputs: dict[str, list[bytes]] = {
        "trace": [(folder / "trace.json").read_bytes()],
        "log": [p.read_bytes() for p in sorted((folder / "compile").glob("*.log"))],
        "snapshot": [(folder / "snap.pickle").read_bytes()],
        "timeline": [],
    }
    for name in filter(None, os.environ.get("NBT_FUZZ_FIXTURES", "").split(os.pathsep)):
        kind = (
            "log" if name.endswith(".log")
            else "snapshot" if name.endswith(".pickle")
            else "timeline" if ".raw" in name
            else "trace"
        )
        inputs[kind].append(Path(name).read_bytes())
    return {kind: files for kind, files in inputs.items() if files}


def _read_once(
    reader: tuple[str, Callable[[Path], Any]], kind: str, damaged: bytes, scratch: Path, how: str
) -> str:
    """Read one damaged file: "result" or "NbtError"; anything else (or a hang) fails, keeping the file."""
    from nbtoolkit.core.errors import NbtError

    suffix, read = reader
    gz = ".gz" if damaged[:2] == b"\x1f\x8b" else ""
    path = scratch / f"rank0{suffix}{gz}"
    path.write_bytes(damaged)
    signal.alarm(_PER_EXAMPLE_S)
    try:
        read(path)
        return "result"
    except NbtError:
        return "NbtError"
    except BaseException as exc:
        keep = scratch / f"failing-{kind}{suffix}{gz}"
        keep.write_bytes(damaged)
        raise AssertionError(
            f"{kind} reader on a damaged file ({how}, kept at {keep}) raised {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        signal.alarm(0)
        path.unlink(missing_ok=True)


def fuzz() -> None:
    """Run every reader on damaged copies of every input; print a summary line."""
    import tempfile
    import time
    import warnings

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import nbtoolkit as nbt

    readers, inputs = _readers(), _inputs()
    reader_modules = (
        "nbtoolkit.trace.kineto",
        "nbtoolkit.compile.log_reader",
        "nbtoolkit.memory.snapshot_reader",
    )
    for module in reader_modules:
        __import__(module)
    nbt.MemorySnapshot  # import the model classes before the memory limit
    _limit_memory(int(1.5 * 2**30))
    signal.signal(signal.SIGALRM, _on_alarm)
    warnings.simplefilter("ignore")  # CompileLogWarning for damaged lines is expected
    examples = int(os.environ.get("NBT_FUZZ_EXAMPLES", "60"))
    counts: dict[str, dict[str, int]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="nbt-fuzz-"))

    def property_of(kind: str, files: list[bytes], tally: dict[str, int]) -> Callable[[], None]:
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,  # the same examples every CI run; NBT_FUZZ_EXAMPLES explores further
            suppress_health_check=list(HealthCheck),
        )
        @given(data=st.data())
        def read_damaged(data: Any) -> None:
            how, damaged = _damage(data.draw, kind, data.draw(st.sampled_from(files)))
            tally[_read_once(readers[kind], kind, damaged, scratch, how)] += 1

        return read_damaged  # type: ignore[no-any-return]
    start = time.perf_counter()

    for kind, files in inputs.items():
        tally = counts.setdefault(kind, {"result": 0, "NbtError": 0})
        property_of(kind, files, tally)()
    elapsed = time.perf_counter() - start
    print(f"fuzzed in {elapsed:.1f} s: {json.dumps(counts)}")  # read by the test
    sys.stdout.flush()
