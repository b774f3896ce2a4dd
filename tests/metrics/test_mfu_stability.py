"""The same step's MFU, measured five times from scratch on this CPU (each run measures its
own peak, as a fresh session would), stays within ±15% of the median and never above 100%.

A CPU shared with other jobs makes every wall-clock timing slow by their share, the peak's
and the step's alike, and no measurement can undo that: nbtoolkit watches for it (measures
again, waits, and says so in the peak's source and the notes; tested with a real competing
process in test_cpu_peak.py). This test asks whether the measurement is reproducible when the
CPU is the step's, so the five runs run in a child process in a session of its own at the
highest scheduling priority the OS grants (its autogroup's and its own nice value: -20 as
root, unchanged otherwise). They stop at the first run nbtoolkit itself reports as measured
on a busy machine all the same, and the test is then skipped with what was measured; what is
always checked is that no run shows an MFU above 100%.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

RUNS = 5

SCRIPT = textwrap.dedent(
    """
    import json, os
    priority = []
    try:  # this session's autogroup: how the kernel shares the CPU between sessions
        with open("/proc/self/autogroup", "w") as group:
            group.write("-20")
        priority.append("session nice -20")
    except OSError:
        pass
    try:  # before torch starts its threads, which inherit it
        os.setpriority(os.PRIO_PROCESS, 0, -20)
        priority.append("process nice -20")
    except (OSError, AttributeError):
        pass
    import torch
    import torch.nn.functional as F
    from torch import nn
    import nbtoolkit as nbt
    # one intra-op thread: with two on this 2-core machine the same step ran 21 or 28 ms from one
    # fresh model to the next (where the OS put the second thread), a spread of the machine, not of
    # the measurement; the peak is then measured for one thread too
    torch.set_num_threads(1)
    from nbtoolkit.metrics.cpu_peak import clear_cpu_peaks, cpu_peak

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.norm(x))))

    runs = []
    for run in range({runs}):
        clear_cpu_peaks()  # a fresh session: the peak is measured again
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 256), Block(256), Block(256), nn.Linear(256, 16))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(512, 256), torch.randint(0, 16, (512,))

        def step():
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        m = nbt.step_metrics(step, steps=9, warmup=3)
        busy = [note for note in m.notes if note.startswith("while the kept steps were timed")]
        if cpu_peak(m.dtype).busy:
            busy.append(m.peak_source)
        runs.append({{"mfu": m.mfu, "why": m.mfu_unavailable, "peak": m.peak_flops, "step_s": m.step_time_s,
                     "source": m.peak_source, "notes": m.notes, "busy": busy,
                     "priority": ", ".join(priority) or "normal"}})
        if busy:
            break
    print(json.dumps(runs))
    """
).format(runs=RUNS)


def test_mfu_of_the_same_step_is_stable_across_five_fresh_runs() -> None:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).resolve().parents[2], check=False, start_new_session=True)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    report = "\n".join(
        f"  run {i}: MFU {r['mfu']}, peak {r['peak'] / 1e9:.1f} GFLOP/s, step {1e3 * r['step_s']:.1f} ms; "
        f"{r['source']}; notes {r['notes']}"
        for i, r in enumerate(runs)
    ) + f"\n  priority: {runs[0]['priority']}"
    # never above 100%, busy machine or not
    assert all(r["mfu"] is None or 0 < r["mfu"] <= 1.0 for r in runs), report
    assert all(r["mfu"] is not None or r["why"] for r in runs), report
    if runs[-1]["busy"]:
        pytest.skip(f"run {len(runs) - 1} of {RUNS} was measured while other processes kept this CPU busy, "
                    f"as nbtoolkit reported: {runs[-1]['busy'][0][:300]} (priority: {runs[0]['priority']}); "
                    "MFUs of a shared CPU are not comparable, so their spread is not judged")
    assert len(runs) == RUNS
    assert all(r["mfu"] is not None for r in runs), report  # a peak measured on a quiet machine holds
    mfus = [r["mfu"] for r in runs]
    median = statistics.median(mfus)
    assert all(abs(v / median - 1) <= 0.15 for v in mfus), report
    assert time.perf_counter() - started < 90, report
