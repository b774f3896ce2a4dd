"""``%nbt fit MAKE_MODEL MAKE_BATCH``: will the configuration fit, and which way is fastest (nbt.fit)."""

from __future__ import annotations

import argparse
from typing import Any

from nbtoolkit.core.magic_registry import APIDefault, Argument, MagicCall, Subcommand, register


def _words(value: str | None) -> list[str] | None:
    return None if value is None else [w.strip() for w in value.split(",") if w.strip()]


def _fit(args: argparse.Namespace, call: MagicCall) -> Any:
    from nbtoolkit.capacity.api import fit
    from nbtoolkit.core.errors import NbtUsageError

    options: dict[str, Any] = {}
    if args.strategies is not None:
        options["strategies"] = _words(args.strategies)
    if args.recompute is not None:
        options["recompute"] = _words(args.recompute)
    if args.micro_batches is not None:
        try:
            options["micro_batches"] = [int(w) for w in _words(args.micro_batches) or []]
        except ValueError:
            raise NbtUsageError(
                f"--micro-batches takes whole numbers, e.g. 1,2,4; got {args.micro_batches!r}"
            ) from None
    if args.amp is not None:
        options["amp"] = [None if w in ("fp32", "none") else w for w in _words(args.amp) or []]
    return fit(
        call.lookup(args.make_model, "model function"),
        call.lookup(args.make_batch, "batch function"),
        args.devices,
        optimizer=args.optimizer,
        loss_fn=call.lookup(args.loss, "loss function"),
        **options,
    )


def _default(parameter: str) -> APIDefault:
    return APIDefault("nbtoolkit.capacity.api", "fit", parameter)


register(Subcommand(
    name="fit",
    summary="predict per-rank memory and step time of DDP/ZeRO/FSDP2 configurations (fake tensors)",
    description=(
        "Trace one training step of MAKE_MODEL() on MAKE_BATCH(micro_batch) under fake tensors (no memory "
        "used) and predict, for every strategy x recompute x micro-batch x amp, each rank's peak memory by "
        "category, whether it fits the card, and a roofline step time; the fastest that fits is "
        "recommended. Lists are comma-separated."
    ),
    mode="line",
    arguments=(
        Argument("make_model", help="variable holding a function that builds the model"),
        Argument("make_batch",
                 help="variable holding a function of the micro-batch size that builds a batch",),
        Argument("--devices", default=_default("devices"),
                 help="cards, e.g. 8xH100-80GB (default %(default)s)"),
        Argument("--strategies", default=None, help="e.g. ddp,zero3,fsdp2 (default: all five)"),
        Argument("--recompute", default=None,
                 help="none,auto,all (default: all three; auto: the fewest blocks that fit)"),
        Argument("--micro-batches", default=None, dest="micro_batches", help="e.g. 1,2,4 (default: 1)"),
        Argument("--amp", default=None, help="bf16,fp16,fp32 (default: bf16,fp32)"),
        Argument("--optimizer", default=_default("optimizer"),
                 help="adamw, adam or sgd (default %(default)s)"),
        Argument("--loss", default=None,
                 help="variable holding loss_fn(output, targets) (default: the integrations')"),
    ),
    handler=_fit,
))
