"""The memory profiler's one native noise line is held back; everything else the step writes to
stderr comes through (``nbtoolkit.core.native_stderr.native_stderr_filtered``)."""

from __future__ import annotations

import os

import pytest
import torch

from nbtoolkit.core.native_stderr import native_stderr_filtered
from nbtoolkit.memory.profile import run_memory_profiled


def test_filtered_lines_are_dropped_and_the_rest_written_back(capfd: pytest.CaptureFixture[str]) -> None:
    with native_stderr_filtered(("noise",)):
        os.write(2, b"[W] some noise here\nthe user's own line\n")
    err = capfd.readouterr().err
    assert "the user's own line" in err
    assert "noise" not in err


def test_a_profiled_step_that_frees_older_memory_prints_no_allocator_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    model = torch.nn.Linear(64, 64)
    model(torch.randn(8, 64)).sum().backward()  # gradients from before the profiled step

    def step() -> None:
        model.zero_grad(set_to_none=True)  # frees blocks allocated before profiling started
        model(torch.randn(8, 64)).sum().backward()
        os.write(2, b"written by the step\n")

    run = run_memory_profiled(step, calls=2)
    assert run.failure is None
    err = capfd.readouterr().err
    assert "Memory block of unknown size" not in err
    assert "written by the step" in err
