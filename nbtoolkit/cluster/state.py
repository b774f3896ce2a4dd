"""What the cluster gives back, as plain data: results of a call on the ranks, status, fetched files.

:class:`nbtoolkit.cluster.cluster.Cluster` produces these; they live apart from it (and import
nothing of Ray) so that figures, magics and reports can show them without importing the Ray side.
Everything shown comes from the ranks (values, tracebacks, hostnames, causes) and is escaped in HTML.

The cluster's defaults are declared here, once: the magics and ``Cluster`` both read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtoolkit.core.errors import RemoteCellError
from nbtoolkit.core.measure_config import DEFAULT_STEPS
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes

__all__ = [
    "CLUSTER_ACTIONS",
    "COLLECTIVE_TIMEOUT_S",
    "DEFAULT_RANKS",
    "PROFILE_STEPS",
    "START_TIMEOUT_S",
    "ClusterStatus",
    "FetchedFiles",
    "RankCallResult",
    "RankFailure",
    "RemoteRun",
    "rank_label",
]

#: What ``cluster_command`` (``%nbt cluster ACTION``) can do.
CLUSTER_ACTIONS = ("start", "connect", "status", "stop", "restart", "why")
#: Ranks of a local cluster when no number is given (``%nbt cluster start``, ``Cluster.local()``).
DEFAULT_RANKS = 2
#: How ranks are placed over nodes (Ray's placement-group strategies, lower case).
PLACEMENT_STRATEGIES = ("pack", "spread", "strict_pack", "strict_spread")
#: How long a rank waits for a dead or stuck peer in a collective before it fails.
COLLECTIVE_TIMEOUT_S = 120.0
#: How long starting the rank workers (placement, process group) may take.
START_TIMEOUT_S = 120.0
#: Recorded runs of the step when a cell is profiled on the ranks.
PROFILE_STEPS = DEFAULT_STEPS

#: After a new process group formed, what to do with a rank variable built on the old one (by kind).
REBUILD_HINTS = {
    "DistributedDataParallel": "wrap its module again, {name} = DDP({name}.module)",
    "DeepSpeedEngine": "call deepspeed.initialize again with model={name}.module",
    "ProcessGroup": "make it again with dist.new_group(...)",
    "DeviceMesh": "make it again with init_device_mesh(...)",
    "FSDP2 model": "build the model again and call fully_shard on it",
}

_SHORT_REPR_CHARS = 2000
_STATE_COLOURS = {
    "idle": "#2e7d32",
    "busy": "#1565c0",
    "dead": "#c62828",
    "broken": "#ef6c00",
    "unresponsive": "#ef6c00",
}


@dataclass
class RankFailure:
    """A rank whose actor died (not a Python exception in the cell: the process is gone)."""

    rank: int
    cause: str


@dataclass
class RankCallResult:
    """Raw results of one call on several ranks, as the rank group collected them."""

    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> outcome dict
    dead: list[RankFailure] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)  # ranks that did not stop when asked
    freed: list[int] = field(default_factory=list)  # stuck ranks freed by closing the process group
    regroup_error: str | None = None  # why no new process group could be formed after freeing them
    rebuild: list[tuple[str, str]] = field(default_factory=list)  # (variable, kind) still on the old group
    rebound: list[str] = field(default_factory=list)  # DDP variables moved to the new group for the user
    interrupted: bool = False
    interrupt_reason: str = "Ctrl-C"  # what interrupted the call (the hang detector's stop says so)
    interrupted_ranks: list[int] = field(default_factory=list)  # ranks still running when it came


def rank_label(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0, 1``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _group_tracebacks(errors: dict[int, str]) -> list[tuple[list[int], str]]:
    """Ranks that failed with the same traceback share one entry (shown once)."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(errors):
        groups.setdefault(errors[rank], []).append(rank)
    return [(ranks, text) for text, ranks in groups.items()]


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHORT_REPR_CHARS else text[:_SHORT_REPR_CHARS] + "…"


