"""Thousands of ranks: nbtoolkit vs HolisticTraceAnalysis 0.5 and traceinsight 0.6.1, side by side.

For each N (default 256, 1,024, 4,096) a scale set is written from the 8 real ranks of
``param_dlrm_8rank`` (``nbtoolkit.trace.scale_set``: rank ids rewritten, one straggler stretched
1.5x, the others waiting for it); then, each in a fresh subprocess:

- ``nbtoolkit``: the path people take: ``trace = nbt.load_trace(folder)`` (from 32 rank files a
  RankFolderTrace: worker processes, one per core, summarize each rank),
  ``nbt.comm_comp_overlap(trace)`` and ``nbt.stragglers(trace)``, from a script (one thread:
  workers are forked);
- ``nbtoolkit_kernel_like``: the same with a second thread running, as in a notebook kernel
  (workers start from a forkserver);
- ``nbtoolkit_cached`` (``--cached``): ``nbt.summarize_traces(folder, cache_dir=...)``, second call;
- ``hta``: HolisticTraceAnalysis 0.5.0 (this interpreter's), ``TraceAnalysis(trace_dir=folder)``
  and ``get_comm_comp_overlap()``;
- ``traceinsight``: the same calls with traceinsight 0.6.1 (HTA's new name on PyPI; it keeps the
  ``hta`` package), run by the interpreter of a separate virtual environment
  (``--traceinsight-python``; it pins other pandas/numpy than the project).

The references run up to ``--references-up-to`` ranks (default 1,024: at 4,096 each needs tens
of GB and most of an hour on 2 cores).

Wall time is the subprocess's (interpreter start and imports included). Peak RSS is the
largest total resident memory of the subprocess and all its children (workers included),
sampled every 20 ms with psutil; PSS (proportional set size: a page shared by forked
processes counted once in all) is recorded beside it, since both tools' workers share pages.
The overlap of every rank is compared with each reference's (0.1 pp), and the straggler
nbtoolkit finds with the injected one. ``--cluster`` adds the cluster path
(``Cluster.local(ranks=2).summarize_traces(folder)``; run it inside ``unshare --net``).

    nice -n 10 .venv/bin/python benchmarks/trace_scale.py --ranks 256 1024 \
        --traceinsight-python /path/to/ti-venv/bin/python --out benchmarks/results/trace_scale.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NBTOOLKIT = """
import nbtoolkit as nbt
{setup}
trace = nbt.load_trace(folder{workers})
table = nbt.comm_comp_overlap(trace)
report = nbt.stragglers(trace)
overlap = dict(zip(table["rank"].tolist(), table["overlap_pct"].round(4).tolist()))
answer = {{"overlap": overlap, "straggler": report.slowest_rank if report.has_straggler else None,
          "kind": type(trace).__name__}}
"""

CACHED = """
import nbtoolkit as nbt
summary = nbt.summarize_traces(folder, cache_dir={cache_dir!r})
report = nbt.stragglers(summary)
overlap = dict(zip(summary.overlap["rank"].tolist(), summary.overlap["overlap_pct"].round(4).tolist()))
answer = {{"overlap": overlap, "straggler": report.slowest_rank if report.has_straggler else None}}
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


def measure(body: str, folder: Path, python: str = sys.executable) -> dict[str, object]:
    """Run ``body`` in a fresh interpreter; wall time, peak RSS of its process tree, its answer."""
    import resource

    import psutil

    code = WRAPPER.format(body=body)
    # CPU seconds of the whole tree (the child and the workers it waited for): on a shared machine
    # wall time depends on the neighbours, CPU time far less (the linearity check reads both)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-c", code, str(folder)],
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
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{err[-3000:]}")
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
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
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/nbt-trace-scale"))
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "trace_scale.json")
    parser.add_argument("--no-hta", action="store_true", help="skip HTA (e.g. a second run)")
    parser.add_argument(
        "--hta-from", type=Path, help="take HTA's numbers from an earlier --out file (HTA runs minutes)"
    )
    parser.add_argument("--cluster", action="store_true", help="add the cluster path (inside unshare --net)")
    parser.add_argument(
        "--one-process", action="store_true", help="add load_trace(folder, workers=1): no worker processes"
    )
    parser.add_argument("--cached", action="store_true", help="add summarize_traces with a filled cache")
    parser.add_argument("--no-kernel-like", action="store_true", help="skip the notebook-kernel-like run")
    parser.add_argument(
        "--traceinsight-python", help="python of a virtual environment with traceinsight==0.6.1 installed"
    )
    parser.add_argument("--references-up-to", type=int, default=1024, help="run HTA/traceinsight up to N")
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
            "load_average_at_start": list(os.getloadavg()),
            "json_mb": made.bytes_written / 2**20,
            "injected_straggler": made.straggler,
        }
        print(f"--- {n} ranks, {made.bytes_written / 2**20:.0f} MB of JSON", flush=True)
        row["nbtoolkit"] = measure(NBTOOLKIT.format(setup="", workers=""), folder)
        if not args.no_kernel_like:
            row["nbtoolkit_kernel_like"] = measure(NBTOOLKIT.format(setup=KERNEL_LIKE, workers=""), folder)
        if args.one_process:
            row["nbtoolkit_one_process"] = measure(NBTOOLKIT.format(setup="", workers=", workers=1"), folder)
        if args.cached:
            cache_dir = str(args.workdir / f"cache{n}")  # outside the folder: HTA reads every file there
            shutil.rmtree(cache_dir, ignore_errors=True)
            measure(CACHED.format(cache_dir=cache_dir), folder)  # fills the cache
            row["nbtoolkit_cached"] = measure(CACHED.format(cache_dir=cache_dir), folder)
        if args.cluster:
            row["cluster"] = measure(CLUSTER, folder)
        references = n <= args.references_up_to
        if args.hta_from:
            earlier = {r["ranks"]: r for r in json.loads(args.hta_from.read_text()) if "hta" in r}
            if n in earlier:
                row["hta"] = earlier[n]["hta"]
        elif not args.no_hta and references:
            row["hta"] = measure(HTA, folder)
        if args.traceinsight_python and references:
            row["traceinsight"] = measure(HTA, folder, python=args.traceinsight_python)
        row["load_average_at_end"] = list(os.getloadavg())
        _scaling(results, row)
        _summarize(row)
        results.append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    print(f"written {args.out}")


