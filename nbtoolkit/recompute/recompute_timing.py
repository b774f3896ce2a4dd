"""What checkpointing each candidate block costs a step, measured: step 2 of ``nbt.plan_recompute``.

:func:`time_recompute` runs timing rounds of the real step and :func:`block_costs` turns them
into per-block costs with their spread. The choices, and why:

* **What is timed: the block's forward as checkpointing re-runs it, inside real steps.**
  With every candidate checkpointed, each call of a block's forward after the first within
  one checkpointed call is the re-run backward makes to rebuild the activations; that
  re-run is timed where it happens (during the step's backward, after the caches have held
  the rest of the step). Timing the block in isolation would repeat one forward on warm
  caches and a quiet allocator (too fast), and would run the block's side effects
  (BatchNorm statistics, the RNG) outside the step. Timing the step with each block
  checkpointed alone instead takes the difference of two whole-step times for a cost that
  is a fraction of one: on a busy machine that ranged identical ViT blocks from 4 to 29 ms.
* **What the re-run misses is measured on the whole step, where it is largest.** Checkpointing
  also costs the checkpoint machinery (saving inputs and RNG state, a Python hook for every
  tensor saved for backward, in the forward and in the re-run) and can give time back
  (on the CPU, freed activations make the allocator cheaper). Each round times one plain
  step and one step with every candidate checkpointed, and the round's *overhead factor*
  ``k = (step time with all checkpointed - plain step time) / (sum of the re-run times)``
  turns each block's re-run time ``r`` of that round into a cost sample ``k * r``. A
  factor above 1 means the machinery costs more than it gives back; it applies to every
  block alike, in proportion to its re-run time (what the machinery grows with: the
  tensors saved and the ops re-run). Measured on the CPU: about 1.0 for 192-wide ViT
  blocks, 1.1-1.2 for 64-wide transformer blocks, 1.4-1.9 for 32-wide ones, whose many
  small ops make the per-tensor hooks weigh: the re-run alone would predict too little.
* **Interleaved rounds.** The plain and the checkpointed step alternate (which comes first
  alternates too), and every block is timed in every checkpointed step, so load from other
  processes hits every block and both configurations alike.
* **Clock.** On the CPU every time is the calling thread's processor time
  (``time.thread_time``): waiting for a core on a busy machine, or for the GIL while another
  Python thread runs, does not count (wall time and process time on a loaded 2-core machine
  spread identical blocks over 1.3-2.9x; this clock over 1.1x). On an idle machine it equals
  wall time when torch computes on one thread; with several intra-op threads it is the
  calling thread's share, which follows the wall time of the parallel regions it takes
  part in. The CPU's backward runs on the calling thread, so the step is timed by the same
  clock. On a GPU the re-runs and forwards are timed by CUDA events (the device's own time
  between two points of its stream), and steps by wall time after a synchronisation.
* **Robust statistics.** A block's cost is the median of its samples over the rounds and
  its spread the 25th to 75th percentile; load adds time only now and then, so the median
  ignores the loaded rounds as long as they are fewer than half.
* **Identical blocks pooled.** Blocks of the same class with the same parameter and buffer
  shapes that were called with the same input shapes run the same kernels on the same
  sizes: what tells their timings apart is noise. Their samples are pooled (each gets the
  pool's median and spread), which multiplies the samples per estimate and keeps the
  solver from choosing between identical blocks on noise. The input shapes are part of
  the test because a block of the same shape can run at another resolution (a U-Net level).
* **Repetitions.** At least ``steps`` rounds; then more while the estimates are imprecise
  (the standard error of a median, ``0.93 * IQR / sqrt(n)``, above :data:`PRECISION` of it
  for the overhead factor or any block's re-run time), until :data:`TIME_LIMIT_S` seconds of
  rounds or :data:`MAX_ROUNDS` rounds. Under ``torch.distributed`` with several ranks exactly
  ``steps`` rounds run: the step's collectives pair the ranks' steps up, so a rank that
  stopped sooner than another would leave it waiting forever.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.step_runner import run_steps
from nbtoolkit.recompute.checkpoint import Rerun, checkpoint_modules

if TYPE_CHECKING:
    import torch

    from nbtoolkit.recompute.blocks import Candidates

__all__ = [
    "MAX_ROUNDS",
    "PRECISION",
    "TIME_LIMIT_S",
    "BlockCosts",
    "Rounds",
    "Stopwatch",
    "block_costs",
    "identical_groups",
    "quantile",
    "time_recompute",
]

#: Seconds of timing rounds after the first ``steps`` rounds, at most.
TIME_LIMIT_S = 20.0
#: Rounds at most (a tiny model reaches the precision long before).
MAX_ROUNDS = 200
#: Rounds go on while a median's standard error is above this share of it.
PRECISION = 0.05
#: Fewest rounds whose quartiles say anything about the spread.
_MIN_ROUNDS_FOR_SPREAD = 3
#: One timed call, no warm-up: the rounds interleave configurations, so each is timed alone.
_ONE_STEP = MeasureConfig(steps=1, warmup=0)


class Stopwatch:
    """Marks taken around a piece of the step, read in seconds once the step is over.

    CPU (``device`` None): the calling thread's processor time, read at once. CUDA: a pair of
    timing events recorded on the current stream, read after the step's synchronisation.
    """

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.clock = "CUDA events" if device is not None else "the calling thread's processor time"

    def start(self) -> Any:
        if self.device is None:
            return time.thread_time()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, start: Any) -> Any:
        if self.device is None:
            return time.thread_time() - start
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return (start, end)

    def seconds(self, mark: Any) -> float:
        if self.device is None:
            return float(mark)
        begin, end = mark
        return float(begin.elapsed_time(end)) / 1e3

    def time_step(self, step: Callable[[], Any]) -> float:
        """Seconds of one call of the step, by the step runner: the calling thread's processor
        time on the CPU, synchronised wall time on a GPU; the step's errors become StepError."""
        run = run_steps(step, _ONE_STEP, device=self.device)
        return run.thread_times_s[0] if self.device is None else run.times_s[0]


