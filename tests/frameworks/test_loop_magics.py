"""``--loop`` of ``%%nbt profile``, ``%%nbt memory``, ``%%nbt graphs`` and ``%%nbt metrics`` in a real
IPython shell, with a real transformers Trainer, Lightning Trainer and plain loop in the cell (issue 35);
and the detection of a loop cell from its code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.core.loop_cell import loop_reason

from ._loop_models import PlainLoop, hf_trainer, lightning_parts

MAX_STEPS = 10
DETECTED = (
    "measured as a training loop (the cell calls trainer.train()); --no-loop measures the cell as one step"
)


def test_profile_cell_that_calls_trainer_train_profiles_its_steps_and_stops_it(
    shell: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = hf_trainer(tmp_path, MAX_STEPS)
    shell.user_ns["trainer"] = trainer
    trace = shell.run_cell_magic("nbt", "profile --steps 2", "trainer.train()\n")
    assert DETECTED in capsys.readouterr().out
    assert isinstance(trace, nbt.Trace) and len(trace.steps) == 2
    assert trainer.state.global_step == 1 + 2
    assert "of the training loop measured (1 warm-up step skipped)" in repr(trace)
    assert shell.user_ns["_nbt"] is trace
    shell.run_cell("trainer.train()")  # the kernel and the trainer go on
    assert trainer.state.global_step == MAX_STEPS


def test_memory_cell_with_a_plain_loop_is_detected_and_recorded(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = PlainLoop(MAX_STEPS)
    shell.user_ns.update(model=loop.model, optimizer=loop.optimizer, TokenLoader=loop.loader)
    cell = (
        "for batch in TokenLoader():\n"
        "    model(**batch).loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
    )
    timeline = shell.run_cell_magic("nbt", "memory --steps 2 --no-figure --static", cell)
    assert "the cell runs optimizer.step() inside a for loop" in capsys.readouterr().out
    assert isinstance(timeline, nbt.MemoryTimeline) and timeline.loop.measured_steps == 2
    assert timeline.loop.framework == "plain loop"
    assert int(next(iter(loop.optimizer.state.values()))["step"]) == 1 + 2


def test_metrics_cell_with_lightning_fit_and_after_continue_runs_to_the_end(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer, module, data = lightning_parts(MAX_STEPS)
    shell.user_ns.update(trainer=trainer, module=module, data=data)
    metrics = shell.run_cell_magic(
        "nbt", "metrics --steps 2 --after continue --peak-flops 1e12", "trainer.fit(module, data)\n"
    )
    assert "the cell calls trainer.fit()" in capsys.readouterr().out
    assert len(metrics.step_times_s) == 2 and metrics.model_flops > 0
    assert trainer.global_step == MAX_STEPS  # it ran on to its end, unmeasured
    assert "the loop then ran to its end unmeasured" in repr(metrics)


def test_graphs_cell_with_an_explicit_loop_flag(shell: InteractiveShell, tmp_path: Path) -> None:
    torch._dynamo.reset()  # an earlier test compiled the same model code: its graphs would be cached
    trainer = hf_trainer(tmp_path, MAX_STEPS)
    trainer.model.forward = torch.compile(trainer.model.forward, backend="eager")
    shell.user_ns["run_training"] = trainer.train  # no .train( in the cell: --loop says it
    report = shell.run_cell_magic("nbt", "graphs --loop --steps 1 --no-cost", "run_training()\n")
    assert report.error is None and report.steps == 1 and len(report.graphs) >= 1
    assert trainer.state.global_step == 1 + 1  # the compiling first step, then one timed
    assert any("no eager baseline" in note for note in report.notes)


def test_no_loop_measures_a_trainer_cell_as_one_step(shell: InteractiveShell, tmp_path: Path) -> None:
    trainer = hf_trainer(tmp_path, 2)
    shell.user_ns["trainer"] = trainer
    trace = shell.run_cell_magic("nbt", "profile --no-loop --steps 1 --warmup 0", "trainer.train()\n")
    assert len(trace.steps) == 1 and trace.loop is None
    assert trainer.state.global_step == 2  # the whole training was the one step


def test_a_bad_after_is_a_usage_error_that_runs_nothing(shell: InteractiveShell) -> None:
    shell.user_ns["ran"] = []
    with pytest.raises(UsageError, match="invalid choice: 'later'"):
        shell.run_cell_magic("nbt", "profile --after later", "ran.append(1)\n")
    assert shell.user_ns["ran"] == []


@pytest.mark.parametrize("sub", ["profile", "memory", "graphs", "metrics"])
def test_each_measuring_magic_documents_loop_and_after(shell: InteractiveShell, sub: str) -> None:
    text = str(shell.run_line_magic("nbt", f"help {sub}"))
    assert "--loop" in text and "--no-loop" in text and "--after {stop,continue}" in text


# ------------------------------------------------------------------ detection from the cell's code


class FakeTrainer:
    def train(self) -> None: ...


@pytest.mark.parametrize(
    ("cell", "reason"),
    [
        ("trainer.train()", "the cell calls trainer.train()"),
        ("out = trainer.train(resume_from_checkpoint=None)", "the cell calls trainer.train()"),
        ("Trainer(model=m, args=a).train()", "the cell calls Trainer(model=m, args=a).train()"),
        ("pl_trainer.fit(module, datamodule=dm)", "the cell calls pl_trainer.fit()"),
        ("t.train()", "the cell calls t.train()"),  # a notebook object that is no nn.Module
        ("while True:\n    opt.step()", "the cell runs opt.step() inside a while loop"),
        ("for b in data:\n    scaler.step(optimizer)\n    scaler.update()",
         "the cell runs scaler.step() inside a for loop"),
        ("for b in data:\n    sgd.step()", "the cell runs sgd.step() inside a for loop"),  # an Optimizer
        ("model.train()\nloss = model(x).sum()\nloss.backward()\noptimizer.step()", None),  # one step
        ("net.train()", None),  # an nn.Module in the notebook switched to training mode
        ("for epoch in range(3):\n    scheduler.step()", None),
        ("optimizer.step()", None),  # not inside a loop
        ("def broken(:", None),  # a syntax error: the cell run reports it
    ],
)
def test_loop_reason_reads_the_cell(cell: str, reason: str | None) -> None:
    net = torch.nn.Linear(2, 2)
    user_ns = {"t": FakeTrainer(), "net": net, "model": net, "sgd": torch.optim.SGD(net.parameters(), lr=0.1)}
    assert loop_reason(cell, user_ns) == reason
