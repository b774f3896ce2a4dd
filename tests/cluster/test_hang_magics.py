"""The hang diagnosis through the magics and Ctrl-C, on a real local Ray cluster of 2 gloo ranks.

``%%nbt remote --hang-after S --stop-on-hang`` shows the diagnosis in the cell's output and
stops the cell; ``%nbt cluster why`` gives it again as an object; Ctrl-C (before any
threshold) keeps where each rank was, and the cluster runs the next cell. Needs a private
network namespace (``unshare --net``).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nbtoolkit.core.errors import RemoteCellError

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def shell() -> Iterator[Any]:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    shell.run_line_magic("nbt", "cluster start 2 --timeout 120")
    try:
        yield shell
    finally:
        shell.run_line_magic("nbt", "cluster stop")
        shell.run_line_magic("unload_ext", "nbtoolkit")


SKIPPING_CELL = (
    "batches = 3 if rank == 0 else 2\n"  # rank 1's shard is one batch shorter
    "for step in range(batches):\n"
    "    grad = torch.ones(1024)\n"
    "    dist.all_reduce(grad)\n"  # line 4
)


def test_remote_magic_shows_the_diagnosis_and_stops_on_hang(shell, capsys) -> None:
    started = time.monotonic()
    # Rank 1 finished (it skipped the collective); only rank 0 was interrupted (issue 32/5).
    stopped = r"interrupted \(after the hang diagnosis\) on rank 0; finished on rank 1;"
    with pytest.raises(RemoteCellError, match=stopped):
        shell.run_cell_magic("nbt", "remote --hang-after 3 --stop-on-hang", SKIPPING_CELL)
    took = time.monotonic() - started
    out = capsys.readouterr().out
    expected = "rank 1 finished the cell without entering all_reduce #3 that rank 0 waits in (cell line 4)"
    assert expected in out, out
    assert "rank 0: waits in all_reduce #3 [default_pg] (1024 elements: 1024) at cell line 4" in out
    assert "stopping the cell (on_hang='interrupt') after 3 s without progress" in out
    assert took < 60, f"the stopped cell took {took:.0f} s"

    report = shell.run_line_magic("nbt", "cluster why")
    assert report.verdicts[0].message == expected
    assert shell.user_ns["_nbt"] is report
    assert list(report.frame()["seq"].fillna(0).astype(int)) == [3, 0]

    # Fixed: every rank runs the same number of steps; the cluster works again.
    fixed = shell.run_cell_magic(
        "nbt", "remote", "for step in range(2):\n    dist.all_reduce(torch.ones(4))\nrank"
    )
    assert fixed.value_list() == [0, 1]


def test_ctrl_c_keeps_where_each_rank_was_for_cluster_why(shell, capsys) -> None:
    from nbtoolkit.cluster.cluster import Cluster

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # see test_cluster.ctrl_c_raises
    timer = threading.Timer(3.0, _thread.interrupt_main)  # what Ctrl-C does in a kernel
    timer.start()
    try:
        with pytest.raises(RemoteCellError, match=r"interrupted \(Ctrl-C\)"):
            # The default threshold (30 s) is far: the user presses Ctrl-C first.
            shell.run_cell_magic(
                "nbt",
                "remote",
                "if rank == 0:\n    dist.barrier()\nelse:\n    import time\n"
                "    while True:\n        time.sleep(0.05)",
            )
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert "hang diagnosis" not in capsys.readouterr().out
    report = shell.run_line_magic("nbt", "cluster why")
    assert report.source == "at Ctrl-C"
    (verdict,) = report.verdicts
    assert verdict.kind == "outside any collective" and verdict.culprits == (1,) and verdict.op == "barrier"
    assert "cell line 6: time.sleep(0.05)" in verdict.message or "cell line 5" in verdict.message
    assert Cluster.current().run("dist.all_reduce(torch.ones(1)); rank") == [0, 1]


def test_the_threshold_comes_from_the_environment_or_the_cluster(shell, monkeypatch, capsys) -> None:
    from nbtoolkit.cluster.cluster import Cluster
    from nbtoolkit.core.errors import NbtUsageError

    cluster = Cluster.current()
    monkeypatch.setenv("NBT_HANG_AFTER_S", "2")
    result = cluster.execute("if rank == 0:\n    dist.all_reduce(torch.ones(1))", on_hang="interrupt")
    assert result.interrupt_reason == "after the hang diagnosis"
    assert "after 2 s without progress" in capsys.readouterr().out
    monkeypatch.setenv("NBT_HANG_AFTER_S", "soon")
    with pytest.raises(NbtUsageError, match=r"\$NBT_HANG_AFTER_S must be seconds"):
        cluster.run("1")
    monkeypatch.delenv("NBT_HANG_AFTER_S")
    cluster.hang_after_s = 0  # off: a slow cell is nobody's business
    try:
        assert cluster.run("import time\ntime.sleep(1)\nrank") == [0, 1]
    finally:
        cluster.hang_after_s = None
    assert "hang diagnosis" not in capsys.readouterr().out