class RemoteRun(Result):
    """What one call on the ranks gave back: values, errors, deaths, timings."""

    def __init__(self, ranks: list[int], raw: RankCallResult) -> None:
        self.ranks = ranks
        self.values: dict[int, Any] = {}
        self.errors: dict[int, str] = {}
        self.elapsed_s: dict[int, float] = {}
        for rank, outcome in raw.outcomes.items():
            self.values[rank] = outcome.get("value")
            self.elapsed_s[rank] = float(outcome.get("elapsed_s", 0.0))
            if outcome.get("error"):
                self.errors[rank] = str(outcome["error"])
        self.dead = {f.rank: f.cause for f in raw.dead}
        self.stuck = list(raw.stuck)
        self.freed = list(raw.freed)
        self.regroup_error = raw.regroup_error
        self.interrupted = raw.interrupted
        self.interrupt_reason = raw.interrupt_reason
        self.rebuild = [tuple(h) for h in raw.rebuild]
        self.rebound = list(raw.rebound)
        # A rank the interrupt reached before it finished: its error is the interrupt (or, for a
        # rank freed from a collective, the closed connection), not a failure of its own.
        sent = set(raw.interrupted_ranks or (ranks if raw.interrupted else ()))
        self.interrupted_ranks = sorted(
            r for r in sent
            if r not in self.stuck
            and (r in self.freed or (r in self.errors and self.errors[r].startswith("KeyboardInterrupt")))
        )

    @property
    def ok(self) -> bool:
        return not (self.errors or self.dead or self.stuck or self.interrupted)

    @property
    def has_values(self) -> bool:
        """True when at least one rank gave back a value (a cell ending in an expression)."""
        return any(v is not None for v in self.values.values())

    def value_list(self) -> list[Any]:
        """The values in rank order (None for a rank that failed)."""
        return [self.values.get(r) for r in self.ranks]

    def failure_text(self) -> str:
        """What went wrong, in words: which ranks finished, were interrupted, failed or died; then tracebacks.

        Each rank is named once, under exactly one of: finished, interrupted, failed, died.
        """
        interrupted = [r for r in self.interrupted_ranks if r not in self.dead]
        failed = [r for r in sorted(self.errors) if r not in interrupted and r not in self.dead]
        finished = [
            r for r in self.ranks
            if r in self.values and r not in self.errors and r not in self.dead and r not in self.stuck
        ]
        eventful = bool(self.interrupted or interrupted or self.dead or self.stuck)
        parts = []
        if interrupted or (self.interrupted and not failed and not self.dead and not self.stuck):
            parts.append(
                f"interrupted ({self.interrupt_reason}) on {rank_label(interrupted)}"
                if interrupted
                else f"interrupted ({self.interrupt_reason}) after every rank had ended"
            )
        if failed and eventful:  # a plain failure: the tracebacks below name the ranks
            parts.append(f"failed on {rank_label(failed)}")
        if finished and eventful:
            parts.append(f"finished on {rank_label(finished)}")
        if self.dead:
            deaths = "; ".join(f"rank {r} died: {cause}" for r, cause in sorted(self.dead.items()))
            parts.append(
                deaths + ". Its process is gone and the process group is broken: run "
                "cluster.restart() (or `%nbt cluster restart`) for fresh ranks"
            )
        if self.freed and self.regroup_error:
            parts.append(
                f"{rank_label(self.freed)} kept waiting in a collective for ranks that had stopped; "
                "nbtoolkit closed the process group to free it, but forming a new one failed "
                f"({self.regroup_error}): run cluster.restart() for fresh ranks"
            )
        elif self.freed:
            parts.append(
                f"{rank_label(self.freed)} kept waiting in a collective for ranks that had stopped; "
                "nbtoolkit closed the process group to free it and formed a new one. Every rank kept "
                "its variables" + self._rebuild_text()
            )
        if self.stuck:
            parts.append(
                f"{rank_label(self.stuck)} did not stop: blocked in a collective until its timeout, or "
                "in one long call (C code) until it returns; run cluster.restart() for fresh ranks"
            )
        bad = sorted(set(failed) | set(self.dead) | set(self.stuck))
        if bad:
            head = f"the cell failed on {len(bad)} of {len(self.ranks)} ranks"
        elif self.interrupted:
            head = "the cell was stopped"
        else:
            head = "the cell stopped"
        lines = [head + (": " + "; ".join(parts) if parts else "")]
        for ranks, text in _group_tracebacks(self.errors):
            lines.append(f"--- {rank_label(ranks)} ---")
            lines.append(text)
        return "\n".join(lines)

    def _rebuild_text(self) -> str:
        """What the user must build again after a new group formed (named by the ranks), or nothing."""
        moved = ""
        if self.rebound:
            names = ", ".join(repr(name) for name in self.rebound)
            plural = "s" if len(self.rebound) > 1 else ""
            moved = f"; nbtoolkit moved the DDP model{plural} {names} to the new group"
        return moved + self._left_text()

    def _left_text(self) -> str:
        if not self.rebuild:
            return (
                "; none of them needs building again (a DDP model or a subgroup kept inside a list or "
                "an object would: it must be built again)"
            )
        named = "; ".join(
            f"{name} ({kind}): " + REBUILD_HINTS.get(kind, "build it again").format(name=name)
            for name, kind in self.rebuild
        )
        return f", but these were built on the old group and would fail at their next collective: {named}"

    def raise_for_errors(self) -> None:
        """Raise :class:`~nbtoolkit.core.errors.RemoteCellError` if any rank failed, died or was
        interrupted."""
        if not self.ok:
            raise RemoteCellError(self)

    def _text(self) -> str:
        lines = []
        for rank in self.ranks:
            if rank in self.dead:
                lines.append(f"[rank {rank}] died: {self.dead[rank]}")
            elif rank in self.errors:
                lines.append(f"[rank {rank}] error: {self.errors[rank].splitlines()[-1]}")
            elif self.values.get(rank) is not None:
                lines.append(f"[rank {rank}] {_short_repr(self.values[rank])}")
        return "\n".join(lines) or f"ran on {rank_label(self.ranks)}: no values"

    def _html(self) -> str:
        """One block per rank: its value (repr), or its error's traceback, or how it died."""
        blocks = []
        for rank in self.ranks:
            if rank in self.dead:
                body = f"<span style='color:#c62828'>died: {escape(self.dead[rank])}</span>"
            elif rank in self.errors:
                body = f"<pre style='color:#c62828;margin:0'>{escape(self.errors[rank])}</pre>"
            elif self.values.get(rank) is not None:
                body = f"<pre style='margin:0'>{escape(_short_repr(self.values[rank]))}</pre>"
            else:
                continue
            blocks.append(
                "<div style='display:flex;gap:.5em'>"
                f"<b style='white-space:nowrap'>[rank {rank}]</b>{body}</div>"
            )
        return "<div class='nbt-remote'>" + "".join(blocks) + "</div>" if blocks else escape(self._text())


