"""``nbt.memory_timeline``: run code and see where its memory goes.

How the timeline is made (CPU, and CUDA when the model lives there):

1. ``fn`` runs ``steps`` times under ``torch.profiler.profile(profile_memory=True,
   record_shapes=True, with_stack=True)``, inside torch's ``ModTracker`` (which names
   every ``nn.Module`` that runs by its fully qualified path).
2. torch's memory profiler (``torch.profiler._memory_profiler.MemoryProfile``, the
   engine behind ``prof.export_memory_timeline``) turns the profile into allocation
   events with torch's categories: parameter, optimizer_state, input, temporary,
   activation, gradient, autograd_detail, or None (kept as ``unknown``). The event list
   and the categories are torch's own, so the totals per category equal what
   ``export_memory_timeline`` plots.
3. Each event is joined with the profiler's op tree for what torch's timeline lacks:
   the **phase** (``optimizer`` inside ``Optimizer.step#``/``Optimizer.zero_grad#``,
   ``backward`` inside ``autograd::engine::evaluate_function``, ``forward`` inside an
   ``nn.Module`` call, else ``other``), the **module** (the innermost ``nn.Module``
   around the allocating op; in backward, the module of the forward op with the same
   autograd sequence number), the **shape** (from the op inputs that use the storage)
   and the Python **stack**.
4. **Memory that existed before recording**: torch reports tensors the run touched as
   ``preexisting``. Parameters, gradients and optimizer state of ``model``/``optimizer``
   that the run did not touch (frozen weights, unused state) are added as a baseline at
   time 0 from their storages, so the timeline starts at the real resident size.
5. On CUDA the allocator history (``torch.cuda.memory._record_memory_history``) is
   recorded as well and kept in ``timeline.allocator_snapshot`` (a ``MemorySnapshot``).

Steps 1 and 5 happen here; the profiler run and the walk of torch's memory profile are
``nbtoolkit.memory.profile`` (shared with the optimizations' measurements), the
join of steps 3-4 is ``nbtoolkit.memory.attribution``.

**Failures**: if ``fn`` raises (an error, an out-of-memory, a KeyboardInterrupt), the
profiler and the allocator history are stopped, the timeline up to the failure is
built, attached to the exception as ``exc.timeline``, and the exception propagates
unchanged (with a note saying where the timeline is). Recording is always turned off.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import CaptureError, NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.step_runner import run_steps
from nbtoolkit.memory.attribution import build_timeline
from nbtoolkit.memory.profile import refuse_nested_profiler, run_memory_profiled, tensor_events
from nbtoolkit.memory.sharded import shard_storages

if TYPE_CHECKING:
    import torch

    from nbtoolkit.memory.timeline import MemoryTimeline

__all__ = ["memory_timeline"]

#: The note memory_timeline adds to an exception raised by the captured function.
PARTIAL_TIMELINE_NOTE = "nbtoolkit: the memory timeline up to this failure is in exc.timeline"


def memory_timeline(
    fn: Callable[[], Any],
    steps: int | None = None,
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    device: str | None = None,
    config: MeasureConfig | None = None,
    loop: bool = False,
    after: str = "stop",
) -> MemoryTimeline:
    """Run ``fn`` ``steps`` times and return its :class:`~nbtoolkit.memory.timeline.MemoryTimeline`.

    Args:
        fn: a zero-argument callable, e.g. one training step (forward, backward, optimizer).
        steps: how many times to call it while recording (default 1, see ``config``).
        model: the model, to name modules by their path in it (``layers.0.attn``) and to
            count its parameters/gradients/buffers that the run does not touch.
        optimizer: the optimizer, to count its state that the run does not touch.
        device: the device whose memory to show (``cpu``, ``cuda:0``); by default the
            model's device, else ``cpu``.
        config: a :class:`~nbtoolkit.MeasureConfig`: its ``warmup`` calls run first, unrecorded,
            then its ``steps`` are recorded (``steps=`` given as well wins). Without it, one
            call is recorded with no warm-up: a fresh step's allocations, the optimizer state
            it creates included, are what a timeline is usually wanted for.
        loop: ``fn`` runs a whole training (``lambda: trainer.train()``, a Lightning ``fit``, a
            plain loop): its setup and warm-up training steps (at least 1, so the recorded step
            holds the optimizer state the first step created) run unrecorded, then ``steps``
            training steps are recorded (a step ends at an optimizer step), then the loop is
            stopped (:mod:`nbtoolkit.core.loop_measure`). Without ``model``/``device``, the device is
            that of the parameters the loop's optimizer steps. ``timeline.loop`` is the
            :class:`~nbtoolkit.core.training_loop.LoopOutcome`.
        after: with ``loop``: ``"stop"`` (default) stops the loop through the framework's own
            mechanism once its steps are recorded; ``"continue"`` lets it run on, unrecorded.

    The value ``fn`` returned last is in ``timeline.value``. See the module docstring for
    the method and for what happens when ``fn`` raises (``exc.timeline``).
    """
    if not callable(fn):
        raise NbtUsageError(f"memory_timeline() needs a zero-argument callable, got {type(fn).__name__}")
    if config is None:
        measure = measure_config(MeasureConfig(steps=1, warmup=0), steps=steps)
    else:
        measure = measure_config(config, steps=steps)
    steps = measure.steps
    if loop:
        from nbtoolkit.core.loop_measure import measure_loop

        def record_steps(training: Any) -> MemoryTimeline:
            recorded = dataclasses.replace(measure, warmup=0)
            # without model= or device=, the device the loop's optimizer steps parameters on (CUDA
            # for a trainer on a GPU), known once its warm-up step ran
            known = device is not None or model is not None
            where = device if known else _optimizer_device(training.optimizer)
            return memory_timeline(training, model=model, optimizer=optimizer, device=where, config=recorded)

        return measure_loop(
            fn, record_steps, api="nbt.memory_timeline", warmup=measure.warmup, after=after, needs=steps
        )

    import torch
    from torch.distributed._tools.mod_tracker import ModTracker

    refuse_nested_profiler("memory_timeline")
    target = torch.device(device) if device is not None else _model_device(model)
    use_cuda = target.type == "cuda" and torch.cuda.is_available()

    module_names: dict[int, str] = {}
    if model is not None:
        module_names.update({id(m): name or type(m).__name__ for name, m in model.named_modules()})
    tracker = ModTracker()

    def remember_module(module: torch.nn.Module, _inputs: Any) -> None:
        # ModTracker has just named this module (Root.child.grandchild); keep it by id.
        if id(module) not in module_names:
            module_names[id(module)] = tracker.get_known_fqn(module) or type(module).__name__

    run_steps(fn, measure, warmup_only=True)  # before any hook or recording
    # An FSDP2 model's shards as they are before recording (gradients kept from the last step
    # are freed during it, so they cannot be found afterwards); empty for other models.
    shards_before = shard_storages(model, optimizer)
    tracker.register_user_hooks(pre_fw_hook=remember_module)
    snapshot_dict: dict[str, Any] | None = None
    recording_history = False
    try:
        if use_cuda:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
            recording_history = True
        run = run_memory_profiled(
            fn, calls=steps, details=True, cuda=use_cuda, around=tracker, caller="memory_timeline"
        )
        if recording_history:
            snapshot_dict = torch.cuda.memory._snapshot()
    finally:
        tracker.clear_user_hooks()
        if recording_history:
            torch.cuda.memory._record_memory_history(enabled=None)

    failure = run.failure
    try:
        timeline = build_timeline(
            tensor_events(run.profiler, tolerant=True), target, module_names, model=model,
            optimizer=optimizer, shards_before=shards_before,
        )
    except Exception as exc:
        if failure is not None:
            raise failure from None
        raise CaptureError(
            f"the run finished but its memory profile could not be turned into a timeline: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if snapshot_dict is not None:
        from nbtoolkit.memory.snapshot import MemorySnapshot

        timeline.allocator_snapshot = MemorySnapshot.from_dict(snapshot_dict, source="memory_timeline")
    timeline.value = run.value
    if failure is not None:
        timeline.notes.append(
            f"partial: the run raised {type(failure).__name__} during it; the timeline stops at the failure"
        )
        with contextlib.suppress(AttributeError, TypeError):  # exceptions with __slots__
            failure.timeline = timeline  # type: ignore[attr-defined]  # documented: exc.timeline
            failure.add_note(PARTIAL_TIMELINE_NOTE)
        raise failure
    return timeline


def _model_device(model: Any) -> torch.device:
    import torch

    if model is not None:
        for parameter in model.parameters():
            return torch.device(parameter.device)
    return torch.device("cpu")


def _optimizer_device(optimizer: Any) -> str | None:
    """The device of an optimizer's first parameter, None when it has none."""
    for group in getattr(optimizer, "param_groups", None) or []:
        for parameter in group.get("params", []):
            return str(parameter.device)
    return None
