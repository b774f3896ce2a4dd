"""What runs on each rank of an FSDP2 measurement: the sharded model, its optimizer, one step.

    from nbtoolkit.integrations.fsdp2.rank import build_sharded, make_step
    model, optimizer = build_sharded(make_model, ShardSettings())   # on a rank
    step = make_step(model, optimizer, make_batch)                  # forward, backward, AdamW
    step()                                                          # -> the loss (a float)

These functions are sent to the ranks by :meth:`nbtoolkit.Cluster.run` (or called inside a
function that is); torch is imported inside them, on the rank. The notebook-side entries
(memory, overlap, graph breaks) are in the modules beside this one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.integrations.fsdp2.wrap import ShardSettings, is_fully_sharded, shard_model
from nbtoolkit.integrations.rank_measure import rank_batch, rank_loss

if TYPE_CHECKING:
    import torch

__all__ = [
    "build_sharded",
    "graph_breaks_on_rank",
    "make_step",
    "memory_on_rank",
    "profile_on_rank",
    "require_sharded",
    "unsharded_sizes",
]


def build_sharded(
    model_fn: Callable[[], Any],
    settings: ShardSettings | None = None,
    *,
    blocks: Sequence[str] | None = None,
    lr: float = 1e-3,
    seed: int = 0,
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """On a rank: ``model_fn()`` built with the same seed on every rank, sharded with
    :func:`~nbtoolkit.integrations.fsdp2.wrap.shard_model`, and a ``torch.optim.AdamW`` over its
    (sharded) parameters, so the optimizer state is created per shard too. Where the rank has a
    GPU and an NCCL group, the model is moved to the rank's GPU before it is sharded."""
    import torch

    torch.manual_seed(seed)  # every rank starts from the same weights before sharding
    model = model_fn()
    if not isinstance(model, torch.nn.Module):
        raise NbtUsageError(f"model_fn must return a torch.nn.Module, got {type(model).__name__}")
    if _on_gpu() and not is_fully_sharded(model):
        # the rank's own GPU (the cluster sets it per rank); shard_model's mesh follows the model
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    if not is_fully_sharded(model):
        model = shard_model(model, settings, blocks=blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return model, optimizer


def _on_gpu() -> bool:
    """Whether this rank shards on its GPU: CUDA is there and the group is not gloo (a CPU group)."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return False
    return not dist.is_initialized() or dist.get_backend() != "gloo"


def require_sharded(model: Any, what: str) -> None:
    """Raise one clear error when ``model`` was not wrapped by FSDP2's ``fully_shard``."""
    if not is_fully_sharded(model):
        raise NbtUsageError(
            f"{what} needs a model wrapped by FSDP2's fully_shard, got an unwrapped "
            f"{type(model).__name__}: shard it first with "
            "nbtoolkit.integrations.fsdp2.wrap.shard_model(model) (or build it with build_sharded)"
        )


def make_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch_fn: Callable[[int], Any],
    loss_fn: Callable[[Any, Any], Any] | None = None,
) -> Callable[[], float]:
    """One training step of an FSDP2 model on this rank's batch; the step returns the loss.

    ``batch_fn(rank)`` gives ``inputs`` or ``(inputs, targets)`` (moved to the model's device);
    ``loss_fn(output, targets)`` defaults to MSE against targets, or the output's mean square.
    The step is forward, backward (FSDP2 reduce-scatters each block's gradients), ``optimizer.step()``
    and ``optimizer.zero_grad(set_to_none=True)`` at its end, so gradients live within a step.
    """
    import torch
    import torch.distributed as dist

    require_sharded(model, "make_step")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    inputs, targets = rank_batch(batch_fn, dist.get_rank() if dist.is_initialized() else 0, device)

    def step() -> float:
        loss = rank_loss(model(inputs), targets, loss_fn)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def unsharded_sizes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the whole (unsharded) parameters and of this rank's shards of them.

    ``unsharded_bytes``: every parameter at its global shape (what one rank would hold without
    FSDP2); ``local_bytes``: this rank's shards (``DTensor.to_local()``); plain tensors count
    whole in both.
    """
    whole = local = 0
    for parameter in model.parameters():
        whole += parameter.numel() * parameter.element_size()
        shard = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        local += shard.numel() * shard.element_size()
    return {"unsharded_bytes": int(whole), "local_bytes": int(local)}


def memory_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    settings: ShardSettings | None,
    *,
    blocks: Sequence[str] | None,
    warmup: int,
    steps: int,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> dict[str, Any]:
    """On a rank: the sharded model's :func:`nbtoolkit.memory_timeline` of ``steps`` steps after
    ``warmup`` unrecorded ones (so the AdamW state exists before recording), and its sizes.

    A recording in which torch's profiler missed a free on a backend thread (gloo's, about one in
    six; see ``MemoryTimeline.reused_storages``) has the blocks at that address split from the
    allocator's events, the missed free placed at the latest it can have happened: the shards
    nearly always stay exact (CI once saw a reused block left in rank 1's parameters, 1.18x its
    share), the unsharded peaks may be a little high. So every rank records its steps again
    (they must, since the steps' collectives pair the ranks up), up to :data:`RECORDINGS` times,
    and the timeline's notes say so; the last recording is kept, with its note, when each missed
    a free.
    """
    import torch
    import torch.distributed as dist

    from nbtoolkit.core.measure_config import MeasureConfig
    from nbtoolkit.memory.capture import memory_timeline

    model, optimizer = build_sharded(model_fn, settings, blocks=blocks, lr=lr)
    step = make_step(model, optimizer, batch_fn, loss_fn)
    config = MeasureConfig(steps=steps, warmup=warmup)
    for recording in range(1, RECORDINGS + 1):
        timeline = memory_timeline(step, model=model, optimizer=optimizer, config=config)
        config = MeasureConfig(steps=steps, warmup=0)  # the optimizer state exists from now on
        missed = torch.tensor([timeline.reused_storages])
        if dist.is_initialized():  # any rank's missed free: all ranks record again, together
            dist.all_reduce(missed, op=dist.ReduceOp.MAX)
        if not int(missed):
            if recording > 1:
                timeline.notes.append(
                    f"recorded {recording} times: the earlier recordings (on this rank or another) "
                    "missed a free made on a backend thread, which leaves categories unreliable"
                )
            break
    return {"timeline": timeline, **unsharded_sizes(model)}


#: how many times :func:`memory_on_rank` records the steps at most (its docstring: why again). With
#: two ranks about one recording in three misses a free somewhere; five leave about 1 in 250 runs
#: with every recording marked unreliable, at the cost of re-recording only the runs that missed.
RECORDINGS = 5


def profile_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    settings: ShardSettings | None,
    *,
    blocks: Sequence[str] | None,
    warmup: int,
    steps: int,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> dict[str, Any]:
    """On a rank: a torch.profiler trace of ``steps`` steps of the sharded model after ``warmup``
    (:func:`nbtoolkit.cluster.rank_tools.profile_to_bytes`: ``trace_gz``, ``raw_bytes``, ``last``)."""
    import torch.distributed as dist

    from nbtoolkit.cluster.rank_tools import profile_to_bytes

    model, optimizer = build_sharded(model_fn, settings, blocks=blocks, lr=lr)
    step = make_step(model, optimizer, batch_fn, loss_fn)
    for _ in range(warmup):
        step()
    dist.barrier()  # the ranks start their profiled steps together
    return profile_to_bytes(step, steps=steps, warmup=0)


def graph_breaks_on_rank(
    model_fn: Callable[[], Any],
    batch_fn: Callable[[int], Any],
    settings: ShardSettings | None,
    *,
    blocks: Sequence[str] | None,
    backend: str,
    steps: int,
    lr: float,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> Any:
    """On a rank: compile each block (``block.compile``, before ``fully_shard`` as torchtitan
    does, so FSDP2's hooks stay around the compiled forward), shard, and capture the graphs,
    breaks and recompiles of ``steps`` training steps (a GraphReport)."""
    import torch

    from nbtoolkit.compile.capture import capture_graphs
    from nbtoolkit.core.measure_config import MeasureConfig
    from nbtoolkit.integrations.fsdp2.wrap import sharded_blocks

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = model_fn()
    if is_fully_sharded(model):
        raise NbtUsageError(
            "fsdp2_graph_breaks compiles each block before sharding it: model_fn must return the "
            "plain model, not one already wrapped by fully_shard"
        )
    modules = dict(model.named_modules())
    names = sharded_blocks(model, blocks)
    for name in names:
        modules[name].compile(backend=backend)
    model = shard_model(model, settings, blocks=names)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    step = make_step(model, optimizer, batch_fn, loss_fn)
    try:
        return capture_graphs(
            step, config=MeasureConfig(steps=steps, warmup=0), eager_baseline=False, measure_cost=False,
            label="FSDP2, compiled per block",
        )
    finally:
        torch._dynamo.reset()
