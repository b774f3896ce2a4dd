"""DeepSpeed ZeRO on the cluster's ranks (being split into modules by job; see sweep.py)."""

from nbtoolkit.integrations.deepspeed.sweep import (
    KNOBS,
    ZeroGraphBreaks,
    ZeroSweep,
    default_settings,
    graph_breaks_one_on_rank,
    grid_settings,
    label,
    read_sweep,
    sweep_one_on_rank,
    zero_config,
    zero_graph_breaks,
    zero_sweep,
)

__all__ = [
    "KNOBS",
    "ZeroGraphBreaks",
    "ZeroSweep",
    "default_settings",
    "graph_breaks_one_on_rank",
    "grid_settings",
    "label",
    "read_sweep",
    "sweep_one_on_rank",
    "zero_config",
    "zero_graph_breaks",
    "zero_sweep",
]
