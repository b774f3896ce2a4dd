"""Every fix hint removes its break: the break compiled, then the code changed as the hint says.

Real torch.compile (backend "eager": what Dynamo breaks on does not depend on the backend).
Each case: the break is classified into the hint's category, the hint names the change, and
after the change no break of that category is left. The Hugging Face cases use a small
random-weight Llama and skip when transformers cannot be imported.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.compile.fix_hints import FIX_HINTS

from ._hf import small_llama

log = logging.getLogger("nbt_test_fix_hints")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def summary_of(fn: Callable[..., Any], *args: Any, settings: dict[str, Any] | None = None) -> pd.DataFrame:
    """The break summary of one compiling call of ``fn`` (under the Dynamo ``settings`` given)."""
    torch._dynamo.reset()
    patch: AbstractContextManager[Any] = torch._dynamo.config.patch(**settings) if settings else nullcontext()
    with patch:
        report = nbt.capture_graphs(torch.compile(fn, backend="eager"), *args, steps=0)
    assert report.error is None, report.error
    return report.break_summary()


def assert_hint_fixes(
    category: str,
    broken: pd.DataFrame,
    fixed: pd.DataFrame,
    *,
    names: str,
) -> None:
    """``broken`` has a break of ``category`` whose hint says ``names``; ``fixed`` has none of it."""
    rows = broken[broken["category"] == category]
    assert len(rows) >= 1, broken[["gb_type", "category", "user_line"]].to_string()
    assert names in rows["fix"].iloc[0], rows["fix"].iloc[0]
    assert not (fixed["category"] == category).any(), fixed[["gb_type", "category"]].to_string()
    assert len(fixed) < len(broken)


X = torch.randn(8)
MODEL = torch.nn.Linear(8, 8)


# -------------------------------------------------------------------------------- optimizer
def test_optimizer_breaks_go_when_opt_step_is_called_outside_the_compiled_function() -> None:
    opt = torch.optim.AdamW(MODEL.parameters(), lr=1e-3)

    def step_with_optimizer(x: torch.Tensor) -> torch.Tensor:
        loss = MODEL(x).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    def step_without_optimizer(x: torch.Tensor) -> torch.Tensor:
        loss = MODEL(x).sum()
        loss.backward()
        return loss.detach()

    broken = summary_of(step_with_optimizer, torch.randn(2, 8))
    fixed = summary_of(step_without_optimizer, torch.randn(2, 8))
    opt.step()  # where the hint puts it: after the compiled function, eagerly
    assert_hint_fixes("optimizer", broken, fixed, names="Call opt.step() outside the compiled function")


def test_torch_compile_of_opt_step_alone_still_breaks_as_the_hint_says() -> None:
    opt = torch.optim.SGD(MODEL.parameters(), lr=1e-3)
    MODEL(torch.randn(2, 8)).sum().backward()
    summary = summary_of(opt.step)
    assert list(summary["category"]) == ["optimizer"] and summary["count"].sum() == 1


def test_zero_grad_break_goes_when_called_outside() -> None:
    opt = torch.optim.SGD(MODEL.parameters(), lr=1e-3)

    def step(x: torch.Tensor) -> torch.Tensor:
        y = MODEL(x).relu()
        opt.zero_grad()
        return y * 2

    def step_fixed(x: torch.Tensor) -> torch.Tensor:
        return MODEL(x).relu() * 2

    assert_hint_fixes(
        "zero_grad",
        summary_of(step, torch.randn(2, 8)),
        summary_of(step_fixed, torch.randn(2, 8)),
        names="Call opt.zero_grad() outside",
    )


# -------------------------------------------------------------------------------- backward
def loss_of(x: torch.Tensor) -> torch.Tensor:
    return MODEL(x).pow(2).mean()


def step_returning_detached_loss(x: torch.Tensor) -> torch.Tensor:
    loss = loss_of(x)
    loss.backward()
    return loss.detach()


def step_returning_loss(x: torch.Tensor) -> torch.Tensor:
    loss = loss_of(x)
    loss.backward()
    return loss


def test_backward_break_goes_with_trace_autograd_ops_and_a_detached_loss() -> None:
    x = torch.randn(2, 8)
    broken = summary_of(step_returning_detached_loss, x)
    fixed = summary_of(step_returning_detached_loss, x, settings={"trace_autograd_ops": True})
    assert_hint_fixes("backward", broken, fixed, names="torch._dynamo.config.trace_autograd_ops = True")
    assert fixed.empty
    assert "return loss.detach()" in broken["fix"].iloc[0]
    # why the hint says so: returning the loss itself breaks again
    again = summary_of(step_returning_loss, x, settings={"trace_autograd_ops": True})
    assert list(again["gb_type"]) == ["autograd.grad consumed returned tensor's grad_fn"]


# -------------------------------------------------------------------------------- scalars
def item_in_an_if(x: torch.Tensor) -> torch.Tensor:
    loss = (x * 2).mean()
    if loss.item() > 1e9:
        print("exploded")
    return loss + 1


def item_checked_after(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).mean() + 1  # the caller tests the returned value, outside the compiled step


def item_in_math(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().max().item()
    return x / (scale + 1)


def test_item_in_an_if_goes_when_the_check_leaves_the_compiled_step() -> None:
    broken = summary_of(item_in_an_if, X)
    assert_hint_fixes("scalar_branch", broken, summary_of(item_checked_after, X), names="Keep this check out")
    # why capture_scalar_outputs is not the hint here: the break moves to the branch
    moved = summary_of(item_in_an_if, X, settings={"capture_scalar_outputs": True})
    assert list(moved["gb_type"]) == ["Data-dependent branching"]


def test_item_in_math_goes_with_capture_scalar_outputs() -> None:
    assert_hint_fixes(
        "scalar",
        summary_of(item_in_math, X),
        summary_of(item_in_math, X, settings={"capture_scalar_outputs": True}),
        names="torch._dynamo.config.capture_scalar_outputs = True",
    )


# -------------------------------------------------------------------------------- logging, print
def logs(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    log.info("x")
    return x * 2


def warns(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    warnings.warn("careful", stacklevel=1)
    return x * 2


def prints(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    print("x")
    return x * 2


@pytest.mark.filterwarnings("ignore:careful")
@pytest.mark.parametrize(
    ("fn", "function", "names"), [(logs, log.info, "logger.info"), (warns, warnings.warn, "warnings.warn")]
)
def test_logging_breaks_go_with_ignore_logging_functions(
    fn: Callable[..., Any], function: Any, names: str
) -> None:
    broken = summary_of(fn, X)
    fixed = summary_of(fn, X, settings={"ignore_logging_functions": {function}})
    assert_hint_fixes("logging", broken, fixed, names=names)


def test_print_break_goes_with_reorderable_logging_functions() -> None:
    fixed = summary_of(prints, X, settings={"reorderable_logging_functions": {print}})
    assert_hint_fixes("print", summary_of(prints, X), fixed, names="reorderable_logging_functions.add(print)")


# -------------------------------------------------------------------------------- control flow, numpy, calls
def branches(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:
        return x + 1
    return x - 1


def branches_with_where(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.sum() > 0, x + 1, x - 1)


def branches_with_cond(x: torch.Tensor) -> torch.Tensor:
    return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))


@pytest.mark.parametrize("fixed_fn", [branches_with_where, branches_with_cond])
def test_data_dependent_branch_goes_with_where_or_cond(fixed_fn: Callable[..., Any]) -> None:
    assert_hint_fixes("control_flow", summary_of(branches, X), summary_of(fixed_fn, X), names="torch.where")


def numpy_call(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    _ = np.frombuffer(b"abcd", dtype=np.uint8)
    return x * 2


def torch_only(x: torch.Tensor) -> torch.Tensor:
    return (x + 1) * 2


def test_numpy_break_goes_without_the_numpy_call() -> None:
    assert_hint_fixes("numpy", summary_of(numpy_call, X), summary_of(torch_only, X), names="torch operation")


def heavy(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 3


heavy_disabled = torch.compiler.disable(heavy)


def calls_disabled(x: torch.Tensor) -> torch.Tensor:
    return heavy_disabled(x + 1) - 1


def calls_traceable(x: torch.Tensor) -> torch.Tensor:
    return heavy(x + 1) - 1


def test_disabled_function_break_goes_without_the_decorator() -> None:
    assert_hint_fixes(
        "disabled",
        summary_of(calls_disabled, X),
        summary_of(calls_traceable, X),
        names="remove the decorator",
    )


def reads_the_clock(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    _ = time.time()
    return x * 2


def python_math(t: torch.Tensor) -> torch.Tensor:
    return torch.tensor([v * 2.0 for v in t.tolist()])  # Python numbers: Dynamo cannot trace float .tolist()


@torch.library.custom_op("nbt_test::python_math", mutates_args=())
def python_math_op(t: torch.Tensor) -> torch.Tensor:
    return python_math(t)


@python_math_op.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)


def uses_python_math(x: torch.Tensor) -> torch.Tensor:
    return python_math(x + 1) * 2


def uses_python_math_op(x: torch.Tensor) -> torch.Tensor:
    return python_math_op(x + 1) * 2


def test_unsupported_call_breaks_go_outside_the_step_or_as_a_custom_op() -> None:
    assert_hint_fixes(
        "unsupported_call", summary_of(reads_the_clock, X), summary_of(torch_only, X), names="Call it outside"
    )
    broken = summary_of(uses_python_math, X)
    assert not broken.empty
    assert summary_of(uses_python_math_op, X).empty
    assert "torch.library.custom_op" in FIX_HINTS[[c for c, _, _ in FIX_HINTS].index("unsupported_call")][2]


# -------------------------------------------------------------------------------- checkpoint side effects
STORE: dict[str, torch.Tensor] = {}
LINEAR = torch.nn.Linear(8, 8)


def layer_writing_outside(x: torch.Tensor) -> torch.Tensor:
    y = LINEAR(x)
    STORE["last"] = y  # a side effect inside the checkpointed function
    return y.relu()


def layer_without_write(x: torch.Tensor) -> torch.Tensor:
    return LINEAR(x).relu()


def checkpointed(layer: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    from torch.utils.checkpoint import checkpoint

    def step(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(layer, x, use_reentrant=False).sum()

    return step


def test_checkpoint_side_effect_goes_when_the_write_moves_out_or_with_the_setting() -> None:
    x = torch.randn(2, 8)
    broken = summary_of(checkpointed(layer_writing_outside), x)
    assert list(broken["gb_type"]) == ["HOP: Unsafe side effect"]
    assert_hint_fixes(
        "checkpoint_side_effect",
        broken,
        summary_of(checkpointed(layer_without_write), x),
        names="out of the checkpointed function",
    )
    setting = {"skip_fwd_side_effects_in_bwd_under_checkpoint": True}
    assert_hint_fixes(
        "checkpoint_side_effect",
        broken,
        summary_of(checkpointed(layer_writing_outside), x, settings=setting),
        names="skip_fwd_side_effects_in_bwd_under_checkpoint = True",
    )


# -------------------------------------------------------------------------------- Hugging Face
def _llama_step(model: Any) -> Callable[[], torch.Tensor]:
    ids = torch.randint(0, 128, (2, 8))

    def step() -> torch.Tensor:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.detach()

    return step


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' renamed gradient_checkpointing_enable
def test_hf_gradient_checkpointing_warning_break_goes_with_use_cache_false() -> None:
    model = small_llama()
    model.gradient_checkpointing_enable()
    broken = summary_of(_llama_step(model))
    model.config.use_cache = False
    fixed = summary_of(_llama_step(model))
    assert_hint_fixes("hf_use_cache", broken, fixed, names="model.config.use_cache = False")
    assert list(fixed["category"]) == ["backward"]  # the model itself no longer breaks
    row = broken[broken["category"] == "hf_use_cache"].iloc[0]
    assert "/transformers/" in row["user_file"] and row["call_file"] == __file__


@pytest.mark.slow
def test_hf_checkpointed_decoder_layer_writing_the_cache_goes_with_use_cache_false() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    model = small_llama()
    layer_type = type(model.model.layers[0])
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, layer_type))
    broken = summary_of(_llama_step(model))
    assert "HOP: Unsafe side effect" in set(broken["gb_type"])
    model.config.use_cache = False
    fixed = summary_of(_llama_step(model))
    assert_hint_fixes("hf_use_cache", broken, fixed, names="model.config.use_cache = False")
    assert list(fixed["category"]) == ["backward"]
    row = broken[broken["gb_type"] == "HOP: Unsafe side effect"].iloc[0]
    assert row["user_file"].endswith("transformers/cache_utils.py") and row["call_file"] == __file__


@pytest.mark.slow
def test_hf_llama_backward_break_goes_with_trace_autograd_ops() -> None:
    model = small_llama()
    model.config.use_cache = False
    broken = summary_of(_llama_step(model))
    fixed = summary_of(_llama_step(model), settings={"trace_autograd_ops": True})
    assert_hint_fixes("backward", broken, fixed, names="trace_autograd_ops = True")
    assert fixed.empty
