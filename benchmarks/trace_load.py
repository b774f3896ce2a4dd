"""Load a trace and compute its temporal breakdown: nbtoolkit vs HolisticTraceAnalysis, side by side.

Each measurement runs in a fresh subprocess (interpreter start, imports, load, analysis),
alternating the two tools so that both see the same machine load; the median of
``--repeat`` runs is reported, with peak RSS (the child's own maximum resident set size,
or that of its worker processes if larger: HTA parses ranks in a process pool).

HTA is not a dependency of nbtoolkit: the script creates its own virtual environment with
``holistictraceanalysis==0.5.0`` and ``pandas<3`` (HTA 0.5 breaks on pandas 3; it does not
need torch) the first time, at ``--hta-venv`` (default /tmp/hta-venv).

    .venv/bin/python benchmarks/trace_load.py            # the 87 MB MTIA trace and three more
    .venv/bin/python benchmarks/trace_load.py --repeat 5 --traces hta_mtia_single_rank
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_TRACES = [
    "hta_mtia_single_rank",
    "hta_negative_queue_16rank_r0",
    "hta_trace_filter_2rank",
    "hta_nccl_parser_config",
]

_MEASURE = """
import json, resource, sys, time
start = time.perf_counter()
{body}
elapsed = time.perf_counter() - start
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
peak = max(own, children) / 1024
print("RESULT " + json.dumps({{"seconds": elapsed, "peak_rss_mb": peak, "answer": answer}}))
"""

NBTOOLKIT = """
import nbtoolkit as nbt
trace = nbt.load_trace(sys.argv[1])
tb = nbt.temporal_breakdown(trace)
answer = [round(float(x), 2) for x in tb["idle_pct"]]
"""

HTA = """
import logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
tb = analyzer.get_temporal_breakdown(visualize=False)
answer = [round(float(x), 2) for x in tb["idle_time_pctg"]]
"""


def ensure_hta(venv: Path) -> Path:
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import hta.trace_analysis"]
    if python.exists() and subprocess.run(check, check=False, capture_output=True).returncode == 0:
        return python
    print(f"creating {venv} with holistictraceanalysis==0.5.0 and pandas<3 (once) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "holistictraceanalysis==0.5.0", "pandas<3"], check=True
    )
    subprocess.run(check, check=True)
    return python


def measure(python: Path, body: str, trace_dir: Path) -> dict[str, float]:
    code = _MEASURE.format(body=body)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    command = [str(python), "-c", code, str(trace_dir)]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - begin
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout)[-800:]
        return {"error": tail.strip().splitlines()[-1] if tail.strip() else f"exit {done.returncode}"}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["process_seconds"] = wall
    result["cpu_seconds"] = cpu
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--traces",
        nargs="*",
        default=DEFAULT_TRACES,
        help="real traces by registry name (traces/NAME), found by nbt.locate_data",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta-venv", type=Path, default=Path("/tmp/hta-venv"))
    args = parser.parse_args()

    hta_python = ensure_hta(args.hta_venv)
    nbt_python = Path(sys.executable)
    header = f"{'trace':32s} {'tool':10s} {'wall s':>8s} {'process s':>10s} {'cpu s':>7s} {'peak MB':>8s}"
    print(header + "  idle %")
    summary = []
    import nbtoolkit as nbt

    for name in args.traces:
        try:  # NBT_DATA, ../shared/fixtures, the cache, or the pinned download
            folder = nbt.locate_data(f"traces/{name}")
        except nbt.DataUnavailableError as exc:
            print(f"{name:32s} skipped: {exc}")
            continue
        runs: dict[str, list[dict[str, float]]] = {"nbtoolkit": [], "HTA": []}
        for _ in range(args.repeat):  # alternate, so that both tools see the same load
            runs["nbtoolkit"].append(measure(nbt_python, NBTOOLKIT, folder))
            runs["HTA"].append(measure(hta_python, HTA, folder))
        medians = {}
        for tool, results in runs.items():
            good = [r for r in results if "error" not in r]
            if not good:
                print(f"{name:32s} {tool:10s} failed: {results[0]['error']}")
                continue
            med = {
                k: statistics.median(r[k] for r in good)
                for k in ("seconds", "process_seconds", "cpu_seconds", "peak_rss_mb")
            }
            medians[tool] = med
            print(
                f"{name:32s} {tool:10s} {med['seconds']:8.2f} {med['process_seconds']:10.2f} "
                f"{med['cpu_seconds']:7.2f} {med['peak_rss_mb']:8.0f}  {good[0]['answer']}"
            )
        if len(medians) == 2:
            n, h = medians["nbtoolkit"], medians["HTA"]
            summary.append(
                (
                    name,
                    h["seconds"] / n["seconds"],
                    h["process_seconds"] / n["process_seconds"],
                    h["cpu_seconds"] / n["cpu_seconds"],
                    h["peak_rss_mb"] / n["peak_rss_mb"],
                )
            )
    print()
    print("HTA / nbtoolkit ratios (higher is better for nbtoolkit):")
    print(f"{'trace':32s} {'wall':>8s} {'process':>8s} {'cpu':>8s} {'peak RSS':>9s}")
    for name, wall, process, cpu, rss in summary:
        print(f"{name:32s} {wall:7.1f}x {process:7.1f}x {cpu:7.1f}x {rss:8.1f}x")
    print(
        "wall: import + load + temporal breakdown inside the process; process: the whole subprocess "
        "including interpreter start; cpu: user+system time of the subprocess (least sensitive to other "
        "load on the machine). Targets on the MTIA trace: 8x wall, 3x peak RSS."
    )


if __name__ == "__main__":
    main()
