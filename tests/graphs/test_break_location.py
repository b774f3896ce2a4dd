"""Where a break is shown: the innermost frame outside torch, and the user's own call site below a library."""
# ruff: noqa: E501  (torch's graph-break messages are kept verbatim, long lines included)

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.compile.break_text import parse_graph_break_text
from nbtoolkit.compile.frame_owner import FrameOwner, owner_of, torch_place

SITE = "/venv/lib/python3.11/site-packages"


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(
    ("path", "owner"),
    [
        (f"{SITE}/torch/optim/optimizer.py", FrameOwner.TORCH),
        (f"{SITE}/torch/autograd/__init__.py", FrameOwner.TORCH),
        (f"{SITE}/torch/amp/autocast_mode.py", FrameOwner.TORCH),
        (f"{SITE}/torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py", FrameOwner.TORCH),
        (f"{SITE}/torch/_tensor.py", FrameOwner.TORCH),
        ("/home/me/pytorch/torch/optim/adamw.py", FrameOwner.TORCH),  # a source checkout
        ("/usr/lib/python3/dist-packages/torch/nn/modules/module.py", FrameOwner.TORCH),
        (f"{SITE}/nbtoolkit/compile/capture.py", FrameOwner.NBTOOLKIT),
        (f"{SITE}/transformers/models/llama/modeling_llama.py", FrameOwner.LIBRARY),
        ("/usr/lib/python3.11/contextlib.py", FrameOwner.LIBRARY),
        ("/home/me/train.py", FrameOwner.USER),
        ("/home/me/torch_experiments/train.py", FrameOwner.USER),
        ("/tmp/ipykernel_12/3456.py", FrameOwner.USER),
        ("<ipython-input-3-abc>", FrameOwner.USER),
    ],
)
def test_whose_code_a_file_is(path: str, owner: str) -> None:
    assert owner_of(path) == owner


def test_this_nbtoolkit_and_this_torch_are_recognised_where_they_are_installed() -> None:
    assert owner_of(nbt.__file__) == FrameOwner.NBTOOLKIT
    assert owner_of(inspect.getfile(torch.optim.Optimizer)) == FrameOwner.TORCH
    assert owner_of(__file__) == FrameOwner.USER
    assert torch_place(f"{SITE}/torch/optim/optimizer.py", 79) == "torch/optim/optimizer.py:79"
    assert torch_place("/home/me/train.py", 3) is None


OPTIMIZER_BREAK = f"""\
Graph break in user code at {SITE}/torch/optim/optimizer.py:79
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

Call to `torch._dynamo.graph_break()`
  Explanation: User-inserted graph break. Message: None
  Hint: Remove the `torch._dynamo.graph_break()` call.

  Developer debug context: Called `torch._dynamo.graph_break()` with args `[]`, kwargs `{{}}`

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0025.html

User code traceback:
  File "/home/me/run.py", line 40, in <module>
    train()
  File "/home/me/train.py", line 12, in step
    opt.step()
  File "{SITE}/torch/optim/optimizer.py", line 530, in wrapper
    out = func(*args, **kwargs)
  File "{SITE}/torch/optim/optimizer.py", line 79, in _use_grad
    torch._dynamo.graph_break()

Traceback (most recent call last):
  File "{SITE}/torch/_dynamo/symbolic_convert.py", line 1076, in wrapper
    return inner_fn(self, inst)
"""

