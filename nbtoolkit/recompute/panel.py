"""The optimize panel and the memory-vs-time trade-off figure.

``optimize_panel(model, step)`` measures the candidate blocks once (``plan_recompute``
without a budget); after that the budget controls run no step: each budget is one solve of
the same integer program ``plan_recompute`` solves (milliseconds), so the panel and
``%nbt plan`` choose the same blocks from the same measurements. The budget box takes any
size; below the lowest reachable peak it shows the PlanError's content (the floor, what no
recomputation changes, what would lower it). "Apply and measure" calls :func:`nbtoolkit.optimize`
with the blocks shown and the compile and AMP choices:

- on the kernel's **main thread**, in turn with the cells (``nbtoolkit.core.main_thread``): a
  cell run meanwhile waits and runs afterwards, and Kernel → Interrupt (Ctrl-C) stops the
  measurement (nbt.optimize undoes what it applied; the panel says what was measured so far);
- the button disables itself in the page on the click (``run_button``), and the kernel runs
  one measurement at a time;
- progress shows the stage first (planning, compiling, warming up, measuring, memory, FLOPs);
- torch's native stderr lines and warnings during the run are caught and listed in the panel,
  not printed in red elsewhere;
- the result is written as a static output of the panel's cell (``nbtoolkit.core.cell_output``,
  HTML and text), so it survives the kernel and nbconvert; when the controls move to another
  plan it is marked stale (and unmarked when they come back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtError
from nbtoolkit.core.result import escape
from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.recompute.panel_model import (
    BACKENDS,
    MODES,
    Choice,
    ProgressLog,
    budget_text,
    compile_choice,
    headline,
    interrupted_html,
    is_torch_noise,
    progress_text,
    read_budget,
    result_bundle,
    slider_range,
)
from nbtoolkit.recompute.tradeoff_figure import tradeoff_figure

if TYPE_CHECKING:
    from nbtoolkit.recompute.comparison import Comparison
    from nbtoolkit.recompute.plan import RecomputePlan

__all__ = ["OptimizePanel", "optimize_panel", "plan_summary_html", "zero_recompute_figure"]

_MIB = 2**20

#: Said under the progress while a measurement runs: why a cell run now does not start.
_WAITS = ("<br>measuring on the kernel's main thread: a cell you run now waits until this ends; "
          "Kernel → Interrupt stops it")


def zero_recompute_figure(table: Any) -> Any:
    """Two panels from a ZeroRecompute table (:func:`sharded_recompute_figure`), one line per stage."""
    return sharded_recompute_figure(
        table,
        "stage",
        lambda stage: f"ZeRO-{stage}",
        "Recompute plans under DeepSpeed ZeRO, one plan for all ranks",
    )


def sharded_recompute_figure(table: Any, key: str, name: Callable[[Any], str], title: str) -> Any:
    """Two panels from a ZeRO or FSDP2 recompute table: blocks recomputed against the budget, one
    line per value of ``key`` (a stage, an FSDP2 configuration); and the largest rank's measured
    total peak against the budget (the diagonal is the budget itself: points under it fit)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "blocks recomputed", "largest rank's measured peak (MiB)"))
    planned = table[table["error"] == ""]
    for value, group in planned.groupby(key, sort=False):
        rows = group.sort_values("budget_bytes")
        label = escape(name(value))
        budget_mib = [v / _MIB for v in rows["budget_bytes"]]
        hover = [escape(b or "(none)") for b in rows["blocks"]]
        fig.add_trace(go.Scatter(x=budget_mib, y=rows["n_blocks"], mode="lines+markers", name=label,
                                 text=hover, line={"shape": "hv"}, legendgroup=label,
                                 hovertemplate="%{text}<extra></extra>"), 1, 1)
        fig.add_trace(go.Scatter(x=budget_mib, y=[v / _MIB for v in rows["measured_peak_bytes"]],
                                 mode="markers", name=f"{label} peak", legendgroup=label,
                                 showlegend=False, text=hover), 1, 2)
    if len(table):
        low, high = table["budget_bytes"].min() / _MIB, table["budget_bytes"].max() / _MIB
        fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", line={"dash": "dash"},
                                 name="budget"), 1, 2)
    fig.update_xaxes(title_text="budget per rank, device total (MiB)")
    fig.update_layout(title=title, height=380, margin={"l": 60, "r": 20, "t": 60, "b": 50})
    return fig


