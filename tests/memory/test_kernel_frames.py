"""Stacks of a memory timeline recorded from a notebook cell keep the cell's frames, not the kernel's.

A step run from a cell sits under dozens of IPython (and, in a kernel, ipykernel/tornado/asyncio)
frames that are the same for every cell; they filled every stack in 02_memory's diff and imbalance
tables. The recording here runs through a real IPython shell.
"""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell

CELL = """
import torch
import nbtoolkit as nbt

layer = torch.nn.Linear(64, 64)

def step():
    layer(torch.randn(32, 64)).sum().backward()

kernel_frames_timeline = nbt.memory_timeline(step, model=layer)
"""


def test_stacks_from_a_cell_hold_no_ipython_frames(shell: InteractiveShell) -> None:
    result = shell.run_cell(CELL)
    assert result.error_in_exec is None
    timeline = shell.user_ns["kernel_frames_timeline"]
    frames = [frame for stack in timeline.stacks for frame in stack.splitlines()]
    assert frames, "the recording kept no stacks"
    assert not [f for f in frames if f.startswith(("IPython/", "ipykernel/", "tornado/", "asyncio/"))]
    # the cell's own function is still there: only the kernel's frames went
    assert any(f.endswith(": step") for f in frames), frames[:10]
