"""What the optimize panel decides and says, without widgets or a kernel (so it is tested fast).

- :func:`read_budget` / :func:`budget_text`: the budget box's text and bytes (a bare number is
  MiB, the slider's unit; ``"11MiB"`` stays exactly 11 MiB).
- :class:`Choice`: what one "Apply and measure" applies (blocks, compile options, AMP) and the
  budget it was chosen for; a result is *stale* when the controls now choose another plan.
- :class:`ProgressLog` and :func:`progress_text`: the progress callback's labels shown stage
  first; both label styles read (``"measuring: …"`` and the older ``"before: timed step"``).
- :func:`headline`, :func:`result_bundle`, :func:`interrupted_html`: the result in words: one
  peak (the device total the budget speaks of) with "within the budget" or "over … by X".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.result import escape
from nbtoolkit.core.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from nbtoolkit.recompute.comparison import Comparison

__all__ = [
    "BACKENDS",
    "MODES",
    "Choice",
    "ProgressLog",
    "budget_text",
    "headline",
    "interrupted_html",
    "is_torch_noise",
    "progress_text",
    "read_budget",
    "result_bundle",
    "slider_range",
]

MIB = 2**20

#: torch.compile backends offered (inductor first: torch's default); modes, "default" first.
BACKENDS = ("inductor", "aot_eager", "eager")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

#: New-style progress labels start with one of these stages (nbt.optimize's progress callback).
STAGES = ("planning", "compiling", "warming up", "measuring", "memory", "FLOPs")

#: Older labels: "<side>: <what>"; the side's runs by what they are.
_OLD_STAGE_OF = (("warm-up", "warming up"), ("timed", "measuring"), ("memory", "memory"), ("FLOP", "FLOPs"))

#: Native lines torch prints that say nothing about the user's model (the memory profiler meets
#: blocks allocated before it started): dropped from what the panel shows.
_TORCH_NOISE = ("Memory block of unknown size",)


def read_budget(text: str, device: Any = None) -> int:
    """The budget box's text in bytes: a bare number is MiB (the slider's unit); else anything
    ``nbt.optimize`` reads (``"1.5GB"``, ``"800MiB"``, on a GPU ``"90%"``). Any positive size is
    accepted, below the floor too (the panel then explains why no plan fits)."""
    from nbtoolkit.core.device_memory import budget_bytes_for

    stripped = str(text).strip()
    try:
        mib = float(stripped)
    except ValueError:
        if device is None:
            from nbtoolkit.core.units import parse_bytes

            return parse_bytes(stripped, what="budget")
        return budget_bytes_for(stripped, device)
    if not math.isfinite(mib) or mib <= 0:
        raise NbtUsageError(f"budget {text!r} is not a size: type a positive number of MiB, or e.g. '1.5GB'")
    return round(mib * MIB)


def budget_text(nbytes: int) -> str:
    """Bytes as the budget box shows them: MiB, as many digits as needed (``11 MiB``, ``10.5 MiB``)."""
    return f"{nbytes / MIB:.6g} MiB"


def slider_range(low_bytes: int, high_bytes: int) -> tuple[float, float]:
    """The slider's (min, max) in MiB on a 0.01 grid over the reachable budgets (the box takes any
    other): a whole MiB such as 11 is a stop on it (a range starting at 6.853 with steps of
    0.0372 would show 11 as 10.99); its lowest stop is at or above the floor, so it fits."""
    low = math.ceil(low_bytes / MIB * 100) / 100
    high = math.ceil(high_bytes / MIB * 100) / 100
    return low, max(high, low + 0.01)


@dataclass(frozen=True)
class Choice:
    """What "Apply and measure" applies, and the budget (bytes) it was chosen for."""

    blocks: tuple[str, ...]
    compile: tuple[tuple[str, Any], ...] | None  # torch.compile options as sorted items; None: off
    amp: str | None
    budget_bytes: int

    @property
    def plan_key(self) -> tuple[Any, ...]:
        """What makes two results the same measurement (the budget only chose the blocks)."""
        return self.blocks, self.compile, self.amp

    @property
    def compile_options(self) -> dict[str, Any] | bool:
        """The ``compile=`` argument of ``nbt.optimize``."""
        return False if self.compile is None else dict(self.compile) or True

    def describe(self) -> str:
        blocks = f"checkpoint {len(self.blocks)} block(s): {', '.join(self.blocks)}" if self.blocks else (
            "no checkpointing")
        if self.compile is None:
            compiled = "no torch.compile"
        else:
            compiled = "torch.compile(" + ", ".join(f"{k}={v!r}" for k, v in self.compile) + ")"
        return f"{blocks}; {compiled}; {self.amp or 'no'} AMP"


def compile_choice(enabled: bool, backend: str, mode: str) -> tuple[tuple[str, Any], ...] | None:
    """The panel's compile controls as Choice.compile: the mode is passed only when not "default"
    (torch.compile's own default; other backends than inductor take no mode)."""
    if not enabled:
        return None
    options: dict[str, Any] = {"backend": backend}
    if mode and mode != "default":
        options["mode"] = mode
    return tuple(sorted(options.items()))


def _stage_of(what: str) -> tuple[str, str, str]:
    """(stage, side, detail) of a progress label in either style; side is "" for new labels."""
    head, _, rest = what.partition(": ")
    if head in STAGES:
        return head, "", rest
    if head == "plan":
        return "planning", "", rest
    if head in ("before", "after"):
        stage = next((s for key, s in _OLD_STAGE_OF if key in rest), "measuring")
        return stage, head, rest
    return "", "", what


def progress_text(done: int, total: int, what: str, *, compiling: bool = False) -> str:
    """One progress line, stage first: ``measuring (after): timed step 2 of 3 · 14/22``.

    Older labels name what just finished; after the last run of "before" the next thing is the
    first run of "after", where torch.compile compiles (``compiling``): that is said then, so a
    long compile does not sit under "before: memory step".
    """
    stage, side, detail = _stage_of(what)
    count = f" · {done}/{total}"
    if not stage:
        return f"{what}{count}"
    if side == "before" and total and done * 2 >= total - 1 and stage in ("memory", "FLOPs"):
        upcoming = "compiling (after): torch.compile compiles in the first warm-up step" if compiling else (
            "warming up (after)")
        return f"{upcoming}{count}"
    where = f" ({side})" if side else ""
    return f"{stage}{where}: {detail}{count}" if detail else f"{stage}{where}{count}"


@dataclass
class ProgressLog:
    """The progress reports of one run: what was measured when it stopped."""

    done: int = 0
    total: int = 0
    last: str = ""
    runs_by_stage: dict[str, int] = field(default_factory=dict)

    def add(self, done: int, total: int, what: str) -> None:
        stage, side, _ = _stage_of(what)
        name = f"{stage} ({side})" if side else (stage or what)
        self.runs_by_stage[name] = self.runs_by_stage.get(name, 0) + max(done - self.done, 1)
        self.done, self.total, self.last = done, total, what

    def measured(self) -> str:
        if not self.runs_by_stage:
            return "nothing yet"
        return ", ".join(f"{name} ×{n}" for name, n in self.runs_by_stage.items())


def interrupted_html(log: ProgressLog, elapsed_s: float) -> str:
    """The panel's words for a measurement stopped by Kernel → Interrupt / Ctrl-C."""
    where = f" during “{escape(log.last)}”" if log.last else " before the first step finished"
    return (
        f"<b>interrupted</b>{where} after {escape(format_seconds(elapsed_s))}, "
        f"{log.done} of {log.total or '?'} runs done. Measured so far: {escape(log.measured())}. "
        "Nothing to compare: nbt.optimize undid what it had applied (checkpoints, autocast, compile); "
        "click the button to measure again."
    )


def _peaks(comparison: Comparison, kind: str) -> tuple[int | None, int | None, str]:
    if kind == "step":
        return comparison.before.peak_bytes, comparison.after.peak_bytes, "step peak"
    return comparison.before.total_peak_bytes, comparison.after.total_peak_bytes, "device total peak"


def headline(comparison: Comparison, budget_bytes: int, *, budget_kind: str = "total") -> str:
    """The result in one line: step time before -> after, and one peak (the one the budget counts,
    the device total by default) before -> after with "within the budget" or "over ... by X"."""
    before_t, after_t = comparison.before.step_time_s, comparison.after.step_time_s
    times = f"step time {format_seconds(before_t)} -> {format_seconds(after_t)}"
    if comparison.nothing_applied:
        times += " (nothing applied: the same step twice)"
    elif comparison.time_within_noise:
        times += " (within the measured noise)"
    elif math.isfinite(comparison.speedup):
        times += f" ({comparison.speedup:.2f}× speed)"
    before, after, name = _peaks(comparison, budget_kind)
    if before is None or after is None:
        return f"{times}; {name} not measured (the measurement ran without memory)"
    over = after - budget_bytes
    verdict = (
        f"within the budget {format_bytes(budget_bytes)}" if over <= 0
        else f"over the budget {format_bytes(budget_bytes)} by {format_bytes(over)}"
    )
    return f"{times}; {name} {format_bytes(before)} -> {format_bytes(after)}, {verdict}"


def result_bundle(
    comparison: Comparison, choice: Choice, *, now: Choice | None = None, budget_kind: str = "total"
) -> dict[str, str]:
    """The result as a static output (``text/html`` and ``text/plain``): headline, what was
    measured, the comparison table; marked stale when ``now`` (the controls' choice) is another plan."""
    line = headline(comparison, choice.budget_bytes, budget_kind=budget_kind)
    what = f"measured: {choice.describe()} (budget {format_bytes(choice.budget_bytes)})"
    stale = ""
    if now is not None and now.plan_key != choice.plan_key:
        stale = (
            f"stale: this result was made for another plan than the panel now shows ({now.describe()}); "
            "click Apply and measure to measure that one"
        )
    inner = comparison._repr_mimebundle_()
    html = (
        "<div class='nbt-optimize-result'>"
        + (f"<p style='color:#b45309'><b>{escape(stale)}</b></p>" if stale else "")
        + f"<p><b>{escape(line)}</b></p><p><small>{escape(what)}</small></p>"
        + inner.get("text/html", f"<pre>{escape(inner['text/plain'])}</pre>")
        + "</div>"
    )
    text = "\n".join(([stale.upper()] if stale else []) + [f"OptimizePanel result: {line}", what,
                                                           inner["text/plain"]])
    return {"text/html": html, "text/plain": text}


def is_torch_noise(line: str) -> bool:
    """A native torch line that says nothing about the user's model (dropped from the panel)."""
    return any(marker in line for marker in _TORCH_NOISE)
