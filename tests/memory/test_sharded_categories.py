"""FSDP2's tensors in a memory timeline: each lifetime gets one category (nbtoolkit.memory.sharded).

Synthetic event rows with the columns of a timeline, and FSDP2's ranges as the profiler gives
them; the cluster tests (tests/cluster/test_fsdp2.py) check the same on real ranks.
"""

from __future__ import annotations

import pandas as pd

from nbtoolkit.memory.schema import EVENT_COLUMNS
from nbtoolkit.memory.sharded import FsdpRegions, recategorize_sharded


def _row(time_us: float, action: str, size: int, category: str, tensor: int) -> tuple[object, ...]:
    return (time_us, action, size, category, tensor, "", "forward", "", "", -1)


def test_each_fsdp2_lifetime_gets_its_category() -> None:
    rows = [
        _row(0, "preexisting", 400, "unknown", 0),  # a parameter shard (pointer 1000)
        _row(0, "preexisting", 800, "unknown", 1),  # AdamW state of it (pointer 2000)
        _row(5, "alloc", 1600, "parameter", 2),  # the block's all-gathered parameters
        _row(6, "recategorize", -1600, "parameter", 2),
        _row(6, "recategorize", 1600, "activation", 2),
        _row(9, "free", -1600, "activation", 2),
        _row(20, "alloc", 1600, "gradient", 3),  # autograd's full-size gradient, freed by the reduce
        _row(31, "free", -1600, "gradient", 3),
        _row(32, "alloc", 400, "unknown", 4),  # the reduce-scatter's output: the sharded gradient
        _row(33, "alloc", 1600, "unknown", 5),  # the reduce-scatter's input, freed before the step
        _row(38, "free", -1600, "unknown", 5),
        _row(34, "alloc", 1600, "unknown", 6),  # a staging copy freed on a gloo thread (never seen)
        _row(50, "free", -400, "unknown", 4),  # zero_grad after the optimizer step
        _row(60, "alloc", 64, "activation", 7),  # an ordinary activation: left alone
        _row(61, "free", -64, "activation", 7),
        _row(70, "alloc", 1600, "unknown", 6),  # the same id again: a new lifetime, outside FSDP
    ]
    frame = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    regions = FsdpRegions(all_gather=[(4.0, 7.0)], reduce=[(30.0, 36.0)], optimizer_steps=[40.0])
    shards = {1000: "parameter", 2000: "optimizer_state"}
    out = recategorize_sharded(frame, pointers={0: 1000, 1: 2000}, regions=regions, before=shards, after={})
    keys = zip(out["tensor"], out["time_us"], out["category"], strict=True)
    categories = {(int(t), float(time)): str(c) for t, time, c in keys}
    assert categories[(0, 0.0)] == "parameter"
    assert categories[(1, 0.0)] == "optimizer_state"
    assert categories[(2, 5.0)] == categories[(2, 9.0)] == "unsharded_parameter"
    assert not ((out["tensor"] == 2) & (out["action"] == "recategorize")).any()  # one category, no moves
    assert categories[(3, 20.0)] == "unsharded_gradient"
    assert categories[(4, 32.0)] == categories[(4, 50.0)] == "gradient"
    assert categories[(5, 33.0)] == "unsharded_gradient"
    assert categories[(6, 34.0)] == "unsharded_gradient"
    assert categories[(6, 70.0)] == "unknown"  # the next lifetime of that id is decided on its own
    assert categories[(7, 60.0)] == "activation"
    # bytes are conserved: every alloc still has its free, in the same category
    assert out.groupby("tensor")["delta_bytes"].sum().loc[[2, 3, 4, 5, 7]].eq(0).all()


def test_a_model_without_shards_is_left_as_torch_gave_it() -> None:
    frame = pd.DataFrame([_row(0, "alloc", 8, "activation", 0)], columns=list(EVENT_COLUMNS))
    out = recategorize_sharded(frame, pointers={}, regions=FsdpRegions(), before={}, after={})
    assert out is frame
