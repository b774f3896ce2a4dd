"""Catch what native code prints on stderr, and Python warnings, while a block runs.

torch's C++ side writes some warnings straight to file descriptor 2 (for example the
profiler's "CPUAllocator ... Memory block of unknown size" line): ipykernel forwards that
descriptor to whichever cell last ran, in red, far from what caused it. Inside
:func:`captured_stderr` descriptor 2 points at a temporary file instead (a duplicate of the
original keeps ipykernel's pipe open, so its reader never sees an end of file), and Python
warnings are recorded rather than printed; the caller shows the lines where they belong.

Descriptor 2 is per process: whatever any thread writes there meanwhile is caught too, and
handed to the caller rather than lost.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Captured", "captured_stderr"]


@dataclass
class Captured:
    """What was caught: ``lines`` of native stderr and of warnings (``"UserWarning: text"``), in order."""

    lines: list[str] = field(default_factory=list)


@contextlib.contextmanager
def captured_stderr() -> Iterator[Captured]:
    """Native stderr and Python warnings of the block, in ``Captured.lines`` once it ends."""
    captured = Captured()
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stderr.flush()
    try:
        original = os.dup(2)
    except OSError:  # no descriptor 2 (a detached process): catch the warnings only
        original = None
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings(record=True) as caught:
        if original is not None:
            os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            if original is not None:
                os.dup2(original, 2)
                os.close(original)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            captured.lines.extend(line for line in text.splitlines() if line.strip())
            captured.lines.extend(f"{w.category.__name__}: {w.message}" for w in caught)