@dataclass
class Rounds:
    """What the timing rounds measured, per round ``k`` and block ``i``.

    ``reruns[k][i]``: seconds block i's forward was re-run in round k's checkpointed step (0.0
    when it was not re-run); ``plain_s[k]`` / ``checkpointed_s[k]``: the two steps of round k;
    ``forward_s[i]``: block i's forward in each plain step; ``seconds``: how long the rounds
    took; ``precise``: they stopped because the medians were precise; ``limit_s``: the time
    limit they ran under; ``lockstep``: exactly ``steps`` rounds ran (several ranks).
    """

    reruns: list[list[float]] = field(default_factory=list)
    plain_s: list[float] = field(default_factory=list)
    checkpointed_s: list[float] = field(default_factory=list)
    forward_s: list[list[float]] = field(default_factory=list)
    seconds: float = 0.0
    precise: bool = False
    limit_s: float = 0.0
    lockstep: bool = False


@dataclass(frozen=True)
class BlockCosts:
    """Per block the cost (median) and its 25th/75th percentiles; the overhead factor's median
    and quartiles; which blocks were pooled."""

    cost_s: list[float]
    p25_s: list[float]
    p75_s: list[float]
    factor: tuple[float, float, float] | None
    groups: list[list[int]]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, interpolated linearly between order statistics."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _relative_error(values: Sequence[float]) -> float:
    """The standard error of the median of ``values`` as a share of it (inf when it says nothing)."""
    if len(values) < _MIN_ROUNDS_FOR_SPREAD:
        return math.inf
    middle = statistics.median(values)
    if middle <= 0:
        return math.inf
    spread = quantile(values, 0.75) - quantile(values, 0.25)
    return 0.93 * spread / (middle * math.sqrt(len(values)))


def _factors(rounds: Rounds) -> list[float]:
    """Each round's overhead factor: its step-time increase over its summed re-run time."""
    return [
        (all_ - plain) / sum(reruns)
        for reruns, plain, all_ in zip(rounds.reruns, rounds.plain_s, rounds.checkpointed_s, strict=True)
        if sum(reruns) > 0
    ]


def _precise(rounds: Rounds) -> bool:
    if _relative_error(_factors(rounds)) > PRECISION:
        return False
    blocks = len(rounds.reruns[0]) if rounds.reruns else 0
    for i in range(blocks):
        times = [r[i] for r in rounds.reruns]
        if any(t > 0 for t in times) and _relative_error(times) > PRECISION:
            return False
    return True


def identical_groups(blocks: Sequence[torch.nn.Module], inputs: Sequence[Any]) -> list[list[int]]:
    """Positions of blocks that are alike (same class, parameter and buffer shapes and dtypes,
    same input signature ``inputs[i]``), in model order; a block like no other is its own group."""
    groups: dict[Any, list[int]] = {}
    for i, block in enumerate(blocks):
        tensors = tuple(
            (name, tuple(t.shape), str(t.dtype), bool(t.requires_grad))
            for name, t in [*block.named_parameters(), *block.named_buffers()]
        )
        groups.setdefault((type(block), tensors, inputs[i]), []).append(i)
    return sorted(groups.values())


