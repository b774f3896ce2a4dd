"""Stopping the ranks after Ctrl-C: freeing a rank blocked in a collective, and a new process group.

:meth:`nbtoolkit.cluster.ranks.RankGroup.call` interrupts every rank on Ctrl-C (or after the hang
diagnosis with ``on_hang="interrupt"``) and gives them a grace to stop. A rank still running
after that is nearly always blocked in a collective whose peers stopped; :func:`free_stuck`
ends that wait and has every rank join a new group, keeping the ranks' namespaces:

1. the ranks that stopped leave the process group (``destroy_process_group``), which closes
   gloo's connections when nothing else holds the group;
2. something else often does (a DDP model's reducer, a DeepSpeed engine, an FSDP2 model): then
   every rank cuts its TCP connections to the other ranks (:func:`sever_peer_connections`,
   :mod:`nbtoolkit.cluster.peer_sockets`) and the blocked collective fails at once;
3. all ranks form a new group; what still holds the old one is named to the user
   (:mod:`nbtoolkit.cluster.group_holders`), FSDP2 models are pointed at the new group.

While this runs (seconds), a second Ctrl-C is held off (:func:`interrupts_deferred`): raised in
the middle it would leave some ranks in the old group and some in none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import ClusterError

if TYPE_CHECKING:
    from nbtoolkit.cluster.group_types import OutputCallback, RankGroupLike
    from nbtoolkit.cluster.state import RankCallResult

__all__ = ["free_stuck", "interrupts_deferred", "sever_peer_connections"]

_INTERRUPT_GRACE_S = 5.0  # how long each step waits for the ranks (as RankGroup's grace)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """While the ranks are being stopped, Ctrl-C says to wait instead of raising (main thread only)."""
    import signal
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(_signum: int, _frame: Any) -> None:
        print("nbtoolkit: still stopping the ranks (a few seconds): no need to interrupt again",
              file=sys.stderr)

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)




def free_stuck(
    group: RankGroupLike, refs: dict[Any, int], result: RankCallResult, on_output: OutputCallback | None
) -> None:
    """Free the ranks an interrupt could not stop, then give every rank a fresh process group.

    A rank that does not stop when interrupted is nearly always blocked in a collective
    whose peers did stop (the interrupt reached them in Python code). Gloo fails such a
    wait at once when a peer closes its connections ("Connection closed by peer"), so
    the ranks that stopped leave the process group; the blocked ranks' cells then end
    and all ranks join a new group, keeping their namespaces. (Gloo's own ``abort()`` on
    the blocked rank does not end the wait: measured, it returned only when the peer
    exited.) A rank blocked in something else, such as one long C call, stays stuck.
    """
    import ray

    stuck = list(result.stuck)
    others = [r for r in range(group.world_size) if r not in stuck and group.ranks[r].state != "dead"]
    # Rounds: a blocked rank may wait on peers that are blocked too (gloo's ring: rank 3 waits
    # on ranks 2 and 0, not on rank 1 that stopped). Each round closes the group on the ranks
    # that stopped last; the ranks this frees close theirs in the next round.
    closing, freed = others, []
    pending = {ref: rank for ref, rank in refs.items() if rank in stuck}
    severed = False
    while closing and pending:
        with contextlib.suppress(ClusterError):
            group._get(
                [group.actors[r].shutdown_group.remote() for r in closing],
                _INTERRUPT_GRACE_S,
                "leave the process group",
            )
        if not severed:  # what still holds the group (DDP, DeepSpeed, FSDP2) keeps it open
            severed = True
            sever_peer_connections(group)
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_INTERRUPT_GRACE_S)
        for ref in ready:
            group._collect(ref, pending[ref], result)
        closing = [pending.pop(ref) for ref in ready]
        freed += [r for r in closing if r in result.outcomes]
    result.stuck = [r for r in stuck if r not in freed]
    if result.stuck:
        label = ", ".join(str(r) for r in result.stuck)
        for r in others + freed:
            group.ranks[r].state = "broken"
            group.ranks[r].cause = f"its process group was closed to free rank {label}, which stayed stuck"
    else:
        result.freed = freed
        try:
            rank0 = group._get([group.actors[0].node_info.remote()], group._start_timeout_s, "find a port")
            joined = group._form_process_group(rank0[0])
            result.rebuild = sorted({tuple(h) for j in joined for h in j.get("holders", [])})
            result.rebound = sorted({name for j in joined for name in j.get("rebound", [])})
        except ClusterError as exc:
            result.regroup_error = str(exc)
            for r in others + freed:
                group.ranks[r].state, group.ranks[r].cause = "broken", f"no process group: {exc}"
        else:
            for r in others + freed:
                group.ranks[r].state, group.ranks[r].cause = "idle", None
    if on_output is not None:
        group._flush_outcomes(result, on_output)

def sever_peer_connections(group: RankGroupLike) -> None:
    """Cut the TCP connections between rank processes (:mod:`nbtoolkit.cluster.peer_sockets`).

    Asked of every live rank on its control thread, the blocked ones included: a gloo
    collective fails at once when its connection ends, whoever still holds the group.
    """
    import ray

    live = [r for r in range(group.world_size) if group.ranks[r].state != "dead"]
    refs = {r: group.actors[r].tcp_endpoints.remote() for r in live}
    ray.wait(list(refs.values()), num_returns=len(refs), timeout=_INTERRUPT_GRACE_S)
    endpoints: dict[int, list[tuple[str, int]]] = {}
    for r, ref in refs.items():
        with contextlib.suppress(ray.exceptions.RayError):
            endpoints[r] = [tuple(e) for e in ray.get(ref, timeout=0.01)]
    cuts = [
        group.actors[r].sever_peers.remote([e for o, es in endpoints.items() if o != r for e in es])
        for r in endpoints
    ]
    ray.wait(cuts, num_returns=len(cuts), timeout=_INTERRUPT_GRACE_S)
