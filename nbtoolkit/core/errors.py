"""The exception tree of nbtoolkit.

Every error a user can cause derives from :class:`NbtError`, so that
``except nbt.NbtError`` catches all of ours and nothing of anyone else's.
Messages state the problem (with the offending value or path) and what to do.

    NbtError
    ├── NbtUsageError     bad arguments to a public function or magic
    │   ├── StepError     the user's step raised while nbtoolkit measured it
    │   └── LoopError     a training loop run as steps (nbt.train_step) cannot give the steps asked
    │       └── LoopEndedError   the loop ended before the steps asked; ``.measured`` says how many ran
    ├── TraceError        a profiler trace that cannot be read or analysed
    ├── CompileLogError   a TORCH_TRACE log that cannot be read
    ├── CaptureError      code run under an instrument failed to produce a result
    ├── SnapshotError     a memory snapshot that cannot be read (or is unsafe)
    ├── SaveError         a result cannot be saved where asked (also an OSError)
    ├── PlanError         no recomputation plan satisfies the request
    ├── MetricsError      FLOPs / MFU cannot be computed for this step
    ├── ClusterError      the cluster or one of its ranks failed
    │   └── RemoteCellError   a cell failed on ranks: their tracebacks, dead or interrupted ranks
    └── DataError         a real-data artifact failed its pinned checksum (nbt.locate_data)
        └── DataUnavailableError   not in NBT_DATA, ../shared/fixtures or the cache, and not downloadable

Outside the tree, :class:`TrainingStopped` is a ``BaseException``: nbtoolkit raises it *inside* a
user's training loop to stop it (so that the loop's own ``except Exception`` does not swallow it).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CaptureError",
    "ClusterError",
    "CompileLogError",
    "DataError",
    "DataUnavailableError",
    "LoopEndedError",
    "LoopError",
    "MetricsError",
    "NbtError",
    "NbtUsageError",
    "PlanError",
    "RemoteCellError",
    "SaveError",
    "SnapshotError",
    "StepError",
    "TraceError",
    "TrainingStopped",
]


class NbtError(Exception):
    """Base class of every error nbtoolkit raises on purpose.

    In IPython the error shows as one line (``TraceError: <message>``) rather than a
    traceback through nbtoolkit's internals: the message already says what to do.
    Scripts still get a normal exception.
    """

    def _render_traceback_(self) -> list[str]:
        # IPython's hook for custom exception display (used by ipyparallel too).
        return [f"{type(self).__name__}: {self}"]


class NbtUsageError(NbtError, ValueError):
    """A public function or magic was called with arguments it cannot use."""


class StepError(NbtUsageError):
    """The user's step raised while being measured; the original exception is ``__cause__``.

    A usage error because the step is the user's code: it must run on its own before it can
    be measured. ``step`` names the step, ``call`` says which call failed ("timed step 2 of 3").
    """

    def __init__(self, message: str, *, step: str = "", call: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.call = call


class LoopError(NbtUsageError):
    """A training loop run step by step (:class:`~nbtoolkit.core.training_loop.LoopSteps`,
    ``nbt.train_step``) cannot give a step: it never steps an optimizer, takes longer than the step
    time limit, or is called from another thread."""


class LoopEndedError(LoopError):
    """The training loop returned before giving the steps asked; ``measured`` steps were measured."""

    def __init__(self, message: str, *, measured: int = 0) -> None:
        super().__init__(message)
        self.measured = measured


class TrainingStopped(BaseException):
    """Raised by nbtoolkit inside a training loop to stop it after the measured steps.

    A ``BaseException`` (like ``KeyboardInterrupt``), so that a loop's ``except Exception`` does not
    swallow it; nbtoolkit catches it where the loop was started. A loop that must clean up on
    being stopped can catch it (``except nbt.TrainingStopped``) and re-raise.
    """


class TraceError(NbtError):
    """A profiler trace is missing, corrupt, or not a trace."""


class CompileLogError(NbtError):
    """A TORCH_TRACE structured compile log is missing or unreadable."""


class CaptureError(NbtError):
    """Code run under an nbtoolkit instrument did not produce a usable result."""


class SnapshotError(NbtError):
    """A memory snapshot is missing, corrupt, or tries to run code."""


class SaveError(NbtError, OSError):
    """A result's ``save`` cannot write where it was asked: a file in the way, no permission, a full disk.

    Also an ``OSError``, so code that treats an unwritable place as a skipped write (the
    caches) goes on doing so.
    """


class PlanError(NbtError):
    """No activation-recomputation plan can meet the request."""


class MetricsError(NbtError):
    """Step metrics (FLOPs, MFU) cannot be computed."""


class ClusterError(NbtError):
    """The cluster, or one of its ranks, failed."""


class RemoteCellError(ClusterError):
    """A cell failed on one or more ranks: a Python exception, a rank that died, or an interrupt.

    Made from the :class:`~nbtoolkit.cluster.state.RemoteRun` of that call (``run``), which
    must offer ``errors``, ``dead`` and ``failure_text()``. ``errors`` maps rank -> the remote
    traceback text; ``dead`` maps rank -> why its process is gone. The message shows each
    failing rank's traceback once (ranks with the same traceback share one block).
    """

    def __init__(self, run: Any) -> None:
        # ``run`` is typed loosely: core imports no feature (RemoteRun is the cluster's).
        self.run = run
        self.errors: dict[int, str] = dict(run.errors)
        self.dead: dict[int, str] = dict(run.dead)
        super().__init__(run.failure_text())


class DataError(NbtError):
    """A real-data artifact (see :mod:`nbtoolkit.core.datasets`) cannot be used as it is."""


class DataUnavailableError(DataError):
    """A real-data artifact is in no data folder nor the cache, and cannot be downloaded here."""
