"""Pieces of the cluster layer that need no Ray: rank specs, output prefixing, rank-side code
execution, displays (escaping), the ZeRO config and the sweep's plain-words reading."""

from __future__ import annotations

import io
import sys

import pandas as pd
import pytest

from nbtoolkit.cluster.output import RankPrefixedPrinter, prefix_lines
from nbtoolkit.cluster.rank_actor import RankActor
from nbtoolkit.cluster.rank_spec import parse_ranks
from nbtoolkit.cluster.rank_tools import read_matching_files
from nbtoolkit.cluster.ranks import _death_cause
from nbtoolkit.cluster.state import ClusterStatus, RankCallResult, RankFailure, RemoteRun
from nbtoolkit.core.errors import ClusterError, NbtUsageError, RemoteCellError
from nbtoolkit.integrations.deepspeed.config import grid_settings, label, zero_config
from nbtoolkit.integrations.deepspeed.sweep import read_sweep


def test_parse_ranks_accepts_lists_ranges_and_all() -> None:
    assert parse_ranks(None, 4) == [0, 1, 2, 3]
    assert parse_ranks("all", 2) == [0, 1]
    assert parse_ranks("0,2", 4) == [0, 2]
    assert parse_ranks("1-3", 4) == [1, 2, 3]
    assert parse_ranks(1, 2) == [1]
    assert parse_ranks([1, 0, 1], 2) == [0, 1]
    with pytest.raises(NbtUsageError, match="0-1"):
        parse_ranks("2", 2)
    with pytest.raises(NbtUsageError, match="rank spec"):
        parse_ranks("a-b", 2)


def test_printer_prefixes_complete_lines_and_flushes_the_rest() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = RankPrefixedPrinter(stdout=out, stderr=err)
    printer(0, "stdout", "hel")
    printer(1, "stdout", "one\ntw")
    printer(0, "stdout", "lo\n")
    printer(1, "stderr", "oops\n")
    assert out.getvalue() == "[rank 1] one\n[rank 0] hello\n"
    printer.flush()
    assert out.getvalue().endswith("[rank 1] tw\n")
    assert err.getvalue() == "[rank 1] oops\n"
    assert prefix_lines(3, "a\nb") == "[rank 3] a\n[rank 3] b"


def test_rank_actor_runs_cells_in_a_persistent_namespace_and_captures_output() -> None:
    actor = RankActor(rank=1, world_size=2)
    stdout = sys.stdout
    first = actor.run_cell("x = rank + 41\nprint('hi'); import sys; print('err', file=sys.stderr)\nx")
    assert sys.stdout is stdout  # the real streams are back
    assert first["value"] == 42 and first["error"] is None
    assert first["output"] == [("stdout", "hi\n"), ("stderr", "err\n")]
    assert actor.run_cell("x * 2")["value"] == 84
    failed = actor.run_cell("def f():\n    raise KeyError('k')\nf()")
    assert failed["error"].startswith("Traceback") and "KeyError: 'k'" in failed["error"]
    assert "rank_actor.py" not in failed["error"]  # only the user's frames
    bad = actor.run_cell("1 +")
    assert "SyntaxError" in bad["error"]
    assert actor.push({"y": 5})["error"] is None and actor.run_cell("y")["value"] == 5
    assert actor.interrupt() is False  # nothing running
    assert actor.state()["cells_run"] >= 4


def test_remote_tracebacks_hide_nbtoolkit_frames_and_keep_causes() -> None:
    """A cell failing under a tool (here a memory timeline) shows the user's frames only, keeps
    a chained cause, and drops the note about exc.timeline (that timeline stays on the rank)."""
    actor = RankActor(rank=0, world_size=1)
    cell = (
        "def load():\n    raise KeyError('cfg')\n"
        "try:\n    load()\nexcept KeyError as e:\n    raise ValueError('bad config') from e"
    )
    failed = actor.run_tool("nbtoolkit.cluster.rank_tools", "memory_timeline_on_rank", cell, {})
    error = failed["error"]
    assert "nbtoolkit" not in error.replace("nbtoolkit:", "")  # no frame of ours, no note of ours
    assert "exc.timeline" not in error
    assert 'File "<remote-cell>", line 4, in <module>' in error and "line 2, in load" in error
    assert "KeyError: 'cfg'" in error and "direct cause" in error and error.endswith("ValueError: bad config")
    # An error nbtoolkit raises itself keeps its message, with no frames at all.
    ours = actor.run_function(read_matching_files, (__file__, 1))
    assert ours["error"].startswith("ValueError: ") and "more than max_bytes" in ours["error"]


