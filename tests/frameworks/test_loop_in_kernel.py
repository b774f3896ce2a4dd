"""A loop run as steps across the cells of a real Jupyter kernel.

The loop's greenlet stays paused between cells (ipykernel runs each cell on the main thread), each
cell's step() resumes it, and the kernel's interrupt (the stop button: SIGINT) stops a step that
hangs, after which the kernel, torch and the next cells are as usable as before.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SETUP = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import threading, time, torch
from nbtoolkit.core.training_loop import LoopSteps
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
entered = []
hang_at = [None]

def loop():
    for index in range(100):
        model(torch.randn(4, 8)).sum().backward()
        while hang_at[0] == index:
            time.sleep(0.01)
        entered.append(index)
        optimizer.step()
        optimizer.zero_grad()

step = LoopSteps(loop, warmup=1)
step.start()
print("started", len(entered), threading.get_ident() == threading.main_thread().ident)
"""


class _Kernel:
    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3")

    def run(
        self, code: str, *, interrupt_after_s: float | None = None, timeout_s: float = 120
    ) -> dict[str, Any]:
        msg_id = self.client.execute(code)
        started = time.monotonic()
        interrupted = False
        text: list[str] = []
        errors: list[str] = []
        while True:
            now = time.monotonic()
            if interrupt_after_s is not None and not interrupted and now - started > interrupt_after_s:
                self.manager.interrupt_kernel()
                interrupted = True
            if now - started > timeout_s:
                raise TimeoutError(f"the kernel did not finish within {timeout_s} s: {code!r}")
            try:
                msg = self.client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind == "error":
                errors.append(f"{content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                return {"text": "".join(text), "errors": errors}

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture
def kernel() -> Iterator[_Kernel]:
    pytest.importorskip("ipykernel", reason="ipykernel (a dev dependency) runs the kernel")
    started = _Kernel()
    yield started
    started.close()


def test_steps_across_cells_and_an_interrupted_step_leave_the_kernel_usable(kernel: _Kernel) -> None:
    first = kernel.run(SETUP)
    assert first["errors"] == [] and "started 1 True" in first["text"]
    second = kernel.run("step(); step(); print('after', len(entered))")
    assert second["errors"] == [] and "after 3" in second["text"]
    third = kernel.run("step(); print('after', len(entered), step.steps_done)")
    assert "after 4 3" in third["text"]
    # a step that hangs: the stop button interrupts it inside the loop's greenlet
    hung = kernel.run("hang_at[0] = len(entered); step()", interrupt_after_s=2.0)
    assert any(error.startswith("KeyboardInterrupt") for error in hung["errors"]), hung
    after = kernel.run(
        "from torch.optim import optimizer as o\n"
        "from nbtoolkit.core import loop_boundaries\n"
        "print('closed', step.outcome is not None, loop_boundaries.active_listeners(),"
        " len(o._global_optimizer_post_hooks), torch.autograd.backward.__module__)\n"
        "x = torch.randn(3, requires_grad=True); x.sum().backward(); print('grad', x.grad.tolist())"
    )
    assert after["errors"] == []
    assert "closed True 0 0 torch.autograd" in after["text"] and "grad [1.0, 1.0, 1.0]" in after["text"]
