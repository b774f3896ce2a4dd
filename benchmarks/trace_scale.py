"""Hundreds of ranks: nbtoolkit vs HolisticTraceAnalysis, load + comm/compute overlap, side by side.

For each N (default 8, 64, 256) a scale set is written from the 8 real ranks of
``param_dlrm_8rank`` (``nbtoolkit.trace.scale_set``: rank ids rewritten, one straggler stretched
1.5x, the others waiting for it); then, each in a fresh subprocess:

- ``nbtoolkit``: ``nbt.summarize_traces(folder)`` (worker processes, one per core) and
  ``nbt.stragglers(summary)``, from a script (one thread: workers are forked);
- ``nbtoolkit_kernel_like``: the same with a second thread running, as in a notebook kernel
  (workers start from a forkserver);
- ``nbtoolkit-cached``: the same with ``cache=True``, second call (the first fills the cache);
- ``hta``: ``TraceAnalysis(trace_dir=folder)`` and ``get_comm_comp_overlap()``.

Wall time is the subprocess's (interpreter start and imports included). Peak RSS is the
largest total resident memory of the subprocess and all its children (workers included),
sampled every 20 ms with psutil; PSS (proportional set size: a page shared by forked
processes counted once in all) is recorded beside it, since both tools' workers share pages.
The overlap of every rank is compared with HTA's (0.1 pp),
and the straggler nbtoolkit finds with the injected one. ``--cluster`` adds the cluster
path (``Cluster.local(ranks=2).summarize_traces(folder)``; run it inside ``unshare --net``).

    nice -n 10 .venv/bin/python benchmarks/trace_scale.py --ranks 8 64 256 --out out/trace_scale.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NBTOOLKIT = """
import nbtoolkit as nbt
{setup}
summary = nbt.summarize_traces(folder, cache_dir={cache_dir!r})
report = nbt.stragglers(summary)
overlap = dict(zip(summary.overlap["rank"].tolist(), summary.overlap["overlap_pct"].round(4).tolist()))
answer = {{"overlap": overlap, "straggler": report.slowest_rank if report.has_straggler else None,
          "failed": len(summary.failed)}}
"""

# A notebook kernel runs threads (IOPub, heartbeat) and has usually imported torch: the
# workers then start from a forkserver instead of a fork (nbtoolkit.trace.summarize_folder).
KERNEL_LIKE = """
import threading
threading.Thread(target=threading.Event().wait, daemon=True).start()
"""

HTA = """
import logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=folder)
df = analyzer.get_comm_comp_overlap(visualize=False)
overlap = dict(zip(df["rank"].astype(int).tolist(), df["comp_comm_overlap_pctg"].astype(float).tolist()))
answer = {"overlap": overlap, "straggler": None}
"""

CLUSTER = """
import nbtoolkit as nbt
with nbt.Cluster.local(ranks=2) as cl:
    start_inner = time.perf_counter()
    summary = cl.summarize_traces(folder)
    inner = time.perf_counter() - start_inner
report = nbt.stragglers(summary)
overlap = dict(zip(summary.overlap["rank"].tolist(), summary.overlap["overlap_pct"].round(4).tolist()))
answer = {"overlap": overlap, "straggler": report.slowest_rank if report.has_straggler else None,
          "summarize_s": inner}
