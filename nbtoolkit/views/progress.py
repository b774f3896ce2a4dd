"""Progress for long-running work, shown only when the work outlasts a short delay.

A quick measurement should not flash a progress bar; a measurement of minutes must show
one (ipyparallel's habit). ``tqdm.auto`` picks a widget in notebooks and text in terminals,
and its ``delay`` keeps the bar hidden until the delay has passed. Output goes to stderr,
so the text/plain results that nbval checks are not affected.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["DEFAULT_DELAY_S", "progress"]

DEFAULT_DELAY_S = 1.0


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