def test_remote_run_text_html_and_error_escape_foreign_text() -> None:
    raw = RankCallResult(
        outcomes={
            0: {
                "rank": 0,
                "value": "<script>alert(1)</script>",
                "error": None,
                "output": [],
                "elapsed_s": 0.1,
            },
            1: {
                "rank": 1,
                "value": None,
                "error": "Traceback\nValueError: <b>",
                "output": [],
                "elapsed_s": 0.1,
            },
        },
        dead=[RankFailure(rank=2, cause="its worker process (pid 7) exited: <killed>")],
    )
    run = RemoteRun([0, 1, 2], raw)
    assert not run.ok
    html = run._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;killed&gt;" in html
    text = repr(run)
    assert "[rank 1] error: ValueError: <b>" in text and "[rank 2] died" in text
    err = RemoteCellError(run)
    assert isinstance(err, ClusterError)
    message = str(err)
    assert "the cell failed on 2 of 3 ranks" in message and "rank 2 died" in message
    assert message.count("ValueError: <b>") == 1


def test_identical_tracebacks_are_shown_once_for_all_their_ranks() -> None:
    same = {
        "rank": 0,
        "value": None,
        "error": "Traceback\nZeroDivisionError: x",
        "output": [],
        "elapsed_s": 0,
    }
    raw = RankCallResult(outcomes={0: dict(same), 1: dict(same, rank=1)})
    message = str(RemoteCellError(RemoteRun([0, 1], raw)))
    assert message.count("ZeroDivisionError") == 1 and "--- ranks 0, 1 ---" in message


def test_status_html_escapes_causes() -> None:
    status = ClusterStatus(
        {"address": "127.0.0.1:1", "origin": "connected", "world_size": 1, "backend": "gloo", "master": None},
        [{"rank": 0, "state": "dead", "pid": 1, "ip": "127.0.0.1", "device": "cpu", "cells_run": 0,
          "busy_s": None, "cause": "<script>x</script>"}],
    )  # fmt: skip
    assert "<script>" not in status._repr_html_()
    assert "rank 0: dead" in repr(status)


def test_death_cause_is_short_and_names_the_pid() -> None:
    ray_message = (
        "The actor died unexpectedly before finishing this task. class_name: RankWorker pid: 1234 "
        "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
        "connection error code 2. End of file. Some common causes include: (1) the OOM killer"
    )
    cause = _death_cause(RuntimeError(ray_message))
    assert cause == (
        "its worker process (pid 1234) exited: Worker unexpectedly exits with a connection error code 2. "
        "End of file."
    )


def test_zero_config_and_labels() -> None:
    cfg = zero_config(stage=3, micro_batch_size=4, stage3_prefetch_bucket_size=50_000, overlap_comm=True)
    assert cfg["zero_optimization"] == {
        "stage": 3,
        "stage3_prefetch_bucket_size": 50_000,
        "overlap_comm": True,
    }
    assert cfg["train_micro_batch_size_per_gpu"] == 4
    with pytest.raises(NbtUsageError, match="stage"):
        zero_config(stage=4)
    with pytest.raises(NbtUsageError, match="reduce_bucket_size"):
        zero_config(reduce_bucket_size=-1)
    assert label({"stage": 2, "reduce_bucket_size": 200_000, "overlap_comm": True}) == "z2 rb=200k overlap"
    assert len(grid_settings({"stage": [1, 2], "overlap_comm": [False, True]})) == 4
    with pytest.raises(NbtUsageError, match="unknown ZeRO knob"):
        grid_settings({"bucket": [1]})


