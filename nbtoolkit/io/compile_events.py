"""Turn torch's structured compile events into the frames of a :class:`GraphReport`.

One parser for both sources, so that a live capture and a TORCH_TRACE log of the same
run give the same report:

- live: :func:`nbtoolkit.capture.graphs.capture_graphs` attaches a logging handler to
  torch's structured trace logger (``torch.__trace``) and feeds every record's
  ``metadata`` and ``payload`` to :meth:`CompileEventParser.add`;
- logs: :func:`nbtoolkit.io.compile_log.load_compile_log` splits each glog line of a
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

Compile ids follow tlparse: ``[!a/]x/y[_z]`` (compiled-autograd id, frame id, frame
compile id, attempt; attempt 0 and a missing attempt are both elided), and the list of
compile ids is every id seen on a record other than ``str``, in order of first
appearance, which is the key order of tlparse's ``compile_directory.json``.

This module holds no I/O beyond reading source lines of user files for context (through
``linecache``, which also knows notebook cells) and imports neither torch nor pandas at
module level.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import linecache
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "GRAPH_BREAK_SITE",
    "CompileEventParser",
    "CompileKey",
    "format_compile_id",
    "parse_graph_break_text",
]

# torch 2.13 prints this link under every registered graph break
# (torch/_dynamo/exc.py: get_gbid_documentation_link): .../gb/gb0124.html
GRAPH_BREAK_SITE = "https://meta-pytorch.github.io/compile-graph-break-site/gb/"

# Envelope keys that are context, not the record kind (torch/_logging/_internal.py reserves them).
_ENVELOPE_KEYS = frozenset(
    {
        "rank",
        "compiled_autograd_id",
        "frame_id",
        "frame_compile_id",
        "attempt",
        "severity",
        "timestamp",
        "pathname",
        "thread",
        "subgraph_name",
        "has_payload",
        "stack",
    }
)

CONTEXT_LINES = 3  # lines of source shown above and below a graph break's user line


@dataclass(frozen=True, order=True)
class CompileKey:
    """A compile id as tlparse keys it (attempt normalized to 0 when the frame compile id is known)."""

    compiled_autograd_id: int | None
    frame_id: int | None
    frame_compile_id: int | None
    attempt: int | None

    @classmethod
    def from_envelope(cls, env: Mapping[str, Any]) -> CompileKey:
        fcid = _as_int(env.get("frame_compile_id"))
        attempt = _as_int(env.get("attempt"))
        if fcid is not None and attempt is None:
            attempt = 0  # tlparse: "Some runtime compile ids don't have attempts"
        return cls(_as_int(env.get("compiled_autograd_id")), _as_int(env.get("frame_id")), fcid, attempt)

    @property
    def frame_key(self) -> tuple[int | None, int | None, int | None]:
        """The compile without its attempt: what a recompile or a runtime region refers to."""
        return (self.compiled_autograd_id, self.frame_id, self.frame_compile_id)

    def __str__(self) -> str:
        return format_compile_id(
            self.compiled_autograd_id, self.frame_id, self.frame_compile_id, self.attempt
        )


def format_compile_id(
    compiled_autograd_id: int | None, frame_id: int | None, frame_compile_id: int | None, attempt: int | None
) -> str:
    """tlparse's display of a compile id without the brackets: ``0/0``, ``0/0_1``, ``!0/1/0``, ``-/-``."""
    text = f"!{compiled_autograd_id}/" if compiled_autograd_id is not None else ""
    text += f"{'-' if frame_id is None else frame_id}/{'-' if frame_compile_id is None else frame_compile_id}"
    if attempt:
        text += f"_{attempt}"
    return text


def _as_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _as_float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def record_kind(envelope: Mapping[str, Any]) -> str | None:
    """The record kind: the first key of the envelope that is not context."""
    for key in envelope:
        if key not in _ENVELOPE_KEYS:
            return str(key)
    return None


# ---------------------------------------------------------------------------------------
# graph-break text (torch/_dynamo/symbolic_convert.py: log_graph_break and
# torch/_dynamo/exc.py: format_graph_break_message)

_USER_AT = re.compile(r"^Graph break in user code at (?P<file>.*):(?P<line>\d+)\s*$", re.M)
_REASON_AT = re.compile(r"^Graph Break Reason: ?(?P<rest>.*)$", re.M)
_LINK = re.compile(r"https://\S+/gb/gb(?P<id>\d+)\.html")
_TB_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


