"""Instruments run ON a rank by :class:`nbtoolkit.cluster.Cluster` (imported inside the rank worker).

Each takes the rank's step (a zero-argument callable made from a cell or a function)
and returns plain data that pickles cheaply back to the notebook.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from typing import Any

from nbtoolkit.core.measure_config import DEFAULT_STEPS, DEFAULT_WARMUP

__all__ = [
    "capture_graphs_on_rank",
    "memory_timeline_on_rank",
    "profile_to_bytes",
    "read_matching_files",
    "step_metrics_on_rank",
]


def profile_to_bytes(
    step: Callable[[], Any],
    *,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
) -> dict[str, Any]:
    """Profile ``step`` on this rank as ``nbt.profile`` does locally; return the gzipped Chrome trace.

    The recording is :func:`nbtoolkit.trace.torch_profiler.record_step_trace` (``warmup``
    unprofiled calls, then ``steps`` calls labelled ``ProfilerStep#0`` ...), so a rank's
    trace has the same structure as the notebook's. Returns ``trace_gz`` (the gzipped
    JSON), ``raw_bytes`` (its size unzipped) and ``last`` (the step's last value when it
    is a plain number, e.g. the loss; else None).
    """
    from nbtoolkit.trace.torch_profiler import record_step_trace, temporary_trace_file

    with temporary_trace_file("nbt-rank-trace-") as path:
        last = record_step_trace(
            step,
            path,
            steps=steps,
            warmup=warmup,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
        )
        raw = path.read_bytes()
    return {"trace_gz": gzip.compress(raw, compresslevel=3), "raw_bytes": len(raw), "last": _plain(last)}


def _plain(value: Any) -> Any:
    """Keep a step's return value only if it is a small plain number (a loss)."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def memory_timeline_on_rank(step: Callable[[], Any], **kwargs: Any) -> Any:
    """nbtoolkit.memory.capture.memory_timeline of the rank's step."""
    from nbtoolkit.memory.capture import PARTIAL_TIMELINE_NOTE, memory_timeline

    try:
        return memory_timeline(step, **kwargs)
    except BaseException as exc:
        # The partial timeline stays on the rank: the note pointing to exc.timeline would mislead.
        notes = getattr(exc, "__notes__", None)
        if notes and PARTIAL_TIMELINE_NOTE in notes:
            notes.remove(PARTIAL_TIMELINE_NOTE)
        raise


def capture_graphs_on_rank(step: Callable[[], Any], **kwargs: Any) -> Any:
    """nbtoolkit.compile.capture.capture_graphs of the rank's step."""
    from nbtoolkit.compile.capture import capture_graphs

    return capture_graphs(step, **kwargs)


def step_metrics_on_rank(step: Callable[[], Any], **kwargs: Any) -> Any:
    """nbtoolkit.metrics.measure.step_metrics of the rank's step (FLOPs, MFU, HFU)."""
    from nbtoolkit.metrics.measure import step_metrics

    return step_metrics(step, **kwargs)


def read_matching_files(pattern: str, max_bytes: int) -> dict[str, bytes]:
    """The files matching ``pattern`` on this rank, by path (``{rank}`` in it is this rank).

    ``~`` is expanded and ``**`` matches folders recursively. Refuses, naming the count and
    size, when the files add up to more than ``max_bytes``: a pattern that is too wide should
    not fill the notebook's memory.
    """
    import glob

    rank = os.environ.get("RANK", "0")
    expanded = os.path.expanduser(pattern.replace("{rank}", rank))
    paths = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
    total = sum(os.path.getsize(p) for p in paths)
    if total > max_bytes:
        raise ValueError(
            f"{len(paths)} files match {expanded!r} on rank {rank}, {total / 2**20:,.1f} MiB in all, "
            f"more than max_bytes ({max_bytes / 2**20:,.1f} MiB): narrow the pattern or raise max_bytes"
        )
    files = {}
    for path in paths:
        with open(path, "rb") as f:
            files[path] = f.read()
    return files
