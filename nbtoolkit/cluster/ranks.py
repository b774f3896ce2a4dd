"""The rank workers: one Ray actor per rank in a placement group, one torch.distributed group.

:class:`RankGroup` starts the actors, wires the process group (rank 0's node and a free
port on it are the rendezvous), sends calls to every rank, and waits for them with three
duties while it waits:

- stream each rank's output as it is printed (polling the actors' control thread, only
  once a call has taken longer than the first short wait, so empty cells stay fast);
- notice a rank that died (its actor raises ``RayActorError``): give the other ranks a
  short grace to fail on their own (gloo notices a closed peer at once; otherwise the
  collective timeout applies), interrupt those still running, and report which rank died
  and why;
- forward Ctrl-C: ``KeyboardInterrupt`` in the notebook interrupts the call on every rank;
  a rank still blocked in a collective after that is freed, and all ranks then join a new
  group (:mod:`nbtoolkit.cluster.freeing`, which also holds off a second Ctrl-C meanwhile).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.group_types import OutputCallback, RankProcess
from nbtoolkit.cluster.state import RankCallResult, RankFailure
from nbtoolkit.core.errors import ClusterError

if TYPE_CHECKING:
    from nbtoolkit.cluster.hang import HangReport
    from nbtoolkit.cluster.hang_watch import StallWatch

__all__ = ["RankGroup"]


_FIRST_WAIT_S = 0.05  # an empty cell comes back within this: no polling at all
_POLL_S = 0.2  # then poll output this often
_DEAD_RANK_GRACE_S = 5.0  # after a rank dies, how long the others get to fail on their own
_INTERRUPT_GRACE_S = 5.0  # after an interrupt, how long ranks get to stop


def _actor_class() -> Any:
    import ray

    from nbtoolkit.cluster.rank_actor import RankActor

    make_actor = ray.remote(concurrency_groups={"control": 1})  # type: ignore[call-overload]  # stubs lag
    return make_actor(_with_control_group(RankActor))


def _with_control_group(cls: type) -> type:
    """A subclass whose control methods run in the ``control`` concurrency group."""
    import ray

    namespace: dict[str, Any] = {}
    for name in ("take_output", "state", "interrupt", "poll", "hang_state", "tcp_endpoints", "sever_peers"):
        method = getattr(cls, name)

        def make(method: Any) -> Any:
            def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
                return method(self, *args, **kwargs)

            forward.__name__ = method.__name__
            return ray.method(concurrency_group="control")(forward)

        namespace[name] = make(method)
    return type("RankWorker", (cls,), namespace)


def _death_cause(exc: BaseException) -> str:
    """A short reason from Ray's long actor-death message (pid and the worker's exit detail)."""
    import re

    text = " ".join(str(exc).split())
    pid = re.search(r"\bpid: (\d+)", text)
    detail = re.search(r"Worker exit detail: (.*?)(?: Some common causes|$)", text)
    if detail:
        reason = detail.group(1).strip()
    elif "killed" in text or "ray.kill" in text:
        reason = "it was killed"
    else:
        reason = text[:300] + ("…" if len(text) > 300 else "")
    where = f" (pid {pid.group(1)})" if pid else ""
    return f"its worker process{where} exited: {reason}"


def _rank_info(rank: int, info: dict[str, Any]) -> RankProcess:
    return RankProcess(
        rank=rank,
        pid=info["pid"],
        host=info["host"],
        ip=info["ip"],
        gpu_ids=info["gpu_ids"],
        node_id=info.get("node_id", ""),
    )


class RankGroup:
    """N rank actors forming one torch.distributed group."""

    #: The diagnosis of the last stall (or Ctrl-C) of a cell, for ``Cluster.hang_report()``.
    last_hang_report: HangReport | None = None

    def __init__(
        self,
        world_size: int,
        *,
        use_gpus: bool,
        collective_timeout_s: float,
        start_timeout_s: float,
        strategy: str = "pack",
        name: str | None = None,
    ) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from nbtoolkit.cluster.placement import place_bundles, rank_actor_name

        self.world_size = world_size
        self.backend = "nccl" if use_gpus else "gloo"
        self.collective_timeout_s = collective_timeout_s
        self._start_timeout_s = start_timeout_s
        bundle: dict[str, float] = {"CPU": 1.0}
        if use_gpus:
            bundle["GPU"] = 1.0
        self._pg: Any = None
        self.actors: list[Any] = []
        try:  # whatever stops the start (Ctrl-C included) frees what was placed: the next start has room
            self._pg = place_bundles(
                world_size, bundle, strategy=strategy, name=name, timeout_s=start_timeout_s
            )
            actor_cls = _actor_class()

            def named(rank: int) -> dict[str, str]:
                # Named ranks are detached: they outlive this process (a kernel restart re-attaches).
                return {"name": rank_actor_name(name, rank), "lifetime": "detached"} if name else {}

            self.actors = [
                actor_cls.options(
                    num_cpus=1,
                    num_gpus=1 if use_gpus else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._pg, placement_group_bundle_index=rank
                    ),
                    max_restarts=0,
                    max_task_retries=0,
                    **named(rank),
                ).remote(rank, world_size)
                for rank in range(world_size)
            ]
            infos = self._get([a.node_info.remote() for a in self.actors], start_timeout_s, "start")
            self.ranks = [_rank_info(r, i) for r, i in enumerate(infos)]
            self._form_process_group(infos[0])
        except BaseException:
            self.kill()
            raise

    @classmethod
    def attach(cls, actors: list[Any], placement: Any, *, start_timeout_s: float) -> RankGroup:
        """The group of rank actors that a previous process started (named ranks), as they are."""
        group = cls.__new__(cls)
        group.actors, group._pg, group._start_timeout_s = actors, placement, start_timeout_s
        group.world_size = len(actors)
        infos = group._get([a.node_info.remote() for a in actors], start_timeout_s, "answer")
        states = group._get([a.state.remote() for a in actors], start_timeout_s, "answer")
        group.ranks = [_rank_info(r, i) for r, i in enumerate(infos)]
        group.backend = states[0]["backend"] or "gloo"
        group.collective_timeout_s = float(states[0].get("collective_timeout_s") or 0)
        group.master = states[0].get("master")
        for info, state in zip(group.ranks, states, strict=True):
            if state.get("busy_s") is not None:
                info.state = "busy"  # still running a cell the previous kernel started
        return group

    def _form_process_group(self, rank0_info: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank joins one torch.distributed group; rendezvous on rank 0's node and free port."""
        master_addr, master_port = rank0_info["ip"], rank0_info["free_port"]
        hosts = {info.ip for info in self.ranks}
        if len(hosts) > 1 and master_addr.startswith("127."):
            raise ClusterError(
                f"rank 0's node calls itself {master_addr}, which ranks on the other nodes ({sorted(hosts)}) "
                "cannot reach: start that node's Ray with --node-ip-address set to an address they reach"
            )
        joined = self._get(
            [
                a.setup_process_group.remote(
                    master_addr, master_port, self.backend, self.collective_timeout_s
                )
                for a in self.actors
            ],
            self._start_timeout_s,
            "join the torch.distributed group",
        )
        self.master = f"{master_addr}:{master_port}"
        return joined

    def _get(self, refs: list[Any], timeout_s: float, what: str) -> list[Any]:
        import ray

        _ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if pending:
            raise ClusterError(
                f"{len(pending)} of {len(refs)} ranks did not {what} within {timeout_s:.0f} s: "
                "the cluster may be overloaded; try again or ask for fewer ranks"
            )
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayActorError as exc:
            raise ClusterError(f"a rank died while trying to {what}: {_death_cause(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            raise ClusterError(f"a rank failed to {what}: {exc.cause!r}") from None

    # ---- calls ----
    def check_usable(self, ranks: Sequence[int]) -> None:
        bad = [r for r in ranks if self.ranks[r].state in {"dead", "broken"}]
        if bad:
            why = "; ".join(f"rank {r} is {self.ranks[r].state}: {self.ranks[r].cause}" for r in bad)
            raise ClusterError(f"{why}. Run cluster.restart() (or `%nbt cluster restart`) for fresh ranks.")

    def call(
        self,
        ranks: Sequence[int],
        method: str,
        *args: Any,
        on_output: OutputCallback | None = None,
        watch: StallWatch | None = None,
    ) -> RankCallResult:
        """Call ``method(*args)`` on each of ``ranks`` and wait for all, streaming output.

        ``watch`` (a :class:`~nbtoolkit.cluster.hang_watch.StallWatch`) diagnoses a stall.
        """
        self.check_usable(ranks)
        refs = {getattr(self.actors[r], method).remote(*args): r for r in ranks}
        result = RankCallResult()
        for r in ranks:
            self.ranks[r].state = "busy"
        try:
            self._wait(refs, result, on_output, watch)
        except KeyboardInterrupt as exc:
            from nbtoolkit.cluster.freeing import free_stuck, interrupts_deferred
            from nbtoolkit.cluster.hang_watch import StopOnHang, note_interrupt

            # Stopping takes seconds (the grace, freeing, a new group): a second Ctrl-C meanwhile
            # must not leave the ranks half stopped, some in the old group and some in none.
            with interrupts_deferred():
                if isinstance(exc, StopOnHang):
                    result.interrupt_reason = "after the hang diagnosis"
                else:  # where each rank was when the user pressed Ctrl-C: for hang_report() after
                    note_interrupt(self)
                result.interrupted = True
                gone = {f.rank for f in result.dead}
                running = [r for r in refs.values() if r not in result.outcomes and r not in gone]
                result.interrupted_ranks = sorted(set(result.interrupted_ranks) | set(running))
                self._interrupt(running)
                self._wait_after(refs, result, on_output, _INTERRUPT_GRACE_S)
                if result.stuck and not result.dead:
                    free_stuck(self, refs, result, on_output)
        finally:
            for r in ranks:
                if self.ranks[r].state == "busy":
                    self.ranks[r].state = "idle" if r not in result.stuck else "busy"
        if result.dead:
            # The survivors' process group has lost a member: collectives can no longer work.
            dead = ", ".join(str(f.rank) for f in result.dead)
            for info in self.ranks:
                if info.state not in {"dead"}:
                    info.state, info.cause = "broken", f"its process group lost rank {dead}"
        return result

    def _wait(
        self,
        refs: dict[Any, int],
        result: RankCallResult,
        on_output: OutputCallback | None,
        watch: StallWatch | None = None,
    ) -> None:
        import ray

        pending = list(refs)
        # Fast path, one round trip (what an empty cell costs, most over Ray Client): every
        # rank answers within the first short wait. Anything else goes through the loop.
        try:
            values = ray.get(pending, timeout=_FIRST_WAIT_S)
        except ray.exceptions.RayError:  # GetTimeoutError (still running), or a rank failed
            pass
        else:
            for ref, value in zip(pending, values, strict=True):
                result.outcomes[refs[ref]] = value
            pending = []
        timeout = _FIRST_WAIT_S
        dead_since: float | None = None
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=timeout)
            self._collect_ready(ready, refs, result)
            if not pending:
                break
            if ready and on_output is not None:  # a rank that finished shows its output now, not at the end
                self._flush_outcomes(result, on_output)
            if result.dead:
                if dead_since is None:
                    dead_since = time.monotonic()
                elif time.monotonic() - dead_since > _DEAD_RANK_GRACE_S:
                    # The others are waiting on the dead rank: stop them now.
                    result.interrupted_ranks = sorted({refs[ref] for ref in pending})
                    died = ", ".join(str(f.rank) for f in result.dead)
                    result.interrupt_reason = f"after rank {died} died"
                    self._interrupt([refs[ref] for ref in pending])
                    self._wait_after(
                        {ref: refs[ref] for ref in pending}, result, on_output, _INTERRUPT_GRACE_S
                    )
                    return
            if watch is not None:
                for ref in ready:
                    watch.finished(refs[ref])
            if on_output is not None or watch is not None:
                self._stream([refs[ref] for ref in pending], on_output, watch)
            if watch is not None:
                watch.check(self)
            timeout = _POLL_S
        if on_output is not None:
            self._flush_outcomes(result, on_output)

    def _wait_after(
        self, refs: dict[Any, int], result: RankCallResult, on_output: OutputCallback | None, grace_s: float
    ) -> None:
        import ray

        pending = [
            ref
            for ref, r in refs.items()
            if r not in result.outcomes and r not in {f.rank for f in result.dead}
        ]
        if pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=grace_s)
            for ref in ready:
                self._collect(ref, refs[ref], result)
        for ref in pending:
            rank = refs[ref]
            result.stuck.append(rank)
            self.ranks[rank].state, self.ranks[rank].cause = "broken", "did not stop when interrupted"
        if on_output is not None:
            self._flush_outcomes(result, on_output)

    def _collect_ready(self, ready: list[Any], refs: dict[Any, int], result: RankCallResult) -> None:
        """Collect finished calls in one ``ray.get`` (one round trip: over Ray Client each costs ~5 ms)."""
        import ray

        if not ready:
            return
        try:
            values = ray.get(ready)
        except ray.exceptions.RayError:  # a rank died or our code failed: sort it out rank by rank
            for ref in ready:
                self._collect(ref, refs[ref], result)
            return
        for ref, value in zip(ready, values, strict=True):
            result.outcomes[refs[ref]] = value

    def _collect(self, ref: Any, rank: int, result: RankCallResult) -> None:
        import ray

        try:
            result.outcomes[rank] = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            where = self.ranks[rank]
            cause = f"{_death_cause(exc)} [on node {where.host} ({where.ip})]"
            result.dead.append(RankFailure(rank=rank, cause=cause))
            self.ranks[rank].state, self.ranks[rank].cause = "dead", cause
        except ray.exceptions.RayTaskError as exc:  # our actor code failed (not the user's cell)
            result.outcomes[rank] = {
                "rank": rank,
                "value": None,
                "error": str(exc),
                "output": [],
                "elapsed_s": 0.0,
            }
        except ray.exceptions.RayError as exc:  # the value came but cannot be unpickled here
            cause = str(exc).strip().splitlines()[0].removeprefix("System error: ")
            result.outcomes[rank] = {
                "rank": rank,
                "value": None,
                "error": f"the cell's value pickled on rank {rank} but cannot be unpickled in the notebook "
                f"({cause}): return plain data (numbers, strings, lists, tensors), or repr(value)",
                "output": [],
                "elapsed_s": 0.0,
            }

    def _stream(
        self, ranks: list[int], on_output: OutputCallback | None, watch: StallWatch | None = None
    ) -> None:
        """Pass on what the ranks printed; tell the watch who made progress."""
        import ray

        refs = {self.actors[r].poll.remote(): r for r in ranks if self.ranks[r].state != "dead"}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=2.0)
        for ref in ready:
            try:
                polled = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # the rank died meanwhile; its main call reports it
            if watch is not None:
                watch.observe(refs[ref], polled.get("completed"), bool(polled["output"]))
            for stream, text in polled["output"]:
                if on_output is not None:
                    on_output(refs[ref], stream, text)

    def _flush_outcomes(self, result: RankCallResult, on_output: OutputCallback) -> None:
        for rank in sorted(result.outcomes):
            outcome = result.outcomes[rank]
            for stream, text in outcome.get("output", []):
                on_output(rank, stream, text)
            outcome["output"] = []

    def _interrupt(self, ranks: list[int]) -> None:
        import ray

        refs = [self.actors[r].interrupt.remote() for r in ranks if self.ranks[r].state != "dead"]
        ray.wait(refs, num_returns=len(refs), timeout=2.0)

    # ---- status and teardown ----
    def states(self, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        """Each rank's live state (asked on its control thread, so it answers while busy)."""
        import ray

        refs = {r: a.state.remote() for r, a in enumerate(self.actors) if self.ranks[r].state != "dead"}
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        rows = []
        for info in self.ranks:
            live: dict[str, Any] = {}
            ref = refs.get(info.rank)
            if ref is not None:
                try:
                    live = ray.get(ref, timeout=0.01)
                except ray.exceptions.RayActorError as exc:
                    info.state, info.cause = "dead", _death_cause(exc)
                except ray.exceptions.GetTimeoutError:
                    live = {"busy_s": None, "unresponsive": True}
            rows.append({"info": info, "live": live})
        return rows

    def kill(self) -> None:
        """Kill every rank actor and free the placement group (no graceful wait)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in getattr(self, "actors", []):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: S112 - an actor already gone is what we want
                continue
        with contextlib.suppress(Exception):  # a group already removed (cluster gone) is fine
            remove_placement_group(self._pg)
        for info in getattr(self, "ranks", []):
            info.state, info.cause = "dead", "stopped"
