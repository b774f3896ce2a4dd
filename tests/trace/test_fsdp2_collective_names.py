"""FSDP2's overlap names each collective the same way whatever recorded it: NCCL's metadata names
(``_allgather_base``, ``_reduce_scatter_base``, as GPU traces carry them) and gloo's both read as
nccl-tests' names. The rows are the shape ``comm_comp_overlap(by="collective")`` gives; the real
gloo recording is checked in tests/cluster/test_fsdp2.py."""

from __future__ import annotations

import pandas as pd

from nbtoolkit.integrations.fsdp2.profile import Fsdp2Overlap


def test_nccl_and_gloo_names_of_one_collective_read_alike() -> None:
    calls = pd.DataFrame({
        "rank": [0, 0, 0, 1],
        "collective": ["_allgather_base", "all_gather_into_tensor", "_reduce_scatter_base", "reduce_scatter"],
        "dur_us": [100.0, 100.0, 50.0, 40.0],
        "overlap_time_us": [60.0, 100.0, 0.0, 10.0],
    })  # fmt: skip
    overlap = pd.DataFrame({"rank": [0, 1], "comm_time_us": [250.0, 40.0], "exposed_comm_us": [90.0, 30.0],
                            "overlap_pct": [64.0, 25.0]})  # fmt: skip
    result = Fsdp2Overlap(trace=None, overlap=overlap, per_step=pd.DataFrame(), per_collective=calls, steps=1)  # type: ignore[arg-type]
    table = result.collectives().set_index(["rank", "collective"])
    assert table.loc[(0, "all_gather"), "calls_per_step"] == 2
    assert table.loc[(0, "all_gather"), "exposed_us_per_step"] == 40.0
    assert table.loc[(1, "reduce_scatter"), "time_us_per_step"] == 40.0
    assert "(all_gather, reduce_scatter)" in result.reading()