class ClusterStatus(Result):
    """A snapshot of the cluster: address, backend, and one row per rank."""

    def __init__(self, header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        self.header = header
        self.rows = rows

    def frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows)

    def _text(self) -> str:
        h = self.header
        lines = [
            f"Cluster at {h['address']} ({h['origin']}): {h['world_size']} ranks, backend {h['backend']}"
            + (f", master {h['master']}" if h.get("master") else ""),
        ]
        for row in self.rows:
            extra = f" — {row['cause']}" if row.get("cause") else ""
            busy = f", busy for {row['busy_s']:.1f} s" if row.get("busy_s") else ""
            # Ranks on several nodes: say which node each is on (its host name and address).
            several = h.get("nodes", 1) > 1 and row.get("node")
            where = f"node {row['node']} {row['ip']}" if several else row["ip"]
            lines.append(
                f"  rank {row['rank']}: {row['state']} (pid {row['pid']}, {where}, {row['device']}, "
                f"{row['cells_run']} cells run{busy}){extra}"
            )
        return "\n".join(lines)

    def _html(self) -> str:
        """A header line and a table with one row per rank, its state coloured."""
        h = self.header
        head = (
            f"<p><b>Cluster</b> at <code>{escape(h['address'])}</code> ({escape(h['origin'])}): "
            f"{h['world_size']} ranks, backend <code>{escape(h['backend'])}</code>"
            + (f", master <code>{escape(h['master'])}</code>" if h.get("master") else "")
            + "</p>"
        )
        where_col = "node ip" if h.get("nodes", 1) > 1 else "ip"
        cols = ["rank", "state", "pid", where_col, "device", "cells run", "busy", "cause"]
        rows = []
        for row in self.rows:
            colour = _STATE_COLOURS.get(row["state"], "#555")
            busy = f"{row['busy_s']:.1f} s" if row.get("busy_s") else ""
            several = h.get("nodes", 1) > 1 and row.get("node")
            where = f"{row['node']} {row['ip']}" if several else row["ip"]
            cells = [
                f"<td>{row['rank']}</td>",
                f"<td style='color:{colour};font-weight:bold'>{escape(row['state'])}</td>",
                f"<td>{row['pid']}</td>",
                f"<td>{escape(where)}</td>",
                f"<td>{escape(row['device'])}</td>",
                f"<td style='text-align:right'>{row['cells_run']}</td>",
                f"<td style='text-align:right'>{busy}</td>",
                f"<td>{escape(row.get('cause') or '')}</td>",
            ]
            rows.append("<tr>" + "".join(cells) + "</tr>")
        table = (
            "<table class='nbt-table'><thead><tr>"
            + "".join(f"<th>{c}</th>" for c in cols)
            + "</tr></thead><tbody>"
            + "".join(rows)
            + "</tbody></table>"
        )
        return head + table


class FetchedFiles(Result, list[Path]):
    """The local copies of files fetched from the ranks: a sorted list of paths, with a summary.

    It is a plain ``list`` of :class:`~pathlib.Path` (index it, iterate it, pass it on); it shows
    how many files came back, their total size and the folder they are in.
    """

    def __init__(self, paths: list[Path]) -> None:
        super().__init__(sorted(paths))

    @property
    def folder(self) -> Path | None:
        """The folder the files were written to (None when nothing was fetched)."""
        return self[0].parent if self else None

    @property
    def total_bytes(self) -> int:
        return sum(path.stat().st_size for path in self if path.exists())

    def _headline(self) -> str:
        files = f"{len(self)} file" + ("s" if len(self) != 1 else "")
        return f"fetched {files} ({format_bytes(self.total_bytes)}) into {self.folder}"

    def _text(self) -> str:
        return "\n".join([self._headline(), *(f"  {path.name}" for path in self)])

    def _html(self) -> str:
        import pandas as pd

        frame = pd.DataFrame(
            {"file": [p.name for p in self], "size": [format_bytes(p.stat().st_size) for p in self]}
        )
        return f"<div class='nbt-fetched'><p>{escape(self._headline())}</p>{html_table(frame)}</div>"
