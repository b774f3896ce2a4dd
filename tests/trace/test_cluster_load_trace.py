"""One API at every scale: ``cluster.load_trace(folder)`` gives the multi-rank Trace ``nbt.load_trace`` does.

A real local Ray cluster (2 ranks) summarizes a scale set made from the gloo job this test session
records (tests/trace/conftest.py), where the files lie; the Trace it returns is a RankFolderTrace
whose overlap and stragglers equal the local load's, and whose rank events are read on the node
when asked for.
Run inside ``unshare --net`` (Ray; see scripts/run_tests.sh).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RANKS = 12


@pytest.fixture(scope="module")
def scale_folder(tmp_path_factory: pytest.TempPathFactory, gloo_trace_folder: Path) -> Path:
    from nbtoolkit.trace.scale_set import write_scale_set

    folder = tmp_path_factory.mktemp("scale") / "traces"
    write_scale_set(gloo_trace_folder, folder, ranks=RANKS, straggler=7)
    return folder


def test_cluster_load_trace_is_the_same_multi_rank_trace(scale_folder: Path) -> None:
    import nbtoolkit as nbt
    from nbtoolkit.trace.rank_folder_trace import RankFolderTrace
    from nbtoolkit.trace.scale_set import ScaleSet

    made = ScaleSet.read(scale_folder)
    local = nbt.load_trace(scale_folder, hold_events=False, workers=1)
    with nbt.Cluster.local(ranks=2, collective_timeout_s=60) as cl:
        remote = cl.load_trace(scale_folder)
        assert type(remote) is RankFolderTrace and type(local) is RankFolderTrace
        assert remote.ranks == local.ranks == list(range(RANKS))
        ours, theirs = nbt.comm_comp_overlap(remote), nbt.comm_comp_overlap(local)
        np.testing.assert_allclose(ours["overlap_pct"], theirs["overlap_pct"])
        np.testing.assert_allclose(ours["exposed_comm_us"], theirs["exposed_comm_us"])
        report = nbt.stragglers(remote)
        assert report.has_straggler and report.slowest_rank == made.straggler
        assert remote.rank_reads == 0
        events = remote.events[3]  # read on the node that holds rank 3's file
        assert remote.rank_reads == 1
        assert len(events) == len(local.events[3]) > 0
