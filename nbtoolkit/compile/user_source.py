"""Lines of the user's own source, read only where a compile log may safely point us.

A graph break names the file and line of the user's code (``Graph break in user code at
FILE:LINE``), and reports show a few lines around it. That name comes from a log, and a log
may come from someone else's cluster while the report goes to someone else again: read
naively (``linecache``), ``/etc/shadow:2`` puts a secret into the report, a bare ``os.py`` is
looked up along ``sys.path``, a FIFO hangs the kernel and ``/dev/zero`` fills its memory.

So a file is read here only when all of these hold:

- the name is an absolute path ending in ``.py`` (or ``.pyw``): never a lookup along
  ``sys.path``, never a file that is not Python source;
- it resolves (symlinks followed, then checked again) outside ``/proc``, ``/sys`` and ``/dev``,
  to a regular file of at most :data:`MAX_SOURCE_BYTES` (``lstat`` before anything is opened;
  opened with ``O_NONBLOCK`` and ``fstat``-ed again, so a path swapped for a FIFO cannot block);
- it lies under one of the folders the caller allows (:class:`SourcePolicy`).

Who allows what (the defaults):

- a **live capture** (``capture_graphs``, ``%%nbt graphs``) compiled the code in this very
  process, so every file it names is the user's own code here: any such file is allowed, and
  notebook cells come from ``linecache``'s in-memory entries (IPython's and ``%%nbt``'s);
- a **log read from disk** (``load_compile_log``, ``%nbt compile-log``) was recorded
  somewhere else, perhaps by someone else: **no source is read** unless the caller names the
  folders that hold the code (``source_roots=``, ``--source-root``). The report then still has
  the break's file, line and the one source line that torch wrote into the log itself
  (tlparse reads no source at all).
"""

from __future__ import annotations

import linecache
import os
import stat
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_SOURCE_BYTES", "SourcePolicy", "read_source_lines"]

#: the largest source file read for context; real modules are far smaller (torch's largest
#: Python file is about 0.6 MB), and this bounds what a hostile name can make us read.
MAX_SOURCE_BYTES = 2 * 1024**2

_SOURCE_SUFFIXES = (".py", ".pyw")
_PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class SourcePolicy:
    """Which source files context may be read from.

    ``any_file``: every regular Python source file (a live capture: the code ran here).
    ``roots``: otherwise, only files under these folders (resolved when the policy is made).
    ``cells``: also linecache's in-memory entries (notebook cells of this kernel).
    """

    any_file: bool = False
    roots: tuple[str, ...] = ()
    cells: bool = False

    @classmethod
    def live(cls) -> SourcePolicy:
        """Code compiled in this process: its files and this kernel's cells."""
        return cls(any_file=True, cells=True)

    @classmethod
    def from_roots(
        cls, roots: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None
    ) -> SourcePolicy:
        """A log recorded elsewhere: files under ``roots`` only (None or empty: no source at all)."""
        if roots is None:
            return cls()
        if isinstance(roots, (str, os.PathLike)):
            roots = [roots]
        resolved = []
        for root in roots:
            try:
                resolved.append(os.path.realpath(os.path.expanduser(os.fspath(root))))
            except (OSError, ValueError, RuntimeError):
                continue  # an unusable root allows nothing
        return cls(roots=tuple(resolved))

    @property
    def reads_nothing(self) -> bool:
        return not (self.any_file or self.roots or self.cells)

    def allows(self, resolved: str) -> bool:
        if self.any_file:
            return True
        return any(
            resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep) for root in self.roots
        )


def read_source_lines(file: str, policy: SourcePolicy) -> list[str] | None:
    """The lines of ``file`` (with their line ends) if the policy allows reading it, else None."""
    if policy.reads_nothing or not file or "\x00" in file:
        return None
    if policy.cells:
        entry = linecache.cache.get(file)
        # In-memory entries (a notebook cell, %%nbt's cell) have no modification time.
        if entry is not None and len(entry) == 4 and entry[1] is None:
            return list(entry[2])
    if not file.endswith(_SOURCE_SUFFIXES) or not os.path.isabs(file):
        return None
    try:
        os.lstat(file)  # never follows the final link: a missing or odd path stops here
        resolved = os.path.realpath(file)
    except (OSError, ValueError):
        return None
    if not resolved.endswith(_SOURCE_SUFFIXES) or _on_pseudo_filesystem(resolved):
        return None
    if not policy.allows(resolved):
        return None
    return _read_regular(resolved)


def _on_pseudo_filesystem(resolved: str) -> bool:
    return any(resolved == top or resolved.startswith(top + "/") for top in _PSEUDO_FILESYSTEMS)


def _read_regular(resolved: str) -> list[str] | None:
    try:
        if not stat.S_ISREG(os.lstat(resolved).st_mode):
            return None
        flags = (
            os.O_RDONLY
            | getattr(os, "O_NONBLOCK", 0)
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0)
        )
        fd = os.open(resolved, flags)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOURCE_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            data = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        return None
    return _decode(data)


def _decode(data: bytes) -> list[str]:
    """Source bytes as text lines, in the file's declared encoding (PEP 263), never failing."""
    lines = data.splitlines(keepends=True)
    try:
        encoding, _ = tokenize.detect_encoding(iter(lines[:2]).__next__)
    except (SyntaxError, LookupError):
        encoding = "utf-8"
    try:
        text = data.decode(encoding, errors="replace")
    except LookupError:
        text = data.decode("utf-8", errors="replace")
    return text.splitlines(keepends=True)


def describe(policy: SourcePolicy) -> str:
    """One phrase saying where source context came from, for a report's notes."""
    if policy.any_file:
        return "source context read from this process's own files and cells"
    if policy.roots:
        return "source context read only under " + ", ".join(str(Path(r)) for r in policy.roots)
    return "no source context: the log was recorded elsewhere (pass source_roots= to read the code's folders)"
