"""Opening and reading input files within bounds: regular files only, a limit on the bytes read.

Every reader of nbtoolkit (traces, compile logs, snapshots, memory timelines) opens its files
here, so that a hostile or mistaken path ends in one clear error instead of a hang or an
exhausted machine:

- **Regular files only.** A named pipe blocks ``open()`` until a writer appears; ``/dev/zero``
  never ends; a socket cannot be read at all. The path is ``stat``-ed first and refused unless
  it is a regular file; the file is then opened with ``O_NONBLOCK`` and ``fstat``-ed again, so a
  path swapped for a FIFO between the two calls cannot block either.
- **A limit on the bytes read, after inflation.** A 1 MB gzip can inflate to gigabytes. Every
  reader counts the bytes it takes from the (inflated) stream and stops at the limit with an
  error giving the size reached and the two knobs that raise it: the environment variable
  ``NBT_MAX_READ_BYTES`` (bytes, or text like ``16GiB``) and the reader's ``max_bytes=`` keyword.

The default, 8 GiB, is about four times the largest real per-rank trace we know (long GPU runs
recorded by HolisticTraceAnalysis and TraceLens are a few hundred MB to 2 GB of JSON;
torch.profiler itself struggles to write more), and above any allocator snapshot of a real GPU
(tens to hundreds of MB). It bounds the time a bomb costs (seconds of inflation), not the memory
of real files: traces are streamed a few MB at a time, so their memory is the events kept.

- **The other limits**, on what one part of a file may make a reader hold or do, are listed in
  one table, :data:`LIMITS` (environment variable, default, what it bounds), read with
  :func:`limit`; every error that one of them stops names the variable that raises it.
  Each default is far above any real file we know and far below what would exhaust a laptop.
"""

from __future__ import annotations

import contextlib
import os
import queue
import stat
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nbtoolkit.core.errors import NbtError, NbtUsageError
from nbtoolkit.core.units import format_bytes, parse_bytes

__all__ = [
    "DEFAULT_MAX_READ_BYTES",
    "ENV_MAX_READ_BYTES",
    "LIMITS",
    "CorruptGzip",
    "Limit",
    "check_max_bytes",
    "inflate",
    "json_depth",
    "limit",
    "max_read_bytes",
    "open_regular",
    "read_ahead",
    "read_all",
    "read_chunks",
    "read_limit",
]

ENV_MAX_READ_BYTES = "NBT_MAX_READ_BYTES"
DEFAULT_MAX_READ_BYTES = 8 * 1024**3


@dataclass(frozen=True)
class Limit:
    """One bound on what a file may make a reader do: the variable that raises it, its default."""

    env: str
    default: int
    bytes: bool  # a size (text like 512MiB accepted) rather than a count
    bounds: str  # what it bounds, for the docs and for errors
    most: int | None = None  # the largest value that is safe (above: a usage error)


#: Every limit of the readers, in one place. ``NBT_MAX_READ_BYTES`` (also ``max_bytes=``) and
#: ``NBT_MAX_SNAPSHOT_ROWS`` (also ``max_rows=``) have keywords as well; the others are raised
#: with their environment variable. Errors name the variable (``limit_hint``).
LIMITS: dict[str, Limit] = {
    "read_bytes": Limit(
        ENV_MAX_READ_BYTES, DEFAULT_MAX_READ_BYTES, True, "the bytes read from one file, after inflation"
    ),
    "event_bytes": Limit(
        "NBT_MAX_EVENT_BYTES",
        256 << 20,
        True,
        "the bytes of a trace read without an event boundary (one event, the space between two events, "
        "or the document before its traceEvents list); real events are a few KB",
    ),
    "json_depth": Limit(
        "NBT_MAX_JSON_DEPTH",
        1000,
        False,
        "how deep JSON values may nest (real traces and logs nest fewer than 20 levels)",
        most=10_000,  # deeper, the C decoders would overflow the thread's stack
    ),
    "log_record_bytes": Limit(
        "NBT_MAX_LOG_RECORD_BYTES",
        256 << 20,
        True,
        "the bytes of one compile-log record (its line and its payload lines); real records are at most "
        "a few MB (inductor's output code)",
    ),
    "world_size": Limit(
        "NBT_MAX_WORLD_SIZE",
        1 << 20,
        False,
        "the ranks of one job (rank numbers and world sizes above it are not believed); the largest "
        "jobs have about 100,000",
    ),
    "snapshot_rows": Limit(
        "NBT_MAX_SNAPSHOT_ROWS",
        5_000_000,
        False,
        "the rows a memory snapshot stands for: segments, blocks, trace entries and annotations "
        "(also max_rows=)",
    ),
    "stack_frames": Limit(
        "NBT_MAX_STACK_FRAMES",
        100_000,
        False,
        "the frames of one allocation stack in a memory snapshot (real stacks, C++ and Python, have "
        "hundreds; deep recursion a few thousand)",
    ),
    "stack_text_bytes": Limit(
        "NBT_MAX_STACK_TEXT_BYTES",
        256 << 20,
        True,
        "the text of a memory snapshot's distinct stacks, formatted (each frame's text is also cut "
        "to a few hundred characters)",
    ),
}