@dataclass
class GraphBreakText:
    """The parts of torch's graph-break message."""

    gb_type: str
    reason: str
    explanation: str
    hints: list[str]
    context: str
    doc_url: str | None
    gb_id: str | None
    user_file: str | None
    user_line: int | None
    user_function: str | None
    traceback_source: str | None


def parse_graph_break_text(text: str) -> GraphBreakText:
    """Split the payload of a ``dynamo_graph_break_reason`` artifact into its parts.

    The message reads (torch 2.13)::

        Graph break in user code at FILE:LINE
        Graph Break Reason: [Encountered graph break when attempting to trace ...:\\n\\n]GB_TYPE
          Explanation: ...
          Hint: ...            (zero or more)

          Developer debug context: ...

         For more details about this graph break, please visit: https://.../gb/gbNNNN.html

        User code traceback:
          File "...", line N, in fn
            source line
        <python traceback of dynamo's internals>

    The graph-break type is the line just above ``Explanation:``; messages of other
    torch versions without that structure keep the whole reason as their type.
    """
    user_file = user_line = None
    m = _USER_AT.search(text)
    if m:
        user_file, user_line = m.group("file"), int(m.group("line"))
    body = text
    m = _REASON_AT.search(text)
    if m:
        body = text[m.start("rest") :]
    tb_text = ""
    for marker in _TRACEBACK_MARKERS:
        cut = body.find(marker)
        if cut >= 0:
            body, tb_text = body[:cut], body[cut + len(marker) :]
            break
    reason = body.strip()
    lines = body.splitlines()
    gb_type, explanation_lines, hints, context_lines = _sections(lines)
    if not explanation_lines:
        # "skip" breaks (torch/_dynamo/convert_frame.py) put torch's message only in the exception
        # text after the traceback: "torch._dynamo.exc.Unsupported: GB_TYPE\n  Explanation: ..."
        exc = list(_EXCEPTION_LINE.finditer(text))
        if exc:
            tail = [exc[-1].group("first"), *text[exc[-1].end() :].splitlines()]
            found = _sections(tail)
            if found[1]:
                gb_type, explanation_lines, hints, context_lines = found
    if not gb_type:
        gb_type = next((x.strip() for x in lines if x.strip()), "")
    link = _LINK.search(text)
    doc_url = link.group(0) if link else None
    gb_id = f"GB{link.group('id')}" if link else None
    if gb_id is None and gb_type:
        # messages without the link (older torch): the registry of the installed torch knows the id
        gb_id = _registry_ids().get(gb_type)
        if gb_id is not None:
            doc_url = f"{GRAPH_BREAK_SITE}gb{gb_id[2:]}.html"  # torch's own link format
    frames = _traceback_frames(_user_traceback(tb_text.splitlines()))
    user_function = traceback_source = None
    if user_file is None or _is_torch_internal(user_file):
        # no location line, or torch names its own polyfill (a break inside code it inlines for
        # the user, e.g. a class constructor): the user's line is the deepest frame outside torch
        outside = [f for f in frames if not _is_torch_internal(f[0])]
        if outside:
            user_file, user_line, user_function, traceback_source = outside[-1]
    else:
        for file, line, function, source in frames:
            if file == user_file and line == user_line:
                user_function, traceback_source = function, source
    explanation = "\n".join(explanation_lines).strip()
    return GraphBreakText(
        gb_type=gb_type,
        reason=reason,
        explanation=explanation,
        hints=hints,
        context=" ".join(context_lines),
        doc_url=doc_url,
        gb_id=gb_id,
        user_file=user_file,
        user_line=user_line,
        user_function=user_function,
        traceback_source=traceback_source,
    )


_TRACEBACK_MARKERS = ("\nUser code traceback:", "\nThe graph break occurred in the following user code:")
_EXCEPTION_LINE = re.compile(r"(?m)^torch\._dynamo\.exc\.\w+: (?P<first>.*)$")


