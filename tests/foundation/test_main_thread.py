"""``core.main_thread``: work handed from another thread runs on the loop's thread, after the request
that holds the main shell, with SIGINT raising KeyboardInterrupt in it (issue 41).

A real asyncio/tornado loop on this (the main) thread stands for ipykernel's main shell; a real
second thread stands for a subshell handling a widget's click; a real SIGINT stands for
Kernel → Interrupt. The JupyterLab test (tests/browser/test_optimize_panel_in_jupyterlab.py) runs
the same path inside a real kernel.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from nbtoolkit.core.main_thread import on_main_thread


@pytest.fixture
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored between requests, as ipykernel sets it; restored afterwards."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_ignored")
def test_a_handed_job_waits_for_the_running_request_runs_on_the_main_thread_and_is_interruptible() -> None:
    from tornado.ioloop import IOLoop

    events: list[object] = []

    def job() -> None:
        events.append(("job", threading.current_thread().name,
                       signal.getsignal(signal.SIGINT) is signal.default_int_handler))
        started = time.monotonic()
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Kernel -> Interrupt
            time.sleep(5)
            events.append("not interrupted")
        except KeyboardInterrupt:
            events.append(("interrupted", time.monotonic() - started))

    async def scenario() -> None:
        loop, lock = IOLoop.current(), asyncio.Lock()
        async with lock:  # a request (a cell) holds the main shell
            clicker = threading.Thread(target=lambda: on_main_thread(job, loop=loop, lock=lock))
            clicker.start()
            clicker.join()
            await asyncio.sleep(0.3)
            events.append("request ends")  # the job has not run beside it
        deadline = time.monotonic() + 10
        while len(events) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert events[:2] == ["request ends", ("job", "MainThread", True)]
    assert events[2][0] == "interrupted" and events[2][1] < 1.0  # type: ignore[index]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the kernel's setting is back


def test_without_a_kernel_loop_the_job_runs_at_once_here() -> None:
    ran: list[str] = []
    assert on_main_thread(lambda: ran.append(threading.current_thread().name)) is False
    assert ran == ["MainThread"]
