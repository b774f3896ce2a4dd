"""Per-module FLOPs billed once: a module that returns its input (Identity, Dropout) carries no
work of its parent's or its input's, shares add up to at most 100%, and a parent's inclusive
count is its own plus its children's, on plain torch.nn models and on a timm ViT."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import nbtoolkit as nbt
from nbtoolkit.metrics.flop_count import count_step_flops

B, D, HIDDEN, CLASSES = 8, 32, 64, 10


class Residual(nn.Module):
    """x + fc2(drop(act(fc1(norm(x))))), then an Identity "layer scale" and a p=0 Dropout "drop
    path" on the branch: the shapes of a timm block's ls/drop_path, which return their input."""

    def __init__(self, recompute: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, HIDDEN)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(HIDDEN, D)
        self.ls = nn.Identity()
        self.drop_path = nn.Dropout(0.0)
        self.recompute = recompute

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(self.norm(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = checkpoint(self.branch, x, use_reentrant=False) if self.recompute else self.branch(x)
        return x + self.drop_path(self.ls(y))


class Net(nn.Module):
    def __init__(self, recompute: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(D, D)
        self.pre = nn.Identity()
        self.blocks = nn.Sequential(Residual(recompute), Residual(recompute))
        self.fc_norm = nn.Identity()
        self.head_drop = nn.Dropout(0.0)
        self.head = nn.Linear(D, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.pre(self.embed(x)))
        return self.head(self.head_drop(self.fc_norm(x)))


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    def step() -> None:
        F.cross_entropy(model(x), y).backward()

    return step


def _frame(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[pd.DataFrame, int]:
    counts = count_step_flops(_step(model, x, y))
    return counts.module_frame().set_index("module"), counts.model_flops


def _assert_billed_once(frame: pd.DataFrame, total: int) -> None:
    """The accounting every model must satisfy, whatever its layers."""
    # each op once: the modules' own FLOPs add up to at most the step's
    assert frame["self_model_flops"].sum() <= total
    # a parent's inclusive count is its own ops plus its children's inclusive counts
    for name, row in frame.iterrows():
        children = frame[frame["parent"] == name]
        assert row["model_flops"] == row["self_model_flops"] + children["model_flops"].sum(), name
        assert row["model_flops"] <= total, name
    # one level of the table (the model's direct parts) adds up to at most 100%
    roots = frame.index[frame["parent"] == ""]
    assert frame.loc[frame["parent"].isin(roots), "model_flops"].sum() <= total


def test_identity_and_dropout_carry_none_of_their_parents_work() -> None:
    torch.manual_seed(0)
    frame, total = _frame(Net(), torch.randn(B, D), torch.randint(0, CLASSES, (B,)))
    _assert_billed_once(frame, total)
    # every matmul runs inside a module: the own FLOPs account for the whole step, exactly
    assert frame["self_model_flops"].sum() == total
    for name in ("Net.pre", "Net.fc_norm", "Net.head_drop", "Net.blocks.0.ls", "Net.blocks.0.drop_path",
                 "Net.blocks.1.ls", "Net.blocks.1.drop_path", "Net.blocks.0.drop", "Net.blocks.0.act"):
        assert name in frame.index, name  # a module that ran is listed, with nothing billed to it
        assert frame.loc[name, "model_flops"] == 0, (name, frame.loc[name].to_dict())
    # the linear layers carry exactly their own products: forward 2·B·in·out; backward the
    # weight's gradient, plus the input's gradient where the input needs one (not for `embed`,
    # whose input is the data)
    expected = {
        "Net.embed": (2 + 2) * B * D * D,
        "Net.blocks.0.fc1": 6 * B * D * HIDDEN,
        "Net.blocks.0.fc2": 6 * B * HIDDEN * D,
        "Net.blocks.1.fc1": 6 * B * D * HIDDEN,
        "Net.head": 6 * B * D * CLASSES,
    }
    for name, flops in expected.items():
        assert frame.loc[name, "model_flops"] == frame.loc[name, "self_model_flops"] == flops, name
    assert frame.loc["Net.blocks.0", "model_flops"] == 12 * B * D * HIDDEN
    assert frame.loc["Net.blocks.0", "self_model_flops"] == 0  # the residual add is no counted op
    assert frame.loc["Net", "model_flops"] == total
    assert frame.loc["Net.blocks", "parent"] == "Net" and frame.loc["Net.blocks.0", "parent"] == "Net.blocks"


def test_recomputed_forward_is_billed_to_the_module_it_reruns() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(B, D), torch.randint(0, CLASSES, (B,))
    plain, total = _frame(Net(), x, y)
    ckpt, ckpt_total = _frame(Net(recompute=True), x, y)
    assert ckpt_total == total
    _assert_billed_once(ckpt, total)
    for name in ("Net.blocks.0.fc1", "Net.blocks.1.fc2"):
        assert ckpt.loc[name, "model_flops"] == plain.loc[name, "model_flops"], name
    # fc1 is re-run in backward; fc2 not (non-reentrant checkpointing stops re-running once the
    # tensors backward needs are back, and fc2's output is not one of them)
    for name in ("Net.blocks.0.fc1", "Net.blocks.1.fc1"):
        assert ckpt.loc[name, "recompute_flops"] == ckpt.loc[name, "forward_flops"] > 0, name
    own_recompute = ckpt["self_hardware_flops"].sum() - ckpt["self_model_flops"].sum()
    assert own_recompute == ckpt.loc["Net", "recompute_flops"] > 0  # all of it billed, once
    for name in ("Net.blocks.0.ls", "Net.blocks.0.drop_path", "Net.fc_norm", "Net.head_drop"):
        assert ckpt.loc[name, "hardware_flops"] == 0, name
    assert ckpt.loc["Net.head", "recompute_flops"] == 0


def test_the_displayed_module_shares_add_up_to_at_most_100_percent() -> None:
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(B, D), torch.randint(0, CLASSES, (B,))
    metrics = nbt.step_metrics(_step(model, x, y), steps=1, warmup=0, peak_flops=1e12)
    top = metrics.top_level_modules()
    assert set(top["module"]) == {"Net.embed", "Net.pre", "Net.blocks", "Net.fc_norm", "Net.head_drop",
                                  "Net.head"}
    assert top["model_pct"].sum() <= 100.0 + 1e-9
    assert float(top.loc[top["module"] == "Net.fc_norm", "model_pct"].iloc[0]) == 0.0
    text = repr(metrics)
    assert "incl." in text and "self" in text  # inclusive and exclusive figures, named apart
    html = metrics._repr_html_() or ""
    assert "incl. callees" in html and "self model FLOPs" in html


def _timm() -> Any:
    try:
        import timm
    except Exception as exc:  # a broken install (a torchvision built for CUDA) raises RuntimeError
        pytest.skip(f"timm is not importable here: {type(exc).__name__}: {str(exc)[:200]}")
    return timm


def test_timm_vit_fc_norm_and_head_drop_carry_nothing() -> None:
    timm = _timm()
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              num_classes=CLASSES)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, CLASSES, (2,))
    frame, total = _frame(model, x, y)
    _assert_billed_once(frame, total)
    assert frame["self_model_flops"].sum() == total
    for name in ("VisionTransformer.fc_norm", "VisionTransformer.head_drop", "VisionTransformer.blocks.0.ls1",
                 "VisionTransformer.blocks.0.drop_path1"):
        assert frame.loc[name, "model_flops"] == 0, (name, frame.loc[name].to_dict())
    top = frame[frame["parent"] == "VisionTransformer"]
    assert top["model_flops"].sum() == total
    blocks = frame[frame.index.str.fullmatch(r"VisionTransformer\.blocks\.\d+")]
    assert blocks["model_flops"].nunique() == 1  # identical blocks, identical counts


def test_hf_gpt2_dropouts_carry_nothing_and_blocks_share_the_step() -> None:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except Exception as exc:  # an import chain broken by another package raises anything
        pytest.skip(f"transformers is not importable here: {type(exc).__name__}: {str(exc)[:200]}")
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config)
    idx = torch.randint(0, 256, (2, 32))

    def step() -> None:
        model(input_ids=idx, labels=idx).loss.backward()

    counts = count_step_flops(step)
    frame, total = counts.module_frame().set_index("module"), counts.model_flops
    _assert_billed_once(frame, total)
    assert frame["self_model_flops"].sum() == total
    dropouts = [name for name in frame.index if name.rsplit(".", 1)[-1] in ("drop", "attn_dropout",
                                                                          "resid_dropout", "dropout")]
    assert len(dropouts) >= 5
    assert (frame.loc[dropouts, "model_flops"] == 0).all(), frame.loc[dropouts, "model_flops"]
    blocks = frame.loc[["GPT2LMHeadModel.transformer.h.0", "GPT2LMHeadModel.transformer.h.1"], "model_flops"]
    assert blocks.nunique() == 1
    head = 6 * 2 * 32 * 64 * 256  # lm_head: 64 -> 256 over 64 tokens, forward and backward
    assert frame.loc["GPT2LMHeadModel.lm_head", "model_flops"] == head
