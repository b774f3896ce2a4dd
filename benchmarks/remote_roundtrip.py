"""Round trip of an empty (`pass`) `%%nbt remote` cell on 2 ranks: locally and across hosts.

``--case local``: nbtoolkit on a local Ray cluster of 2 ranks beside ipyparallel ``%%px
--block`` on a local cluster of 2 engines, both in one IPython shell in this process.

``--case cross-host``: the multi-host test bed (tests/cluster/multihost.py: a Ray head on
host 1, a worker node on host 2, this process on host 3 attached through Ray Client). An
empty ``%%nbt remote`` on 2 ranks spread over the 2 hosts, beside the floor under it: raw
Ray calls of an empty method on 2 plain actors placed the same way, over the same Ray
Client connection. (ipyparallel is not run across the bed's hosts: its controller and
engines would need their own start-up inside the namespaces; raw Ray is the fairer floor,
as it is the transport nbtoolkit uses.) Needs root.

The two sides of a case are timed alternately (so that machine load hits both alike),
``--runs`` times each after a few warmup calls; we print the median and spread
(interquartile range) of each and the ratio of the medians.

Ray must never start outside a private network namespace: when this machine has any
network interface besides loopback, the script re-runs itself under
``unshare --net`` with loopback up (needs root, as in the project's test setup).

    python benchmarks/remote_roundtrip.py [--runs 50] [--case local|cross-host|both]
"""

from __future__ import annotations

import argparse
import os
import shlex
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


def _report(title: str, runs: int, label_a: str, a: list[float], label_b: str, b: list[float]) -> None:
    a_median, a_iqr = _summary(a)
    b_median, b_iqr = _summary(b)
    print(f"{title}, {runs} runs each, alternating:")
    print(f"  {label_a:<14}: median {a_median * 1e3:7.2f} ms   IQR {a_iqr * 1e3:6.2f} ms")
    print(f"  {label_b:<14}: median {b_median * 1e3:7.2f} ms   IQR {b_iqr * 1e3:6.2f} ms")
    print(f"  ratio         : {a_median / b_median:.2f}  ({label_a.strip()} / {label_b.strip()})")


def _alternate(a, b, runs: int, warmup: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    _time(a, warmup)
    _time(b, warmup)
    a_samples: list[float] = []
    b_samples: list[float] = []
    for _ in range(runs):  # alternate so that load spikes hit both
        a_samples += _time(a, 1)
        b_samples += _time(b, 1)
    return a_samples, b_samples


def local_case(shell, runs: int, warmup: int) -> None:  # type: ignore[no-untyped-def]
    import ipyparallel as ipp

    import nbtoolkit as nbt

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
        nbt_samples, px_samples = _alternate(
            lambda: shell.run_cell_magic("nbt", "remote", "pass"),
            lambda: shell.run_cell_magic("px", "--block", "pass"),
            runs,
            warmup,
        )
        _report(
            "empty cell round trip on 2 local ranks/engines", runs,
            "%%nbt remote", nbt_samples, "%%px", px_samples,
        )  # fmt: skip
    finally:
        client.close()
        ipp_cluster.stop_cluster_sync()
        cluster.close()
        os.environ.pop("RAY_AUTH_TOKEN", None)


def cross_host_case(shell, runs: int, warmup: int) -> None:  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the bed lives in tests/cluster
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    import nbtoolkit as nbt
    from tests.cluster.multihost import bed_unavailable_reason, multihost_bed

    reason = bed_unavailable_reason()
    if reason:
        print(f"cross-host case skipped: {reason}")
        return
    started = time.perf_counter()
    with multihost_bed() as bed:
        print(f"bed: head on host 1, worker on host 2 ready in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        cluster = nbt.Cluster.connect(bed.client_address, token=bed.token, ranks=2, strategy="spread")
        nodes = sorted(row["node"] for row in cluster.status().rows)
        print(f"nbtoolkit: 2 ranks on {nodes} ready in {time.perf_counter() - started:.1f} s (Ray Client)")
        group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
        ray.get(group.ready(), timeout=60)

        @ray.remote(num_cpus=1)
        class Empty:
            def ping(self) -> None:
                return None

        actors = [
            Empty.options(  # type: ignore[attr-defined]
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=i
                )
            ).remote()
            for i in range(2)
        ]
        try:
            nbt_samples, ray_samples = _alternate(
                lambda: shell.run_cell_magic("nbt", "remote", "pass"),
                lambda: ray.get([actor.ping.remote() for actor in actors]),
                runs,
                warmup,
            )
            _report(
                "empty cell round trip on 2 ranks on 2 hosts (via Ray Client)", runs,
                "%%nbt remote", nbt_samples, "raw Ray calls", ray_samples,
            )  # fmt: skip
        finally:
            for actor in actors:
                ray.kill(actor)
            remove_placement_group(group)
            cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--case", choices=("local", "cross-host", "both"), default="both")
    args = parser.parse_args()
    if not _in_private_namespace():
        argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
        command = f"ip link set lo up && {sys.executable} {Path(__file__).resolve()} {argv}"
        sys.exit(subprocess.call(["unshare", "--net", "sh", "-c", command]))

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    if args.case in ("local", "both"):
        local_case(shell, args.runs, args.warmup)
    if args.case in ("cross-host", "both"):
        cross_host_case(shell, args.runs, args.warmup)


if __name__ == "__main__":
    main()