def test_reading_names_what_changed_and_what_it_did() -> None:
    table = pd.DataFrame(
        [
            {"config": "z1", "stage": 1, "reduce_bucket_size": None, "allgather_bucket_size": None,
             "stage3_prefetch_bucket_size": None, "overlap_comm": None, "step_time_ms": 50.0,
             "exposed_comm_ms": 20.0, "peak_mb": 100.0, "collectives_per_step": 3.0},
            {"config": "z3", "stage": 3, "reduce_bucket_size": None, "allgather_bucket_size": None,
             "stage3_prefetch_bucket_size": None, "overlap_comm": None, "step_time_ms": 100.0,
             "exposed_comm_ms": 40.0, "peak_mb": 60.0, "collectives_per_step": 9.0},
            {"config": "z1 rb=1k", "stage": 1, "reduce_bucket_size": 1000, "allgather_bucket_size": None,
             "stage3_prefetch_bucket_size": None, "overlap_comm": None, "step_time_ms": 52.0,
             "exposed_comm_ms": 20.0, "peak_mb": 100.0, "collectives_per_step": 3.0},
        ]
    )  # fmt: skip
    lines = read_sweep(table).splitlines()
    assert lines[0].startswith("baseline z1: 50.0 ms per step")
    assert "raised step time by 100% (50.0 ms -> 100.0 ms)" in lines[1]
    assert "cut peak memory by 40% (100.0 MB -> 60.0 MB)" in lines[1]
    assert "9 collective calls per step instead of 3" in lines[1] and "ZeRO-3" in lines[1]
    assert "changed reduce_bucket_size=1k" in lines[2] and "no clear change in step time" in lines[2]
    # the noise band widens with the sweep's measured drift and with the rows' own spreads
    assert "raised step time by 100%" in read_sweep(table, noise=0.5).splitlines()[1]
    assert "no clear change in step time" in read_sweep(table, noise=1.5).splitlines()[1]
    spread = table.assign(step_time_spread_ms=[20.0, 20.0, 1.0])
    assert "raised step time" in read_sweep(spread).splitlines()[1]  # 100% > (20 + 20) / 50
    wide = table.assign(step_time_spread_ms=[40.0, 30.0, 1.0])
    assert "no clear change in step time (50.0 ms -> 100.0 ms, within the ±140% noise)" in read_sweep(
        wide).splitlines()[1]


_CELLS_THEN_MEMORY = r"""
import threading, time
from nbtoolkit.cluster.rank_actor import RankActor
from nbtoolkit.cluster.rank_tools import read_matching_files

actor = RankActor(0, 1)
outcomes = []

def cells():  # a rank's cell thread: a plain cell, an interrupted one, then a memory timeline
    outcomes.append(actor.run_cell("x = 1\nx + 1"))
    outcomes.append(actor.run_cell("import time\nwhile True:\n    time.sleep(0.01)"))
    outcomes.append(actor.run_cell(
        "import torch, nbtoolkit as nbt\n"
        "m = torch.nn.Linear(32, 32)\n"
        "tl = nbt.memory_timeline(lambda: m(torch.randn(8, 32)).sum().backward(), model=m)\n"
        "tl.peak_bytes > 0"
    ))

worker = threading.Thread(target=cells)
worker.start()
while actor.state()["cells_run"] < 1 or actor.state()["busy_s"] is None:
    time.sleep(0.01)
assert actor.interrupt()
worker.join()
print([(o["value"], (o["error"] or "").splitlines()[-1:] ) for o in outcomes])
"""


def test_a_memory_timeline_runs_on_a_rank_thread_after_cells_and_an_interrupt(tmp_path) -> None:
    """Regression: a rank once cleared interrupts with PyThreadState_SetAsyncExc(tid, NULL), which
    on CPython 3.11 leaves the interpreter's "async exception pending" flag up for good; torch's
    Python tracer (memory timelines use with_stack=True) then spun forever at a function entry.
    Run in a subprocess: a hang cannot be recovered in this one."""
    from tests._python import run_python

    script = tmp_path / "cells.py"
    script.write_text(_CELLS_THEN_MEMORY)
    done = run_python(str(script), timeout=90)
    last = done.stdout.strip().splitlines()[-1]
    assert last == "[(2, []), (None, ['KeyboardInterrupt: the cell was interrupted']), (True, [])]"


