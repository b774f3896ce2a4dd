"""Quieting torch's native code where it writes straight to the process's stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["native_stderr_filtered", "native_stderr_silenced"]


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


@contextlib.contextmanager
def native_stderr_filtered(drop: tuple[str, ...]) -> Iterator[None]:
    """Hold back what is written to file descriptor 2 meanwhile and write it back after, without
    the lines that contain one of ``drop``.

    For torch's one-time "CPUAllocator ... Memory block of unknown size was allocated before the
    profiling started" line, which the memory profiler prints during the profiled step whenever
    the step frees a block from before it (the weights' last gradients, always): it says nothing
    about the user's step. Everything else the step writes there comes back, only later.
    """
    import os
    import sys
    import tempfile

    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True)
                    if not any(text.encode() in line for text in drop)]
            if kept:
                os.write(2, b"".join(kept))