def block_costs(rounds: Rounds, groups: Sequence[Sequence[int]], *, pool: bool = True) -> BlockCosts:
    """Per block: the median cost sample ``k_r * r_ri`` over rounds r (pooled over identical blocks
    when ``pool``), with its quartiles; never below 0. A block never re-run costs 0."""
    n = len(rounds.forward_s)
    factors = _factors(rounds)
    per_round = [
        [(all_ - plain) / sum(reruns) * r for r in reruns]
        for reruns, plain, all_ in zip(rounds.reruns, rounds.plain_s, rounds.checkpointed_s, strict=True)
        if sum(reruns) > 0
    ]
    pools = [list(g) for g in groups] if pool else [[i] for i in range(n)]
    cost, p25, p75 = [0.0] * n, [0.0] * n, [0.0] * n
    for members in pools:
        rerun = [i for i in members if _ever_rerun(rounds, i)]
        samples = [row[i] for row in per_round for i in rerun]
        if not samples:
            continue
        middle = max(0.0, statistics.median(samples))
        low = min(middle, max(0.0, quantile(samples, 0.25)))
        high = max(middle, quantile(samples, 0.75))
        for i in rerun:
            cost[i], p25[i], p75[i] = middle, low, high
    factor = (
        (quantile(factors, 0.25), statistics.median(factors), quantile(factors, 0.75)) if factors else None
    )
    return BlockCosts(cost, p25, p75, factor, [list(g) for g in groups if len(g) > 1] if pool else [])


def _ever_rerun(rounds: Rounds, i: int) -> bool:
    """Whether block i was re-run in some round (a block no gradient flows through never is)."""
    return any(r[i] > 0 for r in rounds.reruns)


def _clock_after(seconds: float) -> float:
    """The wall clock ``seconds`` from now: the time limit's (steps are timed by the runner)."""
    return time.perf_counter() + seconds


def _several_ranks() -> bool:
    """Whether this process is one of several ``torch.distributed`` ranks (which must all run
    the same number of steps)."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def time_recompute(
    candidates: Candidates,
    step: Callable[[], Any],
    stopwatch: Stopwatch,
    *,
    forward_marks: Callable[[bool], list[Any | None]],
    steps: int,
    time_limit_s: float | None = None,
    tick: Callable[[str], None],
) -> Rounds:
    """The timing rounds (module docstring): at least ``steps``, more while imprecise.

    ``forward_marks(recording)``: turns the caller's forward probe on for the next step
    (True), or returns the stopwatch marks of each block's forward in the step just run and
    turns it off (False). ``tick(what)`` after each of the first ``steps`` rounds' steps.
    ``time_limit_s``: seconds of rounds after the first ``steps``; None: :data:`TIME_LIMIT_S`.
    Exactly ``steps`` rounds under ``torch.distributed`` with several ranks (module docstring).
    """
    limit_s = TIME_LIMIT_S if time_limit_s is None else time_limit_s
    names = candidates.names
    marks: dict[str, list[Any]] = {name: [] for name in names}

    def rerun_of(name: str) -> Rerun:
        def timed(run: Callable[[], Any]) -> Any:
            start = stopwatch.start()
            try:
                return run()  # torch may stop a re-run early (all tensors rebuilt): still timed
            finally:
                marks[name].append(stopwatch.stop(start))

        return timed

    rounds = Rounds(forward_s=[[] for _ in names], limit_s=limit_s, lockstep=_several_ranks())
    began = time.perf_counter()
    deadline: float | None = None  # set once the first ``steps`` rounds are done
    while len(rounds.plain_s) < MAX_ROUNDS:
        index = len(rounds.plain_s)
        counted = index < steps
        plain = checkpointed = 0.0
        # alternate which configuration comes first, so a trend (a machine warming up or
        # getting busier) does not favour one of them
        for checkpoint_all in ((False, True) if index % 2 == 0 else (True, False)):
            if checkpoint_all:
                for times in marks.values():
                    times.clear()
                applied = checkpoint_modules(candidates.blocks, rerun=rerun_of)
                try:
                    checkpointed = stopwatch.time_step(step)
                finally:
                    applied.undo()
                rounds.reruns.append([sum(stopwatch.seconds(m) for m in marks[name]) for name in names])
                if counted:
                    tick("timed step with every candidate checkpointed")
            else:
                forward_marks(True)
                plain = stopwatch.time_step(step)
                for i, mark in enumerate(forward_marks(False)):
                    if mark is not None:
                        rounds.forward_s[i].append(stopwatch.seconds(mark))
                if counted:
                    tick("timed step")
        rounds.plain_s.append(plain)
        rounds.checkpointed_s.append(checkpointed)
        if len(rounds.plain_s) < steps:
            continue
        if rounds.lockstep:
            rounds.precise = _precise(rounds)
            break
        if _precise(rounds):
            rounds.precise = True
            break
        deadline = _clock_after(limit_s) if deadline is None else deadline
        if _clock_after(0.0) >= deadline:
            break
    rounds.seconds = time.perf_counter() - began
    return rounds
