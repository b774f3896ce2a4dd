"""The step-time verdict of ``nbt.compare``: did the step get faster, slower, or is it the same?

Two traces are two recordings made one after the other, and whatever else ran on the machine
during one and not the other becomes the difference between them. ``nbt.optimize`` avoids that by
interleaving before and after (:mod:`nbtoolkit.core.interleaved`); traces cannot be interleaved
after the fact. What this module does instead:

1. **Leave the disturbed steps out.** ``nbt.profile`` keeps the load measured around every step
   with the trace (:class:`~nbtoolkit.trace.step_load.StepLoad`). A step is *disturbed* when

   - the load probe before or after it, less the part of it spent waiting for a processor, took
     long: another thread of the process held the GIL. The rule of
     :func:`nbtoolkit.core.interleaved.quiet_rounds` (over 4× the quickest probe plus 0.5 ms, or
     over 2 ms), with the quickest probe of *both* traces as the reference, so that a recording
     that was busy throughout is not its own reference;
   - or its thread waited for a processor (another process was busy on its cores) a larger share
     of the step than the typical step of the quieter trace did (the lower of the two traces'
     median shares) by more than :data:`WAIT_SLACK`. The reference is the typical step, not the
     quietest one: on a shared machine every step waits a little, and only bursts of load are
     left out here; what the kept steps still met is point 3.
2. **Compare medians, with an interval that assumes nothing about the step times.** Each side's
   undisturbed step times give their median and a distribution-free confidence interval of it
   (order statistics, :func:`nbtoolkit.core.interleaved.median_interval`), each at
   √0.95 ≈ 97.5%; as the two recordings are independent, both intervals hold their medians with
   at least 95% confidence, and then the ratio of the medians, after/before, lies between
   (after's low / before's high) and (after's high / before's low). Why this and not a bootstrap
   or a rank-based (Hodges-Lehmann) interval: it holds whatever the shape of the step times, and
   the two sides' shapes need not match (the rank-based interval assumes they differ by a factor
   only; load comes in bursts and changes the shape); it gives the same answer on every call (a
   bootstrap resamples at random, and its coverage for the median of a few dozen values is
   poor); and it is the median interval ``nbt.optimize`` uses for its paired ratios. Its price:
   it is conservative (on the recordings of its tests, 1.2 to 2 times as wide as either), and
   needs :data:`MIN_STEPS` undisturbed steps per trace.
3. **Allow for the load the undisturbed steps still met.** When the undisturbed steps of one trace
   still waited longer for a processor than those of the other (median share of the step), that
   alone makes a ratio of (1 - share before) / (1 - share after); the interval is widened to
   cover the ratio with that part taken out as well.
4. **Allow for what no step can show.** Two recordings made one after the other can differ with
   nothing changed and no load either recording could see: the machine's clock, a neighbour on the
   same physical cores, the memory bus. On CI's shared 2-core machine the same step recorded twice
   measured 1.09× the time (1.04-1.14× by points 2 and 3, every step undisturbed), and on the
   development machine one recording's undisturbed steps moved from 10 to 13 ms halfway through.
   So the interval is widened on each side by the *allowance*: the larger of
   :data:`BETWEEN_RECORDINGS` (10%) and the drift either recording showed while it ran (the
   largest ratio between the medians of its thirds, per rank). Changes inside it need
   ``nbt.optimize``, which interleaves before and after and needs no allowance.
5. **Name a change only outside the noise**: faster or slower only when the whole interval lies
   beyond :data:`~nbtoolkit.core.interleaved.NEGLIGIBLE` (2%) of 1; "no change beyond ±12%" (the
   verdict "same", with the allowance + 2%) when it lies within that of 1; otherwise "no
   measurable change". With fewer than :data:`MIN_STEPS` undisturbed steps
   on a side the traces are "not comparable" (that side was recorded while the machine was busy):
   record it again, or time the change with ``nbt.optimize``.

Traces without load measurements (other tools' traces, files) keep the earlier rule: the change
is within the steps' noise when their middle halves (25th to 75th percentile) overlap; the text
says that the load during the recordings is unknown.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from nbtoolkit.core.interleaved import (
    CONFIDENCE,
    DISTURBED_ABOVE_S,
    DISTURBED_FACTOR,
    DISTURBED_SLACK_S,
    FASTER,
    NEGLIGIBLE,
    SAME,
    SLOWER,
    UNCLEAR,
    median_interval,
    verdict,
)

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = [
    "BETWEEN_RECORDINGS",
    "LOAD_UNKNOWN",
    "MIN_STEPS",
    "NOT_COMPARABLE",
    "WAIT_SLACK",
    "StepSide",
    "StepTimeComparison",
    "compare_step_times",
]

#: Undisturbed steps each trace needs for a verdict: with 7 values the smallest to the largest
#: holds the median with 98.4% confidence, above the 97.5% each side needs (see the docstring).
MIN_STEPS = 7
#: A step that waited for a processor this share of its time more than the reference (the lower
#: of the two traces' median shares) is disturbed. Wide enough for the ordinary spread of a shared
#: machine (a 20 ms step on 2 cores busy with 7 runnable tasks waits 40-60% of its time); what
#: remains between the two traces is allowed for by widening the interval.
WAIT_SLACK = 0.15
#: Two recordings made one after the other can differ by at least this much with nothing changed
#: (module docstring, point 4): the least allowance the interval is widened by on each side. 10%:
#: above the 1.09× (1.04-1.14×) CI's shared machine measured between two recordings of one step.
BETWEEN_RECORDINGS = 0.10
#: Undisturbed steps per rank a recording needs for its drift to be measured (three thirds of 3).
_DRIFT_STEPS = 9
#: The interval is widened for the load the undisturbed steps still met only when it moves the
#: ratio by more than this (a quiet machine's steps wait ~0% of their time).
_LOAD_EFFECT_SHOWN = NEGLIGIBLE / 2

NOT_COMPARABLE = "not comparable"
LOAD_UNKNOWN = "load unknown"


@dataclass
class StepSide:
    """One trace's steps as the comparison used them.

    Attributes:
        label: "before" or "after".
        steps: all its steps (ProfilerStep rows, every rank).
        used_ms: the durations (ms) of the steps used: the undisturbed ones when the load is known.
        disturbed: steps left out because other work disturbed them (0 when the load is unknown).
        load_known: whether the trace carries load measurements for all its steps (``nbt.profile``).
        wait_share: median share of their time the used steps waited for a processor; None: unknown.
        machine_busy, cores: the machine's busy share (0-1) over the recording, and its cores.
        drift: how far the used steps' times moved while the recording ran (:func:`_drift`).
    """

    label: str
    steps: int
    used_ms: list[float] = field(default_factory=list)
    disturbed: int = 0
    load_known: bool = False
    wait_share: float | None = None
    machine_busy: float | None = None
    cores: int | None = None
    drift: float = 0.0

    @property
    def median_ms(self) -> float:
        return statistics.median(self.used_ms) if self.used_ms else math.nan

    def counted(self) -> str:
        """The steps used, in words: 14 of 20 before steps (6 disturbed by other work)."""
        text = f"{len(self.used_ms)} of {self.steps} {self.label} steps"
        return text + (f" ({self.disturbed} disturbed by other work)" if self.disturbed else "")


@dataclass
class StepTimeComparison:
    """The step-time verdict of two traces (see the module docstring).

    Attributes:
        before, after: each trace's steps as used (:class:`StepSide`).
        ratio: median after / median before of the used steps (below 1: after is faster).
        low, high: the interval of ``ratio`` (at least :data:`CONFIDENCE`), widened for the load the
            used steps still met; NaN without a verdict.
        verdict: "faster", "slower" (after against before), "same", "no measurable change",
            "not comparable" (a side has too few undisturbed steps) or "load unknown" (a trace carries
            no load measurements: the earlier rule, ``within_noise``, stands).
        load_effect: the ratio the difference in waiting for a processor alone explains (1: none),
            None when unknown.
        within_noise: the earlier rule (step times' middle halves overlap), for traces without load;
            None with fewer than 2 steps on a side.
        why: for "no measurable change" and "not comparable": the reason, and what to do.
        allowance: what two recordings made one after the other can differ by with nothing changed
            (module docstring, point 4): the interval is widened by it on each side.
    """

    before: StepSide
    after: StepSide
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan
    verdict: str = UNCLEAR
    load_effect: float | None = None
    within_noise: bool | None = None
    why: str = ""
    allowance: float = BETWEEN_RECORDINGS

    @property
    def speedup(self) -> float:
        """Median before / median after (above 1: after is faster)."""
        return 1 / self.ratio if self.ratio > 0 and math.isfinite(self.ratio) else math.nan

    def reading(self) -> str:
        """The verdict in one sentence, with the interval and the steps it came from."""
        if self.verdict == LOAD_UNKNOWN:
            return self._unknown_reading()
        if self.verdict == NOT_COMPARABLE:
            return f"not comparable: {self.why}"
        known = self.low > 0 and self.high > 0
        source = f"{self.before.counted()}, {self.after.counted()}"
        if self.verdict == FASTER:
            return (
                f"after is faster: {self.speedup:.2f}× the speed ({1 / self.high:.2f}-{1 / self.low:.2f}× "
                f"with {CONFIDENCE:.0%} confidence; {source})"
            )
        if self.verdict == SLOWER:
            return (
                f"after is slower: {self.ratio:.2f}× the time ({self.low:.2f}-{self.high:.2f}× "
                f"with {CONFIDENCE:.0%} confidence; {source})"
            )
        interval = f" ({self.low:.2f}-{self.high:.2f}× with {CONFIDENCE:.0%} confidence)" if known else ""
        ratio = f"{self.ratio:.2f}× the time{interval}" if math.isfinite(self.ratio) else "no ratio"
        if self.verdict == SAME:
            return (
                f"no change beyond ±{self.allowance + NEGLIGIBLE:.0%}: {ratio}; {source}. Two recordings "
                f"made one after the other can differ by {self.allowance:.0%} with nothing changed: time "
                "smaller changes with nbt.optimize, which interleaves before and after"
            )
        return f"no measurable change: {ratio}; {self.why}; {source}"

    def notes(self) -> list[str]:
        """What else the reader should know: the load the used steps still met, the machine."""
        out = []
        a, b = self.before, self.after
        if self.load_effect is not None and abs(self.load_effect - 1) > _LOAD_EFFECT_SHOWN:
            out.append(
                f"the undisturbed steps still waited for a processor {a.wait_share:.0%} of their time before "
                f"and {b.wait_share:.0%} after, which alone makes {self.load_effect:.2f}× the time; the "
                "interval covers the ratio with and without that"
            )
        drifted = max((a, b), key=lambda side: side.drift)
        if drifted.drift > BETWEEN_RECORDINGS and self.verdict not in (LOAD_UNKNOWN, NOT_COMPARABLE):
            out.append(
                f"the {drifted.label} trace's undisturbed steps drifted by {drifted.drift:.0%} while it was "
                "recorded (the medians of its thirds): the machine's speed moved, and the interval allows "
                "that much between the two recordings"
            )
        busy = {s.label: s for s in (a, b) if s.load_known and s.machine_busy is not None and s.cores}
        shares = {label: f"{side.machine_busy:.0%}" for label, side in busy.items()}
        if len(busy) == 2 and shares["before"] == shares["after"]:
            busy = {"both traces were": a}  # one line for both
        out.extend(
            f"the machine's {side.cores} cores were {side.machine_busy:.0%} busy while "
            f"{label if label.startswith('both') else f'the {label} trace was'} recorded "
            "(every process, this one included)"
            for label, side in busy.items()
        )
        return out

    def _unknown_reading(self) -> str:
        missing = [s.label for s in (self.before, self.after) if not s.load_known]
        which = "the traces carry" if len(missing) == 2 else f"the {missing[0]} trace carries"
        unknown = (
            f"the machine's load during the recordings is unknown ({which} no load measurements: "
            "record both with nbt.profile, or time the change with nbt.optimize, which interleaves "
            "before and after)"
        )
        if self.within_noise is None:
            return f"too few steps to tell noise from change; {unknown}"
        if self.within_noise:
            noise = "within the steps' noise (their middle halves overlap)"
            return f"{self.ratio:.2f}× the time, {noise}; {unknown}"
        change = "faster" if self.ratio < 1 else "slower"
        return (
            f"after looks {change} ({self.ratio:.2f}× the time; the steps' middle halves do not overlap), "
            f"but {unknown}"
        )


def compare_step_times(before: Trace, after: Trace) -> StepTimeComparison:
    """The step-time verdict of two traces (see the module docstring)."""
    a, b = before.steps, after.steps
    sides = (StepSide("before", len(a)), StepSide("after", len(b)))
    load_a, load_b = _step_loads(before), _step_loads(after)
    if load_a is None or load_b is None:
        for side, steps, load in zip(sides, (a, b), (load_a, load_b), strict=True):
            side.used_ms = [float(d) / 1e3 for d in steps["dur"]]
            side.load_known = load is not None
        overlap = _quartiles_overlap(a, b)
        result = StepTimeComparison(sides[0], sides[1], verdict=LOAD_UNKNOWN, within_noise=overlap)
        result.ratio = _ratio(sides[0].median_ms, sides[1].median_ms)
        return result
    quiet = _quiet(load_a, load_b)
    for side, steps, load, ok in zip(sides, (a, b), (load_a, load_b), quiet, strict=True):
        durations = [float(d) / 1e3 for d in steps["dur"]]
        side.load_known = True
        side.used_ms = [d for d, q in zip(durations, ok, strict=True) if q]
        ranks = [r for r, q in zip(steps["rank"].tolist(), ok, strict=True) if q]
        side.drift = _drift(side.used_ms, ranks)
        side.disturbed = len(durations) - len(side.used_ms)
        shares = [s for s, q in zip(load.shares, ok, strict=True) if q and s is not None]
        side.wait_share = statistics.median(shares) if shares and len(shares) == len(side.used_ms) else None
        side.machine_busy, side.cores = load.machine_busy, load.cores
    result = StepTimeComparison(sides[0], sides[1], within_noise=_quartiles_overlap(a, b))
    result.ratio = _ratio(sides[0].median_ms, sides[1].median_ms)
    result.allowance = max(BETWEEN_RECORDINGS, sides[0].drift, sides[1].drift)
    few = [s for s in sides if s.steps < MIN_STEPS]
    busy = [s for s in sides if s.steps >= MIN_STEPS and len(s.used_ms) < MIN_STEPS]
    if few:
        result.why = (
            " and ".join(f"the {s.label} trace has {s.steps} step(s)" for s in few)
            + f"; a verdict needs {MIN_STEPS} undisturbed steps per trace: profile more steps "
            "(nbt.profile(step, steps=20))"
        )
        return result
    if busy:
        result.verdict = NOT_COMPARABLE
        named = "both traces were" if len(busy) == 2 else f"the {busy[0].label} trace was"
        result.why = (
            f"{named} recorded while the machine was busy ("
            + "; ".join(f"{s.disturbed} of {s.steps} {s.label} steps disturbed by other work" for s in busy)
            + f"; a verdict needs {MIN_STEPS} undisturbed steps per trace): record "
            + ("them" if len(busy) == 2 else "it")
            + " again when the machine is quiet, or time the change with nbt.optimize, which interleaves "
            "before and after"
        )
        return result
    used = min(len(s.used_ms) for s in sides)
    unwidened = _interval(result)
    result.verdict = verdict(result.low, result.high, used)
    same_within = 1 + result.allowance + NEGLIGIBLE
    if result.verdict == UNCLEAR and 1 / same_within <= result.low and result.high <= same_within:
        result.verdict = SAME
    elif result.verdict == UNCLEAR and verdict(*unwidened, used) != UNCLEAR:
        result.why = (
            f"two recordings made one after the other can differ by {result.allowance:.0%} with nothing "
            "changed (and by more when they met different load from other work), which could make the "
            "difference: time the change with nbt.optimize, which interleaves before and after"
        )
    elif result.verdict == UNCLEAR:
        result.why = (
            "the step times vary more than the difference: profile more steps, or time the change "
            "with nbt.optimize, which interleaves before and after"
        )
    return result


# ---------------------------------------------------------------------------------- internals
@dataclass
class _SideLoad:
    """Per step row of a trace (in ``trace.steps`` order): the probes around it, its wait share."""

    before_probe: list[float]
    after_probe: list[float]
    shares: list[float | None]
    machine_busy: float | None
    cores: int | None


def _step_loads(trace: Trace) -> _SideLoad | None:
    """The load around each of the trace's step rows, or None when any rank's steps lack it."""
    steps = trace.steps
    if not len(steps) or not trace.step_load:
        return None
    out = _SideLoad([], [], [], None, None)
    busy: list[float] = []
    rank_steps = steps.groupby("rank")["step"].count().to_dict()
    for rank, step in zip(steps["rank"].tolist(), steps["step"].tolist(), strict=True):
        load = trace.step_load.get(rank)
        if load is None or load.problem() is not None or load.steps != rank_steps[rank]:
            return None  # the load was measured for other steps than the trace holds
        if not 0 <= step < load.steps:
            return None  # the load was measured for other steps than the trace holds
        shares, probes = load.wait_shares(), load.thread_probes_s()
        out.before_probe.append(probes[step])
        out.after_probe.append(probes[step + 1])
        out.shares.append(shares[step] if shares else None)
    for load in trace.step_load.values():
        if load.machine_busy is not None:
            busy.append(load.machine_busy)
        out.cores = out.cores or load.cores
    out.machine_busy = max(busy) if busy else None
    return out


def _quiet(a: _SideLoad, b: _SideLoad) -> tuple[list[bool], list[bool]]:
    """Whether each step of either trace is undisturbed (module docstring, point 1)."""
    probes = [*a.before_probe, *a.after_probe, *b.before_probe, *b.after_probe]
    probe_limit = min(min(probes) * DISTURBED_FACTOR + DISTURBED_SLACK_S, DISTURBED_ABOVE_S)
    wait_limit = math.inf
    known = [[s for s in side.shares if s is not None] for side in (a, b)]
    if all(len(k) == len(side.shares) and k for k, side in zip(known, (a, b), strict=True)):
        wait_limit = min(statistics.median(k) for k in known) + WAIT_SLACK

    def quiet(side: _SideLoad) -> list[bool]:
        return [
            before <= probe_limit and after <= probe_limit and (share is None or share <= wait_limit)
            for before, after, share in zip(side.before_probe, side.after_probe, side.shares, strict=True)
        ]

    return quiet(a), quiet(b)


def _interval(result: StepTimeComparison) -> tuple[float, float]:
    """Set ``low``/``high`` of the ratio of medians (module docstring, points 2 to 4); return the
    interval of the step times alone, before it was widened."""
    side_confidence = math.sqrt(CONFIDENCE)
    a_low, a_high = median_interval(result.before.used_ms, side_confidence)
    b_low, b_high = median_interval(result.after.used_ms, side_confidence)
    if not (a_low > 0 and a_high > 0):
        return math.nan, math.nan
    low, high = b_low / a_high, b_high / a_low
    unwidened = low, high
    low, high = low / (1 + result.allowance), high * (1 + result.allowance)
    a_share, b_share = result.before.wait_share, result.after.wait_share
    if a_share is not None and b_share is not None and a_share < 1 and b_share < 1:
        effect = (1 - a_share) / (1 - b_share)
        result.load_effect = effect
        if abs(effect - 1) > _LOAD_EFFECT_SHOWN:
            low, high = min(low, low / effect), max(high, high / effect)
    result.low, result.high = low, high
    return unwidened


def _drift(used_ms: list[float], ranks: list[int]) -> float:
    """How far one recording's machine speed moved while it ran: per rank, the largest ratio between
    the medians of its undisturbed steps' thirds, less 1 (0 with too few steps to tell)."""
    drift = 0.0
    for rank in set(ranks):
        times = [d for d, r in zip(used_ms, ranks, strict=True) if r == rank]
        if len(times) < _DRIFT_STEPS:
            continue
        third = len(times) // 3
        medians = [statistics.median(times[i * third : (i + 1) * third]) for i in range(3)]
        if min(medians) > 0:
            drift = max(drift, max(medians) / min(medians) - 1)
    return drift


def _ratio(before_ms: float, after_ms: float) -> float:
    return after_ms / before_ms if before_ms > 0 and math.isfinite(after_ms) else math.nan


def _quartiles_overlap(a: pd.DataFrame, b: pd.DataFrame) -> bool | None:
    """The earlier rule: whether the step durations' middle halves (25th-75th percentile) overlap;
    None when either trace has fewer than 2 steps (a single step has no spread to compare)."""
    if len(a) < 2 or len(b) < 2:
        return None
    a_low, a_high = np.percentile(a["dur"], [25, 75])
    b_low, b_high = np.percentile(b["dur"], [25, 75])
    return bool(a_low <= b_high and b_low <= a_high)
