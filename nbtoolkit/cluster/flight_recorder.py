"""Read PyTorch Flight Recorder dumps (one file per rank) into a :class:`~nbtoolkit.cluster.hang.HangReport`.

    report = nbt.load_flight_recorder("dumps/")   # files like nccl_trace_rank_0 ... _3
    print(report)                                  # per rank: where it waits; then the verdicts
    report.frame()

A dump is what ``torch._C._distributed_c10d._dump_fr_trace()`` returns (a pickle; torch
writes it to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` when NCCL's watchdog fires) or its JSON form
(``_dump_fr_trace_json()``). The rank is the number at the end of the file name, as torch's
``fr_trace`` reads it. Pickles are read with an unpickler that loads no class or function
(builtin containers and scalars only), so a hostile file cannot run code.

From each entry we take: the process group, ``collective_seq_id``, the op (``profiling_name``
without its ``nccl:``/``gloo:`` prefix), ``input_sizes``/``input_dtypes`` and the first
frame of the stack outside torch and Python's own library (the user's line). An entry counts
as completed when its state says so, when it is ``retired`` (the recorder retires an entry
when its work finished), or when the group's ``pg_status`` has ``last_completed_collective``
at or past it. Gloo entries stay "scheduled" whatever happens, and that counter lags (measured:
2 while entry 3 was retired), so ``retired`` is what tells for gloo. Point-to-point entries
(``is_p2p``) are left out.

torch 2.13 quirk handled here: a gloo dump lists the default group in ``pg_config`` under the
name ``""`` while its entries call it ``"0"`` (ProcessGroupGloo registers with the recorder
before ``init_process_group`` sets the name); the lone unnamed group is read as the name the
entries use. torch's own ``fr_trace`` fails on such a file with ``KeyError: ('0', 1)``.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

from nbtoolkit.cluster.hang import HangReport
from nbtoolkit.cluster.hang_records import CollectiveCall, RankHang
from nbtoolkit.core.errors import SnapshotError, TraceError
from nbtoolkit.core.paths import user_path
from nbtoolkit.memory.snapshot_reader import restricted_loads

__all__ = ["load_flight_recorder", "parse_dump", "rank_from_dump", "read_dump", "repair_pg_config"]

_RANK_AT_END = re.compile(r"(\d+)(?:\.json)?$")
_MAX_DUMP_BYTES = 512 * 1024 * 1024


def read_dump(path: str | Path) -> dict[str, Any]:
    """One rank's dump as plain data (pickle or JSON), with a clear error when it is not one."""
    path = Path(path)
    size = path.stat().st_size
    if size > _MAX_DUMP_BYTES:
        raise TraceError(f"{path} is {size} bytes: too large for a Flight Recorder dump; pass the dump files")
    return parse_dump(path.read_bytes(), name=str(path))


def parse_dump(data: bytes, *, name: str = "<bytes>") -> dict[str, Any]:
    """A dump's bytes (what ``_dump_fr_trace()`` returns, or its JSON form) as plain data."""
    try:
        dump = json.loads(data) if data[:1] == b"{" else restricted_loads(data, name=name)
    except (SnapshotError, ValueError) as exc:
        raise TraceError(
            f"{name} is not a readable Flight Recorder dump ({exc}); dump it with "
            "torch._C._distributed_c10d._dump_fr_trace() (pickle) or _dump_fr_trace_json()"
        ) from None
    if not isinstance(dump, dict) or "entries" not in dump:
        raise TraceError(f"{name} is not a Flight Recorder dump: no 'entries' in it")
    return dump


def repair_pg_config(dump: dict[str, Any]) -> dict[str, Any]:
    """``pg_config`` with gloo's unnamed default group under the name its entries use (see module doc)."""
    config = dict(dump.get("pg_config") or {})
    used = {str(e["process_group"][0]) for e in dump.get("entries", []) if e.get("process_group")}
    missing = sorted(used - set(config))
    if "" in config and len(missing) == 1:
        config[missing[0]] = config.pop("")
    return config


def _group_label(name: str, desc: str | None) -> str:
    return desc if desc and desc != "undefined" else name


_OWN_PACKAGE = str(Path(__file__).resolve().parent.parent).replace("\\", "/") + "/"


