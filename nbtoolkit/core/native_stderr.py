"""Quieting torch's native code where it writes straight to the process's stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["native_stderr_silenced"]


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null while the profiler starts or stops.

    Kineto prints ``USDT: <timestamp> ... profiler_start`` lines straight to the process's
    stderr; in a notebook they show up under the cell (with a new timestamp every run).
    Only the start/stop calls are wrapped, never the user's code.
    """
    import os
    import sys

    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2 (embedded interpreters): nothing to silence
        yield
        return
    try:
        sys.stderr.flush()
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)
