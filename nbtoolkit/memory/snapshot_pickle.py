"""The restricted unpickler every snapshot reader uses, and how a pickle it cannot read is reported.

It resolves no global at all: only the pickle opcodes for builtin containers and scalars (dict,
list, tuple, str, bytes, int, float, bool, None) can succeed; a pickle that names any module
attribute (``os.system``, ``builtins.eval``, a torch class...) is refused before anything is
imported or called. Shared by :mod:`nbtoolkit.memory.snapshot_reader` (whole files and Flight Recorder
dumps) and :mod:`nbtoolkit.memory.snapshot_stream` (large files, read in bounded memory).

The one way around ``find_class``: the extension registry. The EXT1/EXT2/EXT4 opcodes name an
integer code; C's unpickler first looks the code up in ``copyreg._extension_cache`` and, when
some earlier unpickling in this process resolved that code, pushes the cached object (say
``os.system``) without asking ``find_class`` at all, and a following REDUCE calls it. So while
our unpickler runs, that cache is emptied (and refilled afterwards): every EXT opcode then goes
through ``find_class`` (via ``copyreg._inverted_registry``), which refuses it, or names an
unregistered code, which C reports as a corrupt pickle. A lock keeps our own loads from
overlapping. What Python cannot close: another thread of the process that unpickles an EXT
pickle with plain ``pickle.loads`` during our load refills the cache for that code; the load
then refuses its result when it ends, but by then a REDUCE may have run. That needs a second
thread using the extension registry at that moment, which no library we know of does.
"""

from __future__ import annotations

import contextlib
import copyreg
import pickle
import threading
from collections.abc import Iterator
from typing import Any

from nbtoolkit.core.errors import SnapshotError

__all__ = ["UNPICKLING_ERRORS", "RefusingUnpickler", "corrupt_pickle"]


class RefusingUnpickler(pickle.Unpickler):
    """An unpickler that resolves no global: builtin containers and scalars only."""

    def find_class(self, module: str, name: str) -> Any:
        # Called for GLOBAL/STACK_GLOBAL/INST/OBJ/EXT*: the only way a pickle can reach a
        # callable. Refusing here means REDUCE/BUILD/NEWOBJ have nothing to call.
        raise SnapshotError(f"refused: the pickle tries to load {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError(f"refused: the pickle uses a persistent id ({str(pid)[:60]!r})")

    def load(self) -> Any:
        with _extension_cache_emptied() as refilled:
            result = super().load()
            if refilled():
                raise SnapshotError(
                    "refused: the pickle extension cache was filled while the snapshot was read "
                    "(another thread unpickled objects by extension code); read it again"
                )
        return result


_EXTENSION_LOCK = threading.Lock()


@contextlib.contextmanager
def _extension_cache_emptied() -> Iterator[Any]:
    """``copyreg._extension_cache`` empty within the block (restored after); yields a check."""
    cache: dict[int, Any] = copyreg._extension_cache  # type: ignore[attr-defined]
    with _EXTENSION_LOCK:
        saved = dict(cache)
        cache.clear()
        try:
            yield lambda: bool(cache)
        finally:
            cache.clear()
            cache.update(saved)


#: what the C unpickler raises on a corrupt or truncated pickle
UNPICKLING_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    UnicodeDecodeError,
    OverflowError,
    MemoryError,
)


def corrupt_pickle(name: str, exc: BaseException) -> SnapshotError:
    """The error for a snapshot pickle the unpickler could not read."""
    return SnapshotError(
        f"{name} is not a readable memory snapshot (corrupt or truncated pickle: "
        f"{type(exc).__name__}: {exc}); re-dump it with torch.cuda.memory._dump_snapshot()"
    )
