"""Integrations with other training libraries: DeepSpeed ZeRO (:mod:`.deepspeed`) and FSDP2
(:mod:`.fsdp2`), and what their sweeps and recompute plans share:

- :mod:`.rank_measure` (on a rank) and :mod:`.sweep_common`, :mod:`.sweep_result` (in the
  notebook): how a configuration is timed, profiled and read;
- :mod:`.recompute_rank` (on a rank) and :mod:`.recompute_table`: recompute plans measured on
  every rank of any wrapper;
- :mod:`.recompute_strategies`: ``nbt.plan_recompute_on(cluster, ..., strategy=...)``, one entry
  for the ZeRO stages and FSDP2.
"""