def test_a_gpu_ranks_memory_result_survives_the_trip_to_the_notebook(real_data) -> None:
    """On a GPU rank, memory_timeline attaches the CUDA allocator snapshot it recorded. A real
    snapshot from a GPU run stands in for it here; Ray ships results with its cloudpickle."""
    from ray import cloudpickle

    from nbtoolkit import load_memory_snapshot
    from nbtoolkit.memory.rank_memory import RankMemory

    snapshot = load_memory_snapshot(real_data("memory/kk_memory_files_memory_ctx128_fullstep.pickle"))
    timeline = snapshot.timeline()
    timeline.allocator_snapshot = snapshot
    shipped = cloudpickle.loads(cloudpickle.dumps(timeline))
    assert shipped.allocator_snapshot.stats().lines() == snapshot.stats().lines()
    assert shipped.peak_bytes == timeline.peak_bytes > 0
    result = RankMemory(timelines={0: shipped, 1: timeline})
    assert result.imbalance() == 1.0
    assert result.peaks()["peak_bytes"].tolist() == [timeline.peak_bytes] * 2
    assert repr(result).splitlines()[0].startswith("RankMemory: 2 ranks on cuda")


def test_the_message_after_freeing_a_blocked_rank_says_whether_a_new_group_formed() -> None:
    outcome = {"rank": 0, "value": None, "error": "KeyboardInterrupt: the cell was interrupted", "output": []}
    formed = RemoteRun([0, 1], RankCallResult(outcomes={0: outcome}, freed=[0], interrupted=True))
    assert "rank 0 kept waiting in a collective" in formed.failure_text()
    assert "formed a new one" in formed.failure_text() and "must be built again" in formed.failure_text()
    failed = RemoteRun(
        [0, 1],
        RankCallResult(outcomes={0: outcome}, freed=[0], regroup_error="port in use", interrupted=True),
    )
    assert "forming a new one failed (port in use): run cluster.restart()" in failed.failure_text()


def test_old_import_paths_name_the_moved_classes() -> None:
    """RemoteRun and ClusterStatus moved to the model, RemoteCellError to errors: old imports still work."""
    import nbtoolkit as nbt
    import nbtoolkit.cluster.ranks as ranks
    import nbtoolkit.cluster.state as model
    from nbtoolkit.cluster.figures import remote_run_html, status_html
    from nbtoolkit.core import errors

    assert RemoteRun is model.RemoteRun and ClusterStatus is model.ClusterStatus
    assert RemoteCellError is errors.RemoteCellError is nbt.RemoteCellError
    assert issubclass(RemoteCellError, ClusterError) and "RemoteCellError" in nbt.__all__
    assert ranks.RankCallResult is model.RankCallResult and ranks.RankFailure is model.RankFailure
    run = RemoteRun([0], RankCallResult(outcomes={0: {"value": "<i>", "error": None}}))
    assert remote_run_html(run) == run._repr_html_() and "&lt;i&gt;" in remote_run_html(run)
    status = ClusterStatus(
        {"address": "a:1", "origin": "connected", "world_size": 1, "backend": "gloo", "master": None}, []
    )
    assert status_html(status) == status._repr_html_()


def test_fetched_files_are_a_list_of_paths_that_says_what_came_back(tmp_path) -> None:
    from pathlib import Path

    from nbtoolkit.cluster.state import FetchedFiles

    (tmp_path / "rank1-b.json").write_bytes(b"x" * 3000)
    (tmp_path / "rank0-a.json").write_bytes(b"y" * 1000)
    files = FetchedFiles([tmp_path / "rank1-b.json", tmp_path / "rank0-a.json"])
    assert isinstance(files, list) and all(isinstance(p, Path) for p in files)
    assert [p.name for p in files] == ["rank0-a.json", "rank1-b.json"]  # sorted
    assert files.total_bytes == 4000 and files.folder == tmp_path
    from nbtoolkit.core.units import format_bytes

    assert repr(files).splitlines()[0] == f"fetched 2 files ({format_bytes(4000)}) into {tmp_path}"
    assert "rank1-b.json" in files._repr_html_()


def test_rank_counts_read_from_a_line_or_given_as_numbers() -> None:
    from nbtoolkit.cluster.rank_spec import rank_count
    from nbtoolkit.cluster.state import DEFAULT_RANKS

    assert rank_count(None) == DEFAULT_RANKS
    assert rank_count("4") == rank_count(4) == 4
    for bad in ("two", "0", 0, -1, True, 1.5):
        with pytest.raises(NbtUsageError, match="positive integer"):
            rank_count(bad)  # type: ignore[arg-type]


