"""torch's graph-break message, split into its parts, and the user's source around the break.

The payload of a ``dynamo_graph_break_reason`` artifact is the text torch prints for a
graph break (torch/_dynamo/symbolic_convert.py: ``log_graph_break`` and
torch/_dynamo/exc.py: ``format_graph_break_message``). :func:`parse_graph_break_text`
reads its type, explanation, hints, registry id and link, and where the break is: the break
site (the innermost frame outside torch, a library's line included) and, when that is a
library's code, the user's own call site (:mod:`nbtoolkit.compile.frame_owner` says which
is which); :func:`source_context` reads a few numbered lines of the user's source around
the break, only where a :class:`~nbtoolkit.compile.user_source.SourcePolicy` allows it (a log can
name any file: see :mod:`nbtoolkit.compile.user_source`).

torch is not imported: its graph-break registry (the ``GBnnnn`` ids of messages that carry
no link) is read as JSON from the installed package.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

from nbtoolkit.compile.frame_owner import pick_locations, torch_place
from nbtoolkit.compile.user_source import SourcePolicy, read_source_lines

__all__ = ["CONTEXT_LINES", "GRAPH_BREAK_SITE", "GraphBreakText", "parse_graph_break_text", "source_context"]

# torch 2.13 prints this link under every registered graph break
# (torch/_dynamo/exc.py: get_gbid_documentation_link): .../gb/gb0124.html
GRAPH_BREAK_SITE = "https://meta-pytorch.github.io/compile-graph-break-site/gb/"

CONTEXT_LINES = 3  # lines of source shown above and below a graph break's user line

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
    # the user's own frame that led into a library's break site (None when the site is the user's)
    call_file: str | None = None
    call_line: int | None = None
    call_function: str | None = None
    call_source: str | None = None
    # where in torch the break was when torch named its own file ("torch/optim/optimizer.py:79")
    inside_torch: str | None = None


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
        user_file, user_line = m.group("file"), _line_number(m.group("line"))
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
    # torch names its own file when the break is inside torch (an optimizer's step, a polyfill it
    # inlines for the user): the break site is then the innermost frame outside torch
    site, call = pick_locations(user_file, user_line, frames)
    inside_torch = torch_place(user_file, user_line) if site.file != user_file else None
    explanation = "\n".join(explanation_lines).strip()
    return GraphBreakText(
        gb_type=gb_type,
        reason=reason,
        explanation=explanation,
        hints=hints,
        context=" ".join(context_lines),
        doc_url=doc_url,
        gb_id=gb_id,
        user_file=site.file,
        user_line=site.line,
        user_function=site.function,
        traceback_source=site.source,
        call_file=call.file,
        call_line=call.line,
        call_function=call.function,
        call_source=call.source,
        inside_torch=inside_torch,
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
                gb_type, detail = _type_and_detail([x.rstrip() for x in lines[:i] if x.strip()])
                explanation_lines.extend(detail)
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


def _type_and_detail(previous: list[str]) -> tuple[str, list[str]]:
    """The graph-break type above ``Explanation:``, and indented detail lines between them.

    Mostly the type is the line just above. Some breaks put a detail line of their own in
    between, indented (torch 2.13's higher-order-op breaks)::

        HOP: Unsafe side effect
          Higher Order Operator: torch.utils.checkpoint.checkpoint
          Explanation: ...

    The type is then the last line that is not indented; the detail goes to the explanation.
    """
    if not previous:
        return "", []
    detail: list[str] = []
    for line in reversed(previous):
        if line[:1].isspace():
            detail.insert(0, line.strip())
            continue
        if line.startswith("Encountered graph break"):  # torch's header, never a type
            break
        return line.strip(), detail
    return previous[-1].strip(), []


def _line_number(digits: str) -> int | None:
    """A line number from the log's text; None past 64 bits (damage: int() would need 4,300+ digits)."""
    return int(digits) if len(digits) <= 18 else None


def _traceback_frames(tb_lines: list[str]) -> list[tuple[str, int | None, str, str | None]]:
    """(file, line, function, source line) of each frame of a formatted traceback, outermost first."""
    frames = []
    for i, line in enumerate(tb_lines):
        fm = _TB_FRAME.match(line)
        if fm is None:
            continue
        nxt = tb_lines[i + 1] if i + 1 < len(tb_lines) else ""
        source = nxt.strip() if nxt.startswith("    ") and not _TB_FRAME.match(nxt) else None
        frames.append((fm.group("file"), _line_number(fm.group("line")), fm.group("func").strip(), source))
    return frames


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
    file: str | None, line: int | None, *, policy: SourcePolicy | None = None, around: int = CONTEXT_LINES
) -> tuple[str | None, str]:
    """The source line and a few numbered lines around it, where ``policy`` allows reading the file.

    The default policy reads nothing: a file name from a log is not a reason to open a file.
    """
    if not file or not line or line < 1 or policy is None:
        return None, ""
    lines = read_source_lines(file, policy)
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