def _scaling(earlier: list[dict[str, object]], row: dict[str, object]) -> None:
    """nbtoolkit's time at N over its time at the largest smaller N measured (linear: N / N0)."""
    smaller = [r for r in earlier if r["ranks"] < row["ranks"]]  # type: ignore[operator]
    if smaller:
        base = max(smaller, key=lambda r: r["ranks"])  # type: ignore[arg-type,return-value]
        ours, theirs = row["nbtoolkit"], base["nbtoolkit"]
        row["time_over_smaller"] = {
            "ranks": base["ranks"],
            "ratio": ours["seconds"] / theirs["seconds"],  # type: ignore[index]
        }
        if "cpu_seconds" in theirs:  # type: ignore[operator]
            row["time_over_smaller"]["cpu_ratio"] = ours["cpu_seconds"] / theirs["cpu_seconds"]  # type: ignore


def _summarize(row: dict[str, object]) -> None:
    ours = row["nbtoolkit"]
    assert isinstance(ours, dict)
    found = ours["answer"]["straggler"]
    row["straggler_found"] = found == row["injected_straggler"]
    kernel = row.get("nbtoolkit_kernel_like", ours)  # the script's own numbers where it was skipped
    assert isinstance(kernel, dict)
    line = (
        f"nbtoolkit {ours['seconds']:.1f} s {ours['peak_rss_mb']:.0f} MB (PSS {ours['peak_pss_mb']:.0f} MB); "
        f"kernel-like {kernel['seconds']:.1f} s {kernel['peak_rss_mb']:.0f} MB; "
        f"straggler {found} (injected {row['injected_straggler']}), {ours['answer']['kind']}"
    )
    if "nbtoolkit_cached" in row:
        line += f"; cached {row['nbtoolkit_cached']['seconds']:.1f} s"  # type: ignore[index]
    if "time_over_smaller" in row:
        scaling = row["time_over_smaller"]
        line += f"; time x{scaling['ratio']:.2f} of {scaling['ranks']} ranks"  # type: ignore[index]
    if "cluster" in row:
        cluster = row["cluster"]
        assert isinstance(cluster, dict)
        row["cluster_max_overlap_diff_pp"] = compare_overlap(
            cluster["answer"]["overlap"], ours["answer"]["overlap"]
        )
        line += f"; cluster {cluster['seconds']:.1f} s (summarize {cluster['answer']['summarize_s']:.1f} s)"
    if "traceinsight" in row:
        ti = row["traceinsight"]
        assert isinstance(ti, dict)
        row["time_ratio_traceinsight_over_nbt"] = ti["seconds"] / ours["seconds"]
        row["rss_ratio_traceinsight_over_nbt"] = ti["peak_rss_mb"] / ours["peak_rss_mb"]
        row["pss_ratio_traceinsight_over_nbt"] = ti["peak_pss_mb"] / ours["peak_pss_mb"]
        row["max_overlap_diff_traceinsight_pp"] = compare_overlap(
            ours["answer"]["overlap"], ti["answer"]["overlap"]
        )
        line += (
            f"; traceinsight {ti['seconds']:.1f} s {ti['peak_rss_mb']:.0f} MB"
            f" (PSS {ti['peak_pss_mb']:.0f} MB)"
            f" -> time x{row['time_ratio_traceinsight_over_nbt']:.1f},"
            f" RSS x{row['rss_ratio_traceinsight_over_nbt']:.1f},"
            f" overlap max diff {row['max_overlap_diff_traceinsight_pp']:.3f} pp"
        )
    _cpu_ratios(row)
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


def _cpu_ratios(row: dict[str, object]) -> None:
    """Each reference's CPU seconds (process tree) over each nbtoolkit variant's, and its RSS over theirs.

    On a machine shared with other work wall time follows the neighbours; CPU time much less.
    """
    variants = [k for k in ("nbtoolkit", "nbtoolkit_kernel_like", "nbtoolkit_one_process") if k in row]
    ratios: dict[str, dict[str, float]] = {}
    for ref in ("hta", "traceinsight"):
        theirs = row.get(ref)
        if not isinstance(theirs, dict) or "cpu_seconds" not in theirs:
            continue
        for name in variants:
            ours = row[name]
            assert isinstance(ours, dict)
            ratios[f"{ref}_over_{name}"] = {
                "wall": theirs["seconds"] / ours["seconds"],
                "cpu": theirs["cpu_seconds"] / ours["cpu_seconds"],
                "rss": theirs["peak_rss_mb"] / ours["peak_rss_mb"],
                "pss": theirs["peak_pss_mb"] / ours["peak_pss_mb"],
            }
    row["ratios"] = ratios
    for key, r in ratios.items():
        print(
            f"  {key}: wall x{r['wall']:.1f}, cpu x{r['cpu']:.1f}, RSS x{r['rss']:.1f}, PSS x{r['pss']:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
