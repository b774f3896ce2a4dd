"""nbt.Cluster on a real local Ray cluster of 2 CPU ranks (gloo), and the cluster magics.

One cluster serves the whole module (starting Ray costs 10-25 s on 2 cores). Every test
here needs a private network namespace: run pytest under
``unshare --net sh -c 'ip link set lo up && ...'``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbtoolkit.core.errors import ClusterError, NbtUsageError

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STALE_FILE = Path("/tmp/ray/ray_current_cluster")  # where `ray start` records its address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _no_ray_processes_left() -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ("raylet" in cmd or "gcs_server" in cmd) and str(os.getpid()) in _parents(int(pid)):
            out.append(cmd[:80])
    return out


def _parents(pid: int) -> str:
    chain = []
    for _ in range(10):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        chain.append(str(pid))
        if pid <= 1:
            break
    return " ".join(chain)


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    import nbtoolkit as nbt

    # The Ray trap: a `ray_current_cluster` file naming a cluster that is gone. Starting
    # must not try to join it (and the stale file is removed).
    wrote_stale = False
    if not STALE_FILE.exists():
        STALE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STALE_FILE.write_text(f"127.0.0.1:{_free_port()}")
        wrote_stale = True
    cl = nbt.Cluster.local(ranks=2, collective_timeout_s=60)
    try:
        if wrote_stale:
            assert not STALE_FILE.exists(), "the stale ray_current_cluster file should be removed"
        yield cl
    finally:
        cl.close()
        if wrote_stale:
            STALE_FILE.unlink(missing_ok=True)
    assert not _no_ray_processes_left(), "raylet/gcs processes left after close()"


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in this process, however the suite was started.

    A shell starts a background job (``make test &``) with SIGINT ignored, and Python then
    leaves it ignored: ``_thread.interrupt_main`` does nothing and an interrupt test waits
    forever. A kernel always has the default handler; give the test the same.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_started_cluster_has_two_gloo_ranks_with_token_auth(cluster) -> None:
    assert cluster.world_size == 2 and cluster.backend == "gloo"
    assert cluster.token and len(cluster.token) >= 32
    assert ":" in cluster.address
    text = repr(cluster)
    assert "2 ranks" in text and cluster.token not in text


def test_run_gives_one_value_per_rank_and_namespaces_persist(cluster) -> None:
    assert cluster.run("import os\nx = rank * 10\nx") == [0, 10]
    assert cluster.run("x + 1") == [1, 11]  # the namespace survived the previous cell
    assert cluster.run("(dist.get_rank(), dist.get_world_size(), os.environ['MASTER_ADDR'] != '')") == [
        (0, 2, True),
        (1, 2, True),
    ]


def test_a_function_is_called_on_every_rank_in_one_process_group(cluster) -> None:
    def all_reduce_rank() -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return float(t.item())

    assert cluster.run(all_reduce_rank) == [3.0, 3.0]
    assert cluster.run("rank + 100", ranks="1") == [101]
    assert cluster.run("rank", ranks=[0, 1]) == [0, 1]


def test_output_is_streamed_live_with_a_rank_prefix(cluster) -> None:
    from nbtoolkit.cluster.output import RankPrefixedPrinter

    arrivals: list[tuple[float, int, str]] = []
    out = io.StringIO()
    printer = RankPrefixedPrinter(stdout=out, stderr=out)

    def on_output(rank: int, stream: str, text: str) -> None:
        arrivals.append((time.monotonic(), rank, text))
        printer(rank, stream, text)

    started = time.monotonic()
    cluster.execute(
        "import sys, time\nprint('first', rank)\nsys.stdout.flush()\ntime.sleep(1.5)\n"
        "print('second', rank, file=sys.stderr)",
        on_output=on_output,
    )
    ended = time.monotonic()
    printer.flush()
    lines = out.getvalue().splitlines()
    assert "[rank 0] first 0" in lines and "[rank 1] first 1" in lines
    assert "[rank 0] second 0" in lines and "[rank 1] second 1" in lines
    first = min(t for t, _, text in arrivals if "first" in text)
    assert first < ended - 0.8, "the first line should arrive while the cell still runs"
    assert first - started < 1.2


def test_an_exception_is_reported_once_per_rank_with_the_remote_traceback(cluster) -> None:
    from nbtoolkit.core.errors import RemoteCellError

    with pytest.raises(RemoteCellError) as info:
        cluster.run("def f():\n    return 1 / (rank - 1)\nf()")
    err = info.value
    assert set(err.errors) == {1}
    message = str(err)
    assert message.count("ZeroDivisionError") == 1
    assert "rank 1" in message and "line 2, in f" in message
    assert "the cell failed on 1 of 2 ranks" in message
    assert cluster.run("rank") == [0, 1]  # the ranks are still usable


def test_an_unpicklable_value_comes_back_as_its_repr(cluster) -> None:
    values = cluster.run("import threading\nthreading.Lock()")
    assert all("lock" in repr(v) and "not picklable" in repr(v) for v in values)


def test_a_value_past_max_result_bytes_is_refused_naming_the_limit_and_the_rank_stays_usable(cluster) -> None:
    """Issue 32/9: a cell returning 1 GiB had no cap (fetch has one). The default cap (256 MiB)
    refuses a 257 MiB value on the rank; a call's limit and the cluster's attribute change it."""
    from nbtoolkit.cluster.shipping import RESULT_MAX_BYTES
    from nbtoolkit.core.errors import RemoteCellError

    assert cluster.max_result_bytes == RESULT_MAX_BYTES == 256 * 2**20
    with pytest.raises(RemoteCellError) as info:
        cluster.run("big = bytes(257 * 2**20)\nbig", ranks=0)
    message = str(info.value)
    assert "the cell's value is 257.00 MiB pickled, more than max_result_bytes (256.00 MiB)" in message
    assert "cluster.max_result_bytes = N" in message and "Traceback" not in message
    assert cluster.run("len(big)", ranks=0) == [257 * 2**20]  # kept on the rank, which still works
    cluster.run("del big", ranks=0)
    # A pickled object (a tensor) is measured as Ray would ship it; the call's limit wins.
    with pytest.raises(RemoteCellError, match=r"max_result_bytes \(1.00 KiB\)"):
        cluster.run("torch.zeros(1024)", max_result_bytes=1024)
    assert [len(v) for v in cluster.run("torch.zeros(1024)", max_result_bytes=8192)] == [1024, 1024]
    cluster.max_result_bytes = 100
    try:
        with pytest.raises(RemoteCellError, match=r"more than max_result_bytes \(100 B\)"):
            cluster.run("'x' * 101")
        assert cluster.run("'x' * 100") == ["x" * 100] * 2
        # fetch brings files back under its own cap (max_bytes), not the cell-value limit.
        cluster.run("open(f'/tmp/nbt-cap-{rank}.bin', 'wb').write(bytes(5000))")
        fetched = cluster.fetch("/tmp/nbt-cap-{rank}.bin")
        assert [p.stat().st_size for p in fetched] == [5000, 5000]
    finally:
        cluster.run("import pathlib\npathlib.Path(f'/tmp/nbt-cap-{rank}.bin').unlink(missing_ok=True)")
        cluster.max_result_bytes = RESULT_MAX_BYTES
    with pytest.raises(NbtUsageError, match="max_result_bytes must be a positive number of bytes"):
        cluster.run("1", max_result_bytes=0)
    assert cluster.run("rank") == [0, 1]


def test_push_and_pull_variables(cluster) -> None:
    cluster.push({"scale": 2.5, "names": ["a", "<b>"]})
    assert cluster.run("scale * (rank + 1)") == [2.5, 5.0]
    assert cluster.pull("names") == [["a", "<b>"], ["a", "<b>"]]
    with pytest.raises(NbtUsageError, match="identifier"):
        cluster.push({"not a name": 1})
    with pytest.raises(NbtUsageError, match="ranks"):
        cluster.run("1", ranks="5")


def test_ctrl_c_interrupts_the_cell_on_every_rank(cluster, ctrl_c_raises) -> None:
    import _thread

    from nbtoolkit.core.errors import RemoteCellError

    timer = threading.Timer(1.0, _thread.interrupt_main)  # what Ctrl-C does in a kernel
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(RemoteCellError, match="interrupted") as info:
            cluster.run("import time\nwhile True:\n    time.sleep(0.02)")
    finally:
        timer.cancel()
    assert time.monotonic() - started < 8
    assert set(info.value.errors) == {0, 1}
    assert cluster.run("rank") == [0, 1]  # both ranks took new work at once


def test_ctrl_c_frees_a_rank_blocked_in_a_collective_and_forms_a_new_group(cluster, ctrl_c_raises) -> None:
    """Rank 0 waits in all_reduce for rank 1, which loops in Python: the interrupt stops rank 1
    at once but cannot reach rank 0 inside the collective. Closing the group on rank 1 ends
    rank 0's wait; a new group is formed and both ranks keep their variables."""
    import _thread

    from nbtoolkit.core.errors import RemoteCellError

    cluster.run("kept = rank * 10")
    cell = (
        "import time\n"
        "if rank == 0:\n"
        "    dist.all_reduce(torch.ones(1))\n"
        "else:\n"
        "    while True:\n"
        "        time.sleep(0.02)"
    )
    timer = threading.Timer(1.0, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(RemoteCellError) as info:
            cluster.run(cell)
    finally:
        timer.cancel()
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "rank 0 kept waiting in a collective" in message and "formed a new one" in message
    assert elapsed < 30, f"took {elapsed:.1f} s; the collective timeout is 60 s"
    assert [row["info"].state for row in cluster._live_group().states()] == ["idle", "idle"]
    assert cluster.run("t = torch.ones(1)\ndist.all_reduce(t)\n(kept, t.item())") == [(0, 2.0), (10, 2.0)]


def test_ctrl_c_pressed_again_while_the_ranks_are_freed_does_not_leave_them_half_stopped(
    cluster, ctrl_c_raises
) -> None:
    """A second Ctrl-C 0.4 s after the first, and a third while the ranks get their grace to stop:
    they once escaped mid-way, leaving rank 1 out of the group and rank 0 still blocked (the next
    cell hung). Now they are held off until the ranks stopped, and the call ends with one error."""
    import _thread

    from nbtoolkit.core.errors import RemoteCellError

    cluster.run("kept = rank + 100")
    cell = (
        "import time\nif rank == 0:\n    dist.all_reduce(torch.ones(1))\n"
        "else:\n    while True:\n        time.sleep(0.02)"
    )
    timers = [threading.Timer(at, _thread.interrupt_main) for at in (1.0, 1.4, 3.0)]
    for timer in timers:
        timer.start()
    err = io.StringIO()
    try:
        with pytest.raises(RemoteCellError) as info, contextlib.redirect_stderr(err):
            cluster.run(cell)
    finally:
        for timer in timers:
            timer.cancel()
    assert "rank 0 kept waiting in a collective" in str(info.value)
    assert "still stopping the ranks (a few seconds): no need to interrupt again" in err.getvalue()
    assert [row["info"].state for row in cluster._live_group().states()] == ["idle", "idle"]
    assert cluster.run("t = torch.ones(1)\ndist.all_reduce(t)\n(kept, t.item())") == [(100, 2.0), (101, 2.0)]


def test_ctrl_c_frees_a_rank_blocked_in_ddps_own_allreduce_in_backward(cluster, ctrl_c_raises) -> None:
    """Rank 1 skips a training step: rank 0 waits in the allreduce DDP's reducer starts during
    backward (inside autograd's C++ engine, no Python frame to interrupt). Ctrl-C frees it long
    before the 60 s collective timeout, and the same DDP model trains on in the new group."""
    import _thread

    from nbtoolkit.core.errors import RemoteCellError

    cluster.run("from torch.nn.parallel import DistributedDataParallel as DDP\n"
                "ddp = DDP(torch.nn.Linear(4, 4)); steps = 0")
    skip = "if rank == 0:\n    ddp(torch.ones(2, 4)).sum().backward(); steps += 1\nelse:\n    pass  # skipped"
    timer = threading.Timer(2.0, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(RemoteCellError) as info:
            cluster.run(skip, hang_after_s=0)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 20
    head = str(info.value).splitlines()[0]
    assert "interrupted (Ctrl-C) on rank 0; finished on rank 1; rank 0 kept waiting in a collective" in head
    assert "nbtoolkit moved the DDP model 'ddp' to the new group" in head
    # The same DDP object trains on, its reducer reset after the interrupted backward.
    again = (
        "ddp.zero_grad()\nddp(torch.ones(2, 4)).sum().backward(); steps += 1\n"
        "(steps, ddp.module.weight.grad.sum().item())"
    )
    assert cluster.run(again) == [(1, 32.0), (1, 32.0)]
    cluster.run("del ddp")


def test_stop_on_hang_stops_a_skipped_ddp_step_and_the_model_trains_on(cluster, capsys) -> None:
    """The same skipped step with the hang detector: rank 0 in backward, rank 1 finished, is a hang
    (it was taken for a long step and waited out the 60 s collective timeout)."""
    cluster.run("from torch.nn.parallel import DistributedDataParallel as DDP\n"
                "net = DDP(torch.nn.Linear(4, 4))")
    skip = "if rank == 0:\n    net(torch.ones(2, 4)).sum().backward()"
    started = time.monotonic()
    result = cluster.execute(skip, hang_after_s=3, on_hang="interrupt")
    assert time.monotonic() - started < 20
    out = capsys.readouterr().out
    assert "=> rank 0 waits in backward at cell line 2" in out and "rank 1 finished the cell" in out
    assert result.interrupted and result.freed == [0] and result.rebound == ["net"]
    step = "net.zero_grad()\nnet(torch.ones(2, 4)).sum().backward()\nnet.module.bias.grad.tolist()"
    trained = cluster.run(step)
    assert trained == [[2.0] * 4] * 2
    cluster.run("del net")


def test_careless_cells_end_in_one_clear_error_and_the_ranks_stay_usable(cluster) -> None:
    """A cell raising KeyboardInterrupt itself is its own error, not "interrupted"; a value that
    pickles on the rank but not in the notebook is named (it escaped as Ray's RaySystemError)."""
    from nbtoolkit.core.errors import RemoteCellError

    with pytest.raises(RemoteCellError) as info:
        cluster.run("if rank == 1:\n    raise KeyboardInterrupt('mine')\nrank")
    message = str(info.value)
    assert message.startswith("the cell failed on 1 of 2 ranks\n--- rank 1 ---\nTraceback")
    assert "KeyboardInterrupt: mine" in message and "the cell was interrupted" not in message
    bad = "class Bad:\n    def __reduce__(self):\n        return (int, ('x',))\nBad()"
    with pytest.raises(RemoteCellError) as info:
        cluster.run(bad, ranks=0)
    unpickled = "the cell's value pickled on rank 0 but cannot be unpickled in the notebook (invalid literal"
    assert unpickled in str(info.value)
    assert cluster.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()") == [2.0, 2.0]


def test_ctrl_c_during_restart_leaves_nothing_placed_and_the_next_restart_works(
    cluster, ctrl_c_raises
) -> None:
    """Ctrl-C while restart() waited for its placement group left the group holding every CPU:
    the next restart waited its whole start timeout for room."""
    import _thread

    def restart_then_wait() -> None:
        cluster.restart()
        time.sleep(30)  # a restart that finished before the interrupt: it lands here instead

    cluster.run("x = 1")
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            restart_then_wait()
    finally:
        timer.cancel()
    with pytest.raises(ClusterError, match=r"run cluster.restart\(\)"):
        cluster.run("1")
    started = time.monotonic()
    cluster.restart()
    assert time.monotonic() - started < 60  # the start timeout is 120 s
    assert cluster.run("t = torch.ones(1)\ndist.all_reduce(t)\n(rank, t.item())") == [(0, 2.0), (1, 2.0)]


def test_profile_gathers_one_trace_per_rank(cluster) -> None:
    def step() -> float:
        import torch
        import torch.distributed as dist

        x = torch.randn(64, 64)
        y = (x @ x).sum()
        t = torch.ones(1024)
        dist.all_reduce(t)
        return float(y)

    trace = cluster.profile(step, steps=2, warmup=1)
    assert trace.ranks == [0, 1]
    for rank in (0, 1):
        events = trace.rank_events(rank)
        names = set(events["name"].astype(str))
        assert any(n.startswith("ProfilerStep#") for n in names)
        assert any("all_reduce" in n for n in names), "the gloo collective should be in the trace"
    assert trace.info[1].world_size == 2


def _profiled_steps(trace, rank: int) -> int:
    return len({n for n in trace.rank_events(rank)["name"].astype(str) if n.startswith("ProfilerStep#")})


def test_profile_takes_a_measure_config_and_its_keywords_win(cluster) -> None:
    from nbtoolkit.core.measure_config import MeasureConfig

    def step() -> float:
        import torch

        return float(torch.ones(8).sum())

    trace = cluster.profile(step, config=MeasureConfig(steps=2, warmup=0))
    assert [_profiled_steps(trace, r) for r in (0, 1)] == [2, 2]
    trace = cluster.profile(step, config=MeasureConfig(steps=2, warmup=0), steps=1)  # steps= wins
    assert [_profiled_steps(trace, r) for r in (0, 1)] == [1, 1]
    with pytest.raises(NbtUsageError, match=r"must be a nbtoolkit\.MeasureConfig"):
        cluster.profile(step, config={"steps": 2})  # type: ignore[arg-type]
    with pytest.raises(NbtUsageError, match="steps must be >= 1 and warmup >= 0"):
        cluster.profile(step, steps=0)


def test_graph_reports_come_back_from_every_rank(cluster) -> None:
    def compiled_with_a_break() -> object:
        import torch

        @torch.compile(backend="eager")
        def f(x):
            y = x.sin()
            print("a graph break")
            return y.cos()

        return f(torch.ones(4))

    reports = cluster.graphs(compiled_with_a_break, steps=0, eager_baseline=False, measure_cost=False)
    assert len(reports) == 2
    assert all(len(r.breaks) >= 1 for r in reports)


def test_step_metrics_come_back_from_every_rank(cluster) -> None:
    from nbtoolkit.metrics.step_metrics import StepMetrics, metrics_frame

    def linear_step() -> None:
        import torch

        layer = torch.nn.Linear(32, 16, bias=False)
        layer(torch.randn(8, 32)).sum().backward()

    results = cluster.step_metrics(linear_step, steps=2, warmup=1, peak_flops=1e12)
    assert len(results) == 2
    assert all(isinstance(m, StepMetrics) for m in results)
    # forward 2*8*32*16 plus the weight gradient (the same again); the input needs no gradient
    assert [m.model_flops for m in results] == [2 * 2 * 8 * 32 * 16] * 2
    assert len(metrics_frame(results, label="rank")) == 2


_MEMORY_SETUP = """
import torch
mem_model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
mem_opt = torch.optim.SGD(mem_model.parameters(), lr=0.01, momentum=0.9)
"""
_MEMORY_STEP = """
for i in range(2):
    print('step', i)
    mem_opt.zero_grad()
    mem_model(torch.randn(512 * (rank + 1), 128)).sum().backward()  # rank 1: twice the batch
    mem_opt.step()
"""


def test_memory_timelines_of_every_rank_after_an_interrupt_with_output_streaming(
    cluster, ctrl_c_raises, capsys: pytest.CaptureFixture[str]
) -> None:
    """The magic's path: output streams while each rank records its timeline with stacks.

    An interrupted cell comes first on purpose: ranks once cleared interrupts in a way that
    left torch's Python tracer (which memory timelines use) spinning forever afterwards.
    """
    import _thread

    from IPython.core.interactiveshell import InteractiveShell

    from nbtoolkit.core.errors import RemoteCellError
    from nbtoolkit.memory.rank_memory import RankMemory

    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(RemoteCellError, match="interrupted"):
            cluster.run("import time\nwhile True:\n    time.sleep(0.02)")
    finally:
        timer.cancel()
    cluster.run(_MEMORY_SETUP)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    try:
        started = time.monotonic()
        result = shell.run_cell_magic(
            "nbt", "remote --memory --model mem_model --optimizer mem_opt --name per_rank", _MEMORY_STEP
        )
        elapsed = time.monotonic() - started
    finally:
        shell.run_line_magic("unload_ext", "nbtoolkit")
    out = capsys.readouterr().out
    assert "[rank 0] step 1" in out and "[rank 1] step 1" in out
    assert elapsed < 60
    assert isinstance(result, RankMemory) and shell.user_ns["per_rank"] is result
    assert result.ranks == [0, 1]
    table = result.peaks().set_index("rank")
    parameter_bytes = 4 * (128 * 256 + 256 + 256 * 128 + 128)
    assert table.loc[0, "parameter"] == parameter_bytes == table.loc[1, "parameter"]
    assert table.loc[0, "optimizer_state"] == parameter_bytes  # one momentum buffer per parameter
    assert table.loc[1, "activation"] > table.loc[0, "activation"] > 0
    assert result.imbalance() > 1
    assert result.reading().startswith("rank 1 peaks highest")
    assert all(set(t.by_phase()["phase"]) >= {"forward", "backward", "optimizer"} for t in result)


def test_fetch_brings_back_the_files_ranks_wrote_and_they_load_as_one_trace(
    cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    import nbtoolkit as nbt
    from nbtoolkit.core.errors import RemoteCellError

    written = tmp_path / "on_ranks"  # a local cluster's ranks share this file system
    cluster.run(
        "import os\n"
        "from torch.profiler import profile\n"
        "with profile() as prof:\n"
        "    dist.all_reduce(torch.ones(256))\n"
        "    (torch.randn(64, 64) @ torch.randn(64, 64)).sum()\n"
        f"os.makedirs({str(written)!r}, exist_ok=True)\n"
        f"prof.export_chrome_trace(os.path.join({str(written)!r}, f'trace_{{rank}}.json'))"
    )
    local = tmp_path / "fetched"
    paths = cluster.fetch(str(written / "trace_{rank}.json"), into=local)
    assert [p.name for p in paths] == ["rank0-trace_0.json", "rank1-trace_1.json"]
    assert all(p.parent == local and p.stat().st_size > 0 for p in paths)
    trace = nbt.load_trace(local)
    assert trace.ranks == [0, 1]
    assert all(trace.info[r].world_size == 2 for r in trace.ranks)

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    try:
        one = shell.run_line_magic(
            "nbt", f"fetch {written}/trace_{{rank}}.json --to {tmp_path / 'm'} --ranks 1"
        )
    finally:
        shell.run_line_magic("unload_ext", "nbtoolkit")
    assert [p.name for p in one] == ["rank1-trace_1.json"]
    assert repr(one).startswith("fetched 1 file (") and "rank1-trace_1.json" in repr(one)
    assert repr(one).replace(str(tmp_path / "m"), "M") == repr(
        cluster.fetch(f"{written}/trace_{{rank}}.json", into=tmp_path / "api", ranks=1)
    ).replace(str(tmp_path / "api"), "M")

    with pytest.raises(ClusterError, match="no file matches"):
        cluster.fetch(str(tmp_path / "nothing_{rank}.txt"))
    with pytest.raises(RemoteCellError, match="more than max_bytes"):
        cluster.fetch(str(written / "*.json"), max_bytes=100)


def test_status_shows_every_rank(cluster) -> None:
    status = cluster.status()
    assert [row["rank"] for row in status.rows] == [0, 1]
    assert {row["state"] for row in status.rows} == {"idle"}
    assert set(cluster.pids) == {row["pid"] for row in status.rows}
    assert "rank 1: idle" in repr(status)
    assert "<table" in status._repr_html_()


def test_wrong_or_missing_token_fails_fast_with_authentication_failed(
    cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import nbtoolkit as nbt

    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"authentication failed.*rejected"):
        nbt.Cluster.connect(cluster.address, token="not-the-token")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ClusterError, match=r"authentication failed.*no token"):
        nbt.Cluster.connect(cluster.address)
    assert time.monotonic() - started < 10
    assert cluster.run("rank") == [0, 1]  # our own connection is untouched


def test_connecting_where_nothing_listens_fails_fast() -> None:
    import nbtoolkit as nbt

    started = time.monotonic()
    with pytest.raises(ClusterError, match="no Ray cluster answers"):
        nbt.Cluster.connect(f"127.0.0.1:{_free_port()}", token="x")
    assert time.monotonic() - started < 10
    with pytest.raises(NbtUsageError, match=r"'ray://HEAD:10001' \(Ray Client.*'HEAD:6379'"):
        nbt.Cluster.connect("nowhere", token="x")


def test_magics_run_cells_stream_output_and_show_errors_once(
    cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    from nbtoolkit.core.errors import RemoteCellError

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    try:
        result = shell.run_cell_magic("nbt", "remote", "print('hello from', rank)\nrank * 2")
        out = capsys.readouterr().out
        assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out
        assert result.value_list() == [0, 2]
        assert shell.user_ns["_nbt"] is result
        assert "[rank 1] 2" in repr(result)

        assert shell.run_cell_magic("nbt", "remote --ranks 1", "print('only', rank)") is None
        assert capsys.readouterr().out.strip() == "[rank 1] only 1"

        shell.user_ns["lr"] = 0.1
        shell.run_line_magic("nbt", "push lr")
        shell.run_cell_magic("nbt", "remote", "w = lr * (rank + 1)")
        shell.run_line_magic("nbt", "pull w --name ws")
        assert shell.user_ns["ws"] == [0.1, 0.2]

        with pytest.raises(RemoteCellError) as info:
            shell.run_cell_magic("nbt", "remote", "raise ValueError(f'bad <b> on {rank}')")
        rendered = "\n".join(info.value._render_traceback_())
        assert rendered.count("ValueError: bad <b> on 0") == 1
        assert rendered.count("ValueError: bad <b> on 1") == 1

        status = shell.run_line_magic("nbt", "cluster status")
        assert "rank 0: idle" in repr(status)
    finally:
        shell.run_line_magic("unload_ext", "nbtoolkit")


def test_magics_show_what_the_cluster_api_gives(cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Each cluster magic is one call of the API: same result, same display, same printed lines."""
    from IPython.core.interactiveshell import InteractiveShell

    from nbtoolkit.cluster.commands import cluster_command

    def bundle(value: object) -> dict[str, str]:
        return value._repr_mimebundle_()  # type: ignore[attr-defined]

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    try:
        status = shell.run_line_magic("nbt", "cluster status")
        assert bundle(status) == bundle(cluster_command("status")) == bundle(cluster.status())

        capsys.readouterr()
        from_magic = shell.run_cell_magic("nbt", "remote --ranks 0,1", "print('seen', rank)\nrank * 3")
        magic_out = capsys.readouterr().out
        from_api = cluster.run_cell("print('seen', rank)\nrank * 3", ranks="0,1")
        assert capsys.readouterr().out == magic_out and "[rank 1] seen 1" in magic_out
        assert bundle(from_magic) == bundle(from_api) and from_api.value_list() == [0, 3]
        assert shell.run_cell_magic("nbt", "remote", "x3 = 1") is None is cluster.run_cell("x3 = 1")

        shell.user_ns["lr"] = 0.5
        shell.run_line_magic("nbt", "push lr --ranks 1")
        magic_out = capsys.readouterr().out
        cluster.push({"lr": 0.5}, ranks="1")
        assert capsys.readouterr().out == magic_out == "pushed lr to rank 1\n"

        with pytest.raises(NbtUsageError, match="not both") as magic_error:
            shell.run_cell_magic("nbt", "remote --profile --memory", "rank")
        with pytest.raises(NbtUsageError) as api_error:
            cluster.run_cell("rank", profile=True, memory=True)
        assert str(magic_error.value) == str(api_error.value)
    finally:
        shell.run_line_magic("unload_ext", "nbtoolkit")


def _small_model():  # built on each rank
    import torch

    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))


def _batch(rank: int):
    import torch

    g = torch.Generator().manual_seed(rank)
    return torch.randn(8, 256, generator=g), torch.randn(8, 256, generator=g)


@pytest.mark.deepspeed
def test_zero_sweep_runs_deepspeed_stages_on_the_ranks(cluster) -> None:
    """ZeRO-1 and ZeRO-3 over the gloo group (the first run on a machine JIT-builds an op)."""
    from nbtoolkit.integrations.deepspeed.sweep import zero_sweep

    small = 16_384  # elements: a quarter of one layer's weights, so each stage needs several calls
    sweep = zero_sweep(
        cluster,
        _small_model,
        _batch,
        settings=[
            {"stage": 1, "reduce_bucket_size": small, "allgather_bucket_size": small},
            {"stage": 3, "reduce_bucket_size": small, "stage3_prefetch_bucket_size": small},
        ],
        steps=2,
        warmup=1,
    )
    table = sweep.table
    assert list(table["config"]) == ["z1 rb=16.4k ag=16.4k", "z3 rb=16.4k pf=16.4k"]
    assert (table["step_time_ms"] > 0).all() and (table["peak_mb"] > 0).all()
    assert (table["comm_ms"] > 0).all(), "gloo collectives should be found in every trace"
    # ZeRO-3 gathers parameters before each layer runs: more collective calls per step.
    assert table["collectives_per_step"].iloc[1] > table["collectives_per_step"].iloc[0]
    # Same seed, same data: the stages compute the same training step.
    assert table["loss"].iloc[0] == pytest.approx(table["loss"].iloc[1], rel=1e-5)
    assert set(sweep.traces) == set(table["config"])
    assert all(t.ranks == [0, 1] for t in sweep.traces.values())
    # the baseline ran again after the last configuration: the machine's drift bounds what is named
    assert sweep.drift is not None and sweep.noise >= max(0.10, sweep.drift)
    assert any("ran again after the last configuration" in note for note in sweep.notes)
    assert (table["step_time_spread_ms"] >= 0).all()
    reading = sweep.reading()
    assert "ZeRO-3 partitions parameters" in reading and "collective calls per step" in reading
    assert "ZeRO sweep: 2 configurations" in repr(sweep)
    fig = sweep.figure()
    assert {t.name for t in fig.data} >= {"step time", "peak memory"}
    assert cluster.run("dist.get_world_size()") == [2, 2]  # the group survives DeepSpeed


@pytest.mark.deepspeed
def test_zero3_splits_the_compiled_graph_where_zero1_does_not(cluster) -> None:
    """The seed's point: communication granularity decides how much of the model one graph holds."""
    from nbtoolkit.integrations.deepspeed.graph_breaks import zero_graph_breaks

    result = zero_graph_breaks(cluster, _small_model, _batch, stages=(1, 3), steps=1)
    table = result.table.set_index("stage")
    assert table.loc[1, "graphs"] == 1
    assert table.loc[1, "graph_breaks"] == 0
    assert table.loc[3, "graph_breaks"] > 0
    assert table.loc[3, "graphs"] > table.loc[1, "graphs"]
    assert table["same_on_all_ranks"].all()
    # ZeRO-3's breaks sit in DeepSpeed's parameter gather/release code, not in the model.
    files = " ".join(str(f) for f in result.reports[3].breaks["user_file"])
    assert "deepspeed" in files
    assert "per ZeRO stage" in repr(result)
    assert cluster.run("dist.get_world_size()") == [2, 2]


@pytest.mark.deepspeed
def test_zero_graph_breaks_takes_a_measure_config(cluster) -> None:
    from nbtoolkit.core.measure_config import MeasureConfig
    from nbtoolkit.integrations.deepspeed.graph_breaks import zero_graph_breaks

    with pytest.raises(NbtUsageError, match=r"must be a nbtoolkit\.MeasureConfig"):
        zero_graph_breaks(cluster, _small_model, _batch, stages=(1,), config=2)  # type: ignore[arg-type]
    with pytest.raises(NbtUsageError, match="steps must be >= 1"):
        zero_graph_breaks(cluster, _small_model, _batch, stages=(1,), config=MeasureConfig(), steps=0)
    result = zero_graph_breaks(cluster, _small_model, _batch, stages=(1,), config=MeasureConfig(steps=1))
    row = result.table.set_index("stage").loc[1]
    assert (row["graphs"], row["graph_breaks"]) == (1, 0)
    assert row["same_on_all_ranks"]


def test_a_killed_rank_ends_the_cell_with_its_name_and_restart_recovers(cluster) -> None:
    from nbtoolkit.core.errors import RemoteCellError

    victim = cluster.pids[1]
    killer = threading.Timer(1.0, os.kill, args=(victim, signal.SIGKILL))
    started = time.monotonic()
    killer.start()
    try:
        with pytest.raises(RemoteCellError) as info:
            # rank 0 enters the collective and waits for rank 1, which dies before joining it
            cluster.run(
                "import time\nif rank == 1:\n    time.sleep(30)\nt = torch.ones(1)\ndist.all_reduce(t)"
            )
    finally:
        killer.cancel()
    elapsed = time.monotonic() - started
    err = info.value
    assert set(err.dead) == {1}
    assert f"pid {victim}" in err.dead[1]
    assert "rank 1 died" in str(err) and "restart" in str(err)
    assert 0 in err.errors, "rank 0 must not hang in the collective"
    assert elapsed < 20

    status = cluster.status()
    states = {row["rank"]: row["state"] for row in status.rows}
    assert states == {0: "broken", 1: "dead"}
    with pytest.raises(ClusterError, match=r"rank 1 is dead.*restart"):
        cluster.run("rank")

    cluster.restart()
    assert victim not in cluster.pids
    assert cluster.run("t = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nt.item()") == [3.0, 3.0]
    assert {row["state"] for row in cluster.status().rows} == {"idle"}


def test_stop_then_start_again_in_the_same_process(cluster) -> None:
    """Last in the module: stop the shared cluster, then a fresh local start must work."""
    import nbtoolkit as nbt

    cluster.close()
    assert cluster.closed
    with pytest.raises(ClusterError, match="no cluster is running"):
        nbt.Cluster.current()
    again = nbt.Cluster.local(ranks=1)
    try:
        assert again.run("rank") == [0]
    finally:
        again.close()
