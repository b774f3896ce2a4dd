"""Turn torch's structured compile events into the frames of a :class:`GraphReport`.

One parser for both sources, so that a live capture and a TORCH_TRACE log of the same
run give the same report:

- live: :func:`nbtoolkit.compile.capture.capture_graphs` attaches a logging handler to
  torch's structured trace logger (``torch.__trace``) and feeds every record's
  ``metadata`` and ``payload`` to :meth:`CompileEventParser.add`;
- logs: :func:`nbtoolkit.compile.log_reader.load_compile_log` splits each glog line of a
  TORCH_TRACE file into its JSON envelope and its tab-indented payload and feeds the same.

What is read (record kinds are the first key of the envelope, as tlparse reads them):

``dynamo_output_graph``
    one row of ``graphs`` (the FX graph's readable code is the payload).
``compilation_metrics``
    compile times, op counts, function and file of a compile id; ``fail_type`` and
    ``restart_reasons`` become rows of ``failures`` exactly as tlparse's
    "Failures and Restarts" table lists them (one row per restart reason, then one per
    failure, in log order); ``recompile_reason`` becomes a row of ``recompiles``.
``artifact`` named ``dynamo_graph_break_reason``
    one row of ``breaks``: torch's own text of the break (type, explanation, hints,
    documentation link, user location and traceback) parsed into columns.
``artifact`` named ``recompile_reasons``
    a row of ``recompiles`` (the guard that failed), merged with the metrics' reason.
``str``
    the string intern table (file names of ``dynamo_start`` stacks).

Compile ids follow tlparse (:mod:`nbtoolkit.compile.log_envelope` reads them and the
record kind), and the list of compile ids is every id seen on a record other than ``str``,
in order of first appearance, which is the key order of tlparse's ``compile_directory.json``.
The break's text is parsed by :mod:`nbtoolkit.compile.break_text`; the frames' columns
and dtypes are :data:`nbtoolkit.compile.schema.FRAME_COLUMNS`.

This module holds no I/O beyond reading source lines of user files for context, where the
parser's :class:`~nbtoolkit.compile.user_source.SourcePolicy` allows it (nothing by default: a live
capture allows its own files and cells, a log read from disk only the folders the user names),
and imports neither torch nor pandas at module level.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.compile.break_text import (
    GraphBreakText,
    parse_graph_break_text,
    source_context,
)
from nbtoolkit.compile.log_envelope import (
    CompileKey,
    as_float,
    as_int,
    out_of_range,
    record_kind,
)
from nbtoolkit.compile.schema import FRAME_COLUMNS
from nbtoolkit.compile.user_source import SourcePolicy

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CompileEventParser"]


@dataclass
class _Compile:
    """What is known about one compile (frame/compile, all attempts) of one rank."""

    rank: int | None
    key: CompileKey
    metrics: dict[str, Any] | None = None
    stack_top: tuple[str, int, str] | None = None  # (file, line, function) of the dynamo_start stack


@dataclass
class CompileEventParser:
    """Accumulates structured compile records (live or from a log) and builds the report frames.

    ``add`` takes one record's envelope (``metadata``) and its payload text; the caller
    tells the rank when the file name knows it better than the envelope does.
    ``source_policy`` says which files the breaks' source context may be read from.
    """

    source: str = ""
    source_policy: SourcePolicy = field(default_factory=SourcePolicy)
    notes: list[str] = field(default_factory=list)
    compile_ids: list[tuple[int | None, str]] = field(default_factory=list)
    _seen_ids: set[tuple[int | None, CompileKey]] = field(default_factory=set)
    _interned: dict[tuple[int | None, int], str] = field(default_factory=dict)
    _compiles: dict[tuple[int | None, tuple[int | None, int | None, int | None]], _Compile] = field(
        default_factory=dict
    )
    _graphs: list[dict[str, Any]] = field(default_factory=list)
    _breaks: list[dict[str, Any]] = field(default_factory=list)
    _recompiles: list[dict[str, Any]] = field(default_factory=list)
    _failures: list[dict[str, Any]] = field(default_factory=list)
    _metrics_rows: list[dict[str, Any]] = field(default_factory=list)
    records: int = 0

    def add(self, metadata: Mapping[str, Any], payload: str | None, *, rank: int | None = None) -> None:
        """Read one record. Unknown kinds are counted and otherwise ignored.

        A record whose fields do not have the expected shape (another torch version) is
        skipped with a note rather than failing the whole report.
        """
        try:
            self._add(metadata, payload, rank=rank)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            kind = record_kind(metadata) if isinstance(metadata, Mapping) else None
            if len(self.notes) < 50:
                self.notes.append(
                    f"skipped a record ({kind or 'unknown kind'}) that could not be read: {exc!r}"
                )

    def _add(self, metadata: Mapping[str, Any], payload: str | None, *, rank: int | None) -> None:
        too_large = out_of_range(metadata)
        if too_large and len(self.notes) < 50:
            self.notes.append(
                f"a record ({record_kind(metadata) or 'unknown kind'}) has "
                + ", ".join(f"{key} = {shown}" for key, shown in too_large.items())
                + ", which does not fit in 64 bits: read as absent"
            )
        if rank is None:
            rank = as_int(metadata.get("rank"))
        if "str" in metadata:
            entry = metadata["str"]
            if isinstance(entry, list) and len(entry) == 2:
                index = as_int(entry[1])
                if index is not None:
                    self._interned[(rank, index)] = str(entry[0])
            return
        self.records += 1
        key = CompileKey.from_envelope(metadata)
        if (rank, key) not in self._seen_ids:
            self._seen_ids.add((rank, key))
            self.compile_ids.append((rank, str(key)))
        kind = record_kind(metadata)
        if kind is None:
            return
        body = metadata.get(kind)
        compile_ = self._compile(rank, key)
        if kind == "dynamo_start":
            self._on_dynamo_start(compile_, body, rank)
        elif kind == "dynamo_output_graph":
            self._graphs.append({"rank": rank, "key": key, "code": payload or ""})
        elif kind == "compilation_metrics" and isinstance(body, Mapping):
            self._on_metrics(compile_, key, dict(body))
        elif kind == "artifact" and isinstance(body, Mapping):
            name = body.get("name")
            if name == "dynamo_graph_break_reason":
                self._on_break(rank, key, payload or "")
            elif name == "recompile_reasons":
                self._on_recompile_artifact(rank, key, payload)

    # -- record handlers ------------------------------------------------------------
    def _compile(self, rank: int | None, key: CompileKey) -> _Compile:
        k = (rank, key.frame_key)
        found = self._compiles.get(k)
        if found is None:
            found = self._compiles[k] = _Compile(rank=rank, key=key)
        return found

    def _on_dynamo_start(self, compile_: _Compile, body: Any, rank: int | None) -> None:
        stack = body.get("stack") if isinstance(body, Mapping) else None
        if isinstance(stack, list) and stack and isinstance(stack[-1], Mapping):
            top = stack[-1]
            filename = top.get("filename")
            if isinstance(filename, int):
                filename = self._interned.get((rank, filename), f"<interned {filename}>")
            compile_.stack_top = (str(filename), as_int(top.get("line")) or 0, str(top.get("name", "")))

    def _on_metrics(self, compile_: _Compile, key: CompileKey, m: dict[str, Any]) -> None:
        compile_.metrics = m
        rank = compile_.rank
        cid = str(key)
        restart_reasons = m.get("restart_reasons") or []
        if isinstance(restart_reasons, str):
            restart_reasons = [restart_reasons]
        for reason in restart_reasons:
            self._failures.append(
                {
                    "rank": rank,
                    "compile_id": cid,
                    "failure_type": "RestartAnalysis",
                    "description": str(reason),
                    "source": None,
                }
            )
        if m.get("fail_type"):
            self._failures.append(
                {
                    "rank": rank,
                    "compile_id": cid,
                    "failure_type": str(m["fail_type"]),
                    "description": "" if m.get("fail_reason") is None else str(m["fail_reason"]),
                    # tlparse's "Failure Source": file:line, N/A:0 when torch did not know it
                    "source": f"{m.get('fail_user_frame_filename') or 'N/A'}:"
                    f"{m.get('fail_user_frame_lineno') or 0}",
                }
            )
        reason = m.get("recompile_reason")
        if reason:
            self._add_recompile(rank, key, str(reason))
        self._metrics_rows.append({"rank": rank, "key": key, "metrics": m})

    def _on_break(self, rank: int | None, key: CompileKey, text: str) -> None:
        parsed = parse_graph_break_text(text)
        self._breaks.append({"rank": rank, "key": key, "parsed": parsed})

    def _on_recompile_artifact(self, rank: int | None, key: CompileKey, payload: str | None) -> None:
        if not payload:
            return
        try:
            value = json.loads(payload)
        except (ValueError, RecursionError):  # RecursionError: nested thousands deep, read as text
            value = payload
        reasons = value if isinstance(value, list) else [value]
        text = "\n".join(str(r) for r in reasons if r)
        if text:
            self._add_recompile(rank, key, text)

    def _add_recompile(self, rank: int | None, key: CompileKey, reason: str) -> None:
        for row in self._recompiles:
            if row["rank"] == rank and row["key"].frame_key == key.frame_key:
                return  # the artifact and the metrics carry the same reason: keep one row
        self._recompiles.append({"rank": rank, "key": key, "reason": reason})

    # -- frames -----------------------------------------------------------------------
    def frames(self) -> dict[str, pd.DataFrame]:
        """``graphs``, ``breaks``, ``recompiles``, ``failures``, ``compiles`` as DataFrames."""
        import pandas as pd

        graphs = []
        for i, g in enumerate(self._graphs):
            key: CompileKey = g["key"]
            c = self._compiles.get((g["rank"], key.frame_key))
            m = (c.metrics if c else None) or {}
            function, file, line = _where(c)
            graphs.append(
                {
                    "graph": i,
                    "rank": g["rank"],
                    "compile_id": str(key),
                    "frame_id": key.frame_id,
                    "frame_compile_id": key.frame_compile_id,
                    "attempt": key.attempt,
                    "function": function,
                    "file": file,
                    "line": line,
                    "op_count": as_int(m.get("graph_op_count")) if m else _count_ops(g["code"]),
                    "node_count": as_int(m.get("graph_node_count")),
                    "compile_time_s": _compile_seconds(m),
                    "backend_compile_time_s": as_float(m.get("backend_compile_time_s")),
                    "fx_code": g["code"],
                }
            )
        breaks = []
        for i, b in enumerate(self._breaks):
            key = b["key"]
            p: GraphBreakText = b["parsed"]
            user_line = as_int(p.user_line)  # a line of 10**30 is damage: read as absent
            source_line, context = source_context(p.user_file, user_line, policy=self.source_policy)
            breaks.append(
                {
                    "break": i,
                    "rank": b["rank"],
                    "compile_id": str(key),
                    "frame_id": key.frame_id,
                    "frame_compile_id": key.frame_compile_id,
                    "attempt": key.attempt,
                    "gb_type": p.gb_type,
                    "gb_id": p.gb_id,
                    "reason": p.reason,
                    "explanation": p.explanation,
                    "hints": "\n".join(p.hints),
                    "user_file": p.user_file,
                    "user_line": user_line,
                    "user_function": p.user_function,
                    "source_line": source_line if source_line is not None else p.traceback_source,
                    "source_context": context,
                    "doc_url": p.doc_url,
                    "call_file": p.call_file,
                    "call_line": as_int(p.call_line),
                    "call_function": p.call_function,
                    "call_source_line": _call_source(p, self.source_policy),
                    "inside_torch": p.inside_torch,
                }
            )
        recompiles = []
        for r in self._recompiles:
            key = r["key"]
            c = self._compiles.get((r["rank"], key.frame_key))
            function, file, line = _where(c)
            previous, guard = _split_recompile_reason(r["reason"])
            recompiles.append(
                {
                    "rank": r["rank"],
                    "compile_id": str(key),
                    "frame_id": key.frame_id,
                    "frame_compile_id": key.frame_compile_id,
                    "function": function,
                    "file": file,
                    "previous_compile_id": previous,
                    "failed_guard": guard,
                    "reason": r["reason"],
                }
            )
        compiles = []
        for row in self._metrics_rows:
            key = row["key"]
            m = row["metrics"]
            compiles.append(
                {
                    "rank": row["rank"],
                    "compile_id": str(key),
                    "frame_id": key.frame_id,
                    "frame_compile_id": key.frame_compile_id,
                    "attempt": key.attempt,
                    "function": m.get("co_name"),
                    "file": m.get("co_filename"),
                    "line": as_int(m.get("co_firstlineno")),
                    "op_count": as_int(m.get("graph_op_count")),
                    "compile_time_s": _compile_seconds(m),
                    "status": _status(m),
                    "fail_type": m.get("fail_type"),
                    "restarts": len(m.get("restart_reasons") or []),
                }
            )
        return {
            "graphs": _frame(pd, graphs, FRAME_COLUMNS["graphs"]),
            "breaks": _frame(pd, breaks, FRAME_COLUMNS["breaks"]),
            "recompiles": _frame(pd, recompiles, FRAME_COLUMNS["recompiles"]),
            "failures": _frame(pd, self._failures, FRAME_COLUMNS["failures"]),
            "compiles": _frame(pd, compiles, FRAME_COLUMNS["compiles"]),
        }


def _call_source(p: GraphBreakText, policy: SourcePolicy | None) -> str | None:
    """The source line of the user's call site: read where the policy allows, else the traceback's."""
    line = as_int(p.call_line)
    read, _ = source_context(p.call_file, line, policy=policy, around=0)
    return read if read is not None else p.call_source


def _frame(pd: Any, rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    return frame.astype(columns)


def _where(c: _Compile | None) -> tuple[str | None, str | None, int | None]:
    if c is None:
        return None, None, None
    m = c.metrics or {}
    if m.get("co_name") is not None:
        return str(m["co_name"]), _opt_str(m.get("co_filename")), as_int(m.get("co_firstlineno"))
    if c.stack_top is not None:
        file, line, function = c.stack_top
        return function, file, line
    return None, None, None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _compile_seconds(m: Mapping[str, Any]) -> float | None:
    """Whole-frame compile time (dynamo + backend), as torch's compilation_metrics report it."""
    value = as_float(m.get("entire_frame_compile_time_s"))
    if value is None:
        us = as_float(m.get("dynamo_cumulative_compile_time_us"))
        value = us / 1e6 if us is not None else None
    return value


