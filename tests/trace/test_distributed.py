"""A real 2-rank CPU run: DDP over a gloo group on loopback, each rank profiled with nbt.profile."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import nbtoolkit as nbt

WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    import nbtoolkit as nbt

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(64, 256)

        def step():
            loss = ddp(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item()

        nbt.profile(step, steps=3, warmup=1, trace_path=f"{out}/rank{rank}.json")
    finally:
        dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ddp_traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp")
    script = folder / "worker.py.txt"  # not .json: load_trace skips it with a note
    script.write_text(WORKER)
    port = _free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), "2", str(port), str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    return folder


@pytest.mark.distributed
@pytest.mark.slow
def test_two_gloo_ranks_have_collectives_and_a_finite_overlap(ddp_traces):
    trace = nbt.load_trace(ddp_traces)
    assert trace.ranks == [0, 1]
    for rank in (0, 1):
        info = trace.info[rank]
        assert info.backend == "gloo" and info.world_size == 2
        assert info.notes == []  # the rank came from distributedInfo
        assert list(trace.steps.query("rank == @rank")["step"]) == [0, 1, 2]
    assert any("worker.py.txt" in note for note in trace.notes)

    overlap = nbt.comm_comp_overlap(trace)
    assert list(overlap["rank"]) == [0, 1]
    assert (overlap["method"] == "cpu-gloo").all()
    assert (overlap["comm_time_us"] > 0).all()
    for pct in overlap["overlap_pct"]:
        assert math.isfinite(pct) and 0 <= pct <= 100
    calls = nbt.comm_comp_overlap(trace, by="collective")
    for rank in (0, 1):
        assert "all_reduce" in set(calls.loc[calls["rank"] == rank, "collective"])

    breakdown = nbt.temporal_breakdown(trace)
    total = breakdown["idle_us"] + breakdown["compute_us"] + breakdown["non_compute_us"]
    assert (abs(total - breakdown["span_us"]) < 1e-6).all()
    assert (breakdown["compute_us"] > 0).all()

    report = nbt.stragglers(trace)
    assert report.slowest_rank in (0, 1)
