"""A cache folder that is safe to read and write: no symlink is ever followed, no write leaves it.

The trace-summary and snapshot caches live in ``<data folder>/.nbt-cache`` or in a ``cache_dir``
the user names. A data folder may come from someone else (a tarball of traces from a cluster),
and so may a ``.nbt-cache`` inside it. Were links followed, a ``.nbt-cache`` symlink to ``/etc``
shipped with the traces, or a ``cache_dir`` that is one, would make the cache write there, and a
link planted inside the cache (``<key>.summary.json -> /dev/zero``, a FIFO) would hang a read.

The rules, kept by every cache here:

- the cache folder itself must be a real folder, not a symbolic link (missing: it is made);
  otherwise there is no cache this time and the result says why in a note; caching costs speed,
  never the result;
- names inside it are plain file names (no separator, no ``..``);
- files are read with ``O_NOFOLLOW | O_NONBLOCK`` and must be regular files of bounded size;
  a folder (a saved Trace or MemorySnapshot) is read only when everything in it is a regular
  file or folder;
- files are written under a fresh name (``O_CREAT | O_EXCL | O_NOFOLLOW``) and renamed into
  place; folders are written into a fresh ``mkdtemp`` folder and renamed into place; whatever
  was at the final name (a link, a file, an old folder) is removed, never followed.

Nothing here follows a symlink it did not create, and it creates none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "DEFAULT_CACHE_NAME",
    "MAX_CACHED_FILE_BYTES",
    "file_identity",
    "is_plain_folder",
    "read_cached_file",
    "usable_cache_folder",
    "write_cached_file",
    "write_cached_folder",
]

#: the largest single cache file read back (a rank's summary is a few KB; generous for 10^5 steps)
MAX_CACHED_FILE_BYTES = 256 * 1024**2
DEFAULT_CACHE_NAME = ".nbt-cache"  # <folder>/.nbt-cache unless the caller names one (hidden: loaders skip it)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def file_identity(file: Path) -> str:
    """``<name>-<size>-<mtime_ns>``: what a cache entry made from ``file`` is keyed by."""
    st = file.stat()
    return f"{file.name}-{st.st_size}-{st.st_mtime_ns}"


def usable_cache_folder(folder: Path) -> tuple[Path | None, str]:
    """``(folder, "")`` when it is (or could be made) a real folder; else ``(None, why not)``.

    The reason is a phrase for the caller's note ("did not cache: ...").
    """
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            info = os.lstat(folder)
        except OSError as exc:
            return None, f"cannot make the folder {folder}: {exc.strerror or exc}"
    except OSError as exc:
        return None, f"cannot use the folder {folder}: {exc.strerror or exc}"
    if stat.S_ISLNK(info.st_mode):
        return None, (
            f"{folder} is a symbolic link, and a cache never follows a link it did not make (it may "
            "point anywhere): remove it, or pass cache_dir= naming a real folder"
        )
    if not stat.S_ISDIR(info.st_mode):
        return None, f"{folder} is not a folder"
    return folder, ""


def _plain_name(name: str) -> bool:
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and os.sep not in name
        and "\x00" not in name
    )


def read_cached_file(folder: Path, name: str, limit: int = MAX_CACHED_FILE_BYTES) -> bytes | None:
    """The bytes of ``folder/name`` if it is a regular file (not a link) within ``limit``; else None."""
    if not _plain_name(name):
        return None
    try:
        fd = os.open(folder / name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError:
        return None  # missing, a link (ELOOP), unreadable
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_cached_file(folder: Path, name: str, data: bytes) -> None:
    """``data`` into ``folder/name``, written under a fresh name and renamed (raises OSError)."""
    if not _plain_name(name):
        raise OSError(f"not a plain file name: {name!r}")
    tmp = folder / f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, folder / name)  # replaces a link at the name; never writes through it
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_cached_folder(folder: Path, name: str, save: Callable[[Path], object]) -> Path:
    """``save(path)`` into a fresh folder inside ``folder``, then renamed to ``name``; its final path."""
    if not _plain_name(name):
        raise OSError(f"not a plain folder name: {name!r}")
    partial = Path(tempfile.mkdtemp(dir=folder, prefix=f".{name}."))
    target = folder / name
    try:
        os.chmod(partial, 0o755)  # noqa: S103 - mkdtemp's 0o700 would hide a shared cache from its other users
        save(partial)
        _remove(target)
        os.replace(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def is_plain_folder(folder: Path) -> bool:
    """A real folder holding only regular files and real folders (no link, FIFO or device anywhere)."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
        for parent, dirs, files in os.walk(folder, followlinks=False):
            for entry in (*dirs, *files):
                mode = os.lstat(os.path.join(parent, entry)).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    return False
    except OSError:
        return False
    return True


def _remove(path: Path) -> None:
    """Remove what is at ``path`` (a link itself, a file, a folder's tree), following no link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)  # rmtree never follows links inside the tree
    else:
        os.unlink(path)
