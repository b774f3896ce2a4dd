"""The hostile inputs of the hardening issue: time and peak memory of each reader, in a fresh process.

Each case is written to a temporary folder (a few MB each, sparse or gzipped where the content
is larger) and read by the public reader in a subprocess; the script prints the outcome (result
or the error's first words), the seconds and the child's peak RSS. Run it on two checkouts to
compare: ``PYTHONPATH`` picks the package, from a folder outside both (the child's working folder
comes first on its path)::

    cd /tmp && PYTHONPATH=~/nbtoolkit ~/nbtoolkit/.venv/bin/python ~/nbtoolkit/benchmarks/hostile_inputs.py
    ... hostile_inputs.py --cases braces_64mib wsbomb_1gib --timeout 120

On 2 shared cores (h-readers vs the tree it branched from): braces_24mib 0.8 s / 242 MB (was 20 s),
braces_64mib 1.6 s / 402 MB (was > 150 s), closers_1.2m 0.3 s (> 150 s), wsbomb_1gib 1.1 s / 300 MB
(14.6 s / 3.1 GB), nested_100k one TraceError (a RecursionError), log_line_2gib 6 s / 278 MB
(13.5 s / 6.2 GB), frames_1e7 0.2 s / 166 MB (9 s / 1.8 GB), shared_1mb_name 0.4 s / 166 MB
(15 s / 4.2 GB), world_1e12 0.4 s (MemoryError at a 4 GB ulimit).

Each reader should give a result or one clear error within seconds and under 1.5 GB.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

_EVENT = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
_PREFIX = b"V0403 07:28:48.061000 1 torch/_dynamo/convert_frame.py:1] "


def _doc(events: list[dict[str, object]], **top: object) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **top}).encode()


def _braces(mib: int) -> Callable[[Path], tuple[str, Path]]:
    def write(folder: Path) -> tuple[str, Path]:
        path = folder / f"braces_{mib}.json"
        path.write_bytes(
            b'{"traceEvents": [{"ph":"X","name":"'
            + b"{" * (mib << 20)
            + b'","ts":1,"dur":1,"pid":1,"tid":1}]}'
        )
        return "load_trace", path

    return write


def _closers(folder: Path) -> tuple[str, Path]:
    path = folder / "closers.json"
    path.write_bytes(_doc([_EVENT])[:-1] + b', "x": "' + b"}]" * 1_200_000 + b'"}')
    return "load_trace", path


def _wsbomb(folder: Path) -> tuple[str, Path]:
    path = folder / "wsbomb.json.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as out:
        out.write(packer.compress(b'{"traceEvents": ['))
        for _ in range(1024):
            out.write(packer.compress(b" " * (1 << 20)))
        out.write(packer.flush())
    return "load_trace", path


def _deep(folder: Path) -> tuple[str, Path]:
    path = folder / "deep.json"
    path.write_bytes(_doc([_EVENT])[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    return "load_trace", path


def _long_log(folder: Path) -> tuple[str, Path]:
    path = folder / "one_line.log"
    with open(path, "wb") as out:
        out.write(_PREFIX + b'{"dynamo_start": {"stack": "')
        out.truncate(2 << 30)  # sparse: a 2 GiB line of NUL characters
    return "load_compile_log", path


def _frames(folder: Path) -> tuple[str, Path]:
    frames = [{"filename": "a.py", "line": 1, "name": "f"}] * 10**7
    block = {"size": 512, "state": "active_allocated", "frames": frames}
    path = folder / "frames.pickle"
    path.write_bytes(
        pickle.dumps({"segments": [{"device": 0, "address": 0, "total_size": 512, "blocks": [block]}]})
    )
    return "load_memory_snapshot", path


def _shared_name(folder: Path) -> tuple[str, Path]:
    name = "x" * (1 << 20)
    blocks = [
        {
            "size": 512,
            "state": "active_allocated",
            "frames": [{"filename": f"/u/m{i}.py", "line": i, "name": name}],
        }
        for i in range(2000)
    ]
    path = folder / "shared_name.pickle"
    path.write_bytes(
        pickle.dumps({"segments": [{"device": 0, "address": 0, "total_size": 512 * 2000, "blocks": blocks}]})
    )
    return "load_memory_snapshot", path


def _world(folder: Path) -> tuple[str, Path]:
    job = folder / "world"
    job.mkdir()
    (job / "rank0.json").write_bytes(_doc([_EVENT], distributedInfo={"rank": 0, "world_size": 10**12}))
    return "summarize_traces", job


CASES: dict[str, Callable[[Path], tuple[str, Path]]] = {
    "braces_24mib": _braces(24),
    "braces_64mib": _braces(64),
    "closers_1.2m": _closers,
    "wsbomb_1gib": _wsbomb,
    "nested_100k": _deep,
    "log_line_2gib": _long_log,
    "frames_1e7": _frames,
    "shared_1mb_name": _shared_name,
    "world_1e12": _world,
}

_CHILD = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
import nbtoolkit as nbt
start = time.perf_counter()
try:
    getattr(nbt, sys.argv[1])(sys.argv[2])
    outcome = "result"
except nbt.NbtError as exc:
    outcome = f"{type(exc).__name__}: {str(exc)[:90]}"
print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - start,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per case before it is stopped")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nbt-hostile-") as tmp:
        for case in args.cases:
            folder = Path(tmp) / case
            folder.mkdir()
            reader, path = CASES[case](folder)
            try:
                done = subprocess.run(
                    [sys.executable, "-c", _CHILD, reader, str(path)],
                    capture_output=True,
                    text=True,
                    timeout=args.timeout,
                    check=False,
                )
                lines = done.stdout.strip().splitlines()
                if done.returncode or not lines:
                    print(f"{case:18s} crashed: {(done.stdout + done.stderr)[-200:]!r}")
                    continue
                out = json.loads(lines[-1])
                print(f"{case:18s} {out['seconds']:7.2f} s {out['rss_mb']:8.0f} MB  {out['outcome']}")
            except subprocess.TimeoutExpired:
                print(f"{case:18s} > {args.timeout:.0f} s (stopped)")


if __name__ == "__main__":
    main()
