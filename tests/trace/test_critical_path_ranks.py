"""Issue 38: the critical path across ranks names the late rank and the collective it delays.

On a real 3-rank DDP job over gloo (recorded here, inside the test's network namespace) in which
rank 1 sleeps before ``backward()`` in every step, and on the 8 real DLRM ranks (where present):
as recorded, and as a scale set with rank 5 made slow.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.scale_set import write_scale_set
from tests.trace.conftest import STRAGGLER_RANK, STRAGGLER_SLEEP_S, record_gloo_job

WORLD = 3


@pytest.fixture(scope="module")
def three_rank_gloo_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rank0..2.json of a 3-rank gloo DDP run; rank 1 sleeps in every step (tests/trace/conftest.py)."""
    return record_gloo_job(tmp_path_factory.mktemp("ddp3"), world=WORLD)


def test_the_slow_rank_of_a_real_gloo_job_is_named_with_the_collective_it_delays(
    three_rank_gloo_job: Path,
) -> None:
    path = nbt.critical_path_across_ranks(nbt.load_trace(three_rank_gloo_job))
    assert path.bounding_rank == STRAGGLER_RANK
    its = path.iterations
    assert len(its) >= 1
    assert (its["late_rank"] == STRAGGLER_RANK).all(), its
    assert set(its["collective"]) == {"all_reduce"}  # DDP's gradient all_reduce waits for it
    others = sorted(set(range(WORLD)) - {STRAGGLER_RANK})
    assert all(sorted(w) == others for w in its["waiting_ranks"])
    # the sleep is what the others wait for, and what the late rank's compute costs them
    assert (its["median_wait_us"] > 0.5 * STRAGGLER_SLEEP_S * 1e6).all(), its
    assert (its["delay_us"] > 0.5 * STRAGGLER_SLEEP_S * 1e6).all(), its
    assert (its["transfer_us"] < its["median_wait_us"]).all()
    assert list(path.chain["link"]) == ["compute", "collective", "wait"] * len(its)
    text = repr(path)
    assert f"rank {STRAGGLER_RANK} computes" in text and "wait in all_reduce" in text
    # the same from a trace whose events are read one rank at a time
    lazy = nbt.critical_path_across_ranks(nbt.load_trace(three_rank_gloo_job, hold_events=False, workers=1))
    pd.testing.assert_frame_equal(lazy.iterations, its)


def test_one_rank_is_refused_with_what_to_use(cpu_trace_file: Path) -> None:
    with pytest.raises(nbt.TraceError, match=r"two or more ranks.*nbt\.critical_path"):
        nbt.critical_path_across_ranks(nbt.load_trace(cpu_trace_file))


def test_on_the_dlrm_ranks_and_a_dlrm_set_with_rank_5_slow(real_data, tmp_path: Path) -> None:
    base = real_data("traces/param_dlrm_8rank")
    real = nbt.critical_path_across_ranks(nbt.load_trace(base))
    assert len(real.iterations) >= 1
    for row in real.iterations.itertuples(index=False):
        assert sorted([*row.waiting_ranks, row.late_rank]) == list(range(8))
        assert row.total_wait_us >= row.max_wait_us >= row.median_wait_us >= 0
    made = write_scale_set(base, tmp_path / "set", ranks=8, straggler=5)
    slow = nbt.critical_path_across_ranks(nbt.load_trace(made.path))
    assert (slow.iterations["late_rank"] == 5).all(), slow.iterations
    # the scale set makes the others wait in the last communication call of each step
    last_call = slow.calls.groupby("step")["call"].max()
    assert (slow.iterations.set_index("step")["call"] == last_call.reindex(slow.iterations["step"])).all()
    assert (slow.iterations["delay_us"] > 0).all()
