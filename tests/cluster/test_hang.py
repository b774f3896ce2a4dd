"""Hangs on a real local Ray cluster of 4 gloo ranks: each classic mistake is diagnosed while the
cell hangs, naming the rank(s), the op, its sequence number and the user's line, and the cluster
runs the next cell afterwards.

One cluster for the module (4 ranks on a 2-core machine: starting it costs 20-40 s). Every
hang here is stopped by the detector itself (``on_hang="interrupt"``, a 3 s threshold), which
takes the same path as Ctrl-C. Needs a private network namespace (``unshare --net``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nbtoolkit.core.errors import RemoteCellError

pytestmark = [pytest.mark.ray, pytest.mark.slow]

THRESHOLD_S = 3.0
DIAGNOSIS_WITHIN_S = 60.0  # the promise: diagnosed within a minute of the stall


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import nbtoolkit as nbt

    cl = nbt.Cluster.local(ranks=4, collective_timeout_s=120)
    try:
        yield cl
    finally:
        cl.close()


def _hang(cluster: Any, cell: str, capsys: pytest.CaptureFixture[str]) -> tuple[Any, str, float, Any]:
    """Run a cell that hangs: the diagnosis, what the cell printed, seconds it took, its RemoteRun."""
    started = time.monotonic()
    result = cluster.execute(cell, hang_after_s=THRESHOLD_S, on_hang="interrupt")
    assert not result.ok and result.interrupted and result.interrupt_reason == "after the hang diagnosis"
    report = cluster._live_group().last_hang_report
    assert report is not None, "no diagnosis was made"
    out = capsys.readouterr().out
    assert out.startswith("hang diagnosis (live ranks) after "), out
    assert report.stalled_s is not None and THRESHOLD_S <= report.stalled_s < DIAGNOSIS_WITHIN_S
    return report, out, time.monotonic() - started, result


def _usable_after(cluster: Any) -> None:
    assert cluster.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()") == [4.0] * 4


def test_a_skipped_collective_names_the_rank_that_finished_and_those_waiting(cluster, capsys) -> None:
    cell = (
        "t = torch.ones(8192)\n"  # line 1
        "dist.all_reduce(t)\n"  # 2: all_reduce #1 on every rank
        "if rank != 1:\n"  # 3
        "    dist.all_reduce(t)\n"  # 4: #2, skipped by rank 1
    )
    report, out, _, _ = _hang(cluster, cell, capsys)
    (verdict,) = report.verdicts
    assert verdict.kind == "skipped collective"
    assert (verdict.culprits, verdict.waiting, verdict.op, verdict.line) == ((1,), (0, 2, 3), "all_reduce", 4)
    assert verdict.message == (
        f"rank 1 finished the cell without entering all_reduce #{verdict.seq} that ranks 0, 2, 3 wait in "
        "(cell line 4)"
    )
    assert verdict.message in out and "rank 0: waits in all_reduce" in out
    frame = report.frame()
    assert list(frame["state"]) == ["in collective", "finished", "in collective", "in collective"]
    _usable_after(cluster)
    # The stall's diagnosis stays on hand after the cell: cluster.hang_report() / %nbt cluster why.
    assert cluster.hang_report() is report


def test_reordered_collectives_name_both_ops_and_lines(cluster, capsys) -> None:
    cell = (
        "a, b = torch.ones(64), torch.ones(64)\n"
        "if rank < 2:\n"
        "    dist.all_reduce(a)\n"  # line 3
        "    dist.broadcast(b, 0)\n"
        "else:\n"
        "    dist.broadcast(b, 0)\n"  # line 6
        "    dist.all_reduce(a)\n"
    )
    report, _, _, result = _hang(cluster, cell, capsys)
    kinds = {v.kind for v in report.verdicts}
    assert kinds == {"reordered collectives"}, report
    verdict = report.verdicts[0]
    assert verdict.waiting == (0, 1) and {v.culprits[0] for v in report.verdicts} == {2, 3}
    assert (
        f"#{verdict.seq} [default_pg] is all_reduce on ranks 0, 1 (cell line 3) but broadcast on rank 2 "
        "(cell line 6)" in verdict.message
    )
    # Every rank is blocked in a collective: no interrupt reaches Python, and closing a group on a
    # rank whose collective is in flight does not end its peers' waits (measured). Fresh ranks:
    assert sorted(result.stuck) == [0, 1, 2, 3]
    cluster.restart()
    _usable_after(cluster)


def test_a_size_mismatch_names_the_rank_and_both_element_counts(cluster, capsys) -> None:
    # An empty shard on rank 2: gloo lets its all_reduce through at once, the others wait forever.
    # (Unequal non-empty sizes make gloo abort the process instead: a dead rank, not a hang.)
    cell = (
        "n = 0 if rank == 2 else 8192\n"
        "grad = torch.ones(n)\n"
        "dist.all_reduce(grad)\n"  # line 3
    )
    report, _, _, _ = _hang(cluster, cell, capsys)
    (verdict,) = report.verdicts
    assert verdict.kind == "size mismatch" and verdict.culprits == (2,) and verdict.line == 3
    assert (
        f"sizes differ in all_reduce #{verdict.seq} [default_pg] (cell line 3): rank 2 sends 0 elements, "
        "the others 8192" == verdict.message
    )
    _usable_after(cluster)


def test_a_rank_stuck_in_time_sleep_outside_any_collective_is_named_with_its_line(cluster, capsys) -> None:
    cell = (
        "import time\n"
        "if rank == 3:\n"
        "    for _ in range(3000):\n"
        "        time.sleep(0.1)\n"  # line 4: where rank 3 is stuck (waiting for a file, say)
        "dist.all_reduce(torch.ones(4))\n"  # line 5
    )
    report, _, took, _ = _hang(cluster, cell, capsys)
    (verdict,) = report.verdicts
    assert verdict.kind == "outside any collective" and verdict.culprits == (3,) and verdict.line == 4
    assert verdict.waiting == (0, 1, 2) and verdict.op == "all_reduce"
    assert "rank 3 is outside any collective, at cell line 4: time.sleep(0.1)" in verdict.message
    assert "(cell line 5)" in verdict.message
    assert any("time.sleep" not in line and "<remote-cell>:4" in line for line in report.ranks[3].stack)
    assert took < DIAGNOSIS_WITHIN_S + 15
    _usable_after(cluster)


def test_hang_report_answers_live_from_another_thread_then_ctrl_c_frees_the_ranks(cluster) -> None:
    """The on-demand diagnosis while a cell hangs (the detector off), then Ctrl-C frees the ranks."""
    import _thread
    import signal

    reports: list[Any] = []

    def ask_then_press_ctrl_c() -> None:
        time.sleep(3)
        reports.append(cluster.hang_report())
        _thread.interrupt_main()  # what Ctrl-C does in a kernel

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # see test_cluster.ctrl_c_raises
    helper = threading.Thread(target=ask_then_press_ctrl_c)
    helper.start()
    try:
        cell = "if rank == 0:\n    dist.barrier()\nelse:\n    import time\n    while True:\n"
        cell += "        time.sleep(0.1)\n"
        result = cluster.execute(cell, hang_after_s=0)
    finally:
        helper.join()
        signal.signal(signal.SIGINT, previous)
    (report,) = reports
    assert report.source == "live ranks"
    assert report.ranks[0].state == "in collective" and report.ranks[0].current.op == "barrier"
    assert {r.state for r in report.ranks[1:]} == {"computing"}
    assert report.verdicts[0].kind == "outside any collective" and report.verdicts[0].op == "barrier"
    assert result.interrupted and result.freed == [0] and not result.stuck
    assert cluster.hang_report().source == "at Ctrl-C"  # where each rank was when Ctrl-C came
    _usable_after(cluster)


def test_a_bad_threshold_is_a_usage_error(cluster) -> None:
    from nbtoolkit.core.errors import NbtUsageError

    with pytest.raises(NbtUsageError, match="hang_after_s must be >= 0"):
        cluster.run("1", hang_after_s=-1)
    with pytest.raises(NbtUsageError, match="on_hang must be one of wait, interrupt"):
        cluster.run("1", on_hang="explode")


def test_without_a_hang_nothing_is_shown(cluster, capsys) -> None:
    cell = "import time\nfor i in range(4):\n    dist.all_reduce(torch.ones(2))\n    time.sleep(0.5)\nrank"
    assert cluster.run(cell, hang_after_s=1.5) == [0, 1, 2, 3]
    # Every rank computing without output is a long step, not a hang: nothing is shown.
    assert cluster.run("import time\ntime.sleep(4)\nrank", hang_after_s=1.5) == [0, 1, 2, 3]
    assert "hang diagnosis" not in capsys.readouterr().out
    with pytest.raises(RemoteCellError):
        cluster.run("raise ValueError('x')", hang_after_s=1.5)


def test_torch_flight_recorder_as_the_source_gives_the_same_verdict(cluster, capsys) -> None:
    """The path NCCL ranks take (their collectives return before the GPU ran them), run on gloo:
    the collectives come from torch's Flight Recorder on each rank instead of our own record."""
    import ray

    cluster.run("import os\nos.environ['NBT_HANG_FLIGHT_RECORDER'] = '1'")
    cell = "t = torch.ones(256)\ndist.all_reduce(t)\nif rank != 2:\n    dist.all_reduce(t)\n"
    report, _, _, result = _hang(cluster, cell, capsys)
    own_calls = ray.get(cluster._live_group().actors[0].hang_state.remote())["calls"]  # our own record
    assert len(report.verdicts) == 1, repr(report)
    (verdict,) = report.verdicts
    assert verdict.kind == "skipped collective" and verdict.culprits == (2,) and verdict.waiting == (0, 1, 3)
    assert verdict.line == 4 and "(cell line 4)" in verdict.message
    # torch numbers the collectives of the group the way our own record does.
    assert verdict.seq == own_calls[-1]["seq"] and own_calls[-1]["op"] == "all_reduce"
    assert report.ranks[0].current is not None and report.ranks[0].current.code == "dist.all_reduce(t)"
    # Freeing goes through the ranks that stopped: here (256 elements, rank 2 skipped) closing rank
    # 2's group freed none of the others (measured), so: fresh ranks, which also drops the variable.
    cluster.restart()
    _usable_after(cluster)
    assert result.interrupted
