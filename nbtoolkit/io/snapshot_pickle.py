"""The restricted unpickler every snapshot reader uses, and how a pickle it cannot read is reported.

It resolves no global at all: only the pickle opcodes for builtin containers and scalars (dict,
list, tuple, str, bytes, int, float, bool, None) can succeed; a pickle that names any module
attribute (``os.system``, ``builtins.eval``, a torch class...) is refused before anything is
imported or called. Shared by :mod:`nbtoolkit.io.snapshot` (whole files) and
:mod:`nbtoolkit.io.snapshot_stream` (large files, read in bounded memory).
"""

from __future__ import annotations

import pickle
from typing import Any

from nbtoolkit.errors import SnapshotError

__all__ = ["UNPICKLING_ERRORS", "RefusingUnpickler", "corrupt_pickle"]


class RefusingUnpickler(pickle.Unpickler):
    """An unpickler that resolves no global: builtin containers and scalars only."""

    def find_class(self, module: str, name: str) -> Any:
        # Called for GLOBAL/STACK_GLOBAL/INST/OBJ/EXT*: the only way a pickle can reach a
        # callable. Refusing here means REDUCE/BUILD/NEWOBJ have nothing to call.
        raise SnapshotError(f"refused: the pickle tries to load {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError(f"refused: the pickle uses a persistent id ({str(pid)[:60]!r})")


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
