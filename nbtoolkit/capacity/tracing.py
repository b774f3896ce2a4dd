"""One training step traced under fake tensors: live bytes by storage over time, and the step's FLOPs.

The model and batch are built inside torch's ``FakeTensorMode``, so no parameter, activation or
optimizer state takes memory: an 8-billion-parameter model traces on a laptop. The step is the
real one (forward, loss, backward, ``optimizer.step()``), so the activations are what autograd
really saves, not a formula per architecture.

:class:`LiveBytes` is a ``TorchDispatchMode`` that sees every op's outputs. A storage is counted
when an op first returns a tensor on it and freed when the last reference to it dies (a weak
finalizer on the storage: torch keeps one Python object per storage alive as long as any tensor
views it, so the finalizer fires exactly when the memory would be released). Each change is an
event ``(storage key, +/-bytes, phase)``; which storages are parameters, gradients and optimizer
state is known only after the step, so the events are classified then (:class:`StepTrace`).

A model function that allocates real memory (``torch.from_numpy``, a tensor built before the call
and captured) is refused with the user's file and line (:class:`RealAllocationGuard`).
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["StepTrace", "trace_step"]

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
#: a real tensor at least this large made under fake mode is refused (small constants are harmless)
REAL_BYTES_LIMIT = 1 << 20


@dataclass
class StepTrace:
    """What one fake step allocated, classified after the step.

    ``events``: (storage key, signed bytes, phase) in order; ``parameter``, ``gradient``,
    ``optimizer_state``, ``input`` and ``buffer``: storage key -> bytes of those storages;
    ``block_parameter_bytes``: bytes of each repeated block's parameters (the unit that ZeRO-3
    and FSDP2 gather); ``flops``: hardware FLOPs of the step (forward, backward, recompute)
    by the dtype that carried them; ``parameter_count``.
    """

    events: list[tuple[int, int, str]] = field(default_factory=list)
    parameter: dict[int, int] = field(default_factory=dict)
    gradient: dict[int, int] = field(default_factory=dict)
    optimizer_state: dict[int, int] = field(default_factory=dict)
    input: dict[int, int] = field(default_factory=dict)
    buffer: dict[int, int] = field(default_factory=dict)
    block_parameter_bytes: list[int] = field(default_factory=list)
    model_flops: int = 0
    hardware_flops: int = 0
    flops_dtype: str = "float32"
    parameter_count: int = 0

    def state_bytes(self, kind: str) -> int:
        return int(sum(getattr(self, kind).values()))

    def transient_timeline(self) -> list[tuple[str, int, int, int]]:
        """Per event: (phase, gradient bytes live, forward/backward transient bytes live, optimizer
        transient bytes live). Transients are every storage that is not a parameter, buffer,
        input, gradient or optimizer state: saved activations and temporaries."""
        state = set(self.parameter) | set(self.optimizer_state) | set(self.input) | set(self.buffer)
        grads = self.gradient
        born: dict[int, str] = {}
        grad = fb = opt = 0
        rows = []
        for key, delta, phase in self.events:
            if key in state:
                continue
            if delta > 0:
                born[key] = phase
            where = born.get(key, phase)
            if key in grads:
                grad += delta
            elif where == "optimizer":
                opt += delta
            else:
                fb += delta
            rows.append((phase, grad, fb, opt))
        return rows or [("forward", 0, 0, 0)]

    def activation_bytes(self) -> int:
        """Transient bytes still live when forward ended: what autograd saved for backward."""
        last = 0
        for phase, _grad, fb, _opt in self.transient_timeline():
            if phase == "forward":
                last = fb
        return last


def _user_line() -> str:
    """``file:line`` of the innermost frame outside torch and nbtoolkit (the user's code)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith((_PACKAGE_DIR, "<frozen")) or "/torch/" in name or "/transformers/" in name):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown line"


def _is_real(tensor: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(tensor, FakeTensor) and not tensor.is_meta


def _make_guard() -> Any:
    """A TorchFunctionMode that refuses a real tensor of REAL_BYTES_LIMIT or more made under fake mode."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    class RealAllocationGuard(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and _is_real(leaf):
                    size = leaf.untyped_storage().nbytes()
                    if size >= REAL_BYTES_LIMIT:
                        raise NbtUsageError(
                            f"{_user_line()}: {getattr(func, '__name__', func)} made a real tensor of "
                            f"{size:,} bytes while nbt.fit builds the model without memory (fake tensors): "
                            "create tensors with torch functions (torch.zeros, torch.randn, nn layers) "
                            "inside make_model / make_batch, not from numpy or data loaded outside"
                        )
            return out

    return RealAllocationGuard()


class _Live:
    """Storages alive now: address -> (allocation id, bytes). An address is reused after a free,
    so events carry the allocation id, unique over the step."""

    def __init__(self) -> None:
        self.by_address: dict[int, tuple[int, int]] = {}
        self.next_id = 0

    def key(self, tensor: Any) -> int:
        """The allocation id of the storage under ``tensor`` (its negative address when it was made
        before tracing started: parameters, inputs)."""
        address = tensor.untyped_storage()._cdata
        found = self.by_address.get(address)
        return found[0] if found else -address

    def sizes(self, tensors: Sequence[Any]) -> dict[int, int]:
        return {self.key(t): int(t.untyped_storage().nbytes()) for t in tensors}

    def existing(self, tensors: Sequence[Any]) -> dict[int, int]:
        """Sizes of storages made before tracing (parameters, buffers, inputs), remembered so that
        a view of them (a weight's transpose) is not counted as a new allocation."""
        sizes = self.sizes(tensors)
        for tensor in tensors:
            address = tensor.untyped_storage()._cdata
            self.by_address.setdefault(address, (-address, 0))
        return sizes


def _flop_formulas() -> dict[Any, Any]:
    """torch's FLOP formulas by op, with the project's for CPU attention (metrics/flop_count.py)."""
    from torch.utils.flop_counter import flop_registry, shape_wrapper

    from nbtoolkit.metrics.flop_count import _cpu_attention_formulas

    return {**flop_registry, **{k: shape_wrapper(v) for k, v in _cpu_attention_formulas().items()}}


def _make_live_bytes(trace: StepTrace, phase: list[str], live: _Live) -> Any:
    """The dispatch mode that records live bytes, and counts FLOPs with torch's formulas.

    FLOPs are counted here rather than under nbtoolkit's FlopCounterMode (metrics/flop_count.py):
    its per-module attribution hooks keep a checkpointed block's recomputed tensors alive longer
    than the real step does, which would inflate the traced memory of ``recompute="all"``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    formulas = _flop_formulas()
    by_dtype: dict[str, int] = {}

    def freed(address: int, ident: int) -> None:
        current = live.by_address.get(address)
        if current is not None and current[0] == ident:
            del live.by_address[address]
            trace.events.append((ident, -current[1], phase[0]))

    class LiveBytes(TorchDispatchMode):
        """Counts each storage once, from the op that made it until its last reference dies."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = formulas.get(func._overloadpacket)
            if formula is not None:
                flops = int(formula(*args, **kwargs, out_val=out))
                # a forward re-run inside backward (grad mode on in the engine) is recomputation
                recomputed = torch._C._current_graph_task_id() != -1 and torch.is_grad_enabled()
                trace.hardware_flops += flops
                trace.model_flops += 0 if recomputed else flops
                first = next((t for t in tree_leaves(args) if isinstance(t, torch.Tensor)), None)
                if first is not None:
                    dtype = str(first.dtype).removeprefix("torch.")
                    by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
                    trace.flops_dtype = max(by_dtype, key=lambda d: by_dtype[d])
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    storage = leaf.untyped_storage()
                    address = storage._cdata
                    if address not in live.by_address:
                        size = int(storage.nbytes())
                        live.next_id += 1
                        live.by_address[address] = (live.next_id, size)
                        trace.events.append((live.next_id, size, phase[0]))
                        weakref.finalize(storage, freed, address, live.next_id)
            return out

    return LiveBytes()


def _split_batch(batch: Any) -> tuple[Any, Any]:
    return batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)


def default_loss(out: Any, targets: Any) -> Any:
    """The integrations' default loss: MSE against targets, else the output's mean square; a HF
    output's ``loss`` (when the model computed one) or its ``logits``."""
    import torch

    if hasattr(out, "loss") and getattr(out, "loss", None) is not None:
        return out.loss
    if hasattr(out, "logits"):
        out = out.logits
    if targets is not None:
        return torch.nn.functional.mse_loss(out.float(), targets.float())
    return out.float().pow(2).mean()


def trace_step(
    make_model: Callable[[], Any],
    make_batch: Callable[[int], Any],
    *,
    micro_batch: int,
    recompute: str,
    amp: str | None,
    optimizer: str,
    loss_fn: Callable[[Any, Any], Any] | None,
    blocks: Sequence[str] | None,
    checkpointed: int | None = None,
) -> StepTrace:
    """Build the model and batch under fake tensors and trace one training step (see module doc).

    ``recompute="all"`` checkpoints every repeated block; ``checkpointed=k`` the first k (0: none)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nbtoolkit.capacity.recompute_blocks import apply_recompute, block_modules

    trace = StepTrace()
    phase = ["build"]
    fake = FakeTensorMode(allow_non_fake_inputs=False)
    with fake, _make_guard():
        model = make_model()
        if not isinstance(model, torch.nn.Module):
            raise NbtUsageError(f"make_model must return a torch.nn.Module, got {type(model).__name__}")
        _refuse_real_state(model)
        batch = make_batch(micro_batch)
        inputs, targets = _split_batch(batch)
        if not isinstance(inputs, torch.Tensor) or _is_real(inputs):
            got = "a real tensor" if isinstance(inputs, torch.Tensor) else type(inputs).__name__
            raise NbtUsageError(
                "make_batch(micro_batch) must return tensors it builds inside the call (torch.randint, "
                f"torch.randn, ...), as inputs or (inputs, targets); got {got}"
            )
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise NbtUsageError("the model has no parameters that require grad: there is nothing to train")
        modules = block_modules(model, blocks)
        trace.block_parameter_bytes = [
            sum(p.numel() * p.element_size() for p in m.parameters()) for m in modules
        ]
        if checkpointed is not None:
            if checkpointed:
                apply_recompute(modules[:checkpointed])
        elif recompute == "all":
            apply_recompute(modules)
        trace.parameter_count = sum(p.numel() for p in params)
        opt = _optimizer(optimizer, params)
        live = _Live()
        trace.parameter = live.existing(list(model.parameters()))
        trace.buffer = live.existing(list(model.buffers()))
        trace.input = live.existing([t for t in (inputs, targets) if isinstance(t, torch.Tensor)])
        loss_of = loss_fn or default_loss
        with _make_live_bytes(trace, phase, live):
            phase[0] = "forward"
            with _autocast(amp):
                out = model(inputs)
                loss = loss_of(out, targets)
            del out
            phase[0] = "backward"
            loss.backward()
            del loss
            gc.collect()
            phase[0] = "optimizer"
            opt.step()
            trace.gradient = live.sizes([p.grad for p in params if p.grad is not None])
            trace.optimizer_state = live.sizes(
                [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
            )
            opt.zero_grad(set_to_none=True)
            gc.collect()
    del model, opt, params, inputs, targets, batch, modules
    gc.collect()
    return trace


def _refuse_real_state(model: Any) -> None:
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in named:
            if _is_real(tensor):
                raise NbtUsageError(
                    f"the model's {kind} {name!r} is a real tensor: make_model must build the model inside "
                    "the call (nbt.fit runs it under fake tensors), not return a model built before it"
                )


def _optimizer(name: str, params: list[Any]) -> Any:
    import torch

    makers = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
    if name not in makers:
        raise NbtUsageError(f"unknown optimizer {name!r}: use one of {sorted(makers)}")
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return makers[name](params, lr=1e-3)


def _autocast(amp: str | None) -> Any:
    import contextlib

    import torch

    if amp is None:
        return contextlib.nullcontext()
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if amp not in dtypes:
        raise NbtUsageError(f"unknown amp {amp!r}: use 'bf16', 'fp16' or None (full precision)")
    return torch.autocast("cpu", dtype=dtypes[amp])
