"""How busy the machine's processors were over a stretch of time (Linux; unknown elsewhere).

A timing taken while other work runs on the machine says so in its text ("the machine's 2
cores were 95% busy"). Read from ``/proc/stat``'s first line (processor time of every process,
in clock ticks, since boot): the busy share is the non-idle ticks over all ticks between two
readings. It includes this process: it says how contended the cores were, not who used them.
"""

from __future__ import annotations

import os

__all__ = ["BusySampler"]


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy ticks, all ticks) of all processors since boot, or None where /proc/stat is absent."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    try:
        ticks = [int(value) for value in fields[1:]]
    except ValueError:
        return None
    # user nice system idle iowait irq softirq steal (guest time is already inside user/nice)
    idle = sum(ticks[3:5])
    total = sum(ticks[:8])
    return total - idle, total


class BusySampler:
    """Reads the processors' tick counters when made; :meth:`busy_share` reads them again."""

    def __init__(self) -> None:
        self._start = _cpu_ticks()
        self.cores = os.cpu_count()

    def busy_share(self) -> float | None:
        """Busy share of all cores (0 to 1) since this sampler was made; None where unknown."""
        end = _cpu_ticks()
        if self._start is None or end is None:
            return None
        busy, total = end[0] - self._start[0], end[1] - self._start[1]
        return busy / total if total > 0 else None
