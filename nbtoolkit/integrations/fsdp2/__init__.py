"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on the cluster's ranks, beside DeepSpeed ZeRO.

One module per job:

- :mod:`.wrap`: how a model is sharded (``fully_shard`` on each repeated block, then the root) and
  how a wrapped model is recognised;
- :mod:`.rank`: what runs on each rank (``build_sharded`` -> model and AdamW, ``make_step``, and
  the rank side of the measurements below);
- :mod:`.profile`: :func:`fsdp2_memory` (per-rank memory timelines: the shards, and FSDP2's
  gathered parameters and full-size gradients as categories of their own), :func:`fsdp2_overlap`
  (how much of the all-gathers and reduce-scatters computation hides) and
  :func:`fsdp2_graph_breaks` (a model compiled per block, then sharded);
- :mod:`.sweep` (+ :mod:`.sweep_rank`): :func:`fsdp2_sweep` and its :class:`Fsdp2Sweep` result,
  FSDP2's knobs measured on every rank (step time, exposed communication, overlap, peak memory)
  and read in plain words;
- :mod:`.recompute`: :func:`fsdp2_plan_recompute`, one recompute plan for all ranks under a
  per-rank device budget (also ``nbt.plan_recompute_on(cluster, ..., strategy="fsdp2")``);

Import each name from the module that defines it: this package file imports nothing, so importing
one part does not import the others (nor torch.distributed).
"""
