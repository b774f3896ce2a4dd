"""Per-rank memory of each data-parallel strategy, from one traced step of the whole model.

The trace (:mod:`nbtoolkit.capacity.tracing`) is of one unsharded rank: its parameters, gradients,
optimizer state, and, at every allocation, the live gradients and transients (activations
and temporaries). A strategy changes which of these a rank holds whole and which a 1/N
shard of, and adds the buffers its collectives need. Per rank and strategy::

    peak = parameters + optimizer state + max over the step of
           (gradients(t) * g + forward/backward transients(t) + optimizer transients(t) * o)
           + gathered blocks + communication buckets

where ``g`` and ``o`` are 1 or 1/N (below). Categories reported at that peak: parameters,
gradients, optimizer state, activations (transients saved by forward), temporaries (the rest
of the transients, and the gathered blocks of ZeRO-3 / FSDP2), communication buckets. The
batch (``make_batch``'s tensors, alive through the step) is counted with the activations.

What each strategy holds, as the real implementations do (the ones ``FitResult.verify`` runs):

``ddp`` (torch DistributedDataParallel)
    everything whole; its reducer keeps flat buckets as large as all gradients together
    (``gradient_as_bucket_view=False``, the default), alive from construction.
``zero1`` / ``zero2`` / ``zero3`` (DeepSpeed)
    DeepSpeed keeps an fp32 master copy of its partition beside the model's own parameters
    (also when those are fp32), counted as optimizer state as DeepSpeed's docs do: with bf16,
    2 + 2 + 12 = 16 bytes per parameter over the stages. Stage 1 shards the optimizer state,
    2 the gradients too, 3 the parameters too (each block gathered while it runs). Gradients
    are reduced through a bucket of ``reduce_bucket_size`` elements (DeepSpeed's 5e8 default), into a
    partition buffer (stages 2 and 3) allocated whole. Stage 3 gathers a parameter into a new
    whole-size tensor and keeps its partition beside it (``ds_tensor``): the gathered copy is in
    addition to the 1/N share, not instead of it. Gathered parameters stay until
    ``stage3_max_live_parameters`` (1e9 elements) plus the ``stage3_prefetch_bucket_size`` (5e7)
    ahead are live, so a smaller model stays gathered through forward and backward. Parameters
    under ``stage3_param_persistence_threshold`` (1e5 elements) are never released: once gathered
    they stay whole, and their partition stays beside them as every parameter's does.
``fsdp2`` (torch ``fully_shard`` per repeated block, AdamW over the shards)
    parameters, gradients and optimizer state as 1/N shards; the block that runs is gathered
    (in bf16 under ``amp="bf16"``), and backward prefetches the next block's gather, so two gathered
    blocks are counted. Gradients are 1/N shards except the last two blocks' worth so far, held
    whole: the running block's until its reduce-scatter, and the previous block's reduce-scatter
    input, which FSDP2 frees only when the next reduce-scatter is issued (with every block
    recomputed the step peaks inside a later block's backward, where that input is alive).
"""

from __future__ import annotations

from dataclasses import dataclass

from nbtoolkit.capacity.tracing import StepTrace
from nbtoolkit.core.errors import NbtUsageError

__all__ = ["CATEGORIES", "STRATEGIES", "RankMemory", "communication_bytes", "rank_memory"]

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2")

CATEGORIES = (
    "parameters", "gradients", "optimizer_state", "activations", "temporaries", "communication_buckets",
)

#: DeepSpeed's default stage3_max_live_parameters (elements)
ZERO3_LIVE_PARAMETERS = 1_000_000_000
#: DeepSpeed's default stage3_prefetch_bucket_size (elements): gathered ahead of the running module
ZERO3_PREFETCH_BUCKET = 50_000_000
#: DeepSpeed's default stage3_param_persistence_threshold (elements): smaller parameters stay whole
ZERO3_PERSISTENCE_THRESHOLD = 100_000
#: DeepSpeed's default reduce_bucket_size (elements)
ZERO_REDUCE_BUCKET = 500_000_000