def test_status_names_each_ranks_node_only_when_ranks_span_several_nodes() -> None:
    def status(nodes: int) -> ClusterStatus:
        header = {"address": "ray://h:1", "origin": "connected", "world_size": 2, "backend": "gloo",
                  "master": "10.0.0.1:5", "nodes": nodes}
        rows = [{"rank": r, "state": "idle", "pid": 1, "node": f"host{r + 1}", "ip": f"10.0.0.{r + 1}",
                 "device": "cpu", "cells_run": 0, "busy_s": None, "cause": None} for r in range(2)]
        return ClusterStatus(header, rows)  # fmt: skip

    two = status(2)
    assert "rank 1: idle (pid 1, node host2 10.0.0.2," in repr(two)
    assert "<td>host2 10.0.0.2</td>" in two._repr_html_() and "<th>node ip</th>" in two._repr_html_()
    assert "node host" not in repr(status(1)) and "<th>ip</th>" in status(1)._repr_html_()


def test_connect_starts_one_rank_per_gpu_else_per_cpu_slot_unless_told() -> None:
    from nbtoolkit.cluster.lifecycle import ranks_for

    assert ranks_for({"CPU": 6.0}, None) == 6
    assert ranks_for({"CPU": 64.0, "GPU": 8.0}, None) == 8
    assert ranks_for({"CPU": 6.0, "GPU": 8.0}, 3) == 3
    assert ranks_for({}, None) == 2  # a cluster that reports nothing: the default


def test_placement_strategy_is_checked_before_anything_starts() -> None:
    import nbtoolkit as nbt
    from nbtoolkit.cluster.placement import parse_strategy

    assert parse_strategy("spread") == "SPREAD" and parse_strategy("STRICT_PACK") == "STRICT_PACK"
    with pytest.raises(NbtUsageError, match="strategy must be one of pack, spread"):
        nbt.Cluster.connect("ray://h:1", token="t", strategy="everywhere")
    with pytest.raises(NbtUsageError, match=r"ray://HEAD:10001.*HEAD:6379"):
        nbt.Cluster.connect("ray://nowhere", token="t")
    with pytest.raises(NbtUsageError, match="name must be"):
        nbt.Cluster.connect("ray://h:1", token="t", name="no spaces")


def test_a_version_mismatch_message_names_both_sides() -> None:
    from nbtoolkit.cluster.connection import _connect_failure

    ray_text = (
        "Version mismatch: The cluster was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n"
        "This process on Ray Client was started with:\n    Ray: 2.59.1\n    Python: 3.12.2\n"
    )
    message = _connect_failure("ray://h:10001", RuntimeError(ray_text))
    assert "runs Ray 2.60.0 on Python 3.11.7" in message and "has Ray 2.59.1 on Python 3.12.2" in message
    assert "pip install 'ray==2.60.0'" in message and "\n" not in message


_INTERRUPTED = "KeyboardInterrupt: the cell was interrupted"


def _outcome(rank: int, error: str | None = None, value: object = None) -> dict:
    return {"rank": rank, "value": value, "error": error, "output": []}


