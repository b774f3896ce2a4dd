"""Time two configurations of one step interleaved, and say whether they differ beyond the noise.

Why interleave: two configurations measured one after the other meet different machine
load, and the change in load becomes the result (a user saw "4.77× speed" for a change that
was 10% slower). Here the two sides alternate step by step in an A B B A B A A B … order (the
order flips every round, so a load that rises or falls steadily hits both sides alike), and
every round gives one **paired ratio** ``time(B) / time(A)`` of two steps that ran next to each
other, under the same load. The result is the median of those ratios, with a
distribution-free confidence interval of that median (order statistics of the binomial
distribution, :func:`median_interval`): no assumption that step times are normal, and a few
disturbed rounds move neither the median nor the interval much.

Load that comes and goes (another job starting, a busy thread holding the GIL) does not slow
both steps of a round alike: a step with more Python-side operations waits for the GIL more
often. So every round is bracketed by a **load probe** (:func:`load_probe`, a fraction of a
millisecond on a quiet machine): a few hand-overs of the GIL and the processor with a little
work between them, which take far longer when another thread or process is waiting to run. A
round whose probe before or after took more than a few times the quickest probe is
**disturbed**, and the ratios come from the quiet rounds only (:func:`quiet_rounds`) while there
are enough of them. The probe does not look at the steps' own times, so a step that is
irregular by itself (one slow step in four) is not filtered in its own favour. Under load that
lasts the whole measurement every round is alike and all of them count.

The verdict (:func:`verdict`) calls B faster or slower only when the whole interval lies
beyond a small band around 1 (:data:`NEGLIGIBLE`, 2%); when the interval lies inside the band
the sides are "the same"; otherwise the difference is "no measurable change" so far and more
rounds are run, until the answer is clear or the time limit is reached
(:func:`time_interleaved`). The rounds are checked at growing counts (10, 14, 20, 28, …)
rather than after every round, so that looking often does not make a chance difference more
likely to be called real.

This module imports no torch: it times zero-argument callables (the caller switches the model
between configurations inside them).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CONFIDENCE",
    "NEGLIGIBLE",
    "InterleavedTiming",
    "median_interval",
    "time_interleaved",
    "verdict",
]

#: Confidence of the interval around the median ratio.
CONFIDENCE = 0.95

#: Ratios within this share of 1 are not a change worth a name (2%: below what a user acts on,
#: and above the systematic difference two identical configurations show on a quiet machine).
NEGLIGIBLE = 0.02

#: The fewest (quiet) rounds a verdict is drawn from: with 5 paired ratios the interval from
#: the smallest to the largest holds the median with 94% confidence; fewer cannot be clear.
MIN_ROUNDS_FOR_VERDICT = 5

#: A probe this many times the quickest one (and 0.5 ms longer) marks its rounds disturbed...
DISTURBED_FACTOR = 4.0
DISTURBED_SLACK_S = 0.0005
#: ...and so does any probe over 2 ms, in case every probe so far met the load (a quiet probe
#: takes about 0.1 ms; a thread holding the GIL makes it 5 ms or more).
DISTURBED_ABOVE_S = 0.002

FASTER, SLOWER, SAME, UNCLEAR = "faster", "slower", "same", "no measurable change"


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of ``values``.

    The k-th smallest and k-th largest values, with k the largest count such that the chance
    of k or fewer of n values falling below the median (Binomial(n, 1/2)) is at most
    (1 - confidence) / 2 on each side. With fewer than 6 values that k is 0 and the interval is
    the smallest to the largest value (94% at n=5, 88% at n=4, 75% at n=3).
    """
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return math.nan, math.nan
    tail = (1 - confidence) / 2
    cumulative = 0.0
    k = 0  # values cut from each end
    for j in range(n):
        cumulative += math.comb(n, j) / 2**n  # P(at most j of the n values lie below the median)
        if cumulative > tail:
            break
        k = j  # the (j+1)-th smallest value lies below the median with probability >= 1 - tail
    k = min(k, (n - 1) // 2)
    return ordered[k], ordered[n - 1 - k]


def load_probe() -> float:
    """Seconds a small fixed task takes that other threads and processes slow down when they wait.

    ``time.sleep(0)`` hands the GIL to any thread waiting for it (which may keep it for the
    interpreter's switch interval, 5 ms) and lets the scheduler run another process on this core;
    the sum between them is a little work of our own. About 0.1 ms on a quiet machine.
    """
    start = time.perf_counter()
    for _ in range(4):
        time.sleep(0)
        sum(range(1000))
    return time.perf_counter() - start


def quiet_rounds(probes: Sequence[float]) -> list[int]:
    """Indices of the rounds whose probes before and after (``probes[i]``, ``probes[i + 1]``) both
    took at most :data:`DISTURBED_FACTOR` times the quickest probe plus :data:`DISTURBED_SLACK_S`,
    and at most :data:`DISTURBED_ABOVE_S`."""
    rounds = len(probes) - 1
    if rounds <= 0:
        return []
    limit = min(min(probes) * DISTURBED_FACTOR + DISTURBED_SLACK_S, DISTURBED_ABOVE_S)
    return [i for i in range(rounds) if probes[i] <= limit and probes[i + 1] <= limit]


def verdict(low: float, high: float, rounds: int) -> str:
    """What the interval [low, high] of the ratio B/A, from ``rounds`` rounds, says: FASTER, SLOWER,
    SAME or UNCLEAR."""
    if rounds < MIN_ROUNDS_FOR_VERDICT or not (math.isfinite(low) and math.isfinite(high)):
        return UNCLEAR
    if high < 1 - NEGLIGIBLE:
        return FASTER
    if low > 1 + NEGLIGIBLE:
        return SLOWER
    if low >= 1 - NEGLIGIBLE and high <= 1 + NEGLIGIBLE:
        return SAME
    return UNCLEAR


@dataclass
class InterleavedTiming:
    """Two configurations timed interleaved (A first in the first round).

    Attributes:
        labels: the two sides' names, (A, B).
        times_s: wall seconds of each timed step of A and of B, in round order.
        cpu_times_s: processor seconds (``time.process_time``) of the same steps.
        ratios: time(B) / time(A) of each round.
        probes_s: the load probe before the first round and after every round (:func:`load_probe`).
        quiet: the indices of the rounds no load disturbed (:func:`quiet_rounds`), whose ratios
            give ``ratio``, ``low`` and ``high``.
        ratio: the median of the quiet rounds' ratios; below 1 means B is faster.
        low, high: the confidence interval of ``ratio`` (:data:`CONFIDENCE`).
        verdict: "faster", "slower" (B against A), "same" (within :data:`NEGLIGIBLE` of each other
            with confidence) or "no measurable change" (the interval reaches both sides of the band).
        stopped: why the rounds ended: "clear", "time limit" or "rounds limit".
        machine_busy: the machine's busy share of all its cores during the rounds (0 to 1, from
            /proc/stat; every process, this one included), None where unknown.
        cores: the machine's cores, for the text.
    """

    labels: tuple[str, str]
    times_s: dict[str, list[float]] = field(default_factory=dict)
    cpu_times_s: dict[str, list[float]] = field(default_factory=dict)
    ratios: list[float] = field(default_factory=list)
    probes_s: list[float] = field(default_factory=list)
    quiet: list[int] = field(default_factory=list)
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan
    verdict: str = UNCLEAR
    stopped: str = ""
    machine_busy: float | None = None
    cores: int | None = None

    @property
    def rounds(self) -> int:
        return len(self.ratios)

    @property
    def speedup(self) -> float:
        """time(A) / time(B) from the median paired ratio (above 1: B is faster)."""
        return 1 / self.ratio if self.ratio and math.isfinite(self.ratio) else math.nan

    def reading(self) -> str:
        """The verdict in one sentence, with the interval, the rounds and (when unclear) why."""
        a, b = self.labels
        known = self.low > 0 and self.high > 0
        confidence = f"with {CONFIDENCE:.0%} confidence, {self._rounds_used()}"
        interval = (
            f"{self.speedup:.2f}× the speed ({1 / self.high:.2f}-{1 / self.low:.2f}× {confidence})"
            if known else f"{self.rounds} interleaved rounds"
        )
        if self.verdict == FASTER:
            return f"{b} is faster than {a}: {interval}"
        if self.verdict == SLOWER:
            return (
                f"{b} is slower than {a}: {self.ratio:.2f}× the time "
                f"({self.low:.2f}-{self.high:.2f}× {confidence})"
            )
        if self.verdict == SAME:
            return f"no measurable change: {interval}, within ±{NEGLIGIBLE:.0%}"
        why = "the paired step times vary more than the difference"
        if self.rounds < MIN_ROUNDS_FOR_VERDICT:
            why = f"only {self.rounds} round(s) ran; a verdict needs {MIN_ROUNDS_FOR_VERDICT} at least"
        elif self.stopped == "time limit":
            why += " within the time limit (set MeasureConfig(time_limit_s=...) for more rounds)"
        if len(self.quiet) == self.rounds and self.probes_s and min(self.probes_s) > DISTURBED_ABOVE_S:
            why += "; other work kept the machine busy in every round"
        if self.machine_busy is not None and self.cores:
            why += f"; the machine's {self.cores} cores were {self.machine_busy:.0%} busy"
        return f"no measurable change: {interval}; {why}"

    def _rounds_used(self) -> str:
        if len(self.quiet) < self.rounds:
            return f"the {len(self.quiet)} undisturbed of {self.rounds} interleaved rounds"
        return f"{self.rounds} interleaved rounds"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["labels"] = list(self.labels)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InterleavedTiming:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["labels"] = tuple(values.get("labels", ("A", "B")))
        return cls(**values)


def _checkpoints(first: int) -> list[int]:
    """Round counts at which the verdict is looked at: ``first`` (at least 5), then ~1.4× more each time."""
    counts = [max(first, MIN_ROUNDS_FOR_VERDICT)]
    while counts[-1] < 10_000:
        counts.append(max(counts[-1] + 1, round(counts[-1] * 1.4)))
    return counts


def _summarise(timing: InterleavedTiming, *, final: bool) -> None:
    """The quiet rounds, their median ratio, its interval and the verdict, from the rounds so far.

    While rounds can still be added, too few quiet rounds leave the verdict unclear (more rounds
    are run); at the end they give way to all the rounds, the load then being the condition the
    step runs in."""
    timing.quiet = quiet_rounds(timing.probes_s)
    if len(timing.quiet) < MIN_ROUNDS_FOR_VERDICT:
        if not final:
            timing.verdict = UNCLEAR
            return
        timing.quiet = list(range(timing.rounds))
    ratios = [timing.ratios[i] for i in timing.quiet if math.isfinite(timing.ratios[i])]
    timing.ratio = statistics.median(ratios) if ratios else math.nan
    timing.low, timing.high = median_interval(ratios)
    timing.verdict = verdict(timing.low, timing.high, len(ratios))


def time_interleaved(
    run_a: Callable[[], tuple[float, float]],
    run_b: Callable[[], tuple[float, float]],
    *,
    labels: tuple[str, str] = ("before", "after"),
    min_rounds: int = 5,
    max_rounds: int = 200,
    time_limit_s: float = 10.0,
    on_round: Callable[[int, int], None] | None = None,
) -> InterleavedTiming:
    """Time A and B interleaved until the verdict is clear, ``time_limit_s`` or ``max_rounds``.

    ``run_a``/``run_b`` switch the model to their configuration, run one step and return its
    (wall, processor) seconds (``nbtoolkit.core.step_runner.timed_call``, which synchronises
    the device). ``min_rounds`` always run (even past the time limit). ``on_round(done,
    planned)`` is called after every round, ``planned`` being the rounds now expected.
    """
    from nbtoolkit.core.machine_load import BusySampler

    a, b = labels
    timing = InterleavedTiming(labels=labels, times_s={a: [], b: []}, cpu_times_s={a: [], b: []})
    sampler = BusySampler()
    checkpoints = _checkpoints(min_rounds)
    look = 0
    min_rounds = max(1, min_rounds)
    deadline = time.monotonic() + time_limit_s
    timing.probes_s.append(load_probe())
    while True:
        order = ((a, run_a), (b, run_b)) if timing.rounds % 2 == 0 else ((b, run_b), (a, run_a))
        pair: dict[str, float] = {}
        for label, run in order:
            wall, cpu = run()
            pair[label] = wall
            timing.cpu_times_s[label].append(cpu)
            timing.times_s[label].append(wall)
        timing.ratios.append(pair[b] / pair[a] if pair[a] > 0 else math.nan)
        timing.probes_s.append(load_probe())
        done = timing.rounds
        if on_round is not None:
            on_round(done, max(min_rounds, checkpoints[look]))
        if done < min_rounds:
            continue
        if done >= checkpoints[look]:
            while look + 1 < len(checkpoints) and checkpoints[look] <= done:
                look += 1
            _summarise(timing, final=False)
            if timing.verdict != UNCLEAR:
                timing.stopped = "clear"
                break
        if done >= max_rounds:
            timing.stopped = "rounds limit"
            break
        if time.monotonic() >= deadline:
            timing.stopped = "time limit"
            break
    _summarise(timing, final=True)
    timing.machine_busy, timing.cores = sampler.busy_share(), sampler.cores
    return timing
