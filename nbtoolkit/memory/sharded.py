"""FSDP2's memory in a timeline: the shards as parameters, gradients and optimizer state, and the
whole (unsharded) parameters and gradients of the block that runs as their own categories.

torch's memory profiler does not see FSDP2 the way a user thinks of it. Under
``fully_shard`` a module's parameters are DTensors whose wrapper has no storage: the
profiler never connects their local shards (``p._local_tensor``) with the module, so the
shards, their gradients and the AdamW state made from them come out uncategorised. What it
does call ``PARAMETER`` are the all-gathered unsharded parameters FSDP2 swaps into a block
while it runs (and frees after it), and what it calls ``GRADIENT`` are autograd's full-size
gradients of those, which FSDP2 frees once they are reduce-scattered. Read that way, a
sharded model would show the unsharded size of whatever block is running as its
parameters and nothing for the shards it actually keeps.

So, for a model with DTensor parameters, each tensor of the timeline is given one category:

1. by storage: a tensor alive before the run (or still alive after it) whose storage is a
   parameter shard, a gradient shard or optimizer state of a DTensor parameter is
   ``parameter``, ``gradient`` or ``optimizer_state``;
2. by where FSDP2 made it (its ``record_function`` ranges, matched by time, since they are
   siblings of the Python frames in the op tree): memory allocated inside ``FSDP::all_gather*``
   is ``unsharded_parameter`` (the all-gather's output and the block's unsharded parameters
   copied out of it: temporary, one or a few blocks at a time). Memory allocated inside
   ``FSDP::post_backward_reduce`` that is freed after the optimizer step starts is the
   reduce-scatter's output, which FSDP2 hands out as the sharded gradients: ``gradient``
   (one still alive after the run is found by storage, rule 1); the rest of it (the
   reduce-scatter's full-size input, the backend's staging copies) is ``unsharded_gradient``;
3. a tensor torch calls a gradient that FSDP2 frees inside its reduce (autograd's gradient
   of an unsharded parameter) is ``unsharded_gradient``.

Why categories of their own rather than "temporary": the unsharded parameters and gradients
are what FSDP2's knobs trade (``reshard_after_forward`` keeps the parameters gathered
between forward and backward, prefetching gathers the next blocks early), so a user
comparing settings wants them counted apart from the step's own temporaries, and the
``parameter``/``gradient``/``optimizer_state`` categories keep meaning "what this rank
holds": about 1/N of the model on each of N ranks.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FsdpRegions", "fsdp_regions", "recategorize_sharded", "shard_storages"]

#: FSDP2's record_function labels (torch.distributed.fsdp._fully_shard); a module path follows
#: in parentheses ("FSDP::all_gather (layers.0)").
ALL_GATHER_PREFIX = "FSDP::all_gather"
REDUCE_PREFIX = "FSDP::post_backward_reduce"
_OPTIMIZER_STEP_PREFIX = "Optimizer.step#"


def _local(tensor: Any) -> Any:
    local = getattr(tensor, "_local_tensor", None)
    return local if local is not None else tensor


def shard_storages(model: Any, optimizer: Any) -> dict[int, str]:
    """Storage pointer -> category of this rank's shards: the local tensors of the DTensor
    parameters (``parameter``), of their gradients (``gradient``) and the optimizer state of
    those parameters (``optimizer_state``). Empty for a model without DTensor parameters."""
    import torch

    found: dict[int, str] = {}
    if model is None:
        return found
    sharded = [p for p in model.parameters() if getattr(p, "_local_tensor", None) is not None]
    for parameter in sharded:
        found[int(_local(parameter).untyped_storage().data_ptr())] = "parameter"
        if parameter.grad is not None:
            found[int(_local(parameter.grad).untyped_storage().data_ptr())] = "gradient"
    if optimizer is not None and sharded:
        wanted = {id(p) for p in sharded}
        for parameter, state in optimizer.state.items():
            if id(parameter) not in wanted:
                continue
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    found[int(_local(value).untyped_storage().data_ptr())] = "optimizer_state"
    found.pop(0, None)
    return found


@dataclass
class FsdpRegions:
    """FSDP2's ranges of one profile, in µs on the timeline's clock (0 = its first event)."""

    all_gather: list[tuple[float, float]] = field(default_factory=list)
    reduce: list[tuple[float, float]] = field(default_factory=list)
    optimizer_steps: list[float] = field(default_factory=list)  # start times, sorted

    def __bool__(self) -> bool:
        return bool(self.all_gather or self.reduce)

    @staticmethod
    def _inside(t: float, ranges: list[tuple[float, float]]) -> bool:
        return any(a <= t <= b for a, b in ranges)

    def gathering(self, t: float) -> bool:
        return self._inside(t, self.all_gather)

    def reducing(self, t: float) -> bool:
        return self._inside(t, self.reduce)

    def next_optimizer_step(self, t: float) -> float | None:
        """The start of the first optimizer step after ``t`` (None: none follows)."""
        index = bisect_left(self.optimizer_steps, t)
        return self.optimizer_steps[index] if index < len(self.optimizer_steps) else None


def fsdp_regions(op_tree: Any, start_ns: int) -> FsdpRegions:
    """FSDP2's all-gather and reduce ranges and the optimizer steps' starts in a profile's op tree."""
    from torch._C._profiler import _EventType

    regions = FsdpRegions()
    for event in op_tree.sorted_nodes:
        if event.typed[0] != _EventType.TorchOp:
            continue
        name = event.name
        span = ((int(event.start_time_ns) - start_ns) / 1e3, (int(event.end_time_ns) - start_ns) / 1e3)
        if name.startswith(ALL_GATHER_PREFIX):
            regions.all_gather.append(span)
        elif name.startswith(REDUCE_PREFIX):
            regions.reduce.append(span)
        elif name.startswith(_OPTIMIZER_STEP_PREFIX):
            regions.optimizer_steps.append(span[0])
    regions.optimizer_steps.sort()
    return regions