@dataclass(frozen=True)
class RankMemory:
    """Predicted bytes one rank holds at its peak, by category (see the module doc)."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    temporaries: int
    communication_buckets: int

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CATEGORIES)


def _dtype_bytes(amp: str | None) -> int:
    return 2 if amp in ("bf16", "fp16") else 4


def rank_memory(
    trace: StepTrace, strategy: str, world: int, amp: str | None, *, zero_bucket: int = ZERO_REDUCE_BUCKET
) -> RankMemory:
    """Per-rank peak memory of ``strategy`` over ``world`` ranks (see the module doc)."""
    if strategy not in STRATEGIES:
        raise NbtUsageError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    n = world
    params = float(trace.state_bytes("parameter") + trace.state_bytes("buffer"))
    grads_whole = float(trace.state_bytes("gradient"))
    optimizer = float(trace.state_bytes("optimizer_state"))
    count = trace.parameter_count
    largest_block = max(trace.block_parameter_bytes, default=0)
    param_size = params / max(count, 1)  # bytes per parameter as the model holds them (4 for fp32)
    shard_grads = strategy in ("zero2", "zero3", "fsdp2")
    shard_optimizer = strategy != "ddp"
    g = 1 / n if shard_grads else 1.0
    o = 1 / n if shard_optimizer else 1.0
    # the step's transients with gradients and optimizer temporaries scaled; keep the peak's parts
    # FSDP2 holds the last two blocks' worth of the gradients so far whole: the running block's, until
    # its reduce-scatter, and the previous block's reduce-scatter input, which FSDP2 keeps until the
    # running block's own reduce-scatter is issued; the earlier ones are 1/N shards
    whole_window = 2 * largest_block if strategy == "fsdp2" else 0

    def held(grad: float) -> float:
        return grad * g + min(grad, whole_window) * (1 - g)

    best = (-1.0, 0.0, 0.0, 0.0)
    for _phase, grad, fb, opt in trace.transient_timeline():
        at = held(grad) + fb + opt * o
        if at > best[0]:
            best = (at, held(grad), fb, opt * o)
    _, grads_at_peak, fb_at_peak, opt_at_peak = best
    activations = min(fb_at_peak, trace.activation_bytes())
    temporaries = fb_at_peak - activations + opt_at_peak
    activations += trace.state_bytes("input")
    buckets = 0.0
    if strategy == "ddp":
        buckets = grads_whole if n > 1 else 0
    elif strategy.startswith("zero"):
        low = _dtype_bytes(amp) / param_size  # DeepSpeed holds the model in the amp dtype
        params, grads_at_peak = params * low, grads_at_peak * low
        master = 4 * count  # fp32 master copy of the partition (see the module doc)
        optimizer = optimizer + master
        buckets = zero_bucket * _dtype_bytes(amp)  # allocated whole, also past the model's size
        if strategy in ("zero2", "zero3"):
            # the partition's gradient buffer (contiguous_gradients, on by default) is allocated whole
            grads_at_peak += grads_whole * low / n
        if strategy == "zero3":
            small = (b for b in trace.parameter.values() if b / param_size < ZERO3_PERSISTENCE_THRESHOLD)
            persistent = low * sum(small)
            # every parameter gets its partition (ds_tensor) when the model is partitioned, the
            # persistent ones too: they are gathered once and then kept whole, beside their partition
            # (on the small ViT, every parameter persistent, the partitions were 0.77 MiB of 4 ranks
            # that the prediction missed)
            params = params / n + persistent
            # gathered parameters are released only past max_reuse_distance (1e9 by default), up to
            # max_live_parameters (1e9 elements) plus the prefetch bucket: a model below that stays
            # gathered through backward. Each gathered tensor is new memory beside its partition.
            live = min(count, ZERO3_LIVE_PARAMETERS + ZERO3_PREFETCH_BUCKET)
            temporaries += live * _dtype_bytes(amp) - persistent
    elif strategy == "fsdp2":
        params = params / n
        gathered = largest_block * (_dtype_bytes(amp) / param_size)
        # backward gathers the next block while one runs (two gathered); the whole gradients held
        # are counted with the gradients (above)
        temporaries += 2 * gathered
    return RankMemory(
        parameters=int(params),
        gradients=int(grads_at_peak),
        optimizer_state=int(optimizer * o),
        activations=int(activations),
        temporaries=int(temporaries),
        communication_buckets=int(buckets),
    )


def communication_bytes(trace: StepTrace, strategy: str, world: int, amp: str | None) -> float:
    """Bytes each rank sends per step in ring collectives ((N-1)/N of each all-gather or
    reduce-scatter, twice that for an all-reduce)."""
    n = world
    if n == 1:
        return 0.0
    share = (n - 1) / n
    count = trace.parameter_count
    if strategy == "ddp":
        return 2 * share * trace.state_bytes("gradient")  # all-reduce of the gradients as held
    low = count * _dtype_bytes(amp)  # ZeRO / FSDP2 move parameters and gradients in the amp dtype
    if strategy in ("zero1", "zero2"):
        return share * (low + low)  # reduce-scatter gradients, all-gather updated parameters
    return share * (2 * low + low)  # all-gather in forward and in backward, reduce-scatter gradients
