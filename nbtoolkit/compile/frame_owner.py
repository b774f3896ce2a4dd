"""Whose code a traceback frame is: torch's, nbtoolkit's, an installed library's, or the user's.

A graph-break message carries the stack Dynamo was tracing (``User code traceback``), and
torch's own "Graph break in user code at FILE:LINE" names whatever frame was innermost,
which is torch's code when the break happens inside torch (``torch/optim/optimizer.py:79``
for the deliberate breaks around every ``opt.step()``). The report names two places
(:func:`pick_locations`):

- the **break site**: the innermost frame outside the torch package. That is where the
  code Dynamo cannot trace is: the user's own line, or a library's line (a break inside
  Hugging Face transformers' modeling code names the transformers line, whose source tells
  what breaks). All of torch counts as torch: ``torch/optim``, ``torch/autograd``,
  ``torch/amp`` and ``torch/distributed`` included; the user never edits them.
- the **call site**: when the break site is not the user's own code (an installed library,
  nbtoolkit itself), the innermost frame of the user's own code, i.e. outside torch,
  nbtoolkit and every installed package and the standard library: the line in the user's
  file (``out = model(input_ids)``) that led into the library. None when the break site is
  the user's own line, or when no frame of the user's is in the stack.

How a path is classified, without importing anything (a log may come from another machine):

- torch: under ``site-packages/torch/`` or ``dist-packages/torch/``, under the folder of the
  torch installed here, or a file of a torch source checkout (``.../torch/_dynamo/...``,
  ``torch/optim/...``: a folder named ``torch`` holding one of torch's subpackages);
- nbtoolkit: under this nbtoolkit's package folder, or ``site-packages/nbtoolkit/``;
- an installed library or the standard library: under a ``site-packages`` or
  ``dist-packages`` folder, or directly under ``lib/pythonX.Y/``;
- everything else (the user's files, notebook cells such as ``<ipython-input-3-...>`` or
  ``/tmp/ipykernel_12/34.py``) is the user's own code.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FrameOwner", "Location", "owner_of", "pick_locations", "torch_place"]


class FrameOwner:
    """The owners a frame's file can have (plain strings, for frames and tests alike)."""

    TORCH = "torch"
    NBTOOLKIT = "nbtoolkit"
    LIBRARY = "library"
    USER = "user"


# torch's subpackages and private modules, for a source checkout (pytorch/torch/...) that is
# not under site-packages: a folder named `torch` with one of these in it is torch
_TORCH_PARTS = (
    r"_[a-z_]+|amp|ao|autograd|backends|compiler|cpu|cuda|distributed|distributions|export|fft|func"
    r"|futures|fx|jit|library|linalg|masked|mps|mtia|multiprocessing|nested|nn|onnx|optim|overrides"
    r"|package|profiler|quantization|signal|sparse|special|testing|utils|xpu"
)
_TORCH_FILE = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]torch[/\\]"
    rf"|(?:^|[/\\])torch[/\\](?:{_TORCH_PARTS})(?:[/\\]|\.py$)"
    r"|(?:^|[/\\])torch[/\\](?:functional|serialization|random|hub|types|storage|return_types)\.py$"
)
_NBTOOLKIT_FILE = re.compile(r"[/\\](?:site|dist)-packages[/\\]nbtoolkit[/\\]")
_LIBRARY_FILE = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]"
    r"|[/\\]lib[/\\]python\d+(?:\.\d+)?[/\\][^/\\]+(?:[/\\]|\.py$)"  # the standard library
    r"|[/\\]Lib[/\\]"  # Windows' standard library and Lib\site-packages
)


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, str]:
    """The folders of the torch installed here (found without importing it) and of this nbtoolkit."""
    torch_root = ""
    try:
        spec = importlib.util.find_spec("torch")
        locations = list(spec.submodule_search_locations or []) if spec else []
        if locations:
            torch_root = os.path.realpath(locations[0])
    except (ImportError, ValueError, OSError):
        pass
    return torch_root, str(Path(__file__).resolve().parents[1])


def _under(path: str, root: str) -> bool:
    if not root:
        return False
    return path == root or path.startswith(root.rstrip("/\\") + os.sep)


def owner_of(path: str | None) -> str:
    """Whose code the file ``path`` is (a :class:`FrameOwner` value); an unknown path is the user's."""
    if not path:
        return FrameOwner.USER
    torch_root, nbtoolkit_root = _installed_roots()
    # the installed folders are compared as written and resolved (a log names files as Python saw them)
    candidates = {path}
    if os.path.isabs(path) and "\x00" not in path:
        with contextlib.suppress(OSError, ValueError):
            candidates.add(os.path.realpath(path))
    if _TORCH_FILE.search(path) or any(_under(p, torch_root) for p in candidates):
        return FrameOwner.TORCH
    if _NBTOOLKIT_FILE.search(path) or any(_under(p, nbtoolkit_root) for p in candidates):
        return FrameOwner.NBTOOLKIT
    if _LIBRARY_FILE.search(path):
        return FrameOwner.LIBRARY
    return FrameOwner.USER


# (file, line, function, source line) of one traceback frame, outermost first in a stack
Frame = tuple[str, int | None, str, str | None]


@dataclass(frozen=True)
class Location:
    """A frame picked from a stack: file, line, function and its source line (each may be unknown)."""

    file: str | None = None
    line: int | None = None
    function: str | None = None
    source: str | None = None


def pick_locations(
    named_file: str | None, named_line: int | None, frames: Sequence[Frame]
) -> tuple[Location, Location]:
    """(break site, call site) from torch's named location and the traceback (outermost first).

    The break site is torch's named location unless that is torch's own code (or missing):
    then the innermost frame outside torch. The call site is the innermost frame of the
    user's own code when the break site is not the user's (else an empty Location).
    """
    site = Location(named_file, named_line)
    if named_file is None or owner_of(named_file) == FrameOwner.TORCH:
        outside = [f for f in frames if owner_of(f[0]) != FrameOwner.TORCH]
        if outside:
            site = Location(*outside[-1])
    else:
        for file, line, function, source in frames:
            if file == named_file and line == named_line:
                site = Location(file, line, function, source)
    call = Location()
    if site.file is not None and owner_of(site.file) != FrameOwner.USER:
        # the stack is outermost first: frames before the break site's are its callers
        index = next(
            (
                i
                for i in range(len(frames) - 1, -1, -1)
                if (frames[i][0], frames[i][1]) == (site.file, site.line)
            ),
            len(frames),
        )
        own = [f for f in frames[:index] if owner_of(f[0]) == FrameOwner.USER]
        if own:
            call = Location(*own[-1])
    return site, call


def torch_place(file: str | None, line: int | None) -> str | None:
    """``torch/optim/optimizer.py:79``: a file of torch named from torch's own folder; None otherwise."""
    if not file or owner_of(file) != FrameOwner.TORCH:
        return None
    # site-packages/torch/..., else the last `torch` folder (a source checkout: pytorch/torch/...)
    parts = re.split(r"[/\\]", file)
    packages = [i + 1 for i, part in enumerate(parts[:-1]) if part in ("site-packages", "dist-packages")]
    torch_at = [i for i, part in enumerate(parts) if part == "torch"]
    start = next((i for i in packages if parts[i] == "torch"), torch_at[-1] if torch_at else None)
    place = "/".join(parts[start:]) if start is not None else file
    return f"{place}:{line}" if line is not None else place
