"""The cluster path of issue 19: a real local Ray cluster summarizes rank traces where they lie.

The numbers must equal the local path's (``nbt.summarize_traces``) and a full ``load_trace``'s;
the notebook receives summaries, never the JSON (checked by the size of what came back).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RANKS = 12


@pytest.fixture(scope="module")
def scale_folder(tmp_path_factory: pytest.TempPathFactory, real_data) -> Path:
    from nbtoolkit.trace.scale_set import write_scale_set

    folder = tmp_path_factory.mktemp("scale") / "traces"
    write_scale_set(real_data("traces/param_dlrm_8rank"), folder, ranks=RANKS, corrupt=[4], missing=[10])
    return folder


def test_cluster_summary_equals_local_and_full_load(cluster, scale_folder: Path) -> None:
    import nbtoolkit as nbt
    from nbtoolkit.trace.scale_set import ScaleSet

    made = ScaleSet.read(scale_folder)
    remote = cluster.summarize_traces(scale_folder)
    local = nbt.summarize_traces(scale_folder, workers=1)
    assert remote.ranks == local.ranks == [r for r in range(RANKS) if r not in (4, 10)]
    np.testing.assert_allclose(remote.overlap["overlap_pct"], local.overlap["overlap_pct"])
    np.testing.assert_allclose(remote.overlap["exposed_comm_us"], local.overlap["exposed_comm_us"])
    assert [Path(f).name for f in remote.failed] == ["rank00004.json"]
    assert remote.missing_ranks == [10]
    report = nbt.stragglers(remote)
    assert report.has_straggler and report.slowest_rank == made.straggler
    assert any("summarized on the cluster" in n for n in remote.notes)
    # what crossed to the notebook is a summary: far smaller than the JSON the nodes read
    json_bytes = sum(p.stat().st_size for p in scale_folder.glob("rank*.json"))
    assert len(pickle.dumps(remote)) < json_bytes / 20


def test_cluster_brings_the_lanes_of_chosen_ranks_only(cluster, scale_folder: Path) -> None:
    import nbtoolkit as nbt

    remote = cluster.summarize_traces(str(scale_folder / "rank*.json"))
    lanes = cluster.load_trace_ranks(remote, [1, 9])
    assert lanes.ranks == [1, 9]
    direct = nbt.load_trace(scale_folder / "rank00009.json")
    assert len(lanes.events[9]) == len(direct.events[9])


def test_a_pattern_matching_nothing_names_it(cluster, tmp_path: Path) -> None:
    from nbtoolkit.core.errors import ClusterError

    with pytest.raises(ClusterError, match="no trace file matches"):
        cluster.summarize_traces(tmp_path / "nothing-here")
