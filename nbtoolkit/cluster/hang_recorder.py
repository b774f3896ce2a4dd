"""On each rank: a record of the collectives a cell calls, and a look at where the cell is now.

Why our own record and not torch's Flight Recorder: torch 2.13 does record gloo collectives
(``TORCH_FR_BUFFER_SIZE``; ``torch._C._distributed_c10d._dump_fr_trace()``), but a gloo entry
never leaves the state "scheduled" (only the group's ``last_completed_collective`` moves),
its stack holds no line of a notebook cell, and the dump names the default group ``""``
in ``pg_config`` while its entries say ``"0"`` (the name is set after the gloo backend
registered itself), which makes torch's own ``fr_trace`` fail with a KeyError. This record
works the same for every backend: :func:`install` wraps the collective functions of
``torch.distributed`` once per process; while a cell runs, each call is noted on entry (op,
process group, sequence number in that group, input shapes and dtypes, the user's line)
and marked completed when it returns. Calls made by torch itself (DDP's reducer, torch's
own helpers) go through other paths and are not noted; the stack look still shows them.

The control thread of the rank actor reads :meth:`CollectiveRecorder.snapshot` while the
cell's thread is blocked: plain builtins only, cheap to ship.

Imports neither torch nor ray at import time.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import sys
import threading
from collections import deque
from types import FrameType
from typing import Any

__all__ = ["COLLECTIVES", "CollectiveRecorder", "flight_recorder_dump", "install", "recorder"]

#: The torch.distributed functions recorded, and the argument holding what the rank sends.
COLLECTIVES: dict[str, str | None] = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "reduce": "tensor",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "all_to_all": "input_tensor_list",
    "all_to_all_single": "input",
    "gather": "tensor",
    "scatter": "tensor",
    "barrier": None,
    "monitored_barrier": None,
    "all_gather_object": None,
    "broadcast_object_list": None,
    "gather_object": None,
    "scatter_object_list": None,
}

_MAX_CALLS = 512  # calls kept per cell (the newest); a training loop's earlier steps are not needed
_CELL_FILENAME = "<remote-cell>"
_SKIPPED_DIRS = tuple(
    os.path.normpath(p) + os.sep
    for p in {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
)


def _is_user_frame(frame: FrameType) -> bool:
    name = frame.f_code.co_filename
    if name == _CELL_FILENAME:
        return True
    if name.startswith("<"):
        return False
    path = os.path.abspath(name)
    return not (path.startswith(_SKIPPED_DIRS) or "site-packages" in path)


def _shape_of(value: Any) -> tuple[list[tuple[int, ...]], list[str]]:
    """Shapes and dtypes of a tensor or a list of tensors (what the rank sends)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    shapes, dtypes = [], []
    for item in items:
        shape = getattr(item, "shape", None)
        if shape is not None:
            shapes.append(tuple(int(d) for d in shape))
            dtypes.append(str(getattr(item, "dtype", "")).removeprefix("torch."))
    return shapes, dtypes


