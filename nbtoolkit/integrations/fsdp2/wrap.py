"""Shard a model with FSDP2 the way its documentation and torchtitan do, and recognise one that is.

``fully_shard`` is applied to each repeated block first (the unit of all-gather and
reduce-scatter: one block's parameters are gathered just before it runs and freed after), then
to the root, which owns what is left (embeddings, the final norm, the head). The blocks are the
model's repeated blocks as the recompute planner finds them (``model.layers.*`` of HF decoders,
``transformer.h.*`` of GPT-2, ``blocks.*`` of ViTs), or the names given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError

if TYPE_CHECKING:
    import torch

__all__ = ["ShardSettings", "is_fully_sharded", "shard_model", "sharded_blocks"]


@dataclass(frozen=True)
class ShardSettings:
    """FSDP2's knobs as nbtoolkit sweeps them.

    Attributes:
        reshard_after_forward: free each block's gathered parameters after its forward (True,
            FSDP2's default: less memory, one more all-gather per block in backward) or keep them.
        forward_prefetch: how many following blocks each block asks to gather during its own
            forward (0: FSDP2's implicit prefetch only).
        backward_prefetch: the same for backward, in reverse order.
        param_dtype / reduce_dtype: the mixed-precision policy (``"bf16"``, ``"fp16"``,
            ``"fp32"`` or None for the parameters' own dtype).
    """

    reshard_after_forward: bool = True
    forward_prefetch: int = 0
    backward_prefetch: int = 0
    param_dtype: str | None = None
    reduce_dtype: str | None = None

    def label(self) -> str:
        """A short name for tables: ``reshard, fwd-prefetch 1, bf16 params``."""
        parts = ["reshard" if self.reshard_after_forward else "no reshard"]
        if self.forward_prefetch:
            parts.append(f"fwd-prefetch {self.forward_prefetch}")
        if self.backward_prefetch:
            parts.append(f"bwd-prefetch {self.backward_prefetch}")
        if self.param_dtype:
            parts.append(f"{self.param_dtype} params")
        if self.reduce_dtype:
            parts.append(f"{self.reduce_dtype} reduce")
        return ", ".join(parts)


_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
           "fp32": "float32", "float32": "float32"}


def _dtype(name: str | None) -> Any:
    import torch

    if name is None:
        return None
    if name not in _DTYPES:
        raise NbtUsageError(
            f"unknown dtype {name!r} for FSDP2's mixed precision: use one of {sorted(_DTYPES)}"
        )
    return getattr(torch, _DTYPES[name])


def sharded_blocks(model: torch.nn.Module, blocks: Sequence[str] | None = None) -> list[str]:
    """The names of the blocks that get their own ``fully_shard`` (default: the repeated blocks)."""
    from nbtoolkit.recompute.blocks import find_repeated_blocks, resolve_blocks

    names = list(blocks) if blocks is not None else find_repeated_blocks(model)
    resolve_blocks(model, names)  # a clear error for a name that is not a submodule
    return names


def shard_model(
    model: torch.nn.Module,
    settings: ShardSettings | None = None,
    *,
    blocks: Sequence[str] | None = None,
    mesh: Any = None,
) -> torch.nn.Module:
    """``fully_shard`` each block of ``model`` and then the model itself; returns the model.

    Needs an initialised default process group (a cluster rank); ``mesh`` defaults to a 1-D
    mesh over all ranks on the model's device type.
    """
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_available() or not dist.is_initialized():
        raise NbtUsageError(
            "shard_model needs torch.distributed initialised: run it on the ranks of an nbt.Cluster "
            "(cluster.run(...) or %%nbt on N), where each rank is in one process group"
        )
    settings = settings or ShardSettings()
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        device_type = next((p.device.type for p in model.parameters()), "cpu")
        mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=_dtype(settings.param_dtype),
                                  reduce_dtype=_dtype(settings.reduce_dtype))
    names = sharded_blocks(model, blocks)
    modules = dict(model.named_modules())
    block_modules = [modules[n] for n in names]
    for block in block_modules:
        fully_shard(block, mesh=mesh, reshard_after_forward=settings.reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=settings.reshard_after_forward, mp_policy=policy)
    # Explicit prefetch: block i asks for the next k blocks' parameters while it runs (torchtitan's
    # recipe); FSDP2 otherwise prefetches one block implicitly.
    for i, block in enumerate(block_modules):
        if settings.forward_prefetch:
            following = block_modules[i + 1 : i + 1 + settings.forward_prefetch]
            if following:
                block.set_modules_to_forward_prefetch(following)
        if settings.backward_prefetch:
            preceding = block_modules[max(0, i - settings.backward_prefetch) : i][::-1]
            if preceding:
                block.set_modules_to_backward_prefetch(preceding)
    return model


def is_fully_sharded(model: Any) -> bool:
    """Whether ``model`` (or one of its submodules) was wrapped by FSDP2's ``fully_shard``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    modules = model.modules() if hasattr(model, "modules") else []
    return any(isinstance(m, FSDPModule) for m in modules)
