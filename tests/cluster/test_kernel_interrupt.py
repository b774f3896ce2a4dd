"""Ctrl-C on a cluster cell in a real Jupyter kernel: the kernel's interrupt (SIGINT) reaches
every rank, a rank blocked in a collective is freed, and the next cell works.

The module runs after test_cluster.py (alphabetical order), whose cluster is closed by then:
two clusters of 2 ranks do not fit on a 2-core machine. Needs the private network namespace
like the other cluster tests.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


class _Kernel:
    """A real ipykernel: run a cell, optionally interrupt it after some seconds, collect its output."""

    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3")

    def run(
        self, code: str, *, interrupt_after_s: float | None = None, timeout_s: float = 240
    ) -> dict[str, Any]:
        msg_id = self.client.execute(code)
        started = time.monotonic()
        interrupted_at: float | None = None
        text: list[str] = []
        errors: list[str] = []
        displays: list[str] = []  # the progress line and its updates
        while True:
            now = time.monotonic()
            if interrupt_after_s is not None and interrupted_at is None and now - started > interrupt_after_s:
                self.manager.interrupt_kernel()  # what the notebook's stop button (Ctrl-C) does
                interrupted_at = now
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
            elif kind == "execute_result":
                text.append(content["data"].get("text/plain", ""))
            elif kind in {"display_data", "update_display_data"}:
                displays.append(content["data"].get("text/plain", ""))
            elif kind == "status" and content["execution_state"] == "idle":
                end = time.monotonic()
                return {
                    "text": "".join(text),
                    "errors": errors,
                    "displays": displays,
                    "after_interrupt_s": None if interrupted_at is None else end - interrupted_at,
                }

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel_with_cluster() -> Iterator[_Kernel]:
    kernel = _Kernel()
    try:
        started = kernel.run("%load_ext nbtoolkit\n%nbt cluster start 2 --timeout 60")
        assert not started["errors"], started
        yield kernel
        stopped = kernel.run("%nbt cluster stop")
        assert "cluster stopped" in stopped["text"]
    finally:
        kernel.close()


ALL_REDUCE = "%%nbt remote\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"


def test_kernel_interrupt_stops_a_looping_cell_on_every_rank(kernel_with_cluster: _Kernel) -> None:
    looping = "%%nbt remote\nimport time\nprint('looping', rank)\nwhile True:\n    time.sleep(0.02)"
    result = kernel_with_cluster.run(looping, interrupt_after_s=3)
    assert result["after_interrupt_s"] is not None and result["after_interrupt_s"] < 5
    assert "[rank 0] looping 0" in result["text"] and "[rank 1] looping 1" in result["text"]
    assert len(result["errors"]) == 1
    assert (
        result["errors"][0].startswith("RemoteCellError")
        and "interrupted (Ctrl-C) on ranks 0, 1" in result["errors"][0]
    )
    after = kernel_with_cluster.run(ALL_REDUCE)
    assert not after["errors"] and after["text"] == "[rank 0] 2.0\n[rank 1] 2.0"


def test_kernel_interrupt_frees_a_rank_blocked_in_a_collective(kernel_with_cluster: _Kernel) -> None:
    blocked = (
        "%%nbt remote\nimport time\nif rank == 0:\n    dist.all_reduce(torch.ones(1))\n"
        "else:\n    while True:\n        time.sleep(0.02)"
    )
    result = kernel_with_cluster.run(blocked, interrupt_after_s=3)
    # The group's collective timeout is 60 s: freeing must come long before it.
    assert result["after_interrupt_s"] is not None and result["after_interrupt_s"] < 20
    assert len(result["errors"]) == 1 and "rank 0 kept waiting in a collective" in result["errors"][0]
    # A cell running over 5 s shows a progress line, and its last update says how it ended.
    assert result["displays"] and result["displays"][0].startswith("running on all ranks… ")
    assert result["displays"][-1].startswith("running on all ranks: stopped in ")
    after = kernel_with_cluster.run(ALL_REDUCE)
    assert not after["errors"] and after["text"] == "[rank 0] 2.0\n[rank 1] 2.0"
