"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on the cluster's ranks, beside DeepSpeed ZeRO.

One module per job:

- :mod:`.wrap`: how a model is sharded (``fully_shard`` on each repeated block, then the root) and
  how a wrapped model is recognised;

Import each name from the module that defines it: this package file imports nothing, so importing
one part does not import the others (nor torch.distributed).
"""