def test_the_interrupt_message_names_each_rank_once_finished_interrupted_or_failed() -> None:
    """Issue 32/5: "failed on 1 of 2 ranks: interrupted on ranks 0, 1" named a rank that had finished."""
    run = RemoteRun(
        [0, 1],
        RankCallResult(
            outcomes={0: _outcome(0, _INTERRUPTED), 1: _outcome(1)},
            freed=[0],
            interrupted=True,
            interrupted_ranks=[0],
            interrupt_reason="after the hang diagnosis",
        ),
    )
    head = run.failure_text().splitlines()[0]
    assert head.startswith(
        "the cell was stopped: interrupted (after the hang diagnosis) on rank 0; finished on rank 1;"
    )
    assert "ranks 0, 1" not in head and "failed" not in head
    # Three ranks: one failed on its own before Ctrl-C, one was interrupted, one never stopped.
    mixed = RemoteRun(
        [0, 1, 2],
        RankCallResult(
            outcomes={0: _outcome(0, "ValueError: bad batch"), 1: _outcome(1, _INTERRUPTED)},
            stuck=[2],
            interrupted=True,
            interrupted_ranks=[1, 2],
        ),
    )
    head = mixed.failure_text().splitlines()[0]
    assert head.startswith(
        "the cell failed on 2 of 3 ranks: interrupted (Ctrl-C) on rank 1; failed on rank 0;"
    )
    assert "rank 2 did not stop" in head and "finished" not in head
    # A rank that finished just as the interrupt came is "finished", not "interrupted".
    late = RemoteRun(
        [0, 1],
        RankCallResult(outcomes={0: _outcome(0, value=3), 1: _outcome(1, _INTERRUPTED)}, interrupted=True,
                       interrupted_ranks=[0, 1]),
    )
    assert late.failure_text().splitlines()[0] == (
        "the cell was stopped: interrupted (Ctrl-C) on rank 1; finished on rank 0"
    )
    # A rank inside one long C call (time.sleep) never stops: not "after every rank had ended".
    stuck = RemoteRun(
        [0, 1],
        RankCallResult(
            outcomes={1: _outcome(1, value=1)}, stuck=[0], interrupted=True, interrupted_ranks=[0]
        ),
    )
    assert stuck.failure_text() == (
        "the cell failed on 1 of 2 ranks: finished on rank 1; rank 0 did not stop: blocked in a collective "
        "until its timeout, or in one long call (C code) until it returns; run cluster.restart() for "
        "fresh ranks"
    )
    # A plain failure keeps its short head (the tracebacks name the ranks).
    plain = RemoteRun([0, 1], RankCallResult(outcomes={0: _outcome(0, "KeyError: 'k'"), 1: _outcome(1)}))
    assert plain.failure_text().splitlines()[0] == "the cell failed on 1 of 2 ranks"


def test_the_message_after_a_new_group_names_the_variables_to_build_again() -> None:
    run = RemoteRun(
        [0, 1],
        RankCallResult(
            outcomes={0: _outcome(0, _INTERRUPTED), 1: _outcome(1)},
            freed=[0],
            interrupted=True,
            interrupted_ranks=[0],
            rebuild=[("net", "DistributedDataParallel"), ("engine", "DeepSpeedEngine")],
        ),
    )
    text = run.failure_text()
    assert "Every rank kept its variables, but these were built on the old group" in text
    assert "net (DistributedDataParallel): wrap its module again, net = DDP(net.module)" in text
    assert "engine (DeepSpeedEngine): call deepspeed.initialize again with model=engine.module" in text
    # DDP models on the world group are moved for the user: said, and nothing left to build.
    moved = RemoteRun(
        [0, 1],
        RankCallResult(
            outcomes={0: _outcome(0, _INTERRUPTED), 1: _outcome(1)},
            freed=[0],
            interrupted=True,
            interrupted_ranks=[0],
            rebound=["model"],
        ),
    )
    assert moved.failure_text().splitlines()[0].endswith(
        "formed a new one. Every rank kept its variables; nbtoolkit moved the DDP model 'model' to the new "
        "group; none of them needs building again (a DDP model or a subgroup kept inside a list or an "
        "object would: it must be built again)"
    )


