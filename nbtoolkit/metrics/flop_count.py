"""FLOPs of one training step by phase, module and op, counted by torch's ``FlopCounterMode``.

Step 2 of :func:`nbtoolkit.metrics.measure.step_metrics`: one call of the step under
torch's ``FlopCounterMode`` (a ``TorchDispatchMode`` that sees every aten op and applies
torch's FLOP formulas to matrix products, convolutions and attention). Each counted op is
put in one phase:

- *forward*: the op ran outside the autograd engine (``torch._C._current_graph_task_id()``
  is -1);
- *backward*: it ran inside the engine with grad mode off, which is how the engine runs
  gradient formulas (``backward(create_graph=False)``);
- *recompute*: it ran inside the engine with grad mode ON. Only a forward re-run inside
  backward does that: ``torch.utils.checkpoint`` (reentrant and non-reentrant) re-runs the
  forward under ``torch.enable_grad()`` to rebuild the graph it frees.

``model_flops = forward + backward``; ``hardware_flops = forward + backward + recompute``.
The same split is kept per aten op, and per module: each op is billed once, to the module
whose forward created it (:mod:`nbtoolkit.metrics.module_flops`, not torch's
``ModuleTracker``, which bills a module that returns its input, an ``nn.Identity``, for the
rest of the backward); a module's inclusive count adds its callees'.
Limitation: a step that calls ``backward(create_graph=True)`` (double backward, gradient
penalties) runs gradient formulas with grad mode on; they are counted as recomputation.

CPU attention: torch's counter has no formula for the CPU flash-attention kernels
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), so
``F.scaled_dot_product_attention`` on CPU would count 0. We register torch's own SDPA
formulas (``sdpa_flop_count`` / ``sdpa_backward_flop_count``, the ones it applies to the CUDA
kernels) for them, so CPU and GPU runs of one model count the same FLOPs.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import MetricsError
from nbtoolkit.core.step_runner import call_step
from nbtoolkit.metrics.step_metrics import MODULE_COLUMNS, OP_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PHASES", "FlopCounts", "count_step_flops"]

PHASES = ("forward", "backward", "recompute")


@dataclass
class FlopCounts:
    """FLOPs of one counted step, split by phase, module and op, and by (device, dtype)."""

    # phase -> module name -> op name -> FLOPs, inclusive (the module and what it called);
    # "Global" is the whole step.
    by_phase: dict[str, dict[str, dict[str, int]]] = field(
        default_factory=lambda: {p: defaultdict(lambda: defaultdict(int)) for p in PHASES}
    )
    # phase -> module name -> FLOPs of the module's own ops (exclusive: its callees' not included)
    self_by_phase: dict[str, dict[str, int]] = field(
        default_factory=lambda: {p: defaultdict(int) for p in PHASES}
    )
    # module name -> the module that first called it ("" for a root)
    parents: dict[str, str] = field(default_factory=dict)
    # (device string, dtype name) -> FLOPs
    by_device_dtype: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    def total(self, phase: str) -> int:
        return int(sum(self.by_phase[phase].get("Global", {}).values()))

    @property
    def model_flops(self) -> int:
        return self.total("forward") + self.total("backward")

    @property
    def hardware_flops(self) -> int:
        return self.model_flops + self.total("recompute")

    def dominant(self) -> tuple[str, str] | None:
        """The (device, dtype) that carried the most FLOPs, or None when nothing was counted."""
        if not self.by_device_dtype:
            return None
        return max(self.by_device_dtype.items(), key=lambda kv: kv[1])[0]

    @staticmethod
    def _flop_columns(flops: dict[str, int], prefix: str = "") -> dict[str, int]:
        return {
            f"{prefix}forward_flops": flops["forward"],
            f"{prefix}backward_flops": flops["backward"],
            f"{prefix}recompute_flops": flops["recompute"],
            f"{prefix}model_flops": flops["forward"] + flops["backward"],
            f"{prefix}hardware_flops": flops["forward"] + flops["backward"] + flops["recompute"],
        }

    def module_frame(self) -> pd.DataFrame:
        """One row per module that ran: inclusive FLOP columns (``model_flops``: the module and
        every module it called) and exclusive ones (``self_model_flops``: its own ops only)."""
        import pandas as pd

        # every module that ran, also those that ran no counted op (an Identity: 0 FLOPs)
        names = sorted({m for p in PHASES for m in self.by_phase[p] if m != "Global"} | set(self.parents))
        records = []
        for name in names:
            inclusive = {p: int(sum(self.by_phase[p].get(name, {}).values())) for p in PHASES}
            own = {p: int(self.self_by_phase[p].get(name, 0)) for p in PHASES}
            columns = self._flop_columns(inclusive)
            own_columns = self._flop_columns(own, "self_")
            records.append({
                "module": name,
                "parent": self.parents.get(name, ""),
                "depth": name.count("."),
                **columns,
                "self_model_flops": own_columns["self_model_flops"],
                "self_hardware_flops": own_columns["self_hardware_flops"],
            })
        return pd.DataFrame.from_records(records, columns=MODULE_COLUMNS)

    def op_frame(self) -> pd.DataFrame:
        import pandas as pd

        ops = sorted({op for p in PHASES for op in self.by_phase[p].get("Global", {})})
        step = {p: self.by_phase[p].get("Global", {}) for p in PHASES}
        records = [
            {"op": op, **self._flop_columns({p: int(step[p].get(op, 0)) for p in PHASES})} for op in ops
        ]
        frame = pd.DataFrame.from_records(records, columns=OP_COLUMNS)
        return frame.sort_values(["hardware_flops", "op"], ascending=[False, True]).reset_index(drop=True)


def _cpu_attention_formulas() -> dict[Any, Any]:
    """torch's SDPA FLOP formulas applied to the CPU flash-attention kernels it has no entry for."""
    import torch
    from torch.utils import flop_counter

    def forward_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                      **kwargs: Any) -> int:
        return int(flop_counter.sdpa_flop_count(query, key, value))

    def backward_flops(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                       **kwargs: Any) -> int:
        return int(flop_counter.sdpa_backward_flop_count(grad_out, query, key, value))

    formulas: dict[Any, Any] = {}
    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", forward_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", backward_flops),
    ):
        try:
            packet = getattr(torch.ops.aten, name)
        except (AttributeError, RuntimeError):  # an older/newer torch without this kernel
            continue
        if packet not in flop_counter.flop_registry:  # torch's own formula wins once it has one
            formulas[packet] = formula
    return formulas


