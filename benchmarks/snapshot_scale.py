"""A 1 GB allocator snapshot: load + stats with nbtoolkit vs ``python -m torch.cuda._memory_viz stats``.

The snapshot is made by scaling a real one (``nbtoolkit.memory.snapshot_scale``: copies of a real
GPU training step with shifted addresses and times over 8 devices, pickle protocol 5) and kept
at ``--file`` for later runs. Each measurement runs in a fresh process (interpreter start,
imports, load, stats) and reports wall time and the process's peak RSS:

* ``nbtoolkit stats``: ``load_memory_snapshot(path, history=False).stats()`` — what stats needs
  (segments and blocks); streaming stops reading where the history begins;
* ``nbtoolkit full``: ``load_memory_snapshot(path).stats()`` — everything, history included,
  streaming (columns built while the unpickler runs);
* ``nbtoolkit filtered``: one device and a tenth of the time range, applied while reading;
* ``nbtoolkit cache: first`` / ``again``: ``load_memory_snapshot(path, cache_dir=...)`` twice: the
  first reads the pickle and writes its Parquet cache, the second reads the cache;
* ``memory_viz stats``: torch's own command on the same file (or its failure, e.g. out of memory).

Targets (issue 24): load + stats <= 10 s and peak RSS <= 2x the file. The machine is shared:
run it once, nice'd, after checking ``free -g``.

    nice -n 10 .venv/bin/python benchmarks/snapshot_scale.py                  # 1 GiB
    nice -n 10 .venv/bin/python benchmarks/snapshot_scale.py --size-mb 64     # a quick run
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

SOURCE = "memory/kk_memory_files_memory_ctx128_fullstep.pickle"
DEVICES = 8

_MEASURE = """
import json, resource, sys, time
start = time.perf_counter()
{body}
elapsed = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("RESULT " + json.dumps({{"seconds": elapsed, "peak_rss_bytes": peak, "answer": answer}}))
"""

BODIES = {
    "nbtoolkit stats": (
        "import nbtoolkit as nbt\n"
        "snap = nbt.load_memory_snapshot(sys.argv[1], history=False)\n"
        "answer = snap.stats().lines() + snap.notes[:1]\n"
    ),
    "nbtoolkit full": (
        "import nbtoolkit as nbt\n"
        "snap = nbt.load_memory_snapshot(sys.argv[1])\n"
        "answer = snap.stats().lines() + [f'{len(snap.trace):,} trace entries']\n"
    ),
    "nbtoolkit filtered": (
        "import nbtoolkit as nbt\n"
        "window = (float(sys.argv[2]), float(sys.argv[3]))\n"
        "snap = nbt.load_memory_snapshot(sys.argv[1], devices=3, time_range_us=window)\n"
        "answer = snap.stats().lines() + [f'{len(snap.trace):,} trace entries']\n"
    ),
    # cache=True: the first load also writes Parquet beside the file; the second reads that
    "nbtoolkit cache: first": (
        "import nbtoolkit as nbt\n"
        "snap = nbt.load_memory_snapshot(sys.argv[1], cache_dir=sys.argv[1] + '.nbt-cache')\n"
        "answer = snap.stats().lines() + [f'{len(snap.trace):,} trace entries']\n"
    ),
    "nbtoolkit cache: again": (
        "import nbtoolkit as nbt\n"
        "snap = nbt.load_memory_snapshot(sys.argv[1], cache_dir=sys.argv[1] + '.nbt-cache')\n"
        "answer = snap.stats().lines() + [f'{len(snap.trace):,} trace entries'] + snap.notes[-1:]\n"
    ),
    "memory_viz stats": (
        "import io, contextlib, runpy\n"
        "out = io.StringIO()\n"
        "sys.argv = ['_memory_viz', 'stats', sys.argv[1]]\n"
        "with contextlib.redirect_stdout(out):\n"
        "    runpy.run_module('torch.cuda._memory_viz', run_name='__main__')\n"
        "answer = [l for l in out.getvalue().splitlines() if l.startswith(('segments:', 'total_'))]\n"
    ),
}


def make(path: Path, size_mb: int) -> None:
    """Write the scaled snapshot and, beside it, what the filtered run needs (copies, times)."""
    from nbtoolkit.core.datasets import locate_data
    from nbtoolkit.memory.snapshot_reader import restricted_loads
    from nbtoolkit.memory.snapshot_scale import copies_for, copy_times, write_scaled_snapshot

    source = restricted_loads(locate_data(SOURCE).read_bytes())
    start = time.perf_counter()
    copies = copies_for(source, size_mb << 20, path.with_suffix(".probe"), devices=DEVICES)
    write_scaled_snapshot(source, path, copies=copies, devices=DEVICES, protocol=5)
    first, span = copy_times(source, copies)
    path.with_suffix(".json").write_text(json.dumps({"copies": copies, "first_us": first, "copy_us": span}))
    print(
        f"wrote {path} ({path.stat().st_size / 2**20:,.0f} MiB, {copies} copies) "
        f"in {time.perf_counter() - start:,.0f} s"
    )


def measure(name: str, path: Path, extra: list[str], timeout: float, limit_gb: float) -> dict[str, object]:
    """One tool in a fresh process, its address space capped (the machine is shared)."""
    import resource

    def cap() -> None:
        limit = int(limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    code = _MEASURE.format(body=BODIES[name])
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(path), *extra],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            preexec_fn=cap,
        )
    except subprocess.TimeoutExpired:
        return {"tool": name, "failed": f"no result after {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"tool": name, **json.loads(line[len("RESULT ") :])}
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return {
        "tool": name,
        "failed": (
            f"exit {done.returncode} after {time.perf_counter() - start:.1f} s: {' | '.join(tail)[:300]}"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--file", type=Path, default=Path("/tmp/nbt_snapshot_scale/scaled_1g.pickle"))
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--tools", nargs="*", default=list(BODIES))
    parser.add_argument(
        "--memory-limit-gb", type=float, default=12.0, help="address-space cap of each measured process"
    )
    args = parser.parse_args()
    path: Path = args.file
    if not path.exists() or path.stat().st_size < (args.size_mb << 20) * 0.95:
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path, args.size_mb)
    size = path.stat().st_size
    # The filtered run: device 3, the middle tenth of the run (copies are laid out in time).
    layout = path.with_suffix(".json")
    window: list[str] = []
    if layout.exists():
        plan = json.loads(layout.read_text())
        total = plan["copies"] * plan["copy_us"]
        window = [str(plan["first_us"] + 0.45 * total), str(plan["first_us"] + 0.55 * total)]
    elif "nbtoolkit filtered" in args.tools:
        args.tools.remove("nbtoolkit filtered")  # a file made elsewhere: its time layout is unknown
    print(f"file: {path} ({size / 2**20:,.0f} MiB); targets: <= 10 s, peak RSS <= {2 * size / 2**30:.2f} GiB")
    rows = []
    for name in args.tools:
        extra = window if name == "nbtoolkit filtered" else []
        if name == "nbtoolkit cache: first":
            shutil.rmtree(f"{path}.nbt-cache", ignore_errors=True)
        result = measure(name, path, extra, args.timeout, args.memory_limit_gb)
        rows.append(result)
        if "failed" in result:
            print(f"{name:>20}: FAILED {result['failed']}")
            continue
        seconds = float(result["seconds"])  # type: ignore[arg-type]
        rss = int(result["peak_rss_bytes"])  # type: ignore[call-overload]
        print(
            f"{name:>20}: {seconds:7.1f} s  peak RSS {rss / 2**30:6.2f} GiB ({rss / size:4.2f}x the file)  "
            f"{'; '.join(map(str, result['answer']))[:160]}"  # type: ignore[call-overload]
        )
    print(json.dumps({"file_bytes": size, "results": rows}))


if __name__ == "__main__":
    main()
