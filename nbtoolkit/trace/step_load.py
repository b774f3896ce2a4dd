"""What else the machine was doing around each step ``nbt.profile`` recorded: a :class:`StepLoad`.

Two traces recorded one after the other meet different machine load, and a change in load looks
exactly like a change in the step. ``nbt.optimize`` interleaves before and after to keep load out
(:mod:`nbtoolkit.core.interleaved`); two traces cannot be interleaved after the fact, so
``nbt.profile`` records, for every profiled step, what tells a disturbed step from a quiet one,
and ``nbt.compare`` leaves the disturbed steps out (:mod:`nbtoolkit.trace.step_time`):

- ``probes_s``: the load probe (:func:`nbtoolkit.core.interleaved.load_probe`, the one
  ``nbt.optimize`` brackets its rounds with) before the first step and after every step, so that
  step ``i`` lies between ``probes_s[i]`` and ``probes_s[i + 1]``. It hands the GIL and the
  processor over a few times: another Python thread of this process that wants the GIL makes it
  take milliseconds instead of a tenth of one. ``probe_waits_s``: how much of each probe the
  thread spent waiting for a processor (below): on a machine whose cores other processes keep
  busy the probe is slow for that reason too, and the comparison takes that part out to see the
  other threads of this process alone.
- ``wait_s``: how long the thread that ran the step waited, during the step, for a processor
  while it was ready to run (the scheduler's run-queue delay, ``/proc/thread-self/schedstat``,
  Linux; empty elsewhere). Another *process* busy on the same cores does not slow the probe
  (``time.sleep(0)`` gives the processor to no other process), but it makes this wait grow: on a
  quiet machine it is a small share of the step, under a busy process it is most of it.
- ``wall_s`` and ``cpu_s``: the step's wall time and this process's processor time
  (``time.process_time``, all threads) as measured around it, for the reader.
- ``machine_busy``/``cores``: how busy the machine's cores were over the whole recording
  (:class:`nbtoolkit.core.machine_load.BusySampler`; every process, this one included).

The measurements are taken *outside* each ``ProfilerStep#N`` label: the steps' durations in the
trace are not changed by them. They are plain Python (no torch operators), so the profiler records
nothing of them. Traces from other tools carry no StepLoad (``Trace.step_load`` is empty).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from nbtoolkit.core.interleaved import load_probe

__all__ = ["StepLoad", "StepLoadRecorder", "read_wait_s"]

_SCHEDSTAT = "/proc/thread-self/schedstat"


def read_wait_s() -> float | None:
    """Seconds the calling thread has waited on a run queue since it started (None: not Linux).

    ``/proc/thread-self/schedstat`` holds three numbers: time on a processor (ns), time waiting
    to run (ns), time slices. Only the second is used.
    """
    try:
        with open(_SCHEDSTAT, encoding="ascii") as stat:
            fields = stat.read().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class StepLoad:
    """The load measured around each profiled step of one rank (see the module docstring).

    Attributes:
        probes_s: the load probe before the first step and after every step (steps + 1 values).
        probe_waits_s: seconds of each probe spent waiting for a processor (empty where unknown).
        wall_s: each step's wall seconds, as timed around it (the trace's own durations are
            what ``nbt.compare`` uses).
        cpu_s: this process's processor seconds during each step (all its threads).
        wait_s: seconds the stepping thread waited for a processor during each step; empty
            where the system does not say (not Linux).
        machine_busy: busy share (0 to 1) of the machine's cores over the recording; None: unknown.
        cores: the machine's cores.
    """

    probes_s: list[float] = field(default_factory=list)
    probe_waits_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    machine_busy: float | None = None
    cores: int | None = None

    @property
    def steps(self) -> int:
        return len(self.wall_s)

    @property
    def wait_known(self) -> bool:
        return len(self.wait_s) == self.steps and self.steps > 0

    def wait_shares(self) -> list[float]:
        """Each step's wait for a processor as a share of its wall time (empty where unknown)."""
        if not self.wait_known:
            return []
        return [min(1.0, w / t) if t > 0 else 0.0 for w, t in zip(self.wait_s, self.wall_s, strict=True)]

    def thread_probes_s(self) -> list[float]:
        """The probes less their wait for a processor: what other threads of this process cost them."""
        if len(self.probe_waits_s) != len(self.probes_s):
            return list(self.probes_s)
        return [max(0.0, p - w) for p, w in zip(self.probes_s, self.probe_waits_s, strict=True)]

    def problem(self) -> str | None:
        """Why these numbers cannot describe their steps (lengths that do not match, bad values)."""
        n = self.steps
        if (
            len(self.probes_s) != n + 1
            or len(self.probe_waits_s) not in (0, n + 1)
            or len(self.cpu_s) != n
            or len(self.wait_s) not in (0, n)
        ):
            return (
                f"{len(self.probes_s)} probes ({len(self.probe_waits_s)} probe waits), {n} wall times, "
                f"{len(self.cpu_s)} processor times and {len(self.wait_s)} waits "
                "do not describe the same steps"
            )
        values = [*self.probes_s, *self.probe_waits_s, *self.wall_s, *self.cpu_s, *self.wait_s]
        if any(not math.isfinite(v) or v < 0 for v in values):
            return "a time is negative, infinite or missing"
        if self.machine_busy is not None and not 0 <= self.machine_busy <= 1:
            return f"machine_busy {self.machine_busy} is not a share from 0 to 1"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "probes_s": self.probes_s,
            "probe_waits_s": self.probe_waits_s,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "wait_s": self.wait_s,
            "machine_busy": self.machine_busy,
            "cores": self.cores,
        }


class StepLoadRecorder:
    """Fills a :class:`StepLoad` around the steps of one recording (used by ``record_step_trace``).

    ``start()`` before the first step, then ``before_step()`` / ``after_step()`` around each step
    (outside its profiler label), ``finish()`` at the end.
    """

    def __init__(self) -> None:
        self.load = StepLoad()
        self._sampler: Any = None
        self._wall = self._cpu = 0.0
        self._wait: float | None = None

    def start(self) -> None:
        from nbtoolkit.core.machine_load import BusySampler

        self._sampler = BusySampler()
        self._probe()

    def before_step(self) -> None:
        # the wait is read inside the wall-time window: a wait is never longer than its step
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self._wait = read_wait_s()

    def after_step(self) -> None:
        wait = read_wait_s()
        cpu = time.process_time() - self._cpu
        wall = time.perf_counter() - self._wall
        self.load.wall_s.append(wall)
        self.load.cpu_s.append(cpu)
        if self._wait is not None and wait is not None:
            self.load.wait_s.append(max(0.0, wait - self._wait))
        self._probe()

    def _probe(self) -> None:
        before = read_wait_s()
        self.load.probes_s.append(load_probe())
        after = read_wait_s()
        if before is not None and after is not None:
            self.load.probe_waits_s.append(max(0.0, after - before))

    def finish(self) -> StepLoad:
        load = self.load
        # the system stopped saying part way: unknown throughout
        if len(load.wait_s) != load.steps:
            load.wait_s = []
        if len(load.probe_waits_s) != len(load.probes_s):
            load.probe_waits_s = []
        if self._sampler is not None:
            load.machine_busy, load.cores = self._sampler.busy_share(), self._sampler.cores
        return load
