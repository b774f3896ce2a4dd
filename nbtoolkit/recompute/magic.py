"""``%nbt optimize`` and ``%nbt plan``: thin magics over the optimize API."""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.core.magic_registry import APIDefault, Argument, MagicCall, Subcommand, register

_MODEL = Argument("model", help="the model variable (a torch.nn.Module)")
_STEP = Argument("step", help="the variable holding a zero-argument training-step function")


def _names(text: str) -> list[str]:
    """``--blocks a, b`` -> ["a", "b"] (argparse applies it while parsing the line)."""
    return [b.strip() for b in text.split(",") if b.strip()]


_BLOCKS = Argument(
    "--blocks",
    type=_names,
    default=None,
    help="comma-separated module names to consider (default: repeated blocks)",
)


def _plan(args: argparse.Namespace, call: MagicCall) -> Any:
    from IPython.display import display

    from nbtoolkit.recompute.planner import plan_recompute
    from nbtoolkit.recompute.tradeoff_figure import tradeoff_figure

    plan = plan_recompute(
        call.lookup(args.model, "model"), call.lookup(args.step, "step function"), args.budget,
        blocks=args.blocks or None,
    )
    display(tradeoff_figure(plan))  # the front with the chosen plan starred; the plan's table below
    return plan


def _compile_argument(args: argparse.Namespace) -> Any:
    """--compile [--backend B] [--mode M] as nbt.optimize's compile= (backend/mode alone imply it)."""
    if not (args.compile or args.backend or args.mode):
        return False
    options = {k: v for k, v in (("backend", args.backend), ("mode", args.mode)) if v}
    return options or True


def _optimize(args: argparse.Namespace, call: MagicCall) -> Any:
    model = call.lookup(args.model, "model")
    step = call.lookup(args.step, "step function")
    compile_arg = _compile_argument(args)
    if args.run:
        from nbtoolkit.recompute.optimize import optimize

        return optimize(model, step, compile=compile_arg, recompute="auto" if args.budget else None,
                        budget_bytes=args.budget, amp=args.amp, steps=args.steps)
    from nbtoolkit.core.errors import NbtUsageError
    from nbtoolkit.recompute.panel import optimize_panel
    from nbtoolkit.recompute.plan import RecomputePlan

    plan = call.lookup(args.plan, "plan")
    if plan is not None and not isinstance(plan, RecomputePlan):
        raise NbtUsageError(
            f"--plan {args.plan} is a {type(plan).__name__}, not a RecomputePlan: make one with "
            f"%nbt plan {args.model} {args.step} --name {args.plan}"
        )
    return optimize_panel(model, step, plan=plan, budget_bytes=args.budget, compile=compile_arg,
                          amp=args.amp, steps=args.steps)


register(
    Subcommand(
        name="plan",
        summary="measure the model's blocks and choose which to recompute under a memory budget",
        mode="line",
        arguments=(
            _MODEL,
            _STEP,
            Argument(
                "--budget", default=None,
                help="the device's total peak memory (parameters, gradients and optimizer state count), "
                "e.g. 1.5GB, 800MiB, or on a GPU 90%% (default: none)",
            ),
            _BLOCKS,
        ),
        handler=_plan,
    )
)

register(
    Subcommand(
        name="optimize",
        summary="panel: budget slider, compile/AMP toggles, apply and measure before/after",
        mode="line",
        arguments=(
            _MODEL,
            _STEP,
            Argument(
                "--budget", default=None, help="start the slider here, e.g. 1.5GB (with --run: plan for it)"
            ),
            Argument("--compile", action="store_true", help="apply torch.compile"),
            Argument("--backend", default=None, help="torch.compile backend (default inductor), e.g. eager"),
            Argument("--mode", default=None,
                     help="torch.compile mode (default: 'default'), e.g. max-autotune"),
            Argument("--amp", default=None, choices=["bf16", "fp16"], help="autocast dtype"),
            Argument(
                "--steps",
                type=int,
                default=APIDefault("nbtoolkit.core.measure_config", "MeasureConfig", "steps"),
                help="timed steps per measurement (default %(default)s)",
            ),
            Argument("--run", action="store_true", help="no panel: optimize now and show the comparison"),
            Argument(
                "--plan", default=None,
                help="a RecomputePlan variable (from %%nbt plan ... --name p): the panel starts from its "
                "measurements instead of measuring the blocks again, so both choose the same blocks",
            ),
        ),
        handler=_optimize,
    )
)
