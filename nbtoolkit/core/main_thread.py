"""Run work on the kernel's main thread, in turn with the notebook's cells, and interruptibly.

Why: a widget's handler may run on a second thread. JupyterLab 4.6 sends widget messages to
a kernel *subshell* (``commsOverSubshells``, on by default), and ipykernel 7 runs every
subshell on a thread of its own; ipykernel 7.4 routes a comm's messages back to the thread
that last published on it, so which thread a click lands on depends on history. Work started
from such a handler would run beside the user's cells: a training cell and a measurement
stepping the same model at once corrupt it (or the process). And SIGINT (Kernel → Interrupt,
Ctrl-C) is delivered to the main thread only, so work on another thread cannot be interrupted.

How: :func:`on_main_thread` hands the job to the main thread's event loop
(``kernel.io_loop``, tornado's thread-safe ``add_callback``), where ipykernel handles the
main shell's ``execute_request`` messages. There the job holds the main shell's lock
(``kernel._main_asyncio_lock``, the one ipykernel takes around every main-shell request, so
that an ``async`` cell paused at an ``await`` does not interleave with it); a cell run while
the job runs waits in the shell's queue and runs afterwards, and a cell running when the job
is handed over finishes first. While the job runs, SIGINT raises ``KeyboardInterrupt`` in it
(ipykernel ignores SIGINT between requests, so the job installs Python's default handler for
its duration, as ipykernel does around each request).

Without a kernel event loop (a script, a test, terminal IPython) the job runs at once on the
calling thread.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["interruptible", "kernel_main_loop", "on_main_thread"]


def kernel_main_loop() -> tuple[Any, Any] | None:
    """(the running ipykernel's main-thread IOLoop, its main-shell asyncio lock or None), or None
    outside an ipykernel. Imports nothing that is not loaded already."""
    module = sys.modules.get("ipykernel.kernelbase")
    if module is None or not module.Kernel.initialized():
        return None
    kernel = module.Kernel.instance()
    loop = getattr(kernel, "io_loop", None)
    if loop is None:  # a kernel object that was never started (an in-process test kernel)
        return None
    # ipykernel >= 7 serialises main-shell requests with this lock; older ones have none
    return loop, getattr(kernel, "_main_asyncio_lock", None)


def interruptible(job: Callable[[], Any]) -> Any:
    """``job()``, with SIGINT raising KeyboardInterrupt in it when this is the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return job()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return job()
    finally:
        signal.signal(signal.SIGINT, previous)


def on_main_thread(job: Callable[[], None], *, loop: Any = None, lock: Any = None) -> bool:
    """Run ``job`` on the kernel's main thread after the cell that runs now (if any), holding the
    main shell's lock, SIGINT interrupting it; True when handed to the kernel's loop, False when
    it ran here at once (no kernel loop). ``loop``/``lock`` default to the kernel's (tests pass
    their own).

    ``job`` reports its own outcome (a widget callback has nowhere to raise to); a
    KeyboardInterrupt that arrives after it returned is dropped, not logged as a kernel error.
    """
    if loop is None:
        found = kernel_main_loop()
        if found is None:
            interruptible(job)
            return False
        loop, lock = found

    def run() -> None:
        with contextlib.suppress(KeyboardInterrupt):  # an interrupt after the job handled its own
            interruptible(job)

    async def in_turn() -> None:
        if lock is None:
            run()
            return
        async with lock:
            run()

    loop.add_callback(in_turn)
    return True
