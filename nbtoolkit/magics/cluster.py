"""The cluster magics (`%nbt cluster`, `%%nbt remote`, pull, push, fetch): thin calls of nbt.Cluster."""

from __future__ import annotations

from typing import Any

from nbtoolkit.magics._registry import Argument, MagicCall, Subcommand, register

_ACTIONS = ("start", "connect", "status", "stop", "restart")


def _cluster(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster
    from nbtoolkit.errors import NbtUsageError
    from nbtoolkit.views.progress import DelayedProgress

    action, rest = args.action, args.target
    if action == "start":
        ranks = int(rest) if rest and rest.isdigit() else (None if rest else 2)
        if ranks is None:
            raise NbtUsageError(f"`%nbt cluster start N` takes a number of ranks, got {rest!r}")
        with DelayedProgress(f"starting a local Ray cluster with {ranks} ranks"):
            return Cluster.local(ranks=ranks, collective_timeout_s=args.timeout)
    if action == "connect":
        if not rest:
            raise NbtUsageError("`%nbt cluster connect ADDRESS` needs the head's host:port")
        token = None
        if args.token_file:
            from pathlib import Path

            path = Path(args.token_file).expanduser()
            if not path.is_file():
                raise NbtUsageError(f"token file {str(path)!r} does not exist")
            token = path.read_text().strip()
        with DelayedProgress(f"connecting to {rest} and starting ranks"):
            return Cluster.connect(rest, token=token, ranks=args.ranks, collective_timeout_s=args.timeout)
    if rest:
        raise NbtUsageError(f"`%nbt cluster {action}` takes no argument, got {rest!r}")
    cluster = Cluster.current()
    if action == "status":
        return cluster.status()
    if action == "restart":
        with DelayedProgress(f"restarting {cluster.world_size} ranks"):
            cluster.restart()
        return cluster.status()
    cluster.close()  # stop
    print("cluster stopped")
    return None


def _remote(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster
    from nbtoolkit.cluster.output import RankPrefixedPrinter
    from nbtoolkit.views.progress import CELL_DELAY_S, DelayedProgress

    cluster = Cluster.current()
    printer = RankPrefixedPrinter()
    cell = call.cell or ""
    label = f"running on {args.ranks or 'all'} ranks"
    try:
        with DelayedProgress(label, delay_s=CELL_DELAY_S):
            if args.profile:
                return cluster.profile(cell, steps=args.steps, ranks=args.ranks, on_output=printer)
            if args.memory:
                names = {k: v for k, v in (("model", args.model), ("optimizer", args.optimizer)) if v}
                return cluster.memory(cell, ranks=args.ranks, on_output=printer, **names)
            result = cluster.execute(cell, ranks=args.ranks, on_output=printer)
            result.raise_for_errors()  # inside: the progress line then ends with "stopped"
    finally:
        printer.flush()
    return result if any(v is not None for v in result.values.values()) else None


def _pull(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster

    return Cluster.current().pull(args.variable, ranks=args.ranks)


def _push(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster

    cluster = Cluster.current()
    values = {name: call.lookup(name) for name in args.variables}
    cluster.push(values, ranks=args.ranks)
    print(f"pushed {', '.join(values)} to {args.ranks or 'all'} ranks")


register(
    Subcommand(
        name="cluster",
        summary="start N local ranks, connect to a Ray cluster, status, restart or stop",
        mode="line",
        arguments=(
            Argument("action", choices=_ACTIONS, help="start N | connect ADDRESS | status | restart | stop"),
            Argument("target", nargs="?", default=None, help="N ranks (start) or host:port (connect)"),
            Argument("--token-file", default=None, help="file holding the cluster's auth token (connect)"),
            Argument(
                "--ranks", type=int, default=None, help="number of ranks (connect; default: GPUs, or 2)"
            ),
            Argument(
                "--timeout",
                type=float,
                default=120.0,
                help="collective timeout in seconds: how long a rank waits for a dead or stuck peer",
            ),
        ),
        handler=_cluster,
    )
)

register(
    Subcommand(
        name="remote",
        summary="run the cell on every rank (persistent namespaces, rank-prefixed output)",
        mode="cell",
        arguments=(
            Argument("--ranks", default=None, help="which ranks: 0 | 0,2 | 1-3 | all (default: all)"),
            Argument(
                "--profile", action="store_true", help="profile the cell on each rank -> multi-rank Trace"
            ),
            Argument("--steps", type=int, default=3, help="profiled runs of the cell with --profile"),
            Argument("--memory", action="store_true", help="memory timeline of the cell on each rank"),
            Argument("--model", default=None, help="with --memory: the model's variable name on the ranks"),
            Argument("--optimizer", default=None, help="with --memory: the optimizer's variable name"),
        ),
        handler=_remote,
    )
)

def _fetch(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster

    paths = Cluster.current().fetch(args.pattern, into=args.to, ranks=args.ranks)
    size = sum(path.stat().st_size for path in paths)
    files = f"{len(paths)} file" + ("s" if len(paths) != 1 else "")
    print(f"fetched {files} ({size / 2**20:,.1f} MiB) into {paths[0].parent}")
    return paths


register(
    Subcommand(
        name="fetch",
        summary="copy files the ranks wrote (traces, snapshots, compile logs) into a local folder",
        mode="line",
        arguments=(
            Argument(
                "pattern",
                help="a path or glob on the ranks; {rank} becomes each rank's number (IPython first "
                "expands {name} from notebook variables: pass such a pattern as $variable)",
            ),
            Argument("--to", default=None, help="local folder (default: a new temporary folder)"),
            Argument("--ranks", default=None, help="which ranks (default: all)"),
        ),
        handler=_fetch,
    )
)

register(
    Subcommand(
        name="pull",
        summary="a variable's value from every rank (a list in rank order)",
        mode="line",
        arguments=(
            Argument("variable", help="the variable's name on the ranks"),
            Argument("--ranks", default=None, help="which ranks (default: all)"),
        ),
        handler=_pull,
    )
)

register(
    Subcommand(
        name="push",
        summary="copy notebook variables into every rank's namespace",
        mode="line",
        arguments=(
            Argument("variables", nargs="+", help="names of notebook variables"),
            Argument("--ranks", default=None, help="which ranks (default: all)"),
        ),
        handler=_push,
        store_result=False,
    )
)
