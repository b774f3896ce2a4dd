"""Mosaic's allocation categories, from an allocation's stack (its published rules, restated).

Meta's Mosaic (``facebookresearch/mosaic``, ``libmosaic/utils/data_utils.py``) sorts every
allocation of a CUDA snapshot by the frames of its stack with an ordered rule table; the first
rule that matches wins, else ``unknown``. :func:`mosaic_category` applies the same rules, in the
same order, so ``snapshot.memory_by("mosaic")`` gives the totals Mosaic's ``categories`` profile
gives (Mosaic's peak is taken over the trace from zero, without memory that existed before
recording: :func:`nbtoolkit.memory.breakdown.mosaic_peak` does the same).

Rules (``name``: a frame's function, ``file``: its file name; "any" = any frame of the stack):

1. ``fsdp``: any file contains ``fully_sharded_data_parallel.py``.
2. ``net``: any name starts with a DDP comm-hook symbol (``c10d::Reducer::all_reduce_bucket``,
   ``c10d::PythonCommHook::runHook``), or any file is a DDP comm hook or TorchRec ``comm_ops.py``.
3. ``embedding``: any name is a TorchRec/FBGEMM sharding or embedding-init function, or any file
   is a TorchRec/FBGEMM embedding module.
4. ``activation``: any name contains ``forward``; or is an FBGEMM/TBE lookup op; or any file is
   an Inductor cache kernel (``torchinductor_<user>/<xx>/c<hash>.py``).
5. ``parameter``: any name contains ``param`` or ``build_norm_fn``; any file contains
   ``flatten_params_wrapper``; an ``__init__`` frame in ``parallel/layers.py``.
6. ``backward``: any name starts with an autograd-engine or DDP-reducer C++ symbol; is
   ``_instantiate_filtered_grads``; contains ``backward``; is ``clip_grad_norm_``/``calc_grad_norm``.
7. ``optimizer``: any name is an optimizer entry point (``step``, ``_init_group``,
   ``custom_adamw``, ``_per_group_step_impl``, optimizer and Shampoo construction) or any file is
   ``torch/optim/optimizer.py`` / ``torchrec/optim/keyed.py``.
8. ``net``: any name is ``dist_max``/``dist_mean``/``dist_sum``/``_aggregate``.
9. ``net_setup``: any name contains ``validate_process_group``.
10. ``stats``: any name is ``compute_grad_stats``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["MOSAIC_CATEGORIES", "category_of", "frame_rules", "mosaic_category"]

MOSAIC_CATEGORIES = (
    "fsdp",
    "net",
    "embedding",
    "activation",
    "parameter",
    "backward",
    "optimizer",
    "net_setup",
    "stats",
    "unknown",
)

_EMBEDDING_NAMES = frozenset(
    [
        "_init_dmp",
        "_shard_modules_impl",
        "_create_shard_module",
        "shard",
        "apply_2d_emb_sharding",
        "_create_lookups",
        "create_lookup",
        "_create_embedding_kernel",
        "init_parameters",
        "_init_fbgemm_regroup",
        "_apply_split",
        "_apply_cache_state",
    ]
)
_EMBEDDING_FILES = (
    "torchrec/distributed/embedding_lookup.py",
    "torchrec/distributed/embeddingbag.py",
    "torchrec/distributed/batched_embedding_kernel.py",
    "torchrec/distributed/embedding_sharding.py",
    "torchrec/distributed/sharding/",
    "fbgemm_gpu/split_table_batched_embeddings_ops_training.py",
    "fbgemm_gpu/split_table_batched_embeddings_ops_training_common.py",
)
_FBGEMM_LOOKUP = re.compile(
    r"^(?:fbgemm_gpu::.*Op::forward|fbgemm_gpu::group_index_select_dim0|fbgemm_gpu::pack_segments"
    r"|fbgemm_gpu::permute_multi_embedding_|fbgemm_gpu::offsets_range_cuda"
    r"|split_embedding_codegen_lookup_.*_function_pt2|SplitVBELookupFunction_.*::forward)"
)
_INDUCTOR_KERNEL = re.compile(r"torchinductor_[^/]+/[a-z0-9]{2}/c[a-z0-9]+\.py")
_AUTOGRAD_PREFIXES = (
    "torch::autograd::Engine::",
    "torch::autograd::python::PythonEngine::",
    "torch::autograd::Node::operator()",
    "torch::autograd::PyNode::",
    "torch::autograd::CppNode<",
    "torch::autograd::GraphTask::",
    "torch::autograd::AccumulateGrad::",
    "torch::autograd::deleteNode",
    "torch::autograd::utils::LambdaPostHook",
)
_REDUCER_PREFIXES = tuple(
    f"c10d::Reducer::{n}"
    for n in (
        "mark_variable_ready",
        "mark_bucket_ready",
        "autograd_hook",
        "initialize_buckets",
        "initialize_local_used_map",
        "rebuild_buckets",
        "set_static_graph",
    )
)
_OPTIMIZER_NAMES = frozenset(
    [
        "custom_adamw",
        "_init_group",
        "step",
        "_per_group_step_impl",
        "create_optimizer",
        "_create_optimizer",
        "create_keyed_optimizer",
        "_instantiate_shampoo_preconditioner_list",
        "_create_kronecker_factors_state",
        "_create_kronecker_factors_state_for_block",
        "_create_base_kronecker_factors",
    ]
)

# Every rule asks whether *any* frame of the stack satisfies a test of (name, file): so each
# distinct frame is tested once (:func:`frame_rules`, a bit per rule it satisfies) and a stack's
# category is the first rule any of its frames satisfies (:func:`category_of`).
_RULES: list[tuple[Callable[[str, str], bool], str]] = [
    (lambda n, f: "fully_sharded_data_parallel.py" in f, "fsdp"),
    (lambda n, f: n.startswith(("c10d::Reducer::all_reduce_bucket", "c10d::PythonCommHook::runHook")), "net"),
    (lambda n, f: "torch/distributed/algorithms/ddp_comm_hooks/" in f, "net"),
    (lambda n, f: "torchrec/distributed/comm_ops.py" in f, "net"),
    (lambda n, f: n in _EMBEDDING_NAMES, "embedding"),
    (lambda n, f: any(part in f for part in _EMBEDDING_FILES), "embedding"),
    (lambda n, f: "forward" in n, "activation"),
    (lambda n, f: bool(_FBGEMM_LOOKUP.search(n)), "activation"),
    (lambda n, f: bool(_INDUCTOR_KERNEL.search(f)), "activation"),
    (lambda n, f: "param" in n, "parameter"),
    (lambda n, f: "flatten_params_wrapper" in f, "parameter"),
    (lambda n, f: "build_norm_fn" in n, "parameter"),
    (lambda n, f: "__init__" in n and "parallel/layers.py" in f, "parameter"),
    (lambda n, f: n.startswith(_AUTOGRAD_PREFIXES), "backward"),
    (lambda n, f: n.startswith(_REDUCER_PREFIXES), "backward"),
    (lambda n, f: n == "_instantiate_filtered_grads", "backward"),
    (lambda n, f: "backward" in n, "backward"),
    (lambda n, f: n in ("clip_grad_norm_", "calc_grad_norm"), "backward"),
    (lambda n, f: n in _OPTIMIZER_NAMES, "optimizer"),
    (lambda n, f: "torch/optim/optimizer.py" in f or "torchrec/optim/keyed.py" in f, "optimizer"),
    (lambda n, f: n in ("dist_max", "dist_mean", "dist_sum", "_aggregate"), "net"),
    (lambda n, f: "validate_process_group" in n, "net_setup"),
    (lambda n, f: n == "compute_grad_stats", "stats"),
]


def frame_rules(frame: dict[str, Any]) -> int:
    """The rules one frame satisfies, as bits (bit ``i``: rule ``i`` of the table).

    Only the first 4 KB of a name or file are tested: real ones are shorter, and a snapshot whose
    frames share one 1 MB name would otherwise be searched a megabyte per rule per frame.
    """
    name, file = str(frame.get("name", ""))[:4096], str(frame.get("filename", ""))[:4096]
    return sum(1 << i for i, (rule, _) in enumerate(_RULES) if rule(name, file))


def category_of(bits: int) -> str:
    """The category of the first rule set in ``bits`` (the OR of a stack's frames), else unknown."""
    if not bits:
        return "unknown"
    return _RULES[(bits & -bits).bit_length() - 1][1]


def mosaic_category(frames: list[dict[str, Any]] | None) -> str:
    """The Mosaic category of an allocation with these frames (see the module docstring)."""
    bits = 0
    for frame in frames or []:
        bits |= frame_rules(frame)
    return category_of(bits)
