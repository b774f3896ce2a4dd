"""Memory tests: torch imported at collection time, and the memory data the session records.

The session records a CPU training step's memory in the formats real GPU runs produce
(an allocator snapshot written by ``nbt.export_memory_snapshot`` and torch's
``export_memory_timeline`` raw output), so the readers are tested without any real data.


Importing torch for the first time installs its logging handlers (torch._dynamo,
torch.__trace ...); the repository-wide no-instrument fixture would otherwise see those
appear during whichever memory test happens to import torch first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

#: The name tests give the snapshot this session records itself, beside real snapshot names.
RECORDED = "recorded"


@dataclasses.dataclass(frozen=True)
class RecordedMemory:
    """Memory data this test session records on the CPU, in the formats real GPU runs produce."""

    timeline: object  # nbt.MemoryTimeline of one AdamW training step
    snapshot: Path  # that timeline written by nbt.export_memory_snapshot (torch's _dump_snapshot format)
    raw_export: Path  # torch.profiler's export_memory_timeline(device="cpu") of the same kind of step


@pytest.fixture(scope="session")
def recorded_memory(tmp_path_factory: pytest.TempPathFactory) -> RecordedMemory:
    import warnings

    from torch import nn

    import nbtoolkit as nbt

    folder = tmp_path_factory.mktemp("recorded_memory")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64)

    def step() -> float:
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(loss.item())

    step()  # the optimizer state exists before recording, as in a training loop
    timeline = nbt.memory_timeline(step, model=model, optimizer=optimizer)
    snapshot = nbt.export_memory_snapshot(timeline, folder / "recorded_cpu_step.pickle")

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True,
                                with_stack=True) as prof:
        step()
    raw_export = folder / "recorded_cpu_step.raw.json.gz"
    with warnings.catch_warnings():  # torch deprecates the export in favour of CUDA-only snapshots
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(raw_export), device="cpu")
    return RecordedMemory(timeline=timeline, snapshot=snapshot, raw_export=raw_export)


@pytest.fixture
def snapshot_file(request: pytest.FixtureRequest, real_data: Callable[[str], Path]) -> Callable[[str], Path]:
    """``snapshot_file(name)``: the recorded snapshot for RECORDED, else the real one (skips if missing)."""

    def get(name: str) -> Path:
        if name == RECORDED:
            return request.getfixturevalue("recorded_memory").snapshot
        return real_data(f"memory/{name}")

    return get