def _sections(lines: list[str]) -> tuple[str, list[str], list[str], list[str]]:
    """(gb_type, explanation lines, hints, developer context) of torch's graph-break message."""
    gb_type = ""
    explanation_lines: list[str] = []
    hints: list[str] = []
    context_lines: list[str] = []
    section: str | None = None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("Explanation:"):
            if not gb_type:
                previous = [x.strip() for x in lines[:i] if x.strip()]
                gb_type = previous[-1] if previous else ""
            section = "explanation"
            explanation_lines.append(stripped[len("Explanation:") :].strip())
        elif stripped.startswith("Hint:"):
            section = "hint"
            hints.append(stripped[len("Hint:") :].strip())
        elif stripped.startswith("Developer debug context:"):
            section = "context"
            context_lines.append(stripped[len("Developer debug context:") :].strip())
        elif stripped.startswith("For more details about this graph break"):
            section = None
        elif section == "explanation":
            explanation_lines.append(line.rstrip())
        elif section == "hint" and stripped:
            hints[-1] += " " + stripped
        elif section == "context" and stripped:
            context_lines.append(stripped)
    return gb_type, explanation_lines, hints, context_lines


def _traceback_frames(tb_lines: list[str]) -> list[tuple[str, int, str, str | None]]:
    """(file, line, function, source line) of each frame of a formatted traceback, outermost first."""
    frames = []
    for i, line in enumerate(tb_lines):
        fm = _TB_FRAME.match(line)
        if fm is None:
            continue
        nxt = tb_lines[i + 1] if i + 1 < len(tb_lines) else ""
        source = nxt.strip() if nxt.startswith("    ") and not _TB_FRAME.match(nxt) else None
        frames.append((fm.group("file"), int(fm.group("line")), fm.group("func").strip(), source))
    return frames


_TORCH_INTERNAL = re.compile(
    r"(^|[/\\])torch[/\\](_[a-z_]+|fx|nn|utils|testing|compiler)[/\\]"
    r"|(^|[/\\])torch[/\\](_[a-z_]+|functional)\.py$"
)


def _is_torch_internal(path: str) -> bool:
    """A file of the torch package itself (dynamo, polyfills, nn ...), not user code."""
    return bool(_TORCH_INTERNAL.search(path))


def _user_traceback(tb_lines: list[str]) -> list[str]:
    """The "User code traceback" part, without dynamo's own Python traceback after it."""
    for i, line in enumerate(tb_lines):
        if line.startswith("Traceback (most recent call last)"):
            return tb_lines[:i]
    return tb_lines


@functools.lru_cache(maxsize=1)
def _registry_ids() -> dict[str, str]:
    """gb_type -> ``GBnnnn`` from the installed torch's graph-break registry, read without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            return {}
        registry = json.loads((Path(locations[0]) / "_dynamo" / "graph_break_registry.json").read_text())
    except (OSError, ValueError, ImportError):
        return {}
    return {
        entry["Gb_type"]: gb for gb, entries in registry.items() for entry in entries if "Gb_type" in entry
    }


def source_context(
    file: str | None, line: int | None, *, around: int = CONTEXT_LINES
) -> tuple[str | None, str]:
    """The source line and a few numbered lines around it, when the file (or notebook cell) is known."""
    if not file or not line:
        return None, ""
    lines = linecache.getlines(file)
    if not lines or line > len(lines):
        return None, ""
    first = max(1, line - around)
    last = min(len(lines), line + around)
    width = len(str(last))
    shown = []
    for n in range(first, last + 1):
        marker = ">" if n == line else " "
        shown.append(f"{marker} {n:>{width}} | {lines[n - 1].rstrip()}")
    return lines[line - 1].strip(), "\n".join(shown)


# ---------------------------------------------------------------------------------------


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
    """

    source: str = ""
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
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            kind = record_kind(metadata) if isinstance(metadata, Mapping) else None
            if len(self.notes) < 50:
                self.notes.append(
                    f"skipped a record ({kind or 'unknown kind'}) that could not be read: {exc!r}"
                )

    def _add(self, metadata: Mapping[str, Any], payload: str | None, *, rank: int | None) -> None:
        if rank is None:
            rank = _as_int(metadata.get("rank"))
        if "str" in metadata:
            entry = metadata["str"]
            if isinstance(entry, list) and len(entry) == 2:
                index = _as_int(entry[1])
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
            compile_.stack_top = (str(filename), _as_int(top.get("line")) or 0, str(top.get("name", "")))

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
        except ValueError:
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
                    "op_count": _as_int(m.get("graph_op_count")) if m else _count_ops(g["code"]),
                    "node_count": _as_int(m.get("graph_node_count")),
                    "compile_time_s": _compile_seconds(m),
                    "backend_compile_time_s": _as_float(m.get("backend_compile_time_s")),
                    "fx_code": g["code"],
                }
            )
        breaks = []
        for i, b in enumerate(self._breaks):
            key = b["key"]
            p: GraphBreakText = b["parsed"]
            source_line, context = source_context(p.user_file, p.user_line)
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
                    "user_line": p.user_line,
                    "user_function": p.user_function,
                    "source_line": source_line if source_line is not None else p.traceback_source,
                    "source_context": context,
                    "doc_url": p.doc_url,
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
                    "line": _as_int(m.get("co_firstlineno")),
                    "op_count": _as_int(m.get("graph_op_count")),
                    "compile_time_s": _compile_seconds(m),
                    "status": _status(m),
                    "fail_type": m.get("fail_type"),
                    "restarts": len(m.get("restart_reasons") or []),
                }
            )
        return {
            "graphs": _frame(pd, graphs, _GRAPH_COLUMNS),
            "breaks": _frame(pd, breaks, _BREAK_COLUMNS),
            "recompiles": _frame(pd, recompiles, _RECOMPILE_COLUMNS),
            "failures": _frame(pd, self._failures, _FAILURE_COLUMNS),
            "compiles": _frame(pd, compiles, _COMPILE_COLUMNS),
        }


