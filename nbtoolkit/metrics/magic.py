"""``%nbt metrics STEP`` / ``%%nbt metrics``: model FLOPs, step time, MFU and HFU of a training step."""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.core.loop_cell import LOOP_ARGUMENTS, cell_code
from nbtoolkit.core.magic_registry import APIDefault, Argument, MagicCall, Subcommand, register


def _metrics(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.core.errors import NbtUsageError
    from nbtoolkit.metrics.measure import step_metrics

    if (call.cell is None) == (args.step is None):
        raise NbtUsageError(
            "give the step one way: `%nbt metrics STEP` (a variable holding a step function) or "
            "`%%nbt metrics` with the step's code as the cell, not both or neither"
        )
    if call.cell is None:
        step, loop = call.lookup(args.step, "step function"), bool(args.loop)
    else:
        step, loop = cell_code(args, call)
    return step_metrics(
        step,
        model=call.lookup(args.model, "model"),
        steps=args.steps,
        warmup=args.warmup,
        tokens_per_step=args.tokens,
        samples_per_step=args.samples,
        dtype=args.dtype,
        peak_flops=args.peak_flops,
        loop=loop,
        after=args.after,
    )


def _default(parameter: str) -> APIDefault:
    # step_metrics takes None for "MeasureConfig's default": show that default
    return APIDefault("nbtoolkit.core.measure_config", "MeasureConfig", parameter)


register(Subcommand(
    name="metrics",
    summary="model/hardware FLOPs, step time, achieved FLOP/s, MFU and HFU of a step function",
    description=(
        "Run STEP (a variable holding a zero-argument training-step function), or the cell under "
        "%%nbt metrics, under torch's FLOP counter once, then time it; show model FLOPs, hardware FLOPs "
        "(with recomputation), FLOP/s, MFU and HFU against the device's peak (datasheet table, or "
        "measured on CPU). With --loop, STEP or the cell runs a whole training (trainer.train()): its "
        "training steps are counted and timed, then the loop is stopped."
    ),
    mode="both",
    arguments=(
        Argument(
            "step",
            nargs="?",
            default=None,
            help="variable holding a zero-argument callable that runs one training step (or, with "
            "--loop, the whole training); left out under %%nbt metrics, whose cell is the step",
        ),
        Argument("--tokens", type=int, default=None, help="tokens one step processes (for tokens/s)"),
        Argument("--samples", type=int, default=None, help="samples one step processes (for samples/s)"),
        Argument("--steps", type=int, default=_default("steps"), help="timed steps (default %(default)s)"),
        Argument("--warmup", type=int, default=_default("warmup"),
                 help="untimed steps first (default %(default)s)"),
        Argument("--model", default=None, help="variable holding the model (for its parameter count)"),
        Argument("--dtype", default=None, help="dtype whose peak applies, e.g. bfloat16 (default: detected)"),
        Argument("--peak-flops", type=float, default=None, dest="peak_flops",
                 help="the device's peak FLOP/s, overriding the table and the measurement"),
        *LOOP_ARGUMENTS,
    ),
    handler=_metrics,
))
