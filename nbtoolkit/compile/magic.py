"""``%%nbt graphs`` and ``%nbt compile-log``: one call of capture_graphs / load_compile_log each."""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.core.loop_cell import LOOP_ARGUMENTS, cell_code
from nbtoolkit.core.magic_registry import APIDefault, Argument, MagicCall, Subcommand, register


def _graphs(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.compile.capture import capture_graphs
    from nbtoolkit.core.progress import CELL_DELAY_S, DelayedProgress

    code, loop = cell_code(args, call)
    with DelayedProgress("compiling the cell and timing its graphs", delay_s=CELL_DELAY_S):
        return capture_graphs(
            code,  # cell_function() also put the cell's lines in linecache: breaks show their source
            steps=args.steps,
            eager_baseline=False if args.no_eager else None,  # None: the API's default (none for a loop)
            measure_cost=not args.no_cost,
            label="%%nbt graphs cell",
            loop=loop,
            after=args.after,
        )


def _compile_log(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.compile.log_reader import load_compile_log

    roots = [call.resolve(root) for root in args.source_root] if args.source_root else None
    return load_compile_log(call.resolve(args.path), source_roots=roots)


register(
    Subcommand(
        name="graphs",
        summary="torch.compile graphs, graph breaks (ranked by cost, with fixes), recompiles of the cell",
        mode="cell",
        arguments=(
            Argument(
                "--steps",
                type=int,
                default=APIDefault("nbtoolkit.core.measure_config", "MeasureConfig", "steps"),
                help="timed, profiled and eager runs of the cell (default %(default)s)",
            ),
            Argument(
                "--no-eager",
                action="store_true",
                help="skip the eager baseline runs (a loop has none: each run is its next training step)",
            ),
            Argument(
                "--no-cost", action="store_true", help="skip the profiled runs that measure break costs"
            ),
            *LOOP_ARGUMENTS,
        ),
        handler=_graphs,
    )
)

register(
    Subcommand(
        name="compile-log",
        summary="graphs, breaks, recompiles and failures from TORCH_TRACE logs (a file or a folder of ranks)",
        mode="line",
        arguments=(
            Argument("path", help="a TORCH_TRACE .log file or a folder of per-rank logs"),
            Argument(
                "--source-root",
                action="append",
                default=None,
                metavar="DIR",
                help="a folder holding the logged code: breaks show source lines from .py files under it "
                "(repeatable; default: no source is read, the log may come from elsewhere)",
            ),
        ),
        handler=_compile_log,
    )
)