def limit(name: str) -> int:
    """The value of limit ``name`` of :data:`LIMITS`: its environment variable, else its default."""
    spec = LIMITS[name]
    text = os.environ.get(spec.env, "").strip()
    if not text:
        return spec.default
    try:
        value = parse_bytes(text, what=spec.env)
    except NbtError:
        value = 0
    if value <= 0 or (not spec.bytes and not text.replace("_", "").isdigit()):
        kind = "a size in bytes or text like 512MiB" if spec.bytes else "a positive whole number"
        raise NbtUsageError(f"{spec.env}={text!r} is not {kind}; it bounds {spec.bounds}")
    if spec.most is not None and value > spec.most:
        raise NbtUsageError(f"{spec.env}={text!r} is over {spec.most:,}, the most that is safe here")
    return value


def limit_hint(name: str, value: int | None = None) -> str:
    """``"NBT_MAX_X=<value>"`` and how to raise it, for an error message."""
    spec = LIMITS[name]
    value = limit(name) if value is None else value
    shown = format_bytes(value) if spec.bytes else f"{value:,}"
    example = f"{spec.env}={_doubled(spec, value)}"
    return f"the limit {spec.env}={shown}; if the file is real, raise it (e.g. {example})"


def _doubled(spec: Limit, value: int) -> str:
    twice = 2 * value if spec.most is None else min(2 * value, spec.most)
    return f"{twice >> 20}MiB" if spec.bytes and twice % (1 << 20) == 0 else str(twice)


@contextlib.contextmanager
def json_depth() -> Iterator[int]:
    """Within the block, JSON decoders may nest ``NBT_MAX_JSON_DEPTH`` levels below the caller.

    msgspec (and Python's json) bound nesting with Python's recursion limit, counted from the
    caller's own depth, so how deep a value may nest would depend on who calls. For the block
    the limit is set to leave exactly the configured depth free, and restored afterwards. It
    is lowered too when it was higher: torch.compile and other libraries raise the process's
    limit (to 2,000 and more), and the configured depth must hold in a notebook that used them.
    A value nested deeper raises RecursionError, which the readers turn into their error
    naming the limit. Yields the limit.
    """
    depth = limit("json_depth")
    frame, here = sys._getframe(), 0
    while frame is not None:
        frame, here = frame.f_back, here + 1  # type: ignore[assignment]
    needed = here + depth + 50
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(needed)
    try:
        yield depth
    finally:
        if sys.getrecursionlimit() == needed:
            sys.setrecursionlimit(old)


def too_deep(path: Path, error: type[NbtError], what: str = "JSON") -> NbtError:
    """The error for a value nested deeper than ``NBT_MAX_JSON_DEPTH``."""
    return error(
        f"{path}: the {what} nests values more than {limit('json_depth'):,} levels deep, over "
        f"{limit_hint('json_depth')}; real files nest fewer than 20 levels, so this one is damaged "
        "or hostile"
    )

# The limit of the reader call in progress (its max_bytes=); None: the environment or the default.
_CALL_LIMIT: ContextVar[int | None] = ContextVar("nbt_max_read_bytes", default=None)


class CorruptGzip(Exception):
    """The gzip stream is truncated or corrupt (its detail is the message); readers word it."""


def check_max_bytes(value: object) -> int | None:
    """``max_bytes=`` as given to a reader: None, or a positive number of bytes (or ``"16GiB"``)."""
    if value is None:
        return None
    limit = parse_bytes(value, what="max_bytes")
    if limit <= 0:
        raise NbtUsageError(f"max_bytes must be a positive number of bytes, got {value!r}")
    return limit


def max_read_bytes() -> int:
    """The limit in force: the reader's ``max_bytes=``, else ``NBT_MAX_READ_BYTES``, else 8 GiB."""
    limit = _CALL_LIMIT.get()
    if limit is not None:
        return limit
    text = os.environ.get(ENV_MAX_READ_BYTES, "").strip()
    if not text:
        return DEFAULT_MAX_READ_BYTES
    try:
        value = parse_bytes(text, what=ENV_MAX_READ_BYTES)
    except NbtError:
        raise NbtUsageError(
            f"{ENV_MAX_READ_BYTES}={text!r} is not a size: give bytes or text like 16GiB"
        ) from None
    if value <= 0:
        raise NbtUsageError(f"{ENV_MAX_READ_BYTES}={text!r} must be a positive size")
    return value


@contextlib.contextmanager
def read_limit(max_bytes: object) -> Iterator[None]:
    """Within the block, readers stop at ``max_bytes`` (None: the environment or the default)."""
    token = _CALL_LIMIT.set(check_max_bytes(max_bytes))
    try:
        yield
    finally:
        _CALL_LIMIT.reset(token)


