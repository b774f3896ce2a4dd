"""The event arguments that the critical path and the roofline need and the Trace does not keep.

``load_trace`` keeps only the columns every analysis uses (see :mod:`nbtoolkit.trace.trace`);
two analyses need a few more arguments, which this module reads on demand from the rank's
trace file (``trace.info[rank].source``) in one extra pass:

- ``syncs``: one row per ``cuda_sync`` event that waits on a CUDA event (``Stream Wait Event``,
  ``Event Sync``): ``correlation`` (of the runtime call), ``wait_record_correlation`` (the
  correlation of the ``cudaEventRecord`` call it waits on) and ``wait_stream``;
- ``shapes``: one row per host operator recorded with ``record_shapes=True``: ``ts``, ``name``,
  ``external_id``, ``input_dims`` (list of shapes, one per input), ``input_types`` and
  ``concrete`` (the scalar arguments' values as text, where torch recorded them).

Read through the model method ``Trace.event_args(rank)``, so the analyses get them from the
Trace they are given and read no file themselves. ``nbt.profile`` reads them before it removes
its temporary file (:func:`attach_event_args`); a trace with no file behind it otherwise gives
empty frames.
"""

from __future__ import annotations

import math
import weakref
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from nbtoolkit.core.bounded import json_depth
from nbtoolkit.trace._kineto_json import read_bytes

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["EventArgs", "attach_event_args", "event_args"]


class Trace(Protocol):
    """What this module reads of a :class:`nbtoolkit.trace.trace.Trace`: each rank's source file.

    Named here rather than imported: ``Trace.event_args`` imports this module, and importing the
    Trace back (even for annotations) would close an import cycle.
    """

    info: Any  # rank -> RankInfo (its .source: the trace file)

    @property
    def ranks(self) -> list[int]: ...

# Traces whose files are gone (nbt.profile's temporary file): their extras, read while it existed.
_ATTACHED: weakref.WeakKeyDictionary[Trace, dict[int, EventArgs]] = weakref.WeakKeyDictionary()


class _Args(msgspec.Struct, frozen=True, gc=False):
    external_id: int = msgspec.field(default=-1, name="External id")
    correlation: int = -1
    wait_record_correlation: int = msgspec.field(default=-1, name="wait_on_cuda_event_record_corr_id")
    wait_stream: int = msgspec.field(default=-1, name="wait_on_stream")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_types: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = math.nan
    args: _Args = _NO_ARGS


class _Document(msgspec.Struct):
    traceEvents: list[_Event] | None = None


_DECODER = msgspec.json.Decoder(_Document | list[_Event])


class EventArgs:
    """The ``syncs`` and ``shapes`` frames of one rank (see the module docstring)."""

    def __init__(self, syncs: pd.DataFrame, shapes: pd.DataFrame) -> None:
        self.syncs = syncs
        self.shapes = shapes


def event_args(trace: Trace, rank: int) -> EventArgs:
    """The extra arguments of one rank, read from its trace file (empty when there is none)."""
    attached = _ATTACHED.get(trace)
    if attached is not None and rank in attached:
        return attached[rank]
    source = trace.info[rank].source if rank in trace.info else ""
    path = Path(source) if source else None
    if path is None or not path.is_file():
        return _frames([])
    return _read(str(path), path.stat().st_mtime_ns)


def attach_event_args(trace: Trace) -> None:
    """Read the extras of every rank now and keep them with ``trace`` (its files are about to go)."""
    _ATTACHED[trace] = {rank: event_args(trace, rank) for rank in trace.ranks}


@lru_cache(maxsize=8)  # a notebook asks for the same rank's file again and again
def _read(path: str, _mtime_ns: int) -> EventArgs:
    try:
        with json_depth():
            doc = _DECODER.decode(read_bytes(Path(path)))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return _frames([])  # load_trace already read this file; an odd event only loses extras
    events = doc if isinstance(doc, list) else (doc.traceEvents or [])
    return _frames([e for e in events if e.ph == "X" and (e.args.wait_record_correlation >= 0
                                                        or e.args.input_dims is not None)])


def _frames(events: list[_Event]) -> EventArgs:
    import pandas as pd

    syncs = [e for e in events if e.args.wait_record_correlation >= 0]
    shapes = [e for e in events if e.args.input_dims is not None]
    return EventArgs(
        syncs=pd.DataFrame(
            {
                "correlation": pd.Series([e.args.correlation for e in syncs], dtype="int64"),
                "wait_record_correlation": pd.Series(
                    [e.args.wait_record_correlation for e in syncs], dtype="int64"
                ),
                "wait_stream": pd.Series([e.args.wait_stream for e in syncs], dtype="int64"),
            }
        ),
        shapes=pd.DataFrame(
            {
                "ts": pd.Series([e.ts for e in shapes], dtype="float64"),
                "name": pd.Series([e.name for e in shapes], dtype="object"),
                "external_id": pd.Series([e.args.external_id for e in shapes], dtype="int64"),
                "input_dims": pd.Series([e.args.input_dims for e in shapes], dtype="object"),
                "input_types": pd.Series([e.args.input_types or [] for e in shapes], dtype="object"),
                "concrete": pd.Series([e.args.concrete or [] for e in shapes], dtype="object"),
            }
        ),
    )