_GRAPH_COLUMNS = {
    "graph": "int64",
    "rank": "Int64",
    "compile_id": "object",
    "frame_id": "Int64",
    "frame_compile_id": "Int64",
    "attempt": "Int64",
    "function": "object",
    "file": "object",
    "line": "Int64",
    "op_count": "Int64",
    "node_count": "Int64",
    "compile_time_s": "float64",
    "backend_compile_time_s": "float64",
    "fx_code": "object",
}
_BREAK_COLUMNS = {
    "break": "int64",
    "rank": "Int64",
    "compile_id": "object",
    "frame_id": "Int64",
    "frame_compile_id": "Int64",
    "attempt": "Int64",
    "gb_type": "object",
    "gb_id": "object",
    "reason": "object",
    "explanation": "object",
    "hints": "object",
    "user_file": "object",
    "user_line": "Int64",
    "user_function": "object",
    "source_line": "object",
    "source_context": "object",
    "doc_url": "object",
}
_RECOMPILE_COLUMNS = {
    "rank": "Int64",
    "compile_id": "object",
    "frame_id": "Int64",
    "frame_compile_id": "Int64",
    "function": "object",
    "file": "object",
    "previous_compile_id": "object",
    "failed_guard": "object",
    "reason": "object",
}
_FAILURE_COLUMNS = {
    "rank": "Int64",
    "compile_id": "object",
    "failure_type": "object",
    "description": "object",
    "source": "object",
}
_COMPILE_COLUMNS = {
    "rank": "Int64",
    "compile_id": "object",
    "frame_id": "Int64",
    "frame_compile_id": "Int64",
    "attempt": "Int64",
    "function": "object",
    "file": "object",
    "line": "Int64",
    "op_count": "Int64",
    "compile_time_s": "float64",
    "status": "object",
    "fail_type": "object",
    "restarts": "int64",
}

FRAME_COLUMNS = {
    "graphs": _GRAPH_COLUMNS,
    "breaks": _BREAK_COLUMNS,
    "recompiles": _RECOMPILE_COLUMNS,
    "failures": _FAILURE_COLUMNS,
    "compiles": _COMPILE_COLUMNS,
}


def _frame(pd: Any, rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    return frame.astype(columns)


def _where(c: _Compile | None) -> tuple[str | None, str | None, int | None]:
    if c is None:
        return None, None, None
    m = c.metrics or {}
    if m.get("co_name") is not None:
        return str(m["co_name"]), _opt_str(m.get("co_filename")), _as_int(m.get("co_firstlineno"))
    if c.stack_top is not None:
        file, line, function = c.stack_top
        return function, file, line
    return None, None, None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _compile_seconds(m: Mapping[str, Any]) -> float | None:
    """Whole-frame compile time (dynamo + backend), as torch's compilation_metrics report it."""
    value = _as_float(m.get("entire_frame_compile_time_s"))
    if value is None:
        us = _as_float(m.get("dynamo_cumulative_compile_time_us"))
        value = us / 1e6 if us is not None else None
    return value


def _status(m: Mapping[str, Any]) -> str:
    """tlparse's status colours of a compile: error, empty, break (restarted), ok."""
    if m.get("fail_type"):
        return "error"
    if (_as_int(m.get("graph_op_count")) or 0) == 0:
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