def _over_limit(path: Path, error: type[NbtError], reached: int, limit: int) -> NbtError:
    return error(
        f"{path}: stopped reading after {format_bytes(reached)} (inflated), over the limit of "
        f"{format_bytes(limit)} per file; real files are far smaller, so this one is likely a "
        f"decompression bomb or not what you meant. If it is real, raise the limit with "
        f"max_bytes= or the environment variable {ENV_MAX_READ_BYTES} (e.g. {ENV_MAX_READ_BYTES}=32GiB)"
    )


def open_regular(path: Path, error: type[NbtError], what: str = "file") -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file; else ``error`` naming why."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise error(f"{path}: no such {what}; check the path") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    _check_regular(path, info.st_mode, error, what)
    try:
        # O_NONBLOCK: had the path become a FIFO since the stat, open() would not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        _check_regular(path, os.fstat(fd).st_mode, error, what)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_regular(path: Path, mode: int, error: type[NbtError], what: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        kind = "a folder"
    elif stat.S_ISFIFO(mode):
        kind = "a named pipe (FIFO), which would block until something writes to it"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "a device, which may never end"
    elif stat.S_ISSOCK(mode):
        kind = "a socket"
    else:
        kind = "not a regular file"
    raise error(f"{path} is {kind}; pass a regular {what} (write the data to a file first)")


def read_chunks(fh: BinaryIO, path: Path, error: type[NbtError], chunk: int) -> Iterator[bytes]:
    """The file's bytes, ``chunk`` at a time, stopping at the read limit with ``error``."""
    limit = max_read_bytes()
    total = 0
    while data := fh.read(chunk):
        total += len(data)
        if total > limit:
            raise _over_limit(path, error, total, limit)
        yield data


def inflate(
    fh: BinaryIO, path: Path, error: type[NbtError], chunk: int, *, limit: int | None = None
) -> Iterator[bytes]:
    """The gzip stream of ``fh`` inflated, ``chunk`` bytes at most at a time, stopping at the limit.

    Several concatenated gzip members are read one after the other, as ``gzip.decompress`` does.
    Raises :class:`CorruptGzip` for a corrupt or truncated stream (the caller words it),
    ``error`` past the limit. ``limit`` is resolved by the caller when this runs in another
    thread (the call's limit lives in the calling thread's context).
    """
    limit = max_read_bytes() if limit is None else limit
    inflater = zlib.decompressobj(wbits=31)
    total = 0
    data = fh.read(1 << 20)
    while data:
        try:
            out = inflater.decompress(data, chunk)
            while True:
                total += len(out)
                if total > limit:
                    raise _over_limit(path, error, total, limit)
                if out:
                    yield out
                if not inflater.unconsumed_tail:
                    break
                out = inflater.decompress(inflater.unconsumed_tail, chunk)
        except zlib.error as exc:
            raise CorruptGzip(str(exc)) from None
        if inflater.eof:  # the end of one gzip member: another may follow (as gzip.decompress reads)
            data = inflater.unused_data or fh.read(1 << 20)
            while data[:1] == b"\0":  # zero padding after a member, which gzip(1) and Python's gzip skip
                data = data.lstrip(b"\0") or fh.read(1 << 20)
            if data:
                inflater = zlib.decompressobj(wbits=31)
        else:
            data = fh.read(1 << 20)
    if not inflater.eof:
        raise CorruptGzip("the stream ends before the end of its data")


def read_all(
    path: Path,
    error: type[NbtError],
    what: str = "file",
    *,
    on_corrupt_gzip: Callable[[str], NbtError] | None = None,
) -> bytes:
    """The whole file (inflated when it starts with the gzip magic), within the read limit."""
    limit = max_read_bytes()
    with open_regular(path, error, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if fh.read(2) == b"\x1f\x8b":
            fh.seek(0)
            try:
                return b"".join(inflate(fh, path, error, 16 << 20, limit=limit))
            except CorruptGzip as exc:
                if on_corrupt_gzip is not None:
                    raise on_corrupt_gzip(str(exc)) from None
                raise error(
                    f"{path}: the gzip stream is truncated or corrupt ({exc}); copy the file again"
                ) from None
        if size > limit:
            raise _over_limit(path, error, size, limit)
        fh.seek(0)
        return b"".join(read_chunks(fh, path, error, 16 << 20))


_DONE = object()


def read_ahead(source: Iterator[bytes]) -> Iterator[bytes]:
    """Run ``source`` in a thread, a few items ahead of the consumer; its exceptions are re-raised here."""
    items: queue.Queue[object] = queue.Queue(maxsize=3)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for piece in source:
                if not put(piece):
                    return
            put(_DONE)
        except BaseException as exc:
            put(exc)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def consume() -> Iterator[bytes]:
        thread = threading.Thread(target=produce, name="nbt-trace-inflate", daemon=True)
        thread.start()
        try:
            while True:
                item = items.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, bytes)
                yield item
        finally:
            stop.set()
            thread.join()

    return consume()
