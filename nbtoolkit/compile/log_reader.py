"""Read TORCH_TRACE structured compile logs (what tlparse reads) into a :class:`GraphReport`.

A TORCH_TRACE log (``TORCH_TRACE=/tmp/dir python train.py``) holds one glog-prefixed JSON
envelope per line, each optionally followed by tab-indented payload lines::

    V0403 07:28:48.061000 139877824898048 torch/_dynamo/output_graph.py:1139] {"dynamo_output_graph": ...}
    \\tclass GraphModule(torch.nn.Module): ...

``load_compile_log(path)`` reads one such file, or a folder of per-rank files
(``dedicated_log_torch_trace_rank_N.log``), and returns the same
:class:`~nbtoolkit.compile.report.GraphReport` a live capture gives.

Agreement with tlparse 0.4.3 (tested on its own inputs):

- compile ids: every id of a record other than ``str`` in order of first appearance, as
  the keys of tlparse's ``compile_directory.json`` (``report.compile_ids``, ``[x/y_z]``
  written without brackets);
- failures and restarts: ``report.failures`` has the rows of tlparse's
  ``failures_and_restarts.html`` in the same order;
- records of another rank than the first rank seen in a file are skipped (tlparse's
  ``other_rank``), with a note.

Damaged input is skipped, never fatal: a line whose glog prefix or JSON envelope does not
parse is left out (with its payload lines); the report's ``notes`` list every skipped line
and one :class:`CompileLogWarning` per file says how many were skipped. A payload whose MD5
does not match its ``has_payload`` digest is noted and read as is, as tlparse does (its
``fail_payload_md5``); a payload that then does not parse is ignored. In a folder, files that are
not ``.log`` files or hold no structured record (stray or empty files) are skipped with a
note. A path that does not exist, or a folder without any log, raises
:class:`~nbtoolkit.core.errors.CompileLogError` naming it.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from nbtoolkit.compile.log_events import CompileEventParser
from nbtoolkit.compile.user_source import SourcePolicy
from nbtoolkit.compile.user_source import describe as describe_source_policy
from nbtoolkit.core.bounded import limit, limit_hint, max_read_bytes, open_regular, read_limit
from nbtoolkit.core.errors import CompileLogError
from nbtoolkit.core.inputs import is_path, wrong_type
from nbtoolkit.core.paths import user_path
from nbtoolkit.core.units import format_bytes

if TYPE_CHECKING:
    from nbtoolkit.compile.report import GraphReport

__all__ = ["CompileLogWarning", "load_compile_log"]

_GLOG = re.compile(r"^[VIWEC]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +\d+ [^:\]]+:\d+\] ")
_RANK_IN_NAME = re.compile(r"rank_(\d+)")
_MAX_NOTES_PER_FILE = 20


class CompileLogWarning(UserWarning):
    """Some lines of a TORCH_TRACE log were damaged and skipped (the report's notes list them)."""


def load_compile_log(
    path: str | Path,
    *,
    max_bytes: int | str | None = None,
    source_roots: str | Path | Iterable[str | Path] | None = None,
) -> GraphReport:
    """Read a TORCH_TRACE log file, or a folder of per-rank logs, into a GraphReport.

    Folders: every ``*.log`` file with at least one structured record is read; the rank
    comes from ``rank_N`` in the file name, else from the records' ``rank`` field, and is
    the ``rank`` column of every frame (compile ids in ``report.compile_ids`` then read
    ``rank:x/y``). Other files are skipped with a note. Raises
    :class:`~nbtoolkit.core.errors.CompileLogError` when
    ``path`` is missing or holds no readable log, or a file is not a regular file (a FIFO, a
    device) or larger than ``max_bytes`` (default ``NBT_MAX_READ_BYTES``, else 8 GiB; see
    :mod:`nbtoolkit.core.bounded`). A record (its line and payload lines) longer than
    ``NBT_MAX_LOG_RECORD_BYTES`` is skipped with a note, never held; ids that do not fit in 64
    bits are read as absent, with a note.

    Source context: a log may come from another machine and name any file, so by default no
    source file is read; each break still has its file, line and the source line torch wrote
    into the log. ``source_roots`` names the folders holding the code (e.g. ``"."``): regular
    ``.py`` files under them give the breaks a few lines of context (see
    :mod:`nbtoolkit.compile.user_source`).
    """
    if not is_path(path):
        raise wrong_type("load_compile_log()", "the path of a TORCH_TRACE .log file or of its folder", path)
    if source_roots is not None and not (is_path(source_roots) or _are_paths(source_roots)):
        raise wrong_type("load_compile_log(source_roots=)", "a folder or a list of folders", source_roots)
    policy = SourcePolicy.from_roots(source_roots)
    with read_limit(max_bytes):
        return _load(user_path(path, error=CompileLogError), policy)


def _are_paths(value: object) -> bool:
    return isinstance(value, (list, tuple, set, frozenset)) and all(is_path(v) for v in value)


def _load(target: Path, policy: SourcePolicy) -> GraphReport:
    from nbtoolkit.compile.report import GraphReport

    if not target.exists():
        raise CompileLogError(f"compile log not found: {target}. Pass a TORCH_TRACE .log file or its folder.")
    parser = CompileEventParser(source=str(target), source_policy=policy)
    ranks: list[int] = []
    if target.is_dir():
        files = sorted(p for p in target.iterdir() if p.is_file())
        read_any = False
        for file in files:
            if file.suffix != ".log":
                parser.notes.append(f"skipped {file.name}: not a .log file")
                continue
            rank = _rank_from_name(file.name)
            if rank is None and _RANK_IN_NAME.search(file.name):
                parser.notes.append(
                    f"{file.name}: the rank in the name is not below {limit_hint('world_size')}: "
                    "not believed (the records' own rank is used)"
                )
            count = _read_file(file, parser, rank=rank, multi=True)
            if count == 0:
                parser.notes.append(
                    f"skipped {file.name}: no structured compile records (empty or not a TORCH_TRACE log)"
                )
                continue
            read_any = True
            if rank is not None:
                ranks.append(rank)
        if not read_any:
            raise CompileLogError(
                f"no TORCH_TRACE log in folder {target}: expected files like "
                "dedicated_log_torch_trace_rank_0.log written with TORCH_TRACE=<folder>"
            )
    else:
        count = _read_file(target, parser, rank=None, multi=False)
        if count == 0:
            raise CompileLogError(
                f"{target} holds no structured compile record: is it a TORCH_TRACE log "
                "(lines like `V0403 07:28:48.051000 1234 torch/_dynamo/...] {{...}}`)?"
            )
    frames = parser.frames()
    if not frames["breaks"].empty and not policy.roots:
        parser.notes.append(describe_source_policy(policy))
    if frames["breaks"].empty and (frames["failures"]["failure_type"] == "RestartAnalysis").any():
        parser.notes.append(
            "this log has no graph-break records (newer torch logs each break as a dynamo_graph_break_reason "
            "artifact); the restarts in .failures name the breaks that restarted a compile"
        )
    seen_ranks = sorted({r for r, _ in parser.compile_ids if r is not None})
    multi = target.is_dir()
    compile_ids = [f"{r}:{cid}" if multi and r is not None else cid for r, cid in parser.compile_ids]
    return GraphReport(
        **frames,
        compile_ids=compile_ids,
        source=str(target),
        notes=parser.notes,
        ranks=sorted(set(ranks) | set(seen_ranks)) if (ranks or seen_ranks) else [],
    )


def _rank_from_name(name: str) -> int | None:
    """``N`` of ``rank_N`` in a file name; None without one, or when N is no rank (over the world limit)."""
    m = _RANK_IN_NAME.search(name)
    if m is None or len(m.group(1)) > 18:
        return None
    rank = int(m.group(1))
    return rank if rank < limit("world_size") else None


def _lines(binary: BinaryIO, most: int) -> Iterator[tuple[int, str, bool]]:
    """(line number, line without its newline, whole) for each line, never holding more than ``most`` bytes.

    Lines are read as bytes (C speed) and decoded as UTF-8, a damaged byte replaced. A longer line
    is read to its end a MiB at a time, undecoded, and dropped: ``whole`` is False and the line is
    its first character (enough to tell a payload line from an envelope).
    """
    lineno = 0
    while raw := binary.readline(min(most, 1 << 20)):
        lineno += 1
        parts, size = [raw], len(raw)
        while not raw.endswith(b"\n") and size <= most and (raw := binary.readline(1 << 20)):
            parts.append(raw)
            size += len(raw)
        if size <= most:
            line = b"".join(parts).decode("utf-8", "replace")
            line = line[:-1] if line.endswith("\n") else line
            yield lineno, line[:-1] if line.endswith("\r") else line, True
            continue
        first = parts[0][:1].decode("utf-8", "replace")
        del parts
        while not raw.endswith(b"\n") and (raw := binary.readline(1 << 20)):
            pass
        yield lineno, first, False


def _over_record_limit(file: Path, lineno: int, most: int) -> str:
    return (
        f"{file.name}:{lineno}: a record (its line and payload) longer than "
        f"{limit_hint('log_record_bytes', most)}: skipped"
    )


def _read_file(file: Path, parser: CompileEventParser, *, rank: int | None, multi: bool) -> int:
    """Feed every record of one file to the parser; returns how many records were read."""
    import orjson

    binary = open_regular(file, CompileLogError, "compile log")
    size, most_bytes = os.fstat(binary.fileno()).st_size, max_read_bytes()
    if size > most_bytes:  # logs are plain text, never inflated: the file's size is what would be read
        binary.close()
        raise CompileLogError(
            f"{file} is {format_bytes(size)}, over the limit of {format_bytes(most_bytes)} per file; "
            "raise it with max_bytes= or the environment variable NBT_MAX_READ_BYTES"
        )
    skipped: list[str] = []
    mismatched: list[str] = []
    records = 0
    file_rank: int | None = None  # tlparse: the first rank seen in a file is the file's rank
    other_rank = 0
    with binary:
        pending: tuple[int, dict[str, object], list[str]] | None = None

        def flush(entry: tuple[int, dict[str, object], list[str]]) -> None:
            nonlocal records, file_rank, other_rank
            lineno, envelope, payload_lines = entry
            payload: str | None = None
            digest = envelope.get("has_payload")
            if digest is not None:
                payload = "\n".join(payload_lines)
                actual = hashlib.md5(payload.encode("utf-8"), usedforsecurity=False).hexdigest()
                if actual != digest:
                    # tlparse counts these (fail_payload_md5) and still reads the record; so do we.
                    mismatched.append(
                        f"{file.name}:{lineno}: payload does not match its MD5 digest (read as is)"
                    )
            env_rank = envelope.get("rank")
            if isinstance(env_rank, int):
                if file_rank is None:
                    file_rank = env_rank
                elif env_rank != file_rank:
                    other_rank += 1
                    return
            records += 1
            parser.add(envelope, payload, rank=rank)  # None: the envelope's own rank, if any

        max_record = limit("log_record_bytes")
        pending_size = 0
        for lineno, line, whole in _lines(binary, max_record):
            if not whole:  # a line over the record limit: skipped (read to its end, never held)
                if pending is not None and line.startswith("\t"):
                    skipped.append(_over_record_limit(file, pending[0], max_record))
                    pending = None  # the rest of its payload lines follow: skipped with it
                    continue
                if pending is not None:
                    flush(pending)
                    pending = None
                if not line.startswith("\t"):
                    skipped.append(_over_record_limit(file, lineno, max_record))
                continue
            if not line:
                continue  # tlparse: blank lines are never valid (a blank payload line is a lone tab)
            if line.startswith("\t"):
                if pending is not None:
                    pending_size += len(line)
                    if pending_size > max_record:
                        skipped.append(_over_record_limit(file, pending[0], max_record))
                        pending = None
                        continue
                    pending[2].append(line[1:])
                continue  # payload of a damaged envelope: skipped with it
            if pending is not None:
                flush(pending)
                pending = None
            pending_size = len(line)
            m = _GLOG.match(line)
            if m is None:
                skipped.append(f"{file.name}:{lineno}: not a glog-prefixed structured log line")
                continue
            try:
                envelope = orjson.loads(line[m.end() :])
            except orjson.JSONDecodeError as exc:
                skipped.append(f"{file.name}:{lineno}: the JSON envelope does not parse ({str(exc)[:80]})")
                continue
            if not isinstance(envelope, dict):
                skipped.append(f"{file.name}:{lineno}: the JSON envelope is not an object")
                continue
            pending = (lineno, envelope, [])
        if pending is not None:
            flush(pending)
    over = [note for note in skipped if "longer than the limit" in note]
    if over and not records:  # nothing read because of the limit: say so, not "no record"
        if not multi:
            raise CompileLogError(f"{file}: {over[0].split(': ', 1)[1].removesuffix(': skipped')}")
        parser.notes.append(f"skipped {file.name}: {over[0].split(': ', 1)[1].removesuffix(': skipped')}")
    elif skipped and not records and not multi and any("JSON envelope" in note for note in skipped):
        first = next(note for note in skipped if "JSON envelope" in note)
        raise CompileLogError(
            f"{file} holds no readable compile record: {len(skipped):,} line(s) skipped, and its records "
            f"are damaged (first: {first})"
        )
    if other_rank:
        parser.notes.append(f"{file.name}: skipped {other_rank} records of ranks other than {file_rank}")
    if mismatched and records:
        parser.notes.extend(mismatched[:_MAX_NOTES_PER_FILE])
        if len(mismatched) > _MAX_NOTES_PER_FILE:
            parser.notes.append(f"{file.name}: {len(mismatched) - _MAX_NOTES_PER_FILE} more MD5 mismatches")
    if skipped and records:
        parser.notes.extend(skipped[:_MAX_NOTES_PER_FILE])
        if len(skipped) > _MAX_NOTES_PER_FILE:
            parser.notes.append(
                f"{file.name}: {len(skipped) - _MAX_NOTES_PER_FILE} more damaged lines skipped"
            )
        warnings.warn(
            f"{file}: skipped {len(skipped)} damaged line(s), first at {skipped[0].split(': ', 1)[0]} "
            "(see report.notes)",
            CompileLogWarning,
            stacklevel=3,
        )
    return records