class CollectiveRecorder:
    """The record of one rank: collectives of the running (or last) cell and the cell's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}  # process group -> collectives entered since it was formed
        self._calls: deque[dict[str, Any]] = deque(maxlen=_MAX_CALLS)
        self._cell_thread: int | None = None
        self._cell_lines: list[str] = []
        self.completed = 0  # collectives completed since the process started: progress
        self.cell_running = False

    # ---- the cell's side ----
    def reset_groups(self) -> None:
        """A new process group was formed: its collectives count from 1 again."""
        with self._lock:
            self._seq.clear()

    def begin_cell(self, thread_id: int, source: str | None) -> None:
        with self._lock:
            self._calls.clear()
            self._cell_thread = thread_id
            self._cell_lines = source.splitlines() if source else []
            self.cell_running = True

    def end_cell(self) -> None:
        with self._lock:
            self.cell_running = False

    def enter(self, op: str, group: Any, sent: Any) -> dict[str, Any]:
        name = _group_name(group)
        shapes, dtypes = _shape_of(sent) if sent is not None else ([], [])
        file, line, code = self._user_line(sys._getframe(2))
        with self._lock:
            seq = self._seq[name] = self._seq.get(name, 0) + 1
            call = {
                "group": name,
                "seq": seq,
                "op": op,
                "sizes": shapes,
                "dtypes": dtypes,
                "completed": False,
                "file": file,
                "line": line,
                "code": code,
            }
            self._calls.append(call)
        return call

    def complete(self, call: dict[str, Any]) -> None:
        with self._lock:
            call["completed"] = True
            self.completed += 1

    def fail(self, call: dict[str, Any]) -> None:
        """The call raised (a timeout, a closed peer, an interrupt): it no longer waits."""
        with self._lock:
            call["completed"] = True
            call["failed"] = True

    def _user_line(self, frame: FrameType | None) -> tuple[str | None, int | None, str | None]:
        while frame is not None and not _is_user_frame(frame):
            frame = frame.f_back
        if frame is None:
            return None, None, None
        return frame.f_code.co_filename, frame.f_lineno, self._code(frame.f_code.co_filename, frame.f_lineno)

    def _code(self, file: str, line: int) -> str | None:
        if file == _CELL_FILENAME:
            return self._cell_lines[line - 1].strip() if 0 < line <= len(self._cell_lines) else None
        return linecache.getline(file, line).strip() or None

    # ---- the control thread's side ----
    def snapshot(self) -> dict[str, Any]:
        """State, collectives and stack of the cell's thread, without stopping it."""
        with self._lock:
            calls = [dict(c) for c in self._calls]
            running, tid = self.cell_running, self._cell_thread
        frame = sys._current_frames().get(tid) if (running and tid is not None) else None
        stack: list[str] = []
        file = line = code = None
        if frame is not None:
            file, line, code = self._user_line(frame)
            walk: FrameType | None = frame
            while walk is not None and len(stack) < 8:
                stack.append(f"{walk.f_code.co_filename}:{walk.f_lineno} in {walk.f_code.co_name}")
                walk = walk.f_back
            stack.reverse()
        open_call = next((c for c in calls if not c["completed"]), None)
        if not running:
            state = "finished"
        elif open_call is not None:
            state = "in collective"
        else:
            state = "computing"
        return {
            "state": state,
            "calls": calls,
            "file": file,
            "line": line,
            "code": code,
            "stack": stack,
            "completed": self.completed,
            "cell_lines": list(self._cell_lines),
        }


def _group_name(group: Any) -> str:
    """The name users know a process group by: its description, else torch's name for it."""
    if group is None:
        return "default_pg"
    desc = getattr(group, "group_desc", None)
    if desc and desc != "undefined":
        return str(desc)
    return str(getattr(group, "group_name", None) or id(group))


def flight_recorder_dump() -> bytes | None:
    """torch's Flight Recorder of this process (pickle bytes), or None where it is off or missing."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]  # stubs lack it

        return bytes(_dump_fr_trace())
    except Exception:  # an older torch, or a recorder that is off: our own record stands alone
        return None


#: The record of this process (one rank per process).
recorder = CollectiveRecorder()


def _wrap(dist: Any, op: str, sent_arg: str | None) -> None:
    original = getattr(dist, op, None)
    if original is None or getattr(original, "__nbt_recorded__", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        if not recorder.cell_running:
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # let torch give its own message for bad arguments
            return original(*args, **kwargs)
        arguments = bound.arguments
        call = recorder.enter(op, arguments.get("group"), arguments.get(sent_arg) if sent_arg else None)
        try:
            result = original(*args, **kwargs)
        except BaseException:
            recorder.fail(call)
            raise
        # An async op (async_op=True) is in flight, not waited for: its wait() is not recorded,
        # a rank blocked there shows up by its stack.
        recorder.complete(call)
        return result

    recorded.__nbt_recorded__ = True  # type: ignore[attr-defined]
    setattr(dist, op, recorded)


def install() -> None:
    """Record the collectives of ``torch.distributed`` (idempotent; imports torch)."""
    import torch.distributed as dist

    for op, sent_arg in COLLECTIVES.items():
        _wrap(dist, op, sent_arg)
