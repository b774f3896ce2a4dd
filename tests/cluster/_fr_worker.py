"""A real 2-rank gloo job that hangs on purpose with torch's Flight Recorder on; each rank dumps.

``python _fr_worker.py SCENARIO FOLDER PORT``: the ranks run three matching collectives,
then SCENARIO's mistake: ``skipped`` (rank 1 leaves out the fourth), ``reordered`` (rank 1
calls broadcast before all_reduce), ``sizes`` (rank 1's all_reduce has 0 elements, an empty
shard: gloo lets it through at once while rank 0 waits). A rank that is blocked is dumped
from a second thread after a second, the way torch's watchdog dumps a stuck rank; a rank that
is not blocked dumps at once. Files: FOLDER/rank0, FOLDER/rank1 (torch's pickle format).
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _dump(folder: str, rank: int) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace

    data = _dump_fr_trace()
    partial = os.path.join(folder, f".rank{rank}.part")
    with open(partial, "wb") as out:
        out.write(data)
    os.replace(partial, os.path.join(folder, f"rank{rank}"))


def _dump_soon_and_exit(folder: str, rank: int) -> None:
    time.sleep(1.0)  # the main thread is blocked in its collective by now
    _dump(folder, rank)
    _wait_for_both(folder)
    os._exit(0)


def _wait_for_both(folder: str) -> None:
    for _ in range(600):
        if all(os.path.exists(os.path.join(folder, f"rank{r}")) for r in (0, 1)):
            return
        time.sleep(0.05)


def work(rank: int, scenario: str, folder: str, port: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(8192)
    for _ in range(3):
        dist.all_reduce(t)
    threading.Thread(target=_dump_soon_and_exit, args=(folder, rank), daemon=True).start()
    try:
        if scenario == "skipped":
            if rank == 0:
                dist.all_reduce(t)  # rank 1 skips this one
        elif scenario == "reordered":
            if rank == 0:
                dist.all_reduce(t)
                dist.broadcast(t, 0)
            else:
                dist.broadcast(t, 0)
                dist.all_reduce(t)
        elif scenario == "sizes":
            dist.all_reduce(t if rank == 0 else torch.ones(0))
    except RuntimeError:
        # Both ranks have dumped by the time either exits (_wait_for_both); the peer's exit then
        # closes the connection under a rank still blocked here. Expected: the dump is taken.
        pass
    time.sleep(600)  # the dumping thread ends the process


if __name__ == "__main__":
    scenario, folder, port = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(folder, exist_ok=True)
    mp.start_processes(work, args=(scenario, folder, port), nprocs=2, start_method="fork", join=True)