def _status(m: Mapping[str, Any]) -> str:
    """tlparse's status colours of a compile: error, empty, break (restarted), ok."""
    if m.get("fail_type"):
        return "error"
    if (as_int(m.get("graph_op_count")) or 0) == 0:
        return "empty"
    if m.get("restart_reasons"):
        return "break"
    return "ok"


def _count_ops(code: str) -> int | None:
    """Op count of a readable FX graph when no metrics say it: assignments from a call."""
    if not code:
        return None
    return sum(1 for line in code.splitlines() if re.match(r"^\s+\w+(: .*?)? = .*\(", line))


_RECOMPILE_PREFIX = re.compile(r"^\s*(?P<cid>(?:!\d+/)?\d+/\d+):\s*(?P<guard>.*)$", re.S)


def _split_recompile_reason(reason: str) -> tuple[str | None, str]:
    """``"0/0: tensor 'x' size mismatch ..."`` -> (``"0/0"``, ``"tensor 'x' size mismatch ..."``)."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    m = _RECOMPILE_PREFIX.match(first)
    cid, guard = (m.group("cid"), m.group("guard").strip()) if m else (None, first)
    # torch appends the guarded source line as a comment ("x == 1.5  # y = t.item()  # f.py:3 in fn")
    return cid, re.split(r"\s{2,}#\s", guard, maxsplit=1)[0].strip()