def _user_frame(frames: list[dict[str, Any]]) -> tuple[str | None, int | None]:
    for frame in frames or []:
        file = str(frame.get("filename", ""))
        normal = file.replace("\\", "/")
        library = "/torch/" in normal or "site-packages" in normal or "/lib/python" in normal
        library = library or normal.startswith(_OWN_PACKAGE)  # nbtoolkit's own wrappers on a rank
        if library or (file.startswith("<") and file != "<remote-cell>"):
            continue
        return file, int(frame.get("line", 0)) or None
    return None, None


def rank_from_dump(dump: dict[str, Any], rank: int) -> RankHang:
    """One rank's collectives in a dump (see the module docstring for what is taken)."""
    status = dump.get("pg_status") or {}
    calls: list[CollectiveCall] = []
    last_seq: dict[str, int] = {}
    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):
            continue
        name, desc = [*(entry.get("process_group") or ("?", "")), ""][:2]
        seq = int(entry.get("collective_seq_id", 0))
        done_upto = (status.get(str(entry.get("pg_id"))) or {}).get("last_completed_collective", -1)
        file, line = _user_frame(entry.get("frames", []))
        group = _group_label(str(name), desc)
        if seq <= last_seq.get(group, 0):
            # Numbers start again: the group was destroyed and formed anew under the same name
            # (the recorder outlives groups). Only its newest life is matched.
            calls = [c for c in calls if c.group != group]
        last_seq[group] = seq
        calls.append(
            CollectiveCall(
                rank=rank,
                group=group,
                seq=seq,
                op=str(entry.get("profiling_name", "?")).split(":")[-1],
                sizes=tuple(tuple(int(d) for d in s) for s in entry.get("input_sizes") or ()),
                dtypes=tuple(str(d) for d in entry.get("input_dtypes") or ()),
                completed=entry.get("state") == "completed"
                or bool(entry.get("retired"))
                or seq <= int(done_upto),
                file=file,
                line=line,
            )
        )
    pending = any(not c.completed for c in calls)
    return RankHang(rank, "in collective" if pending else "no collective pending", calls)


def _members(dump: dict[str, Any]) -> dict[str, list[int]]:
    entries = [e for e in dump["entries"] if e.get("process_group")]
    names = {str(e["process_group"][0]): e["process_group"][1] for e in entries}
    out = {}
    for name, config in repair_pg_config(dump).items():
        ranks = config.get("ranks", [])
        ranks = ast.literal_eval(ranks) if isinstance(ranks, str) else ranks
        out[_group_label(name, names.get(name) or config.get("desc"))] = [int(r) for r in ranks]
    return out


def load_flight_recorder(folder: str | Path) -> HangReport:
    """The hang diagnosis of the Flight Recorder dumps in ``folder`` (one file per rank).

    Every file whose name ends in a rank number is read (``rank0``, ``nccl_trace_rank_3``,
    ``fr_2.json``). The verdicts match torch's ``fr_trace`` analyzer: a collective that not
    all ranks joined (the skipped collective, with the missing ranks), a size mismatch, ops
    that differ at one sequence number. See :mod:`nbtoolkit.cluster.hang_verdicts` for the rules.
    """
    root = user_path(folder, error=TraceError)
    if not root.is_dir():
        raise TraceError(f"no folder at {root}: pass the folder holding one Flight Recorder dump per rank")
    dumps: dict[int, dict[str, Any]] = {}
    for path in sorted(root.iterdir()):
        match = _RANK_AT_END.search(path.name)
        if not path.is_file() or match is None or path.name.startswith("."):
            continue
        rank = int(match.group(1))
        if rank in dumps:
            raise TraceError(f"two dumps for rank {rank} in {root}: keep one file per rank")
        dumps[rank] = read_dump(path)
    if not dumps:
        raise TraceError(
            f"no Flight Recorder dumps in {root}: expected one file per rank whose name ends in the rank "
            f"(found {', '.join(sorted(os.listdir(root))[:5]) or 'nothing'})"
        )
    rank_hangs = [rank_from_dump(dumps[r], r) for r in sorted(dumps)]
    # A group's members: what any rank's pg_config lists, and every rank that called into it
    # (a re-formed group can be listed with a stale or partial rank list).
    members: dict[str, set[int]] = {}
    for dump in dumps.values():
        for group, ranks in _members(dump).items():
            members.setdefault(group, set()).update(ranks)
    for hang in rank_hangs:
        for call in hang.calls:
            members.setdefault(call.group, set()).add(hang.rank)
    return HangReport(
        rank_hangs,
        source=f"Flight Recorder dumps in {root.name}",
        members={group: sorted(ranks) for group, ranks in members.items()},
    )