def plan_summary_html(plan: RecomputePlan, budget_bytes: float) -> str:
    """What the solver chooses for ``budget_bytes``: blocks, peak and overhead; or, when no plan
    fits, the PlanError's content (the floor and what to do). Escaped HTML."""
    from nbtoolkit.core.errors import PlanError
    from nbtoolkit.recompute.solver import plan_for_budget

    try:
        chosen = plan_for_budget(plan, int(budget_bytes))
    except PlanError as exc:
        return _no_plan_html(exc)
    return _chosen_html(plan, chosen)


def _no_plan_html(exc: Exception) -> str:
    return f"<p style='color:#b91c1c'><b>No plan fits</b>: {escape(exc)}</p>"


def _chosen_html(plan: RecomputePlan, chosen: RecomputePlan) -> str:
    blocks = ", ".join(chosen.blocks) or "(none: the baseline fits)"
    counted = "device total" if plan.budget_kind == "total" else "step's own peak"
    return (
        f"<p>budget <b>{escape(format_bytes(chosen.budget_bytes))}</b> ({counted}): checkpoint "
        f"{len(chosen.blocks)} of {len(plan.candidates)} blocks: <code>{escape(blocks)}</code><br>"
        f"predicted peak {escape(format_bytes(chosen.predicted_peak_bytes))} "
        f"(baseline {escape(format_bytes(plan.baseline_peak_bytes))}, lowest reachable "
        f"{escape(format_bytes(plan.min_peak_bytes))}), predicted extra time "
        f"+{escape(format_seconds(chosen.predicted_overhead_s))} per step "
        f"(baseline step {escape(format_seconds(plan.baseline_step_time_s))})</p>"
    )


