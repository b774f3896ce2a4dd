"""DeepSpeed ZeRO on the cluster's ranks: configs, a sweep of the communication knobs, and the
graph breaks of a compiled model under each stage.

    from nbtoolkit.integrations.deepspeed.config import zero_config
    from nbtoolkit.integrations.deepspeed.sweep import zero_sweep
    cfg = zero_config(stage=2, micro_batch_size=8, reduce_bucket_size=200_000)
    sweep = zero_sweep(cluster, make_model, make_batch)      # a ZeroSweep result
    sweep.table; sweep.figure(); print(sweep.reading())

On CPU ranks DeepSpeed picks its CPU accelerator and talks over the gloo process group
the cluster set up (``deepspeed.initialize`` finds torch.distributed initialized). The
first launch on a machine JIT-builds DeepSpeed's shared-memory communication op (tens of
seconds; cached afterwards in ``~/.cache/torch_extensions``). The sweep passes a plain
``torch.optim.AdamW`` to DeepSpeed so that no fused optimizer op has to be built.

One module per job:

- :mod:`.config`: DeepSpeed config dicts and the settings a sweep tries (notebook side);
- :mod:`.rank`: what runs on each rank (builds the engine, times, profiles, captures graphs);
- :mod:`.sweep`: :func:`zero_sweep` and its :class:`ZeroSweep` result, with the definitions
  of what it measures and the plain-words reading of the table;
- :mod:`.recompute` (+ :mod:`.recompute_rank`): :func:`zero_plan_recompute`, recompute plans
  under each ZeRO stage that keep every rank under a budget of its device's total;
- :mod:`.graph_breaks`: :func:`zero_graph_breaks` and its :class:`ZeroGraphBreaks` result.

Import each name from the module that defines it (``from nbtoolkit.integrations.deepspeed.sweep
import zero_sweep``): this package file imports nothing, so importing one part does not import
the others.
"""