def _first_tensor(args: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_flatten

    for leaf in tree_flatten(args)[0]:
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def _make_counter() -> Any:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from nbtoolkit.metrics.module_flops import ModuleAttribution

    if not hasattr(FlopCounterMode, "_count_flops"):
        raise MetricsError(
            f"torch {torch.__version__}'s FlopCounterMode has no _count_flops hook, which nbtoolkit uses to "
            "split FLOPs by phase: use torch 2.4 or newer"
        )
    if not (hasattr(torch._C, "_current_autograd_node") and hasattr(torch._C._autograd, "_get_sequence_nr")):
        raise MetricsError(
            f"torch {torch.__version__} does not tell which autograd node is running, which nbtoolkit uses "
            "to bill backward FLOPs to modules: use torch 2.4 or newer"
        )

    class PhaseFlopCounter(FlopCounterMode):
        """FlopCounterMode that also files each op's FLOPs under forward/backward/recompute."""

        def __init__(self) -> None:
            super().__init__(display=False, custom_mapping=_cpu_attention_formulas())
            self.counts = FlopCounts()
            # FlopCounterMode enters and leaves its `mod_tracker` with itself: ours replaces
            # torch's ModuleTracker, whose backward attribution double-counts (module_flops.py)
            self.modules = ModuleAttribution()
            self.mod_tracker = self.modules  # type: ignore[assignment]

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            if func_packet in self.flop_registry:
                flops = int(self.flop_registry[func_packet](*args, **kwargs, out_val=out))
                if torch._C._current_graph_task_id() == -1:
                    phase = "forward"
                elif torch.is_grad_enabled():
                    phase = "recompute"
                else:
                    phase = "backward"
                op = str(func_packet)
                by_module = self.counts.by_phase[phase]
                by_module["Global"][op] += flops
                owner = self.modules.owner(backward=phase == "backward")
                if owner is not None:
                    self.counts.self_by_phase[phase][owner] += flops
                    for name in self.modules.chain(owner):
                        by_module[name][op] += flops
                tensor = _first_tensor(args)
                if tensor is not None:
                    key = (str(tensor.device), str(tensor.dtype).removeprefix("torch."))
                    self.counts.by_device_dtype[key] += flops
            return out

    return PhaseFlopCounter()


def _dynamo_eager() -> Any:
    """A context in which torch.compile'd code runs eagerly and compiles nothing.

    Why: a compiled function first called under a dispatch mode (the FLOP counter) fails to
    compile there, and dynamo then marks its code to run eagerly for good: the user's compiled
    model, counted once, ran uncompiled until ``torch._dynamo.reset()`` (and ``optimize``
    measured the compiled side's memory in eager mode). Under the ``force_eager`` stance
    dynamo neither compiles nor marks anything, and the compiled code is used again after.
    The FLOPs counted are the eager ones either way (torch's counter cannot see inside a
    compiled graph). torch before 2.6 has no stances: nothing to do there."""
    import contextlib

    import torch

    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def count_step_flops(step: Callable[[], Any]) -> FlopCounts:
    """Run ``step`` once under torch's FlopCounterMode and return its FLOPs by phase, module and op.

    The counter and its module hooks are removed when the step returns or raises.
    """
    counter = _make_counter()
    with warnings.catch_warnings():
        # The counter's module tracker installs global module hooks; torch.compile warns that they
        # fire once more for the OptimizedModule wrapper. Ours, harmless for counting: not the user's.
        warnings.filterwarnings(
            "ignore", message=r"Using `torch.compile\(module\)` when there are global hooks"
        )
        with _dynamo_eager(), counter:
            call_step(step, "FLOP counting")
    counts: FlopCounts = counter.counts
    counts.parents = {name: parent or "" for name, parent in counter.modules.parent.items()}
    return counts
