"""``%nbt report PATH.html [VAR ...]``: a self-contained HTML report of the notebook's results."""

from __future__ import annotations

from typing import Any

from nbtoolkit.core.magic_registry import Argument, MagicCall, Subcommand, register


def _report(args: Any, call: MagicCall) -> Any:
    from nbtoolkit.core.errors import NbtUsageError
    from nbtoolkit.reporting.report import collect_results, report

    results = collect_results(call.user_ns, args.variables or None)
    if not results:
        raise NbtUsageError(
            "no nbtoolkit results in this notebook yet: run a subcommand first or name variables to include"
        )
    return report(*results, path=args.path, title=args.title)


register(
    Subcommand(
        name="report",
        summary="write a self-contained HTML report of the notebook's results (tables and figures)",
        mode="line",
        arguments=(
            Argument("path", help="the .html file to write"),
            Argument("variables", nargs="*", help="variables to include (default: every result)"),
            Argument("--title", default="nbtoolkit report", help="the report's title"),
        ),
        handler=_report,
        store_result=False,
    )
)
