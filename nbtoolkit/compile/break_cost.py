"""The cost of each graph break: host time per step spent in eager code because of the break.

Measured by :func:`nbtoolkit.capture_graphs` in its profiled steps (``torch.profiler``, CPU)
and written into ``breaks.eager_us_per_step``.

What a break costs. A graph break ends a graph; the code at the break runs eagerly, then the
next graph starts (a resume function, compiled on its own). Without the break, that code
would be in the graph. But some code runs eagerly whether or not there is a break, and is
never part of a break's cost:

- the **backward pass**: ``loss.backward()`` hands the graph to autograd's engine, which runs
  outside any Dynamo frame (compiled forward graphs' backward graphs included); a break at
  or before ``backward()`` does not make the backward eager;
- **compiling**: a compile or recompile that happens inside a profiled step (its time is in
  the report's compile time and recompiles, not in a break);
- torch's optimizer ``zero_grad`` (Dynamo never traces it, wherever it is called).

How it is measured. torch marks every run of a compiled frame with a profiler range
``Torch-Compiled Region: <frame>/<compile>``; the frame's compiled code calls the graph,
then runs the code at the break eagerly, then calls the resume function, whose own
compiled region nests inside. For each region R on the profiled thread:

- the graph's end is the end of the last ``## Call CompiledFxGraph ##`` range (inductor)
  or ``CompiledFunction`` range (AOTAutograd's forward of a graph that needs gradients:
  ``aot_eager``, inductor) directly in R; for graphs that run as plain aten ops (the
  ``eager`` backend, inference graphs of ``aot_eager``), the end of the k-th direct child
  op of R, where k is the number of top-level ops the graph ran, counted in one more
  profiled call with Python stacks (the ops under FX's generated ``forward``;
  :func:`graph_op_counts`), else the graph's op count from ``compilation_metrics``, which
  can differ (a node that runs no op, or several: on a small Llama 152 logged against
  about 160 run, which put the loss computation after the "end" of the graph); 0 for a
  frame without a graph: the end of the ``Pregraph bytecode`` range, else R's start;
- the time after the graph's end that is not the break's (the intervals X, merged):
  R's direct child regions and the ``TorchDynamo Cache Lookup`` range that precedes each
  (the next graph and its guard check, measured as their own regions); compile ranges
  (``... (dynamo_timed)``); ``Optimizer.zero_grad#...`` ranges; and each backward pass:
  a run of autograd engine ranges (``autograd::engine::evaluate_function: ...``, from R's
  thread or, where a device's backward runs on autograd's worker thread, from any other
  thread) not interrupted by another direct child of R, from the start of the first to
  the end of the last, together with the ``aten::ones_like`` just before it (the gradient
  of 1 that ``backward()`` of a scalar creates) and the gap up to the first engine range;
- R's eager time = (R's end - the graph's end) - the part of X after the graph's end.

That eager time is added to the break(s) logged for R's compile id (split evenly when a
compile logged several) and divided by the number of profiled steps. It is host time:
the break's own Python and eager ops, the frame transition and the pregraph work of the
next graph. Known limits: Python code between two ``backward()`` calls that runs no torch
op is counted as backward; where the ops counted with Python stacks are not available,
an op count that differs from the ops actually run moves the graph's end by those ops
(the inductor and AOTAutograd markers are exact). The report's headline sums the costs of all breaks
(``report.eager_between_graphs_s``) and shows them as a share of a profiled step
(``report.profiled_step_time_s``, the mean wall time of a step in the profiled run), so
that both sides of the ratio carry the profiler's overhead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["attribute_break_costs", "graph_op_counts", "region_eager_us"]

REGION = "Torch-Compiled Region: "
_CACHE_LOOKUP = "TorchDynamo Cache Lookup"
_PREGRAPH = "Pregraph bytecode"
_INDUCTOR_CALL = "## Call CompiledFxGraph"
_AOT_FORWARD = "CompiledFunction"  # AOTAutograd's autograd.Function: a training graph's forward runs in it
_NOT_GRAPH_OPS = (_PREGRAPH, "AOTDispatcher Runtime Wrapper Prologue", _CACHE_LOOKUP)
_ENGINE = "autograd::engine::evaluate_function: "
_GRAD_SEED = "aten::ones_like"
_COMPILING = " (dynamo_timed)"
_ALWAYS_EAGER = ("Optimizer.zero_grad#",)
_FX_CODE = "<eval_with_key>"  # the file name of FX's generated forward code


def attribute_break_costs(
    breaks: pd.DataFrame,
    graphs: pd.DataFrame,
    events: list[Any],
    steps: int,
    notes: list[str],
    *,
    ops_run: dict[str, int] | None = None,
) -> None:
    """Fill ``breaks.eager_us_per_step`` from the profiled events (the method in the module docstring).

    ``ops_run``: compile id -> the top-level ops its graph runs (:func:`graph_op_counts`),
    which wins over the op count torch logged.
    """
    op_counts: dict[str, int] = {}
    for row in graphs.itertuples(index=False):
        key = f"{row.frame_id}/{row.frame_compile_id}"
        op_counts[key] = int(row.op_count) if row.op_count is not None and row.op_count == row.op_count else 0
    op_counts.update(ops_run or {})
    regions = [e for e in events if e.name.startswith(REGION)]
    if not regions:
        notes.append("no compiled region ran in the profiled steps: break costs were not measured")
        return
    engine = _engine_events(events)
    eager_by_region: dict[str, float] = {}
    for region in regions:
        cid = region.name[len(REGION) :].strip()
        others = [e for e in engine if e.thread != region.thread]
        eager_by_region[cid] = eager_by_region.get(cid, 0.0) + region_eager_us(
            region, op_counts.get(cid, 0), others
        )
    by_compile: dict[str, list[int]] = {}
    for i, row in enumerate(breaks.itertuples(index=False)):
        by_compile.setdefault(f"{row.frame_id}/{row.frame_compile_id}", []).append(i)
    column = breaks.columns.get_loc("eager_us_per_step")
    for cid, rows in by_compile.items():
        if cid in eager_by_region:
            share = eager_by_region[cid] / steps / len(rows)
            for i in rows:
                breaks.iat[i, column] = share


def graph_op_counts(events: list[Any]) -> dict[str, int]:
    """Compile id -> the top-level ops its graph ran, from a profile taken with Python stacks.

    A graph that runs as plain ops (the ``eager`` backend) is the Python function
    ``forward`` of a file named ``<eval_with_key>.N`` (FX's generated code); the ops it ran
    that a profile without stacks shows as direct children of the region are the outermost
    non-Python events under it. Regions whose graph is not such a function are left out.
    """
    counts: dict[str, int] = {}
    for region in events:
        if not region.name.startswith(REGION):
            continue
        cid = region.name[len(REGION) :].strip()
        forward = _graph_forward(region)
        if forward is not None and cid not in counts:
            counts[cid] = _outermost_ops(forward)
    return counts


def _graph_forward(event: Any) -> Any:
    """The first ``<eval_with_key>...: forward`` Python event under ``event``, outside nested regions."""
    for child in sorted(event.cpu_children, key=lambda e: e.time_range.start):
        if child.name.startswith(REGION):
            continue
        if getattr(child, "is_python_function", False):
            if child.name.startswith(_FX_CODE) and child.name.endswith(": forward"):
                return child
            found = _graph_forward(child)
            if found is not None:
                return found
    return None


def _outermost_ops(event: Any) -> int:
    """How many non-Python events lie under ``event`` with only Python events between."""
    count = 0
    for child in event.cpu_children:
        if getattr(child, "is_python_function", False):
            count += _outermost_ops(child)
        else:
            count += 1
    return count


def _engine_events(events: list[Any]) -> list[Any]:
    """The outermost autograd-engine ranges of every thread (one per backward node run)."""
    found = []
    for e in events:
        if not e.name.startswith(_ENGINE):
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith(_ENGINE):
            parent = parent.cpu_parent
        if parent is None:
            found.append(e)
    return found


def region_eager_us(region: Any, op_count: int, other_thread_engine: Iterable[Any] = ()) -> float:
    """Host µs of one compiled-region run spent in eager code because of its break (see the module)."""
    start, end = region.time_range.start, region.time_range.end
    children = sorted(region.cpu_children, key=lambda e: e.time_range.start)
    graph_end = _graph_end(start, children, op_count)
    excluded: list[tuple[float, float]] = []
    for i, child in enumerate(children):
        lo, hi = child.time_range.start, child.time_range.end
        if child.name.startswith(REGION):
            if i > 0 and children[i - 1].name == _CACHE_LOOKUP:
                lo = children[i - 1].time_range.start
            excluded.append((lo, hi))
        elif child.name.endswith(_COMPILING) or child.name.startswith(_ALWAYS_EAGER):
            excluded.append((lo, hi))
    others = [e for e in other_thread_engine if e.time_range.start >= start and e.time_range.end <= end]
    excluded.extend(_backward_spans(children, others))
    eager = (end - graph_end) - _covered(excluded, graph_end, end)
    return max(eager, 0.0)


def _graph_end(start: float, children: list[Any], op_count: int) -> float:
    """When the region's graph ended (the module docstring says how it is found)."""
    graph_end = start
    pregraph = [c for c in children if c.name == _PREGRAPH]
    if pregraph:
        graph_end = pregraph[0].time_range.end
    graph_calls = [c for c in children if c.name.startswith(_INDUCTOR_CALL) or c.name == _AOT_FORWARD]
    if graph_calls:
        return max(c.time_range.end for c in graph_calls)
    if op_count > 0:
        ops = [
            c
            for c in children
            if not c.name.startswith(REGION)
            and c.name not in _NOT_GRAPH_OPS
            and not c.name.startswith(_ENGINE)
            and c.time_range.start >= graph_end
        ]
        if ops:
            graph_end = ops[min(op_count, len(ops)) - 1].time_range.end
    return graph_end


def _backward_spans(children: list[Any], other_thread_engine: list[Any]) -> list[tuple[float, float]]:
    """Each backward pass in the region: runs of engine ranges no other direct child interrupts."""
    items = [(c.time_range.start, c.time_range.end, c.name) for c in children]
    items += [(e.time_range.start, e.time_range.end, e.name) for e in other_thread_engine]
    items.sort(key=lambda item: item[0])
    spans: list[tuple[float, float]] = []
    span: list[float] | None = None
    previous: tuple[float, float, str] | None = None
    for lo, hi, name in items:
        if name.startswith(_ENGINE):
            if span is None:
                # backward() of a scalar first creates its gradient of 1: part of the backward pass
                seed = previous is not None and previous[2] == _GRAD_SEED
                span = [previous[0] if seed and previous is not None else lo, hi]
            else:
                span[1] = max(span[1], hi)
        elif span is not None:
            spans.append((span[0], span[1]))
            span = None
        previous = (lo, hi, name)
    if span is not None:
        spans.append((span[0], span[1]))
    return spans


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` inside [lo, hi]."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total = 0.0
    current: tuple[float, float] | None = None
    for a, b in clipped:
        if current is None or a > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = (a, b)
        else:
            current = (current[0], max(current[1], b))
    if current is not None:
        total += current[1] - current[0]
    return total
