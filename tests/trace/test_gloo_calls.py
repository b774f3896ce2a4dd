"""Each gloo call on a CPU rank is named by the collective the program called (the c10d op that queued it)."""

from __future__ import annotations

import numpy as np

from nbtoolkit.trace._gloo_calls import collective_of_c10d, gloo_call_collectives


def test_c10d_op_names_read_as_collectives() -> None:
    assert collective_of_c10d("c10d::_reduce_scatter_base_") == "reduce_scatter"
    assert collective_of_c10d("c10d::reduce_scatter_tensor_coalesced_") == "reduce_scatter"
    assert collective_of_c10d("c10d::_allgather_base_") == "all_gather"
    assert collective_of_c10d("c10d::allgather_into_tensor_coalesced_") == "all_gather"
    assert collective_of_c10d("c10d::allreduce_") == "all_reduce"
    assert collective_of_c10d("aten::mm") is None


def test_gloo_all_reduces_that_carried_reduce_scatters_are_named_so() -> None:
    # FSDP2's step on gloo: all-gather, then a reduce-scatter (run by gloo as an all-reduce),
    # then a real all-reduce; the gloo work starts after the op that queued it
    c10d = np.array(["c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::allreduce_"])
    c10d_ts = np.array([0.0, 10.0, 20.0])
    gloo = np.array(["gloo:all_reduce", "gloo:all_gather", "gloo:all_reduce", "gloo:broadcast"])
    gloo_ts = np.array([21.0, 1.0, 11.0, 30.0])
    assert gloo_call_collectives(gloo, gloo_ts, c10d, c10d_ts) == [
        "all_reduce", "all_gather", "reduce_scatter", "broadcast",
    ]
    # no queueing op found (a trace without c10d ops): gloo's own names
    assert gloo_call_collectives(gloo, gloo_ts, c10d[:0], c10d_ts[:0]) == [
        "all_reduce", "all_gather", "all_reduce", "broadcast",
    ]
