"""The cluster magics (`%nbt cluster`, `%%nbt remote`, pull, push, fetch): one call of the cluster API each.

The defaults come from :mod:`nbtoolkit.cluster.state` (a light module: no Ray), where the
API reads them too.
"""

from __future__ import annotations

from typing import Any

from nbtoolkit.cluster.hang_records import HANG_AFTER_ENV, HANG_AFTER_S
from nbtoolkit.cluster.state import (
    CLUSTER_ACTIONS,
    COLLECTIVE_TIMEOUT_S,
    DEFAULT_RANKS,
    PLACEMENT_STRATEGIES,
    PROFILE_STEPS,
)
from nbtoolkit.core.magic_registry import Argument, MagicCall, Subcommand, register


def _cluster(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.commands import cluster_command

    return cluster_command(
        args.action,
        args.target,
        token_file=args.token_file,
        ranks=args.ranks,
        collective_timeout_s=args.timeout,
        strategy=args.strategy,
        name=args.keep_as,
    )


def _remote(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster

    return Cluster.current().run_cell(
        call.cell or "",
        ranks=args.ranks,
        profile=args.profile,
        steps=args.steps,
        memory=args.memory,
        model=args.model,
        optimizer=args.optimizer,
        hang_after_s=args.hang_after,
        on_hang="interrupt" if args.stop_on_hang else "wait",
    )


def _pull(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster

    return Cluster.current().pull(args.variable, ranks=args.ranks)


def _push(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster

    return Cluster.current().push({name: call.lookup(name) for name in args.variables}, ranks=args.ranks)


def _fetch(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.cluster.cluster import Cluster

    return Cluster.current().fetch(args.pattern, into=args.to, ranks=args.ranks)


register(
    Subcommand(
        name="cluster",
        summary="start N local ranks, connect to a Ray cluster, status, restart or stop",
        mode="line",
        arguments=(
            Argument(
                "action",
                choices=CLUSTER_ACTIONS,
                help="start N | connect ADDRESS | status | restart | stop | why (the hang diagnosis)",
            ),
            Argument(
                "target",
                nargs="?",
                default=None,
                help=f"N ranks (start; default {DEFAULT_RANKS}) or ray://HEAD:10001 | HEAD:6379 (connect)",
            ),
            Argument("--token-file", default=None, help="file holding the cluster's auth token (connect)"),
            Argument(
                "--ranks",
                type=int,
                default=None,
                help="number of ranks (connect; default: one per GPU, else one per CPU)",
            ),
            Argument(
                "--strategy",
                choices=PLACEMENT_STRATEGIES,
                default="pack",
                help="placement of the ranks over nodes: pack (few nodes) or spread (many)",
            ),
            Argument(
                "--keep-as",
                default=None,
                help="keep the ranks across kernel restarts under this name; connecting again with it "
                "re-attaches (connect; Cluster.connect(name=...))",
            ),
            Argument(
                "--timeout",
                type=float,
                default=COLLECTIVE_TIMEOUT_S,
                help="collective timeout in seconds: how long a rank waits for a dead or stuck peer "
                f"(default {COLLECTIVE_TIMEOUT_S:g})",
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
            Argument(
                "--steps",
                type=int,
                default=PROFILE_STEPS,
                help=f"profiled runs of the cell with --profile (default {PROFILE_STEPS})",
            ),
            Argument("--memory", action="store_true", help="memory timeline of the cell on each rank"),
            Argument("--model", default=None, help="with --memory: the model's variable name on the ranks"),
            Argument("--optimizer", default=None, help="with --memory: the optimizer's variable name"),
            Argument(
                "--hang-after",
                type=float,
                default=None,
                help=f"seconds without progress on any rank before the hang diagnosis shows "
                f"(default ${HANG_AFTER_ENV}, else {HANG_AFTER_S:g}; 0: off)",
            ),
            Argument(
                "--stop-on-hang",
                action="store_true",
                help="stop the cell (like Ctrl-C) after showing the hang diagnosis, instead of waiting",
            ),
        ),
        handler=_remote,
    )
)

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
