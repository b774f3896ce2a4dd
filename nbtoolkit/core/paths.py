"""Paths a user gives: expanded and checked in one place, so a bad path is one clear error.

Every public function and method that takes a path (``load_trace``, ``load_compile_log``,
``load_memory_snapshot``, ``summarize_traces``, the ``save``/``load`` methods of the result
objects, ``nbt.report(path=...)`` and the magics, which pass their path on) calls
:func:`user_path` first. What the operating system or ``pathlib`` would otherwise raise from
deep inside a reader (``OSError: File name too long``, ``RuntimeError: Could not determine
home directory``, ``ValueError: embedded null byte``) becomes one :class:`~nbtoolkit.core.errors.NbtError`
that names the path (shortened: a path of 8,000 characters is shown by its two ends) and the
problem. :func:`os_problem` turns an ``OSError`` met later (a file in the way of a folder, no
permission, a full disk) into the same kind of message.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nbtoolkit.core.errors import NbtError, NbtUsageError

__all__ = ["NAME_MAX", "PATH_MAX", "dangling_link", "os_problem", "path_errors", "shown_path", "user_path"]

#: the longest file name (one path component) and whole path Linux file systems take, in bytes
NAME_MAX = 255
PATH_MAX = 4096
_SHOWN = 120  # characters of a path shown in a message

_HINTS = {
    errno.EACCES: "no permission: choose a place you may read and write, or change its permissions",
    errno.EPERM: "not permitted: choose a place you may read and write",
    errno.EROFS: "the file system is read-only: choose a writable place",
    errno.ENOSPC: "the disk is full: free some space or choose another disk",
    errno.EDQUOT: "the disk quota is exhausted: free some space or choose another disk",
    errno.EEXIST: "a file is in the way (a folder is needed there): choose another path or remove the file",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "it is a folder, where a file is needed: give a file name",
    errno.ENOENT: "no such file or folder: check the path",
    errno.ENAMETOOLONG: "the path or one of its names is too long",
    errno.ELOOP: "symbolic links in the path point at each other: check the path",
}


def shown_path(path: Any, limit: int = _SHOWN) -> str:
    """``path`` for a message: control characters escaped, a long path cut to its two ends."""
    try:
        text = os.fspath(path)
    except TypeError:
        text = str(path)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    if len(text) > limit:
        half = (limit - 1) // 2
        text = f"{text[:half]}…{text[-half:]} ({len(text):,} characters)"
    return text


def user_path(path: Any, *, error: type[NbtError] = NbtUsageError) -> Path:
    """``path`` (text or a path object) with ``~`` expanded, or ``error`` naming what is wrong with it.

    Refused: anything but text or a path object (an NbtUsageError, whatever ``error``), a NUL
    byte (no file name can hold one), ``~user`` of a user this machine does not know (or a home
    directory it cannot find), characters the file system's encoding cannot write, a name longer
    than :data:`NAME_MAX` bytes or a path longer than :data:`PATH_MAX`.
    """
    if not isinstance(path, (str, os.PathLike)):
        got = f"{type(path).__name__} {path!r:.60}"
        raise NbtUsageError(f"expected a path (a str or pathlib.Path), got {got}")
    text = os.fspath(path)
    if isinstance(text, bytes):
        raise error(f"{shown_path(text)}: give the path as text (str or pathlib.Path), not bytes")
    if "\x00" in text:
        raise error(
            f"{shown_path(text)}: the path holds a NUL byte (\\x00), which no file name can hold; "
            "check how the path was built"
        )
    try:
        expanded = Path(text).expanduser()
    except RuntimeError:
        user = text[1:].split("/", 1)[0]
        who = f"no user {user!r} on this machine" if user else "the home directory is unknown here"
        raise error(
            f"{shown_path(text)}: cannot expand '~{user}' ({who}); write the path out in full"
        ) from None
    try:
        encoded = os.fsencode(expanded)
    except UnicodeEncodeError as exc:
        raise error(
            f"{shown_path(text)}: the path holds characters the file system cannot encode ({exc.reason}); "
            "rename the file or give the path in plain text"
        ) from None
    if len(encoded) >= PATH_MAX:
        raise error(
            f"{shown_path(text)}: the path is {len(encoded):,} bytes long; the system takes at most "
            f"{PATH_MAX - 1:,}. Check how it was built (a whole file's text where its name belongs?)"
        )
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise error(
            f"{shown_path(text)}: one name in the path is {len(longest):,} bytes long; a file or folder "
            f"name holds at most {NAME_MAX}. Check the path"
        )
    return expanded


def dangling_link(path: Path) -> str:
    """A message when ``path`` is a symbolic link leading nowhere (or round in a loop), else ""."""
    if path.is_symlink() and not path.exists():
        return f"{shown_path(path)} is a symbolic link that leads nowhere (or to itself): check the path"
    return ""


def os_problem(exc: OSError, path: Any, doing: str) -> str:
    """``cannot <doing> <path>: <reason>; <what to do>`` for an OSError met on ``path``."""
    reason = exc.strerror or type(exc).__name__
    hint = _HINTS.get(exc.errno or -1, "")
    return f"cannot {doing} {shown_path(path)}: {reason}" + (f" ({hint})" if hint else "")


@contextmanager
def path_errors(path: Any, doing: str, *, error: type[NbtError] = NbtUsageError) -> Iterator[None]:
    """Turn an OSError inside the block into ``error`` (:func:`os_problem`'s message)."""
    try:
        yield
    except NbtError:
        raise  # already one clear error (SaveError is an OSError too)
    except OSError as exc:
        raise error(os_problem(exc, path, doing)) from None