class OptimizePanel:
    """The widgets of the panel and what they act on; ``.widget`` is the VBox to display.

    ``budget_text`` (Text: any size; a bare number is MiB) and ``budget`` (slider over the front,
    MiB) set one budget; ``compile`` (checkbox), ``backend`` and ``mode`` (dropdowns), ``amp``
    (dropdown); ``button`` (:class:`~nbtoolkit.recompute.run_button.RunButton`), ``progress``,
    ``status``; ``comparison`` (the last Comparison, or None) and ``output`` (its static output
    in the cell).
    """

    def __init__(
        self,
        model: Any,
        step: Any,
        plan: RecomputePlan,
        *,
        budget_bytes: int | None = None,
        compile: bool | dict[str, Any] = False,
        amp: str | None = None,
        steps: int | None = None,
        warmup: int | None = None,
    ) -> None:
        import ipywidgets as widgets

        from nbtoolkit.core.cell_output import CellOutput
        from nbtoolkit.core.device_memory import model_device
        from nbtoolkit.recompute.run_button import RunButton

        self.model, self.step, self.plan = model, step, plan
        self.steps, self.warmup = steps, warmup
        self.comparison: Comparison | None = None
        self.output = CellOutput()
        self._device = model_device(model)
        self._lock = threading.Lock()  # one measurement at a time, whichever thread clicks
        self._running = False
        self._syncing = False  # the box and the slider setting each other
        self._slider_set_to: float | None = None
        self._result_choice: Choice | None = None
        self._shown_stale: bool | None = None
        self._done_after = ""  # how long the last measurement took, as text
        self._choices: dict[int, Any] = {}  # budget bytes -> chosen plan or the PlanError (solver cache)
        options = compile if isinstance(compile, dict) else {}
        low, high = slider_range(plan.min_peak_bytes, plan.baseline_peak_bytes)
        start = budget_bytes if budget_bytes is not None else round(high * _MIB)
        self._budget_bytes = int(start)
        self._budget_error: str | None = None
        self.budget_text = widgets.Text(
            value=budget_text(self._budget_bytes), description="budget", continuous_update=False,
            placeholder="e.g. 11 (MiB), 11MiB, 1.5GB", layout=widgets.Layout(width="260px"),
        )
        self.budget = widgets.FloatSlider(
            value=min(max(round(self._budget_bytes / _MIB, 2), low), high), min=low, max=high, step=0.01,
            description="", readout_format=".2f", continuous_update=True,
            layout=widgets.Layout(width="420px"),
        )
        self.compile = widgets.Checkbox(value=bool(compile), description="torch.compile", indent=False,
                                        layout=widgets.Layout(width="120px"))
        backend = str(options.get("backend", BACKENDS[0]))
        mode = str(options.get("mode") or MODES[0])
        self.backend = widgets.Dropdown(options=_with(BACKENDS, backend), value=backend,
                                        description="backend", layout=widgets.Layout(width="220px"))
        self.mode = widgets.Dropdown(options=_with(MODES, mode), value=mode, description="mode",
                                     layout=widgets.Layout(width="300px"))
        # "none", not None: a Dropdown whose value is None shows no choice at all (a blank box)
        self.amp = widgets.Dropdown(options=[("no AMP", "none"), ("bf16", "bf16"), ("fp16", "fp16")],
                                    value=amp or "none", description="AMP",
                                    layout=widgets.Layout(width="200px"))
        self.summary = widgets.HTML()
        self.figure = widgets.Output()
        self.button = RunButton()
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="", layout={"width": "420px"})
        self.status = widgets.HTML()
        self.messages = widgets.HTML()  # torch's own lines caught during the last run
        self.shown_figure: Any = None  # the trade-off figure shown now
        self.budget_text.observe(self._on_budget_text, names="value")
        self.budget.observe(self._on_slider, names="value")
        for control in (self.compile, self.backend, self.mode, self.amp):
            control.observe(self._on_controls, names="value")
        self.button.on_run(self._on_click)
        self._replan()
        self.widget = widgets.VBox([
            widgets.HBox([self.budget_text, self.budget]),
            widgets.HBox([self.compile, self.backend, self.mode, self.amp]),
            self.summary,
            self.figure,
            widgets.HBox([self.button, self.progress]),
            self.status,
            self.messages,
        ])

    # ---- the budget and the plan it chooses ----
    @property
    def budget_bytes(self) -> int:
        return self._budget_bytes

    def chosen(self) -> RecomputePlan:
        """The plan for the current budget (the solver's choice); PlanError when none fits."""
        from nbtoolkit.recompute.solver import plan_for_budget

        budget = self._budget_bytes
        if budget not in self._choices:
            try:
                self._choices[budget] = plan_for_budget(self.plan, budget)
            except NbtError as exc:
                self._choices[budget] = exc
        found = self._choices[budget]
        if isinstance(found, Exception):
            raise found.with_traceback(None)  # cached: no traceback growing with every raise
        return found

    def predicted(self) -> dict[str, Any] | None:
        """What "Apply and measure" will apply for the current budget (None when no plan fits)."""
        try:
            chosen = self.chosen()
        except NbtError:
            return None
        return {"blocks": list(chosen.blocks), "predicted_peak_bytes": chosen.predicted_peak_bytes,
                "predicted_overhead_s": chosen.predicted_overhead_s}

    def choice(self) -> Choice:
        """The controls' choice now; NbtUsageError for an unreadable budget, PlanError when none fits."""
        from nbtoolkit.core.errors import NbtUsageError

        if self._budget_error is not None:
            raise NbtUsageError(self._budget_error)
        chosen = self.chosen()
        compiled = compile_choice(self.compile.value, self.backend.value, self.mode.value)
        amp = None if self.amp.value == "none" else str(self.amp.value)
        return Choice(tuple(chosen.blocks), compiled, amp, self._budget_bytes)

    @property
    def compile_options(self) -> dict[str, Any]:
        """The torch.compile options the controls name ({} when compilation is off)."""
        if not self.compile.value:
            return {}
        return dict(compile_choice(True, self.backend.value, self.mode.value) or ())

    def set_budget(self, text: str) -> None:
        """Type ``text`` into the budget box (any size; a bare number is MiB)."""
        self.budget_text.value = text

    def _on_budget_text(self, change: Any) -> None:
        try:
            self._budget_bytes = read_budget(change["new"], self._device)
            self._budget_error = None
        except NbtError as exc:
            self._budget_error = str(exc)
        else:
            self._sync_slider()
        self._replan()

    def _sync_slider(self) -> None:
        value = min(max(round(self._budget_bytes / _MIB, 2), self.budget.min), self.budget.max)
        self._slider_set_to = value
        self._syncing = True
        try:
            self.budget.value = value
        finally:
            self._syncing = False

    def _on_slider(self, change: Any) -> None:
        new = float(change["new"])
        # our own setting, or the page echoing it back: the box holds the exact budget
        if self._syncing or (self._slider_set_to is not None and abs(new - self._slider_set_to) < 1e-9):
            return
        self._slider_set_to = None
        self.budget_text.value = budget_text(round(round(new, 2) * _MIB))

    def _on_controls(self, _change: Any) -> None:
        self.backend.disabled = self.mode.disabled = not self.compile.value
        self._refresh_result()

    def _replan(self) -> None:
        """Summary and figure for the budget; the button off when nothing can run."""
        from IPython.display import display

        self.backend.disabled = self.mode.disabled = not self.compile.value
        try:
            chosen = self.chosen()  # for the last readable budget
        except NbtError as exc:
            self.summary.value = _no_plan_html(exc)
            # below the floor: the budget's line under the front, no plan starred
            figure = tradeoff_figure(self.plan, budget_bytes=self._budget_bytes)
        else:
            self.summary.value = _chosen_html(self.plan, chosen)
            figure = tradeoff_figure(chosen)  # the star on the very blocks the summary names
        if self._budget_error is not None:
            self.summary.value = f"<p style='color:#b91c1c'>{escape(self._budget_error)}</p>"
        self.button.disabled = self._budget_error is not None or self.predicted() is None
        self.shown_figure = figure
        self.figure.clear_output(wait=True)
        with self.figure:
            display(figure)
        self._refresh_result()

    # ---- running: on the kernel's main thread, one at a time ----
    def _on_click(self) -> None:
        """A click (the page's or ``button.click()``), on whichever thread the kernel runs it."""
        from nbtoolkit.core.main_thread import on_main_thread

        with self._lock:
            if self._running:
                return  # the kernel's guard: one measurement at a time
            self._running = True
        self.button.busy = True
        try:
            choice = self.choice()
        except NbtError as exc:
            self._say(f"<b>{escape(type(exc).__name__)}</b>: {escape(exc)}")
            self._end_run()
            return
        self.progress.value, self.progress.bar_style, self.progress.description = 0, "", ""
        self._say("queued: starts on the kernel's main thread as soon as it is free (a running cell "
                  "finishes first)")
        on_main_thread(lambda: self._run_job(choice))  # without a kernel loop: runs here, now

    def _run_job(self, choice: Choice) -> None:
        """The measurement, on the main thread: result, error or interruption shown, never raised."""
        from nbtoolkit.core.captured_output import Captured, captured_stderr

        log = ProgressLog()
        started = time.monotonic()
        captured = Captured()
        try:
            with captured_stderr() as captured:
                comparison = self._measure(choice, log)
        except KeyboardInterrupt:
            self.progress.bar_style, self.progress.description = "warning", "interrupted"
            self._say(interrupted_html(log, time.monotonic() - started))
        except NbtError as exc:
            self.progress.bar_style = "danger"
            self._say(f"<b>{escape(type(exc).__name__)}</b>: {escape(exc)}")
        except Exception as exc:  # shown in the panel: a widget callback has nowhere to raise to
            self.progress.bar_style = "danger"
            self._say(f"<b>the measurement failed</b> with {escape(type(exc).__name__)}: {escape(exc)}")
        else:
            self._done_after = format_seconds(time.monotonic() - started)
            self._show_result(comparison, choice)
        finally:
            self._show_messages(captured.lines)
            self._end_run()

    def _measure(self, choice: Choice, log: ProgressLog) -> Comparison:
        from nbtoolkit.core.measure_config import measure_config
        from nbtoolkit.recompute.optimize import optimize

        compiling = choice.compile is not None

        def report(done: int, total: int, what: str) -> None:
            log.add(done, total, what)
            self.progress.max = max(total, 1)
            self.progress.value = min(done, total)
            line = progress_text(done, total, what, compiling=compiling)
            self.status.value = f"<small>{escape(line)}{_WAITS}</small>"

        self.status.value = f"<small>{escape('starting: ' + choice.describe())}{_WAITS}</small>"
        return optimize(
            self.model, self.step, compile=choice.compile_options, recompute=list(choice.blocks) or None,
            amp=choice.amp, progress=report, config=measure_config(steps=self.steps, warmup=self.warmup),
        )

    def apply_and_measure(self) -> Comparison:
        """Measure the controls' choice now, on this thread; show and return the comparison
        (errors raise: for scripts and tests; the button shows them in the panel instead)."""
        choice = self.choice()
        log = ProgressLog()
        comparison = self._measure(choice, log)
        self._show_result(comparison, choice)
        return comparison

    def _end_run(self) -> None:
        with self._lock:
            self._running = False
        self.button.end_run()

    def _say(self, html: str) -> None:
        self.status.value = f"<small>{html}</small>"

    def _show_messages(self, lines: list[str]) -> None:
        kept = list(dict.fromkeys(line for line in lines if not is_torch_noise(line)))
        if not kept:
            self.messages.value = ""
            return
        self.messages.value = (
            f"<details><summary><small>{len(kept)} message(s) from torch while measuring</small>"
            "</summary><pre style='font-size:smaller'>" + escape("\n".join(kept)) + "</pre></details>"
        )

    # ---- the result: a static output of the cell, marked stale when the controls move ----
    def _show_result(self, comparison: Comparison, choice: Choice) -> None:
        self.comparison = comparison
        self._result_choice = choice
        self._shown_stale = None
        self._refresh_result()

    def _refresh_result(self) -> None:
        choice = self._result_choice
        if choice is None or self.comparison is None:
            return
        try:
            now: Choice | None = self.choice()
        except NbtError:
            now = None  # no plan for the budget now: not the plan the result measured
        stale = now is None or now.plan_key != choice.plan_key
        if stale == self._shown_stale:
            return  # unchanged: no rewrite of the cell's output on every slider step
        self._shown_stale = stale
        marker = now or Choice(("(no plan fits the budget)",), None, None, self._budget_bytes)
        bundle = result_bundle(self.comparison, choice, now=marker if stale else None,
                               budget_kind=self.plan.budget_kind)
        self.output.show(bundle)
        line = headline(self.comparison, choice.budget_bytes, budget_kind=self.plan.budget_kind)
        took = f" in {self._done_after}" if self._done_after else ""
        note = (" <b style='color:#b45309'>stale: the controls now choose another plan; the result below "
                "is for the one measured</b>") if stale else " (the table is written below the panel)"
        self.progress.description = "stale" if stale else "done"
        self.status.value = f"<small><b>done{took}</b>: {escape(line)}{note}</small>"

    # ---- display ----
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        self.output.bind()  # results go into the cell that shows the panel
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        if isinstance(bundle, dict):
            bundle["text/plain"] = (
                f"OptimizePanel: budget over the trade-off front of {len(self.plan.tradeoff)} plans "
                f"(lowest reachable peak {format_bytes(self.plan.min_peak_bytes)}); the measured result "
                "is written below it"
            )
            bundle["text/html"] = self._static_html()
        return bundle

    def _static_html(self) -> str:
        """What a page without the kernel shows in the panel's place (nbconvert, GitHub): the
        trade-off figure at the current budget, drawn as SVG, and the plan's own table."""
        from nbtoolkit.core.figure_svg import figure_svg

        figure = figure_svg(tradeoff_figure(self.plan, budget_bytes=self._budget_bytes))
        return (
            "<div class='nbt-optimize-panel-static'><p><b>Optimize panel</b> (a static copy: its "
            f"controls need the running kernel; budget {escape(format_bytes(self._budget_bytes))})</p>"
            f"{figure}{self.plan._html()}</div>"
        )

    def __repr__(self) -> str:
        budget = format_bytes(self.budget_bytes)
        return f"OptimizePanel(budget={budget}, front of {len(self.plan.tradeoff)} plans)"


