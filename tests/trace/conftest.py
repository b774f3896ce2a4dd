"""Real traces this test session records itself, on this CPU machine, once per session.

Fresh clones have no GPU trace data (``real_data`` skips), so every trace reader and analysis
is also exercised on traces recorded here:

- ``cpu_trace_file``: one rank, a small model's training step profiled by ``nbt.profile``;
- ``gloo_trace_folder``: two ranks of DDP over a gloo group on loopback, each rank profiled by
  ``nbt.profile``; rank 1 sleeps ``STRAGGLER_SLEEP_S`` in every step before ``backward()``,
  so rank 0 waits for it in the gradient all_reduce: a known straggler.

Both run in subprocesses of ``sys.executable``: no profiler state reaches the test process
(``no_instrument_left_active`` in tests/conftest.py checks that after each test).

Also ``hta``: HolisticTraceAnalysis's ``TraceAnalysis`` class, runnable under this pandas, for the
tests that compare with it (skips naming HTA where it is not installed).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._python import run_python

# The rank of the 2-rank run that sleeps inside every step, and for how long. Long against the
# step's own work (a few ms on one CPU thread), so the straggler stands out on a loaded machine.
STRAGGLER_RANK = 1
STRAGGLER_SLEEP_S = 0.04
PROFILED_STEPS = 3

WORKER = textwrap.dedent(
    f"""
    import sys
    import time
    import torch
    import torch.distributed as dist
    import nbtoolkit as nbt

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(64, 256)

        def step():
            loss = ddp(x).pow(2).mean()
            if rank == {STRAGGLER_RANK}:
                time.sleep({STRAGGLER_SLEEP_S})  # the straggler: the other rank waits in all_reduce
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item()

        nbt.profile(step, steps={PROFILED_STEPS}, warmup=1, trace_path=f"{{out}}/rank{{rank}}.json")
    finally:
        dist.destroy_process_group()
    """
)

CPU_STEP_SCRIPT = textwrap.dedent(
    f"""
    import sys
    import torch
    import nbtoolkit as nbt

    trace_path, saved_folder = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    trace = nbt.profile(step, steps={PROFILED_STEPS}, warmup=1, trace_path=trace_path)
    trace.save(saved_folder)  # what profile() returned, to compare with the file it wrote
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# gloo on loopback only; one thread per process so two ranks share two cores fairly.
_GLOO_ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _subprocess_env() -> dict[str, str]:
    return {**os.environ, **_GLOO_ENV}


@pytest.fixture(scope="session")
def cpu_trace_recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Kineto trace file, folder of the Trace that nbt.profile returned, saved) of one CPU process."""
    folder = tmp_path_factory.mktemp("cpu_trace")
    trace_file = folder / "train_step.json"  # no rank in the name: load_trace notes rank 0
    saved = folder / "profiled"
    run_python("-c", CPU_STEP_SCRIPT, str(trace_file), str(saved), env=_GLOO_ENV)
    return trace_file, saved


@pytest.fixture(scope="session")
def cpu_trace_file(cpu_trace_recording: tuple[Path, Path]) -> Path:
    """A single-rank Kineto trace of 3 profiled training steps (after 1 warm-up) of a small MLP."""
    return cpu_trace_recording[0]


def record_gloo_job(folder: Path, world: int) -> Path:
    """``rank0.json`` ... of a ``world``-rank gloo DDP run in ``folder`` (rank ``STRAGGLER_RANK`` sleeps
    ``STRAGGLER_SLEEP_S`` in every step), each rank a subprocess; plus worker.py.txt."""
    script = folder / "worker.py.txt"  # not .json: load_trace skips it with a note
    script.write_text(WORKER)
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(world), str(port), str(folder)],
            env=_subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
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


@pytest.fixture(scope="session")
def gloo_trace_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rank0.json and rank1.json of a 2-rank gloo DDP run (rank 1 the straggler), plus worker.py.txt."""
    return record_gloo_job(tmp_path_factory.mktemp("ddp"), world=2)


@pytest.fixture
def hta(monkeypatch):
    """HTA's TraceAnalysis class, runnable under this pandas, with HTA's test settings."""
    import logging

    import pandas as pd

    trace_analysis = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    original = pd.DataFrame.drop

    def drop(self, labels=None, *, axis=0, index=None, columns=None, **kwargs):
        if index is not None or columns is not None:  # pandas 3 refuses axis= beside columns=
            return original(self, labels, index=index, columns=columns, **kwargs)
        return original(self, labels, axis=axis, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "drop", drop)
    # HTA's own critical-path tests turn on its zero-weight launch edges (causality kept for
    # kernels that queued behind others); nbtoolkit always has them.
    monkeypatch.setenv("CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE", "1")
    logging.getLogger("hta").setLevel(logging.ERROR)
    return trace_analysis.TraceAnalysis
