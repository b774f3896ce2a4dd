"""On each rank: what still holds the closed process group after the ranks formed a new one.

When Ctrl-C frees a rank blocked in a collective, the ranks leave their process group and form
a new one, keeping their namespaces (:mod:`nbtoolkit.cluster.freeing`). Objects built on the
old group keep a reference to it and would fail at their next collective:

- a ``DistributedDataParallel`` model (its C++ reducer holds the group object): one on the world
  group is moved to the new group for the user (:func:`rebind_ddp`, DDP's own
  ``_update_process_group``); one on a subgroup is named;
- a DeepSpeed engine (its data-parallel group is a clone of the world group; DeepSpeed caches
  that clone, :func:`forget_cached_groups` drops the cache so a new engine uses the new group);
- a process group or device mesh the cell made with ``dist.new_group`` / ``init_device_mesh``
  over part of the ranks;
- an FSDP2 model (``fully_shard``) resolves its group object once; over every rank its device
  mesh names the world group, whose name the new group takes (torch restarts the count when the
  world group is destroyed), so :func:`rebind_fsdp2` asks the mesh again and it goes on working.

:func:`group_holders` finds the top-level variables among these; what cannot be moved is named
in the notebook's message (what to do with each: ``REBUILD_HINTS`` in :mod:`nbtoolkit.cluster.state`).
Imports torch only inside functions.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["forget_cached_groups", "group_holders", "rebind_ddp", "rebind_fsdp2"]

def _kind(value: Any, dist: Any, ddp: type, world_size: int) -> str | None:
    if isinstance(value, ddp):
        return "DistributedDataParallel"
    if any(cls.__name__ == "DeepSpeedEngine" for cls in type(value).__mro__):
        return "DeepSpeedEngine"
    if isinstance(value, dist.ProcessGroup):
        return "ProcessGroup"  # every group made before the new one is the old group or part of it
    mesh = getattr(sys.modules.get("torch.distributed.device_mesh"), "DeviceMesh", None)
    if mesh is not None and isinstance(value, mesh) and (value.ndim > 1 or value.size() != world_size):
        return "DeviceMesh"  # a 1-D mesh over every rank names the world group, which the new one takes
    return None


def group_holders(namespace: dict[str, Any], world_size: int) -> list[tuple[str, str]]:
    """(variable, kind) of each top-level variable of ``namespace`` built on the old group."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    found = []
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        try:
            kind = _kind(value, dist, DistributedDataParallel, world_size)
        except Exception:  # noqa: S112 - an odd object's isinstance/size must not stop the regroup
            continue
        if kind is not None:
            found.append((name, kind))
    return found


def forget_cached_groups() -> None:
    """Drop the groups DeepSpeed caches (its world clone), so what is built next uses the new group."""
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None and hasattr(groups, "_WORLD_GROUP"):
        groups._WORLD_GROUP = None  # type: ignore[attr-defined]  # a module found at run time


def _refresh_mesh_info(info: Any) -> bool:
    """Point an FSDP2 mesh info at the groups its device mesh names now; False where it cannot."""
    mesh = getattr(info, "mesh", None)
    if mesh is None or not hasattr(info, "shard_process_group"):
        return False
    info.shard_process_group = mesh.get_group(info.shard_mesh_dim)
    if getattr(info, "replicate_process_group", None) is not None:
        info.replicate_process_group = mesh.get_group(info.replicate_mesh_dim)
    if hasattr(info, "reduce_scatter_process_group"):
        info.reduce_scatter_process_group = None
    return True


def rebind_fsdp2(namespace: dict[str, Any]) -> list[tuple[str, str]]:
    """Point the FSDP2 models of ``namespace`` at the new group; (variable, kind) of those that could not be.

    FSDP2 keeps its device mesh, which finds groups by name, and resolves the group object once
    (``mesh_info.shard_process_group``); a world-sized mesh names the world group, whose name the
    new group has, so asking the mesh again gives the new group.
    """
    fsdp_module = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    if fsdp_module is None:
        return []
    import torch

    left: list[tuple[str, str]] = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or not isinstance(value, torch.nn.Module):
            continue
        try:
            for module in value.modules():
                if not isinstance(module, fsdp_module):
                    continue
                state = module._get_fsdp_state()
                groups = getattr(state, "_fsdp_param_groups", None) or [
                    getattr(state, "_fsdp_param_group", None)
                ]
                for group in filter(None, groups):
                    infos = [group.mesh_info, getattr(group, "post_forward_mesh_info", None)]
                    for param in group.fsdp_params:
                        infos += [param.mesh_info, getattr(param, "post_forward_mesh_info", None)]
                    for info in filter(None, infos):
                        _refresh_mesh_info(info)
        except Exception:  # a version of FSDP2 laid out otherwise: the user is told to build it again
            left.append((name, "FSDP2 model"))
    return left


def rebind_ddp(
    namespace: dict[str, Any], holders: list[tuple[str, str]], old_world_id: int | None
) -> tuple[list[tuple[str, str]], list[str]]:
    """Move the DDP models built on the old world group to the new one; (holders left, names moved).

    DDP's own ``_update_process_group`` (torch's way to shrink or grow a DDP job without building
    it again) resets the reducer's state (an interrupted backward leaves it mid-iteration) and
    points it at the new group. A DDP model on a subgroup, or a torch without that method, stays
    in ``holders`` for the message.
    """
    import torch.distributed as dist

    left, moved = [], []
    for name, kind in holders:
        value = namespace.get(name)
        group = getattr(value, "process_group", None)
        if kind == "DistributedDataParallel" and old_world_id is not None and id(group) == old_world_id:
            try:
                value._update_process_group(dist.group.WORLD)  # type: ignore[union-attr]
            except Exception:  # an older torch (no such method): the user is told to wrap it again
                left.append((name, kind))
                continue
            moved.append(name)
        else:
            left.append((name, kind))
    return left, moved
