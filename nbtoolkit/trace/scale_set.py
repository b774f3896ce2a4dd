"""A scale test set: N rank traces written from a few real ones, with a straggler injected.

Real multi-rank traces of hundreds of ranks are not public; the ranks of one job are alike,
so a set of N ranks is made from the ranks of a real (or session-recorded) job:

- output rank ``r`` is a copy of base file ``r % len(base)`` (base files sorted by name),
  written as ``rank{r:05d}.json`` with ``distributedInfo.rank = r`` and ``world_size = N``
  (``pg_config`` is dropped: its member lists belong to the base job's world);
- **the straggler** (``straggler`` rank, default ``N // 2 + 1`` clipped to the world): its
  timeline is stretched by ``slowdown`` around its first event (every ``ts`` offset and every
  ``dur`` multiplied), so its work per step is ``slowdown`` times its base rank's; overlap
  percentages are unchanged by a uniform stretch;
- **the waiting**: every other rank waits for it in the last collective of each step: the
  communication event that ends last in the step (an ``nccl*Kernel`` on a GPU, a ``gloo:*``
  host event on a CPU) and the step's ProfilerStep are longer by the straggler's extra time
  per step (``slowdown - 1`` times its base rank's mean ProfilerStep, or span without steps),
  and later steps start that much later;
- ``corrupt`` ranks are written truncated (the first half of their JSON), ``missing`` ranks
  are not written at all, for the bad-input paths.

Deterministic: same base, same arguments, same bytes. ``<folder>.scale-set.json`` beside the
folder records what was injected (:meth:`ScaleSet.read`).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from nbtoolkit.core.bounded import read_all
from nbtoolkit.core.errors import NbtUsageError, TraceError

__all__ = ["MANIFEST_SUFFIX", "ScaleSet", "manifest_path", "write_scale_set"]

MANIFEST_SUFFIX = ".scale-set.json"
_COMM_KERNEL = re.compile(r"^nccl.*Kernel")


@dataclass
class ScaleSet:
    """What :func:`write_scale_set` wrote: where, how many ranks, and what it injected."""

    folder: str
    ranks: int
    straggler: int
    slowdown: float
    base_files: list[str]
    corrupt: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    bytes_written: int = 0

    @property
    def path(self) -> Path:
        return Path(self.folder)

    @classmethod
    def read(cls, folder: str | Path) -> ScaleSet:
        """The manifest of a folder written by :func:`write_scale_set`."""
        return cls(**json.loads(manifest_path(folder).read_text()))


def write_scale_set(
    base: str | Path | Iterable[str | Path],
    folder: str | Path,
    *,
    ranks: int,
    straggler: int | None = None,
    slowdown: float = 1.5,
    corrupt: Iterable[int] = (),
    missing: Iterable[int] = (),
) -> ScaleSet:
    """Write ``ranks`` rank traces into ``folder`` from the base traces (see the module docstring).

    Args:
        base: a folder of per-rank ``.json``/``.json.gz`` traces, or a list of such files.
        folder: where to write (created; existing ``rank*.json`` files are replaced).
        ranks: the world size N of the set.
        straggler: the rank made slow; default ``N // 2 + 1`` (``N - 1`` for N <= 2).
        slowdown: how much longer the straggler works (1.5: 50 % longer); > 1.
        corrupt, missing: ranks written truncated / not written.
    """
    if ranks < 1:
        raise NbtUsageError(f"ranks must be at least 1, got {ranks}")
    if not slowdown > 1.0:
        raise NbtUsageError(f"slowdown must be above 1 (1.5 = 50 % slower), got {slowdown}")
    straggler = (ranks // 2 + 1 if ranks > 2 else ranks - 1) if straggler is None else straggler
    if not 0 <= straggler < ranks:
        raise NbtUsageError(f"straggler must be a rank below {ranks}, got {straggler}")
    files = _base_files(base)
    docs = [_read_doc(f) for f in files]
    spans = [_span(doc["traceEvents"]) for doc in docs]
    base_of_straggler = docs[straggler % len(docs)]["traceEvents"]
    extra = (slowdown - 1.0) * _work_per_step(base_of_straggler, spans[straggler % len(docs)][1])
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    corrupt_set, missing_set = set(corrupt), set(missing)
    encoder = msgspec.json.Encoder()
    written = 0
    for rank in range(ranks):
        if rank in missing_set:
            continue
        doc = docs[rank % len(docs)]
        if rank == straggler:
            events = _stretched(doc["traceEvents"], spans[rank % len(docs)][0], slowdown)
        else:
            events = _waiting(doc["traceEvents"], extra)
        dist = {k: v for k, v in (doc.get("distributedInfo") or {}).items() if k != "pg_config"}
        dist.update(rank=rank, world_size=ranks)
        # Kineto's layout: the document's fields first, written as json.dumps does ("rank": 5, with
        # the space HTA's rank search needs), the events last (msgspec: the bulk, fast).
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        head["distributedInfo"] = dist
        data = (
            json.dumps(head)[:-1].encode()
            + (b', "traceEvents": ' if head else b'{"traceEvents": ')
            + encoder.encode(events)
            + b"}"
        )
        if rank in corrupt_set:
            data = data[: len(data) // 2]
        (out / f"rank{rank:05d}.json").write_bytes(data)
        written += len(data)
    made = ScaleSet(
        folder=str(out),
        ranks=ranks,
        straggler=straggler,
        slowdown=slowdown,
        base_files=[str(f) for f in files],
        corrupt=sorted(corrupt_set),
        missing=sorted(missing_set),
        bytes_written=written,
    )
    manifest_path(out).write_text(json.dumps(asdict(made), indent=1))
    return made


def manifest_path(folder: str | Path) -> Path:
    """``<folder>.scale-set.json``: beside the folder, not in it (HTA reads every JSON file there)."""
    folder = Path(folder).expanduser()
    return folder.with_name(folder.name + MANIFEST_SUFFIX)


def _base_files(base: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(base, str | Path):
        root = Path(base).expanduser()
        files = (
            sorted(p for p in root.iterdir() if p.name.endswith((".json", ".json.gz")))
            if root.is_dir()
            else [root]
        )
    else:
        files = [Path(p).expanduser() for p in base]
    if not files:
        raise NbtUsageError(f"{base}: no .json/.json.gz base traces to build the scale set from")
    return files


def _read_doc(file: Path) -> dict[str, Any]:
    doc = msgspec.json.decode(read_all(file, TraceError, "trace file"))
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{file}: not a Kineto trace (no traceEvents list); use a profiler trace as base")
    return doc


def _is_complete(ev: Any) -> bool:
    return isinstance(ev, dict) and ev.get("ph") == "X" and "ts" in ev and "dur" in ev


def _span(events: list[Any]) -> tuple[float, float]:
    """First start and length (µs) of the complete events."""
    starts = [float(e["ts"]) for e in events if _is_complete(e)]
    ends = [float(e["ts"]) + float(e["dur"]) for e in events if _is_complete(e)]
    if not starts:
        raise TraceError("a base trace has no complete events; record some steps first")
    return min(starts), max(ends) - min(starts)


def _stretched(events: list[Any], origin: float, factor: float) -> list[Any]:
    out = []
    for ev in events:
        if isinstance(ev, dict) and isinstance(ev.get("ts"), int | float):
            new = dict(ev)
            new["ts"] = origin + (float(ev["ts"]) - origin) * factor
            if isinstance(ev.get("dur"), int | float):
                new["dur"] = float(ev["dur"]) * factor
            out.append(new)
        else:
            out.append(ev)
    return out


def _has_ts(ev: Any) -> bool:
    return isinstance(ev, dict) and isinstance(ev.get("ts"), int | float)


def _is_comm(ev: dict[str, Any]) -> bool:
    name = str(ev.get("name", ""))
    return bool(_COMM_KERNEL.match(name)) or name.startswith("gloo:")


def _is_host_step(ev: Any) -> bool:
    return (
        _is_complete(ev)
        and str(ev.get("name", "")).startswith("ProfilerStep")
        and "stream" not in (ev.get("args") or {})
    )


def _work_per_step(events: list[Any], span: float) -> float:
    """Mean ProfilerStep duration (µs), or the span when there are none."""
    steps = [float(e["dur"]) for e in events if _is_host_step(e)]
    return sum(steps) / len(steps) if steps else span


def _waiting(events: list[Any], extra_per_step: float) -> list[Any]:
    """The events of a rank that waits ``extra_per_step`` for the straggler in every step.

    Windows run from one ProfilerStep's start to the next one's (device clocks run behind the
    host's, so a step's kernels often start after its annotation ended); a trace without
    ProfilerSteps is one window. In window ``k`` the communication event that ends last is
    longer by the wait, the ProfilerStep annotation too, and everything in later windows
    starts ``k`` waits later, as in a synchronous job.
    """
    if extra_per_step <= 0:
        return events
    steps = sorted((float(e["ts"]), i) for i, e in enumerate(events) if _is_host_step(e))
    starts = [ts for ts, _ in steps]

    def window(ev: dict[str, Any]) -> int:
        return bisect.bisect_right(starts, float(ev["ts"])) - 1 if starts else 0

    last_in_window: dict[int, int] = {}
    for i, ev in enumerate(events):
        if _is_complete(ev) and _is_comm(ev):
            w, end = window(ev), float(ev["ts"]) + float(ev["dur"])
            old = last_in_window.get(w)
            if old is None or end > float(events[old]["ts"]) + float(events[old]["dur"]):
                last_in_window[w] = i
    longer = set(last_in_window.values()) | {i for _, i in steps}
    out = []
    for i, ev in enumerate(events):
        shift = max(0, window(ev)) * extra_per_step if _has_ts(ev) else 0.0
        if shift or (i in longer and _has_ts(ev)):
            new = {**ev, "ts": float(ev["ts"]) + shift}
            if i in longer and isinstance(ev.get("dur"), int | float):
                new["dur"] = float(ev["dur"]) + extra_per_step
            out.append(new)
        else:
            out.append(ev)
    return out
