"""Progress for long-running work, shown only when the work outlasts a short delay.

A quick measurement should not flash a progress bar; a measurement of minutes must show
one (ipyparallel's habit). Two kinds:

- :func:`progress`, a bar for work counted in steps. ``tqdm.auto`` picks a widget in
  notebooks and text in terminals, and its ``delay`` keeps the bar hidden until the delay
  has passed. Output goes to stderr, so the text/plain results nbval checks are unaffected.
- :class:`DelayedProgress`, an elapsed-time line ("starting 2 ranks… 4 s") for one long
  call that reports no steps (starting a cluster, a cell running on ranks): a background
  thread updates one display in the notebook; outside a kernel it shows nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from nbtoolkit.core.result import escape

__all__ = ["CELL_DELAY_S", "DEFAULT_DELAY_S", "DelayedProgress", "progress"]

DEFAULT_DELAY_S = 1.0
#: For a magic's whole cell: most cells finish well within it and show nothing.
CELL_DELAY_S = 5.0


@contextmanager
def progress(
    description: str, total: int | None = None, *, delay_s: float = DEFAULT_DELAY_S
) -> Iterator[Any]:
    """A progress bar (``.update(n)``, ``.set_description(text)``) that appears after ``delay_s``.

    Usage::

        with progress("measuring baseline", total=steps) as bar:
            for _ in range(steps):
                run_step()
                bar.update(1)

    The bar is closed on exit, also when the work raises or is interrupted.
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=description, delay=delay_s, leave=False, unit="step")
    try:
        yield bar
    finally:
        bar.close()


class DelayedProgress:
    """A one-line progress note ("starting 2 ranks… 4 s") shown only if the work takes > ``delay_s``.

    Runs in a background thread and updates one display (IPython display handle); outside
    IPython it shows nothing. Used by the magics around slow cluster calls.
    """

    def __init__(self, message: str, *, delay_s: float = DEFAULT_DELAY_S, every_s: float = 0.5) -> None:
        self.message = message
        self.delay_s = delay_s
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None
        self._started = 0.0

    def __enter__(self) -> DelayedProgress:
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:  # no IPython: nothing to show
            shell = None
        if shell is not None and getattr(shell, "kernel", None) is not None:
            self._started = time.monotonic()
            self._thread = threading.Thread(target=self._loop, name="nbt-progress", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        from IPython.display import display

        if self._stop.wait(self.delay_s):
            return
        self._handle = display(_Line(self._line()), display_id=True)
        while not self._stop.wait(self.every_s):
            self._handle.update(_Line(self._line()))

    def _line(self) -> str:
        return f"{self.message}… {time.monotonic() - self._started:.0f} s"

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._handle is not None:
            elapsed = time.monotonic() - self._started
            self._handle.update(
                _Line(f"{self.message}: {'done' if exc is None else 'stopped'} in {elapsed:.1f} s")
            )


class _Line:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<span style='color:#555'>{escape(self.text)}</span>"
