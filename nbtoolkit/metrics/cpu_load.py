"""How much of this process's CPUs other processes used while something was timed.

A CPU timing (the matmul peak, a step) is only as good as the share of the cores it had: on
a shared machine another process's work takes cores from ours and the timing comes out
slow. :class:`CpuWatch` brackets a timed region and says what the others took:

- Linux: the busy time of the CPUs this process may run on (``/proc/stat``, the per-CPU
  lines of the CPUs in ``os.sched_getaffinity``; steal time counts as busy: a hypervisor gave
  the core to someone else) minus this process's own CPU time. That is the others' work,
  measured, not guessed from the load average.
- Elsewhere (no ``/proc/stat``): only this process's occupancy is known, the CPU time it got
  per thread per second of wall time; a thread that did not run while the work waited for it
  was descheduled. Meaningful for work that keeps every thread busy (a large matrix product).

The 1-minute load average is recorded alongside for the record, never judged on: it lags by
a minute. Pure standard library; no torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["BUSY_SHARE", "MIN_WINDOW_S", "CpuWatch", "CpuWindow", "load_average"]

#: Other processes taking more than this share of the cores our threads need make a timing
#: "busy" (10%: below it, the timing noise of an idle machine is larger than the loss).
BUSY_SHARE = 0.10

#: /proc/stat counts in ticks of 10 ms: over a shorter region the others' share is noise.
MIN_WINDOW_S = 0.1

# /proc/stat cpu columns: user nice system idle iowait irq softirq steal guest guest_nice.
# Busy = user + nice + system + irq + softirq + steal (guest time is already in user).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def _our_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def _busy_seconds(cpus: set[int]) -> float | None:
    """Busy seconds so far of the given CPUs, from ``/proc/stat``; None where it cannot be read."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.readlines()
        ticks_per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    total = 0
    found = 0
    for line in lines:
        if not (line.startswith("cpu") and line[3:4].isdigit()):
            continue
        fields = line.split()
        if int(fields[0][3:]) not in cpus:
            continue
        values = [int(v) for v in fields[1:]]
        total += sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
        found += 1
    return total / ticks_per_s if found else None


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class CpuWindow:
    """What happened on the CPUs during one watched region.

    Attributes:
        wall_s: wall seconds of the region.
        own_cpu_s: this process's CPU seconds (all its threads) in the region.
        cpus: how many CPUs this process may run on.
        threads: how many threads the timed work used (torch's intra-op threads).
        others_cpu_s: CPU seconds other processes (and the hypervisor, as steal) used on our
            CPUs, or None where ``/proc/stat`` cannot be read.
        load_average: the 1-minute load average at the end, or None.
    """

    wall_s: float
    own_cpu_s: float
    cpus: int
    threads: int
    others_cpu_s: float | None
    load_average: float | None

    @property
    def others_share(self) -> float | None:
        """The share of our threads' cores that other processes took, 0..1 (None: unknown, also
        for a region shorter than ``MIN_WINDOW_S``, which the 10 ms ticks cannot resolve).

        Others first fill the cores our threads do not need (``cpus - threads`` of them);
        only what is left competes with us.
        """
        if self.others_cpu_s is None or self.wall_s < MIN_WINDOW_S:
            return None
        spare = max(0, self.cpus - self.threads)
        competing = max(0.0, self.others_cpu_s / self.wall_s - spare)
        return min(1.0, competing / max(1, min(self.threads, self.cpus)))

    @property
    def occupancy(self) -> float:
        """CPU seconds this process got per thread per wall second (1.0: every thread ran throughout)."""
        if self.wall_s <= 0:
            return 0.0
        return self.own_cpu_s / (self.wall_s * max(1, min(self.threads, self.cpus)))

    def busy(self, *, saturating: bool = False) -> bool:
        """Whether other processes competed for our cores: ``others_share`` above
        :data:`BUSY_SHARE`. Without ``/proc/stat``, for ``saturating`` work (all threads busy
        throughout, like a matrix product) an occupancy below ``1 - BUSY_SHARE`` says the same;
        for other work, unknown is not busy."""
        share = self.others_share
        if share is not None:
            return share > BUSY_SHARE
        return saturating and self.occupancy < 1 - 2 * BUSY_SHARE

    def describe(self) -> str:
        """``"other processes used 35% of the cores, load average 2.1"`` (what is known)."""
        parts = []
        share = self.others_share
        if share is not None:
            parts.append(f"other processes used {100 * share:.0f}% of the cores it needed")
        else:
            parts.append(f"it got {100 * min(self.occupancy, 1.0):.0f}% of its threads' CPU time")
        if self.load_average is not None:
            parts.append(f"load average {self.load_average:.2f} on {self.cpus} CPUs")
        return ", ".join(parts)


class CpuWatch:
    """``with CpuWatch(threads) as watch: ...`` then ``watch.window``: the :class:`CpuWindow`."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, int(threads))
        self._cpus = _our_cpus()
        self.window: CpuWindow | None = None

    def __enter__(self) -> CpuWatch:
        self._busy0 = _busy_seconds(self._cpus) if self._cpus else None
        self._own0 = time.process_time()
        self._wall0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._wall0
        own = time.process_time() - self._own0
        busy1 = _busy_seconds(self._cpus) if self._cpus else None
        others = None
        if self._busy0 is not None and busy1 is not None:
            # Tick granularity (10 ms) and the process-time clock's differ: never below zero.
            others = max(0.0, (busy1 - self._busy0) - own)
        self.window = CpuWindow(
            wall_s=wall,
            own_cpu_s=own,
            cpus=len(self._cpus) if self._cpus else (os.cpu_count() or 1),
            threads=self.threads,
            others_cpu_s=others,
            load_average=load_average(),
        )