def recategorize_sharded(
    frame: pd.DataFrame,
    *,
    pointers: dict[int, int],
    regions: FsdpRegions,
    before: dict[int, str],
    after: dict[int, str],
) -> pd.DataFrame:
    """``frame`` (a timeline's event rows) with each FSDP2 tensor in one category (module docstring).

    ``pointers``: tensor id -> its storage pointer; ``before``/``after``: :func:`shard_storages`
    before and after the run. A tensor given a category loses its recategorize rows (torch's
    category changes no longer apply to it). Rows of other tensors are unchanged.
    """
    import pandas as pd

    if not (before or after or regions) or frame.empty:
        return frame
    # One tensor id can hold several lifetimes: when a backend thread frees a block the profiler
    # does not see, the next allocation at that address continues the old id. Each allocation
    # (or pre-existing tensor) starts a lifetime of its own, decided on its own.
    tracked = frame[frame["tensor"] >= 0]
    starts = tracked["action"].isin(["alloc", "preexisting"]).astype("int64")
    life = starts.groupby(tracked["tensor"]).cumsum()
    decided: dict[tuple[int, int], str] = {}
    for (tensor, lifetime), rows in tracked.groupby([tracked["tensor"], life], sort=False):
        if lifetime == 0:  # rows before the tensor's first allocation: nothing to decide from
            continue
        category = _category_of(
            int(tensor), rows, pointers=pointers, regions=regions, before=before, after=after
        )
        if category is not None:
            decided[(int(tensor), int(lifetime))] = category
    if not decided:
        return frame
    keys = pd.Series(
        list(zip(tracked["tensor"].astype(int), life.astype(int), strict=True)), index=tracked.index
    )
    new = keys.map(decided).reindex(frame.index)
    changed = new.notna()
    frame = frame.copy()
    frame.loc[changed, "category"] = new[changed]
    return frame[~(changed & (frame["action"] == "recategorize"))].reset_index(drop=True)


def _category_of(
    tensor: int,
    rows: pd.DataFrame,
    *,
    pointers: dict[int, int],
    regions: FsdpRegions,
    before: dict[int, str],
    after: dict[int, str],
) -> str | None:
    actions = rows["action"]
    first = rows.iloc[0]
    freed = rows[actions == "free"]
    alive_at_end = freed.empty
    pointer = pointers.get(tensor)
    if first["action"] == "preexisting":
        if pointer in before:
            return before[pointer]
        if alive_at_end and pointer in after:
            return after[pointer]
        return None
    if first["action"] != "alloc":
        return None
    created = float(first["time_us"])
    if alive_at_end and pointer in after:
        return after[pointer]
    if regions.gathering(created):
        return "unsharded_parameter"
    if regions.reducing(created):
        # The reduce-scatter's output becomes the sharded gradients, kept for the optimizer: freed
        # after its step starts (or alive at the end as a gradient: rule 1). A buffer never seen
        # freed is not taken for one: gloo frees its staging copies on its own threads, unrecorded.
        step = regions.next_optimizer_step(created)
        if not alive_at_end and step is not None and float(freed["time_us"].iloc[-1]) > step:
            return "gradient"
        return "unsharded_gradient"
    last_free = None if alive_at_end else float(freed["time_us"].iloc[-1])
    if first["category"] == "gradient" and last_free is not None and regions.reducing(last_free):
        return "unsharded_gradient"
    return None
