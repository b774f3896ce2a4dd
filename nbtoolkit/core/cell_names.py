"""Notebook cells named as IPython's tracebacks name them, not by their temporary file names.

ipykernel compiles each cell under a file name of its own (``/tmp/ipykernel_4242/1277033008.py``)
and IPython's compiler remembers which execution count each such name had
(:meth:`IPython.core.compilerop.CachingCompiler.format_code_name`). Frames recorded in this
kernel (a memory timeline's ``source`` and ``stack``, a snapshot's stack) carry those names;
:func:`name_cells` rewrites them to ``Cell In[3], line 7``, the way a traceback shows a cell.

Only in an IPython kernel, and only names that this kernel's compiler made: text recorded in
another process (a saved result, someone else's snapshot) keeps its paths, since its cell
numbers mean nothing here.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["name_cells"]

# A Python file followed by its line: "path.py(7)" (profiler frames) or "path.py:7" (snapshots).
_FRAME = re.compile(r"(?P<file>[^\s:()]+\.py)(?:\((?P<paren>\d+)\)|:(?P<colon>\d+))")


def _kernel_compiler(shell: Any = None) -> Any:
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover - IPython is a dependency
            return None
        shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:  # plain Python, terminal IPython
        return None
    compiler = getattr(shell, "compile", None)
    return compiler if hasattr(compiler, "format_code_name") else None


def name_cells(text: str, shell: Any = None) -> str:
    """``text`` with every frame of a cell of this kernel written ``Cell In[N], line L``.

    Frames are ``file.py(L)`` or ``file.py:L``; a file is a cell when this kernel's compiler
    named it (full path, or the last two parts a snapshot keeps: ``ipykernel_4242/1277033008.py``).
    Anything else, and everything outside a kernel, is returned unchanged.
    """
    compiler = _kernel_compiler(shell)
    if compiler is None or not text or ".py" not in text:
        return text
    known: dict[str, int] = dict(getattr(compiler, "_filename_map", {}) or {})
    by_tail = {"/".join(name.replace("\\", "/").split("/")[-2:]): n for name, n in known.items()}

    def label(match: re.Match[str]) -> str:
        filename = match["file"]
        line = match["paren"] or match["colon"]
        found = compiler.format_code_name(filename)
        if found is None and filename in by_tail:
            found = ("Cell", f"In[{by_tail[filename]}]")
        if not found:
            return match[0]
        kind, name = found
        return f"{kind} {name}, line {line}"

    return _FRAME.sub(label, text)
