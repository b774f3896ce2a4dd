"""Which collective each gloo call on a CPU rank carried out, named as the program asked for it.

gloo annotates its work on its own threads by the algorithm it runs (``gloo:all_gather``,
``gloo:all_reduce``), which is not always the collective the program called: gloo has no
reduce-scatter of its own, so ``reduce_scatter_tensor`` (FSDP2's gradient reduction,
``c10d::_reduce_scatter_base_`` on the calling thread) shows as ``gloo:all_reduce``. Each
gloo call is matched to the call that queued it: the earliest not yet matched ``c10d::`` op
of a compatible kind that started before it (gloo runs its queue in order), and takes that
op's collective name. A gloo call with no such op keeps its own name.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["collective_of_c10d", "gloo_call_collectives"]

#: gloo's algorithm -> the collectives it can carry out
_CARRIES = {"all_reduce": {"all_reduce", "reduce_scatter"}}


def collective_of_c10d(name: str) -> str | None:
    """``c10d::_reduce_scatter_base_`` -> ``reduce_scatter``; None for an op that is no collective."""
    if not name.startswith("c10d::"):
        return None
    core = name.removeprefix("c10d::").strip("_")
    core = re.sub(r"(_base|_into_tensor|_tensor|_coalesced|_)+$", "", core)
    core = {"allgather": "all_gather", "allreduce": "all_reduce", "alltoall": "all_to_all"}.get(core, core)
    return core or None


def gloo_call_collectives(
    gloo_names: np.ndarray, gloo_starts: np.ndarray, c10d_names: np.ndarray, c10d_starts: np.ndarray
) -> list[str]:
    """The collective of each gloo call (``gloo:<algorithm>``), matched as the module docstring says."""
    issued = [(float(t), collective_of_c10d(str(n))) for n, t in zip(c10d_names, c10d_starts, strict=True)]
    issued = sorted((t, c) for t, c in issued if c is not None)
    taken = [False] * len(issued)
    order = np.argsort(gloo_starts, kind="stable")
    out = [str(n).split(":", 1)[-1] for n in gloo_names]
    for i in order:
        algorithm = out[i]
        accepted = _CARRIES.get(algorithm, {algorithm})
        for j, (start, collective) in enumerate(issued):
            if start > gloo_starts[i]:
                break
            if not taken[j] and collective in accepted:
                taken[j] = True
                out[i] = str(collective)
                break
    return out