def test_a_local_cluster_too_big_for_the_machine_fails_at_once_naming_the_limit(monkeypatch) -> None:
    """Issue 32/9: Cluster.local(ranks=10**6) waited 119 s and took ~6 GB before "no room"."""
    import time

    import nbtoolkit as nbt
    from nbtoolkit.cluster import placement

    started = time.monotonic()
    with pytest.raises(ClusterError) as info:
        nbt.Cluster.local(ranks=10**6)
    assert time.monotonic() - started < 1.0
    assert "cannot run 1,000,000 local ranks" in str(info.value) and "Cluster.connect" in str(info.value)
    # Memory decides where it is the tighter limit: 16 CPUs allow 128 ranks, 2 GiB about 5.
    monkeypatch.setattr(placement.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(placement, "_available_memory", lambda: 2 * 2**30)
    with pytest.raises(ClusterError, match=r"room for at most 5 \(2.0 GiB of memory available, about 300"):
        placement.check_local_room(6)
    placement.check_local_room(5)  # fits: no error
    monkeypatch.setattr(placement, "_available_memory", lambda: None)  # not Linux: CPUs only
    with pytest.raises(ClusterError, match=r"room for at most 128 \(16 CPU cores x 8 ranks per core\)"):
        placement.check_local_room(129)


_PROXIER_TRACEBACK = (
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    '  File ".../ray/util/client/server/proxier.py", line 396, in start_specific_server\n'
    "    cmd = psutil_proc.cmdline()\n"
    "psutil.ZombieProcess: PID still exists but it's a zombie (pid=4242)"
)


def test_a_ray_client_session_the_proxier_failed_to_start_is_tried_again_with_a_fresh_client(
    monkeypatch,
) -> None:
    """Issue 32/6: after a wrong token, the right one failed once in two tries with the proxier's
    ZombieProcess traceback inside the ClusterError. A new ray.init is a new client (fresh id)."""
    import ray

    from nbtoolkit.cluster import connection

    calls: list[str] = []
    outcomes = [ConnectionError(_PROXIER_TRACEBACK), None]

    def init(**kwargs):
        calls.append(kwargs["address"])
        failure = outcomes.pop(0)
        if failure is not None:
            raise failure

    monkeypatch.setattr(connection, "probe_client", lambda address, token: None)
    monkeypatch.setattr(connection, "_CLIENT_RETRY_PAUSE_S", 0.0)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    attachment = connection.connect("ray://10.0.0.1:10001", "the-token")
    assert calls == ["ray://10.0.0.1:10001", "shutdown", "ray://10.0.0.1:10001"]
    assert attachment.address == "ray://10.0.0.1:10001" and attachment.token == "the-token"
    connection._remember_client(None)
    connection._restore_env(attachment.saved_env)

    # Failing every time: one message that says what to do, Ray's last line, no traceback.
    calls.clear()
    outcomes[:] = [ConnectionError(_PROXIER_TRACEBACK)] * 3
    with pytest.raises(ClusterError) as info:
        connection.connect("ray://10.0.0.1:10001", "the-token")
    message = str(info.value)
    assert calls.count("ray://10.0.0.1:10001") == 3
    assert message.startswith("the Ray Client server at ray://10.0.0.1:10001 accepted the token but failed")
    assert "psutil.ZombieProcess: PID still exists but it's a zombie (pid=4242)" in message
    assert "Traceback" not in message and "proxier.py" not in message and "\n" not in message
    assert "Connect again in a few seconds" in message
    # Another failure is not retried: it fails at once with its own message.
    calls.clear()
    outcomes[:] = [RuntimeError("something else")]
    with pytest.raises(ClusterError, match=r"could not connect to the Ray cluster at ray://10\.0\.0\.1:10001"):
        connection.connect("ray://10.0.0.1:10001", "the-token")
    assert calls.count("ray://10.0.0.1:10001") == 1


def test_sever_cuts_this_process_connections_to_the_peers_but_not_those_kept() -> None:
    """The mechanism that frees a blocked gloo collective, on plain sockets: a thread blocked in
    recv() on a connection to a "peer" endpoint wakes when the connection is cut, whoever holds it;
    a connection to a kept endpoint (the rendezvous store) stays up."""
    import socket
    import threading

    from nbtoolkit.cluster.peer_sockets import sever, tcp_endpoints

    def pair() -> tuple[socket.socket, socket.socket, socket.socket]:
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        return server, client, accepted

    peer_server, blocked, peer_side = pair()  # "gloo": this process holds `blocked`
    store_server, store_client, store_side = pair()  # "the store": to be kept
    try:
        mine = set(tcp_endpoints())
        assert blocked.getsockname() in mine and store_client.getsockname() in mine
        woke: list[bytes] = []
        waiter = threading.Thread(target=lambda: woke.append(blocked.recv(1)))
        waiter.start()
        peers = [peer_server.getsockname(), store_server.getsockname()]
        cut = sever(peers, keep=[store_server.getsockname()])
        waiter.join(timeout=5)
        assert not waiter.is_alive() and woke == [b""]  # the blocked recv returned: connection ended
        assert cut == 1
        store_client.sendall(b"k")
        assert store_side.recv(1) == b"k"  # the kept connection still works
        assert blocked.fileno() >= 0  # the descriptor is its owner's to close
    finally:
        for s in (peer_server, blocked, peer_side, store_server, store_client, store_side):
            s.close()
