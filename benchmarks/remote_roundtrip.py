"""Round trip of an empty (`pass`) `%%nbt remote` cell on 2 local ranks, beside ipyparallel `%%px --block`.

Both run in one IPython shell in this process: nbtoolkit on a local Ray cluster of 2 ranks,
ipyparallel on a local cluster of 2 engines. The two magics are timed alternately (so that
machine load hits both alike), ``--runs`` times each after a few warmup calls; we print the
median and spread (interquartile range) of each and the ratio of the medians.

Ray must never start outside a private network namespace: when this machine has any
network interface besides loopback, the script re-runs itself under
``unshare --net`` with loopback up (needs root, as in the project's test setup).

    python benchmarks/remote_roundtrip.py [--runs 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _in_private_namespace() -> bool:
    # /proc/net/dev lists the interfaces of this process's network namespace (/sys may not).
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    return {line.split(":")[0].strip() for line in lines} <= {"lo"}


def _time(fn, runs: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def _summary(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q[2] - q[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if not _in_private_namespace():
        command = f"ip link set lo up && {sys.executable} {Path(__file__).resolve()} --runs {args.runs}"
        sys.exit(subprocess.call(["unshare", "--net", "sh", "-c", command]))

    import ipyparallel as ipp
    from IPython.core.interactiveshell import InteractiveShell

    import nbtoolkit as nbt

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    started = time.perf_counter()
    cluster = nbt.Cluster.local(ranks=2)
    print(f"nbtoolkit: 2 ranks ready in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    ipp_cluster = ipp.Cluster(n=2, log_level=40)
    client = ipp_cluster.start_and_connect_sync()
    client.wait_for_engines(2, timeout=120)
    client[:].activate()  # registers %px / %%px in the shell
    print(f"ipyparallel: 2 engines ready in {time.perf_counter() - started:.1f} s")
    try:

        def nbt_remote() -> None:
            shell.run_cell_magic("nbt", "remote", "pass")

        def px() -> None:
            shell.run_cell_magic("px", "--block", "pass")

        _time(nbt_remote, args.warmup)
        _time(px, args.warmup)
        nbt_samples: list[float] = []
        px_samples: list[float] = []
        for _ in range(args.runs):  # alternate so that load spikes hit both
            nbt_samples += _time(nbt_remote, 1)
            px_samples += _time(px, 1)
        nbt_median, nbt_iqr = _summary(nbt_samples)
        px_median, px_iqr = _summary(px_samples)
        print(f"empty cell round trip on 2 ranks/engines, {args.runs} runs each, alternating:")
        print(f"  %%nbt remote : median {nbt_median * 1e3:7.2f} ms   IQR {nbt_iqr * 1e3:6.2f} ms")
        print(f"  %%px         : median {px_median * 1e3:7.2f} ms   IQR {px_iqr * 1e3:6.2f} ms")
        print(f"  ratio nbt/px : {nbt_median / px_median:.2f}  (below 1 means nbtoolkit is faster)")
    finally:
        client.close()
        ipp_cluster.stop_cluster_sync()
        cluster.close()
        os.environ.pop("RAY_AUTH_TOKEN", None)


if __name__ == "__main__":
    main()