"""

WRAPPER = """
import json, resource, sys, time
folder = sys.argv[1]
{body}
# the driver's own peak (the notebook's share; on the cluster path Ray's processes are the rest)
answer["driver_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(answer))
"""


def measure(body: str, folder: Path) -> dict[str, object]:
    """Run ``body`` in a fresh interpreter; wall time, peak RSS of its process tree, its answer."""
    import psutil

    code = WRAPPER.format(body=body)
    begin = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    top = psutil.Process(proc.pid)
    peak = peak_pss = 0
    while proc.poll() is None:
        try:
            tree = [top, *top.children(recursive=True)]
            total = total_pss = 0
            for p in tree:
                with contextlib.suppress(psutil.Error):  # a worker that just exited
                    full = p.memory_full_info()
                    total += full.rss
                    total_pss += full.pss
            peak, peak_pss = max(peak, total), max(peak_pss, total_pss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    seconds = time.perf_counter() - begin
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{err[-3000:]}")
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return {
        "seconds": seconds,
        "peak_rss_mb": peak / 2**20,
        "peak_pss_mb": peak_pss / 2**20,
        "answer": json.loads(line[7:]),
    }


def compare_overlap(ours: dict[str, float], theirs: dict[str, float]) -> float:
    """The largest per-rank difference (pp); inf when the rank sets differ."""
    if set(ours) != set(theirs):
        return float("inf")
    worst = 0.0
    for rank, value in ours.items():
        other = theirs[rank]
        if value != value and other != other:  # both NaN: no communication
            continue
        worst = max(worst, abs(value - other))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/nbt-trace-scale"))
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "trace_scale.json")
    parser.add_argument("--no-hta", action="store_true", help="skip HTA (e.g. a second run)")
    parser.add_argument(
        "--hta-from", type=Path, help="take HTA's numbers from an earlier --out file (HTA runs minutes)"
    )
    parser.add_argument("--cluster", action="store_true", help="add the cluster path (inside unshare --net)")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    import nbtoolkit as nbt
    from nbtoolkit.trace.scale_set import write_scale_set

    base = nbt.locate_data("traces/param_dlrm_8rank")
    results = []
    for n in args.ranks:
        folder = args.workdir / f"ranks{n}"
        made = write_scale_set(base, folder, ranks=n)
        row: dict[str, object] = {
            "ranks": n,
            "json_mb": made.bytes_written / 2**20,
            "injected_straggler": made.straggler,
        }
        print(f"--- {n} ranks, {made.bytes_written / 2**20:.0f} MB of JSON", flush=True)
        cache_dir = str(args.workdir / f"cache{n}")  # outside the folder: HTA reads every file there
        shutil.rmtree(cache_dir, ignore_errors=True)
        row["nbtoolkit"] = measure(NBTOOLKIT.format(cache_dir=None, setup=""), folder)
        row["nbtoolkit_kernel_like"] = measure(NBTOOLKIT.format(cache_dir=None, setup=KERNEL_LIKE), folder)
        measure(NBTOOLKIT.format(cache_dir=cache_dir, setup=""), folder)  # fills the cache
        row["nbtoolkit_cached"] = measure(NBTOOLKIT.format(cache_dir=cache_dir, setup=""), folder)
        if args.cluster:
            row["cluster"] = measure(CLUSTER, folder)
        if args.hta_from:
            earlier = {r["ranks"]: r for r in json.loads(args.hta_from.read_text()) if "hta" in r}
            if n in earlier:
                row["hta"] = earlier[n]["hta"]
        elif not args.no_hta:
            row["hta"] = measure(HTA, folder)
        _summarize(row)
        results.append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    print(f"written {args.out}")


def _summarize(row: dict[str, object]) -> None:
    ours = row["nbtoolkit"]
    assert isinstance(ours, dict)
    found = ours["answer"]["straggler"]
    row["straggler_found"] = found == row["injected_straggler"]
    kernel = row["nbtoolkit_kernel_like"]
    assert isinstance(kernel, dict)
    line = (
        f"nbtoolkit {ours['seconds']:.1f} s {ours['peak_rss_mb']:.0f} MB; "
        f"kernel-like {kernel['seconds']:.1f} s {kernel['peak_rss_mb']:.0f} MB; "
        f"cached {row['nbtoolkit_cached']['seconds']:.1f} s; straggler {found} "  # type: ignore[index]
        f"(injected {row['injected_straggler']})"
    )
    if "cluster" in row:
        cluster = row["cluster"]
        assert isinstance(cluster, dict)
        row["cluster_max_overlap_diff_pp"] = compare_overlap(
            cluster["answer"]["overlap"], ours["answer"]["overlap"]
        )
        line += f"; cluster {cluster['seconds']:.1f} s (summarize {cluster['answer']['summarize_s']:.1f} s)"
    if "hta" in row:
        hta = row["hta"]
        assert isinstance(hta, dict)
        row["time_ratio_hta_over_nbt"] = hta["seconds"] / ours["seconds"]
        row["rss_ratio_hta_over_nbt"] = hta["peak_rss_mb"] / ours["peak_rss_mb"]
        if "peak_pss_mb" in hta:
            row["pss_ratio_hta_over_nbt"] = hta["peak_pss_mb"] / ours["peak_pss_mb"]
        row["max_overlap_diff_pp"] = compare_overlap(ours["answer"]["overlap"], hta["answer"]["overlap"])
        row["kernel_like_time_ratio"] = hta["seconds"] / kernel["seconds"]
        row["kernel_like_rss_ratio"] = hta["peak_rss_mb"] / kernel["peak_rss_mb"]
        line += (
            f"; HTA {hta['seconds']:.1f} s {hta['peak_rss_mb']:.0f} MB"
            f" -> time x{row['time_ratio_hta_over_nbt']:.1f},"
            f" RSS x{row['rss_ratio_hta_over_nbt']:.1f} (kernel-like x{row['kernel_like_time_ratio']:.1f},"
            f" x{row['kernel_like_rss_ratio']:.1f}), overlap max diff {row['max_overlap_diff_pp']:.3f} pp"
        )
    print(line, flush=True)


if __name__ == "__main__":
    main()
