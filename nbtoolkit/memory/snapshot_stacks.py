"""Allocator stacks of a CUDA snapshot: the readable text, the phase hint and the user's line.

A snapshot (:class:`nbtoolkit.memory.snapshot.MemorySnapshot`) records, for every block and
trace entry, the stack that allocated it as a list of frames (``filename``, ``line``,
``name``), Python and C++ mixed. Many entries share one stack, often the very same list
object (the pickle memo), so :class:`StackInterner` formats each stack once and hands out
its index. Per stack it keeps:

* the text shown to the user (:func:`format_stack`): the Python frames when there are any,
  else the C++ frames without the allocator's and the interpreter's own machinery;
* a phase hint (:func:`stack_hint`) that the timeline heuristics of
  :mod:`nbtoolkit.memory.snapshot_timeline` start from;
* the innermost frame of the user's own code (:func:`user_source`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nbtoolkit.memory.snapshot_mosaic import category_of, frame_rules

__all__ = ["StackInterner", "StackLimits", "format_stack", "frame_info", "stack_hint", "user_source"]

# Frames that only show the allocator's own machinery (the same idea as memory_viz's filter).
_OMIT_FUNCTIONS = (
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
    "_PyEval",
    "Py_RunMain",
    "Py_BytesMain",
    "pymain_",
)
_OMIT_FILES = (
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "ceval.c",
    "pycore_ceval.h",
    "cpython/abstract.h",
)
_MAX_STACK_LINES = 40
# A frame's file and function are cut to this many characters: demangled C++ names run to a few
# hundred; a snapshot whose stacks share one 1 MB name would otherwise repeat it in every stack's
# text (2,000 stacks: 2 GB).
_MAX_FRAME_TEXT = 512


def _clip(text: str) -> str:
    if len(text) <= _MAX_FRAME_TEXT:
        return text
    return f"{text[:_MAX_FRAME_TEXT]}...(+{len(text) - _MAX_FRAME_TEXT:,} characters)"


def _short_path(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else filename


_OMIT_FUNCTIONS_RE = re.compile("|".join(map(re.escape, _OMIT_FUNCTIONS)))
_OMIT_FILES_RE = re.compile("|".join(map(re.escape, _OMIT_FILES)))


def frame_info(frame: dict[str, Any]) -> tuple[bool, bool, str]:
    """(is a Python frame, is allocator/interpreter machinery, its ``file:line in name`` text)."""
    filename = _clip(str(frame.get("filename", "?")))
    name = _clip(str(frame.get("name", "?")))
    omitted = bool(_OMIT_FUNCTIONS_RE.search(name) or _OMIT_FILES_RE.search(filename))
    return filename.endswith(".py"), omitted, f"{_short_path(filename)}:{frame.get('line', 0)} in {name}"


def format_stack(frames: list[dict[str, Any]], info: Any = None) -> str:
    """Python frames when there are any (what a user recognizes), else the filtered C++ frames.

    ``info``: a function giving :func:`frame_info` of a frame (a cache of it), else computed.
    """
    described = list(map(info or frame_info, frames))
    python = [d for d in described if d[0]]
    chosen = python or [d for d in described if not d[1]]
    return "\n".join(d[2] for d in chosen[:_MAX_STACK_LINES])


@dataclass(frozen=True)
class StackLimits:
    """What a snapshot's stacks may cost, with the name of each limit for the error (the readers'
    ``NBT_MAX_STACK_FRAMES`` and ``NBT_MAX_STACK_TEXT_BYTES``)."""

    frames: int  # frames of one stack
    frames_hint: str
    text_bytes: int  # formatted text of all distinct stacks
    text_hint: str


class StackInterner:
    """Interns stacks: the same frames list (often shared by the pickle memo) is formatted once."""

    def __init__(self, limits: StackLimits | None = None, *, source: str = "") -> None:
        #: None: no limits; else a SnapshotError (naming the limit) past one of them
        self.limits = limits
        self.source = source
        self.text_bytes = 0
        self.stacks: list[str] = []
        self._by_text: dict[tuple[str, str], int] = {}
        self._by_identity: dict[int, int] = {}
        self._by_frames: dict[tuple[int, ...], int] = {}
        self._keep_alive: list[Any] = []
        self.hints: list[str] = []  # per stack: phase hint for the heuristics (see stack_hint)
        self.sources: list[str] = []  # per stack: innermost user-code frame
        self.mosaic: list[str] = []  # per stack: Mosaic's category (nbtoolkit.memory.snapshot_mosaic)
        # torch shares frame dicts among stacks: each is described once (kept alive with its list).
        self._frames: dict[int, tuple[bool, bool, str]] = {}
        self._rules: dict[int, int] = {}

    def _mosaic(self, frames: list[dict[str, Any]]) -> str:
        bits = 0
        for frame in frames:
            found = self._rules.get(id(frame))
            if found is None:
                found = self._rules[id(frame)] = frame_rules(frame)
            bits |= found
        return category_of(bits)

    def _frame_info(self, frame: dict[str, Any]) -> tuple[bool, bool, str]:
        found = self._frames.get(id(frame))
        if found is None:
            found = self._frames[id(frame)] = frame_info(frame)
        return found

    def intern(self, frames: Any) -> int:
        if not frames:
            return -1
        key = id(frames)
        found = self._by_identity.get(key)
        if found is not None:
            return found
        if not isinstance(frames, (list, tuple)):
            raise TypeError(f"a stack's frames are a {type(frames).__name__}, not a list of frames")
        if self.limits is not None and len(frames) > self.limits.frames:
            self._refuse(f"a stack of {len(frames):,} frames, over {self.limits.frames_hint}")
        self._keep_alive.append(frames)  # ids (of the list and its frames) stay unique while we hold them
        # Lists made apart but holding the same (shared) frame dicts are the same stack: found by
        # the frames' identities before any text is formatted (long runs repeat their stacks).
        same_frames = tuple(map(id, frames))
        index = self._by_frames.get(same_frames)
        if index is None:
            index = self._intern_new(frames if isinstance(frames, list) else list(frames))
            self._by_frames[same_frames] = index
        self._by_identity[key] = index
        return index

    def _intern_new(self, frames: list[dict[str, Any]]) -> int:
        text = format_stack(frames, self._frame_info)
        # The text shows the Python frames only; stacks alike in it but told apart by their C++
        # frames in Mosaic's rules (e.g. the autograd engine's) stay two stacks.
        mosaic = self._mosaic(frames)
        index = self._by_text.get((text, mosaic))
        if index is None:
            index = len(self.stacks)
            self._count_text(text)
            self.stacks.append(text)
            self._by_text[(text, mosaic)] = index
            self.hints.append(stack_hint(frames))
            self.sources.append(user_source(frames))
            self.mosaic.append(mosaic)
        return index


    def _count_text(self, text: str) -> None:
        self.text_bytes += len(text)
        if self.limits is not None and self.text_bytes > self.limits.text_bytes:
            from nbtoolkit.core.units import format_bytes

            self._refuse(
                f"the snapshot's {len(self.stacks):,}+ distinct stacks make more than "
                f"{format_bytes(self.limits.text_bytes)} of text, over {self.limits.text_hint}"
            )

    def _refuse(self, what: str) -> None:
        from nbtoolkit.core.errors import SnapshotError

        raise SnapshotError(
            f"{self.source + ': ' if self.source else ''}{what}; real snapshots are far from it, so this "
            "one is damaged or built to exhaust memory"
        )


def _rooted(filename: str) -> str:
    return "/" + filename.replace("\\", "/").lstrip("/")


def stack_hint(frames: list[dict[str, Any]]) -> str:
    """Phase hint of a stack, from its frames: optimizer, backward, forward, parameter or other."""
    # Paths are absolute in CUDA snapshots, relative to site-packages in profiler stacks
    # ("torch/optim/adamw.py"): a leading "/" lets one set of rules read both.
    names = [(_clip(str(f.get("name", ""))), _rooted(_clip(str(f.get("filename", ""))))) for f in frames]
    if any("/torch/optim/" in fn for _, fn in names):
        return "optimizer"
    if any(
        "autograd::Engine" in n
        or "evaluate_function" in n
        or "run_backward" in n
        or (n == "backward" and (fn.endswith(("torch/_tensor.py", "autograd/__init__.py"))))
        or (n == "_engine_run_backward")
        for n, fn in names
    ):
        return "backward"
    if any(
        (fn.endswith("torch/nn/modules/module.py") and n in ("_apply", "to", "cuda"))
        or ("/torch/nn/modules/" in fn and n in ("__init__", "reset_parameters"))
        or fn.endswith("torch/nn/parameter.py")
        for n, fn in names
    ):
        return "parameter"
    if any(
        fn.endswith("torch/nn/modules/module.py") and n in ("_call_impl", "_wrapped_call_impl")
        for n, fn in names
    ):
        return "forward"
    return "other"


def user_source(frames: list[dict[str, Any]]) -> str:
    """Innermost Python frame outside torch and site-packages: where in the user's code."""
    for f in frames:
        filename = str(f.get("filename", "")).replace("\\", "/")
        rooted = _rooted(filename)
        if filename.endswith(".py") and "/torch/" not in rooted and "site-packages" not in filename:
            return f"{_clip(_short_path(filename))}:{f.get('line', 0)} in {_clip(str(f.get('name', '?')))}"
    return ""