def _with(options: tuple[str, ...], value: str) -> list[str]:
    """The dropdown's options, with ``value`` (given on the magic line) among them."""
    return list(options) if value in options else [*options, value]


def optimize_panel(
    model: Any,
    step: Any,
    *,
    plan: RecomputePlan | None = None,
    budget_bytes: Any = None,
    compile: bool | dict[str, Any] = False,
    amp: str | None = None,
    steps: int | None = None,
    warmup: int | None = None,
) -> OptimizePanel:
    """Measure the candidates once (unless ``plan`` is given) and build the interactive panel.

    ``budget_bytes`` (the budget it starts at) reads as ``nbt.optimize``'s does: bytes, text such
    as ``"1.5GB"``, or on a GPU a share such as ``"90%"``; any size, below the floor too (the
    panel then says why no plan fits).
    """
    from nbtoolkit.core.device_memory import budget_bytes_for, model_device
    from nbtoolkit.core.units import parse_budget
    from nbtoolkit.recompute.planner import plan_recompute

    # the one budget parser (units.parse_budget), as nbt.optimize reads it: same text, same error
    budget = None if budget_bytes is None else parse_budget(budget_bytes)
    if budget is not None and not isinstance(budget, int):  # a share of the GPU: its bytes
        budget = budget_bytes_for(budget, model_device(model))
    caught: list[str] = []
    if plan is None:
        from nbtoolkit.core.captured_output import captured_stderr

        with captured_stderr() as captured:  # torch's native lines go to the panel, not in red above it
            plan = plan_recompute(model, step, None, steps=steps)
        caught = captured.lines
    panel = OptimizePanel(model, step, plan, budget_bytes=budget, compile=compile, amp=amp,
                          steps=steps, warmup=warmup)
    panel._show_messages(caught)
    return panel
