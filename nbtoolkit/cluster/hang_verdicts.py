"""Why a step stopped: match the ranks' collectives and name the rank, the op and the line at fault.

Algorithm (:func:`hang_verdicts`), per process group in which some rank waits:

1. The *front* is the lowest sequence number ``s`` any rank waits at in that group, and the
   op most of those waiting ranks wait in there (ties: the lowest rank's).
2. Every member of the group is compared with the front:
   - it waits at ``s`` in the same op with the same element count: a partner, fine;
   - it called a different op at ``s``: *reordered* (both wait, in different ops) or
     *mismatched* (it came out of a different op);
   - it called the same op at ``s`` with another element count: *size mismatch* (the
     majority's count is the expected one; "rank 2 sends 4096 elements, the others 8192");
   - it has no call at ``s``: it *skipped* the collective if it finished the cell (or, in a
     Flight Recorder dump, has nothing pending), it is *outside any collective* if it runs
     Python elsewhere (its line says where), it waits in *another process group*, or it is
     dead, unresponsive, or left no dump.
3. When every member waits in the same collective: *waiting together* (the collective itself
   or the network is stuck). When nobody waits: every rank finished (no hang), or some compute
   (a slow step, not a collective hang).

This matches what torch's Flight Recorder analyzer (``fr_trace``) reports for a dump: its
"Not all ranks joining collective, sequence number: s ... missing ranks" is our skipped
collective with the same ``s`` and ranks, its size mismatch our size mismatch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from nbtoolkit.cluster.hang_records import CollectiveCall, HangVerdict, RankHang, user_place

__all__ = ["hang_verdicts"]


def _label(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _wait(ranks: Sequence[int]) -> str:
    """``rank 0 waits`` / ``ranks 0, 2 wait``."""
    return f"{_label(ranks)} {'waits' if len(ranks) == 1 else 'wait'}"


def _at(call: CollectiveCall) -> str:
    return user_place(call.file, call.line, None)


def hang_verdicts(
    ranks: Sequence[RankHang], *, members: Mapping[str, Sequence[int]] | None = None
) -> list[HangVerdict]:
    """The verdicts on ``ranks`` (one :class:`RankHang` each); see the module docstring.

    ``members`` maps a process group to its ranks; a group not in it (or ``members=None``)
    is taken to hold every rank given. :func:`nbtoolkit.cluster.hang.diagnose_hang` wraps them
    in a HangReport.
    """
    by_rank = {r.rank: r for r in ranks}
    verdicts: list[HangVerdict] = []
    waiting = [r for r in ranks if r.current is not None]
    groups = list(dict.fromkeys(r.current.group for r in waiting if r.current is not None))
    for group in groups:
        listed = list(members.get(group, by_rank)) if members else list(by_rank)
        # A rank that waits in the group is a member, whatever a dump's pg_config says.
        waiting_here = [r.rank for r in waiting if r.current is not None and r.current.group == group]
        group_members = sorted(set(listed) | set(waiting_here))
        verdicts += _diagnose_group(group, group_members, by_rank)
    if not waiting:
        verdicts += _nobody_waits(ranks)
    elif not verdicts:
        front = [r.current for r in waiting if r.current is not None]
        verdicts.append(
            HangVerdict(
                kind="waiting together",
                message=f"{_wait([r.rank for r in waiting])} in matching collectives "
                f"({', '.join(sorted({c.label for c in front}))}): every member is there; the "
                "collective is slow, or the network or backend is stuck",
                waiting=tuple(r.rank for r in waiting),
            )
        )
    return verdicts


def _nobody_waits(ranks: Sequence[RankHang]) -> list[HangVerdict]:
    out = [_absent(r, None, ()) for r in ranks if r.state in {"dead", "unresponsive"}]
    computing = [r for r in ranks if r.state == "computing"]
    finished = [r.rank for r in ranks if r.state == "finished"]
    backward = [r for r in computing if r.in_backward] if finished else []
    if backward:  # a training step's gradient reduction that a finished rank never joined
        stuck = [r.rank for r in backward]
        out.append(
            HangVerdict(
                kind="skipped backward",
                message=f"{_label(stuck)} {'waits' if len(stuck) == 1 else 'wait'} in backward at "
                f"{backward[0].place}, where DDP, FSDP and DeepSpeed reduce gradients over the ranks, "
                f"but {_label(finished)} finished the cell without that step",
                culprits=tuple(finished),
                waiting=tuple(stuck),
                line=backward[0].line,
            )
        )
        computing = [r for r in computing if r not in backward]
    if computing:
        where = "; ".join(f"rank {r.rank} at {r.place}" for r in computing)
        out.append(
            HangVerdict(
                kind="computing",
                message=f"no rank waits in a collective: {_label([r.rank for r in computing])} "
                f"run Python outside any collective ({where})",
                culprits=tuple(r.rank for r in computing),
                line=computing[0].line,
            )
        )
    if not out:
        out.append(HangVerdict(kind="no hang", message="no rank waits in a collective: every rank finished"))
    return out


def _call_at(rank: RankHang, group: str, seq: int) -> CollectiveCall | None:
    return next((c for c in rank.calls if c.group == group and c.seq == seq), None)


def _diagnose_group(group: str, members: list[int], by_rank: dict[int, RankHang]) -> list[HangVerdict]:
    current = {
        r: c for r in members if r in by_rank and (c := by_rank[r].current) is not None and c.group == group
    }
    seq = min(c.seq for c in current.values())
    at_front = {r: c for r, c in current.items() if c.seq == seq}
    op = Counter(c.op for _, c in sorted(at_front.items())).most_common(1)[0][0]
    front = next(c for _, c in sorted(at_front.items()) if c.op == op)
    waiting = tuple(sorted(r for r, c in at_front.items() if c.op == op))
    verdicts: list[HangVerdict] = []

    # Same op at the front: do the element counts agree?
    same_op = {
        r: c for r in members if r in by_rank and (c := _call_at(by_rank[r], group, seq)) and c.op == op
    }
    counts = Counter(c.numel for c in same_op.values())
    if len(counts) > 1:
        top = counts.most_common()
        expected = top[0][0] if top[0][1] > top[1][1] else front.numel
        odd = sorted(r for r, c in same_op.items() if c.numel != expected)
        sends = "; ".join(
            f"{_label([r for r in odd if same_op[r].numel == n])} sends {n} elements"
            for n in dict.fromkeys(same_op[r].numel for r in odd)
        )
        others = [r for r in same_op if r not in odd]
        verdicts.append(
            HangVerdict(
                kind="size mismatch",
                message=f"sizes differ in {front.label} [{group}] ({_at(front)}): {sends}, "
                f"{'the others' if len(others) > 1 else _label(others)} {expected}",
                culprits=tuple(odd),
                waiting=waiting,
                op=op,
                seq=seq,
                group=group,
                line=front.line,
            )
        )

    for rank in members:
        if rank in same_op:
            continue
        if rank not in by_rank:
            verdicts.append(
                HangVerdict(
                    kind="no dump",
                    message=f"rank {rank} left no record (no dump file) while {_wait(waiting)} in "
                    f"{front.label} [{group}] ({_at(front)})",
                    culprits=(rank,),
                    waiting=waiting,
                    op=op,
                    seq=seq,
                    group=group,
                )
            )
            continue
        other = _call_at(by_rank[rank], group, seq)
        if other is not None:  # a different op at the same sequence number
            kind = "mismatched collectives" if other.completed else "reordered collectives"
            message = (
                f"collectives called in a different order: #{seq} [{group}] is {op} on {_label(waiting)} "
                f"({_at(front)}) but {other.op} on rank {rank} ({_at(other)})"
                if not other.completed
                else f"rank {rank} completed {other.label} ({_at(other)}) where {_wait(waiting)} in "
                f"{front.label} ({_at(front)}): mismatched collectives"
            )
            verdicts.append(
                HangVerdict(kind, message, (rank,), waiting, op=op, seq=seq, group=group, line=other.line)
            )
            continue
        verdicts.append(_absent(by_rank[rank], front, waiting))
    return _merge_skipped(verdicts)


def _absent(rank: RankHang, front: CollectiveCall | None, waiting: tuple[int, ...]) -> HangVerdict:
    """A rank that has not reached the collective the others wait in: why not."""
    where = f"{front.label} that {_wait(waiting)} in ({_at(front)})" if front else ""

    def verdict(kind: str, message: str, line: int | None = None) -> HangVerdict:
        return HangVerdict(
            kind,
            message,
            (rank.rank,),
            waiting,
            op=front.op if front else None,
            seq=front.seq if front else None,
            group=front.group if front else None,
            line=line,
        )

    if rank.state in {"dead", "unresponsive"}:
        detail = f" ({rank.detail})" if rank.detail else ""
        tail = f", while {_wait(waiting)} for it in {front.label} ({_at(front)})" if front else ""
        kind = "dead rank" if rank.state == "dead" else "unresponsive rank"
        return verdict(kind, f"rank {rank.rank} is {rank.state}{detail}{tail}")
    assert front is not None
    if rank.state == "computing":
        return verdict(
            "outside any collective",
            f"rank {rank.rank} is outside any collective, at {rank.place}, and has not reached {where}",
            rank.line,
        )
    if rank.current is not None:  # waits in a collective of another process group
        other = rank.current
        return verdict(
            "other process group",
            f"rank {rank.rank} waits in {other.label} of process group {other.group} ({_at(other)}) "
            f"instead of {where}",
            other.line,
        )
    done = "finished the cell" if rank.state == "finished" else "has nothing pending"
    last = [c for c in rank.calls if c.group == front.group]
    after = f" (its last: {last[-1].label})" if last and rank.state != "finished" else ""
    return verdict(
        "skipped collective", f"rank {rank.rank} {done}{after} without entering {where}", front.line
    )


def _merge_skipped(verdicts: list[HangVerdict]) -> list[HangVerdict]:
    """Ranks that skipped the same collective in the same way read as one sentence."""

    def rest(v: HangVerdict) -> str:  # the message after "rank 1 " / "ranks 1, 2 "
        return v.message[len(_label(v.culprits)) + 1 :]

    merged: list[HangVerdict] = []
    for verdict in verdicts:
        index = next(
            (
                i
                for i, m in enumerate(merged)
                if m.kind == verdict.kind == "skipped collective" and rest(m) == rest(verdict)
            ),
            None,
        )
        if index is None:
            merged.append(verdict)
            continue
        twin = merged[index]
        culprits = tuple(sorted(twin.culprits + verdict.culprits))
        merged[index] = HangVerdict(
            twin.kind,
            f"{_label(culprits)} {rest(twin)}",
            culprits,
            twin.waiting,
            twin.op,
            twin.seq,
            twin.group,
            twin.line,
        )
    return merged