TRANSFORMERS_BREAK = f"""\
Graph break in user code at {SITE}/transformers/cache_utils.py:114
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

HOP: Unsafe side effect
  Higher Order Operator: torch.utils.checkpoint.checkpoint
  Explanation: Mutating a variable from outside the scope of this HOP is not supported.
  Hint: If the HOP is activation checkpointing (torch.utils.checkpoint.checkpoint), this points to a side effect in forward method.

  Developer debug context: Attempted to mutate UserDefinedObjectVariable(DynamicLayer)

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0067.html

User code traceback:
  File "/home/me/train.py", line 20, in step
    out = model(input_ids=ids, labels=ids)
  File "{SITE}/torch/nn/modules/module.py", line 1787, in _call_impl
    return forward_call(*args, **kwargs)
  File "{SITE}/transformers/models/llama/modeling_llama.py", line 400, in forward
    hidden_states = decoder_layer(
  File "{SITE}/torch/utils/checkpoint.py", line 496, in checkpoint
    ret = function(*args, **kwargs)
  File "{SITE}/transformers/cache_utils.py", line 114, in lazy_initialization
    self.device = key_states.device

Traceback (most recent call last):
  File "{SITE}/torch/_dynamo/side_effects.py", line 960, in mutation
"""


def test_a_break_inside_torch_s_optimizer_names_the_user_s_opt_step_line() -> None:
    p = parse_graph_break_text(OPTIMIZER_BREAK)
    assert (p.user_file, p.user_line, p.user_function) == ("/home/me/train.py", 12, "step")
    assert p.traceback_source == "opt.step()"
    assert p.inside_torch == "torch/optim/optimizer.py:79"
    assert p.call_file is None  # the break site is the user's own line


def test_a_break_inside_a_library_names_the_library_line_and_the_user_s_call() -> None:
    p = parse_graph_break_text(TRANSFORMERS_BREAK)
    assert p.gb_type == "HOP: Unsafe side effect"  # not the indented detail line under it
    assert p.explanation.startswith("Higher Order Operator: torch.utils.checkpoint.checkpoint\n")
    assert (p.user_file, p.user_line) == (f"{SITE}/transformers/cache_utils.py", 114)
    assert p.traceback_source == "self.device = key_states.device"
    assert (p.call_file, p.call_line, p.call_function) == ("/home/me/train.py", 20, "step")
    assert p.call_source == "out = model(input_ids=ids, labels=ids)"
    assert p.inside_torch is None


def test_a_break_in_nbtoolkit_s_own_code_also_names_the_user_s_call() -> None:
    text = TRANSFORMERS_BREAK.replace(
        f"{SITE}/transformers/cache_utils.py", f"{SITE}/nbtoolkit/trace/hooks.py"
    )
    p = parse_graph_break_text(text)
    assert p.user_file == f"{SITE}/nbtoolkit/trace/hooks.py"
    assert (p.call_file, p.call_line) == ("/home/me/train.py", 20)


MODEL = torch.nn.Linear(8, 8)
OPT = torch.optim.SGD(MODEL.parameters(), lr=0.01)


def train_step(x: torch.Tensor) -> torch.Tensor:
    loss = MODEL(x).pow(2).mean()
    loss.backward()
    OPT.step()  # OPTIMIZER LINE
    return loss.detach()


def test_live_capture_names_the_user_s_opt_step_line_for_torch_s_optimizer_breaks() -> None:
    report = nbt.capture_graphs(torch.compile(train_step, backend="eager"), torch.randn(4, 8), steps=0)
    lines, first = inspect.getsourcelines(train_step)
    opt_line = first + next(i for i, line in enumerate(lines) if "# OPTIMIZER LINE" in line)
    summary = report.break_summary()
    optimizer = summary[summary["category"] == "optimizer"]
    assert len(optimizer) == 1 and optimizer["count"].iloc[0] >= 1, summary[
        ["gb_type", "user_file", "user_line"]
    ]
    row = optimizer.iloc[0]
    assert (row["user_file"], row["user_line"]) == (__file__, opt_line)
    assert row["source_line"].startswith("OPT.step()")
    assert row["inside_torch"].startswith("torch/optim/optimizer.py:")
    assert pd_isna(row["call_file"])
    # no break of this step is put on a torch file
    assert not any(owner_of(f) == FrameOwner.TORCH for f in report.breaks["user_file"])
    assert f"{__file__}:{opt_line}" in repr(report)


def pd_isna(value: object) -> bool:
    import pandas as pd

    return bool(pd.isna(value))
