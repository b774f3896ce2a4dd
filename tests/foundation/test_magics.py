"""%load_ext nbtoolkit in a real IPython shell: help, usage errors, storing results."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from nbtoolkit.core.magic_registry import Argument, MagicCall, Subcommand, register


def _echo(args: Any, call: MagicCall) -> dict[str, Any]:
    return {"words": args.words, "cell": call.cell}


# A subcommand registered from outside the dispatcher: proves that features plug in
# without touching dispatch logic.
register(Subcommand(name="zz-echo", summary="test-only echo", mode="both",
                    arguments=(Argument("words", nargs="*"),), handler=_echo))


def test_load_ext_registers_line_and_cell_magic(shell: InteractiveShell) -> None:
    magics = shell.magics_manager.magics
    assert "nbt" in magics["line"]
    assert "nbt" in magics["cell"]


def test_help_lists_every_subcommand_with_one_line(shell: InteractiveShell) -> None:
    from nbtoolkit.core.magic_registry import all_subcommands

    text = str(shell.run_line_magic("nbt", "help"))
    assert "help [SUB]" in text
    for sub in all_subcommands():
        assert sub.name in text and sub.summary in text
    assert "zz-echo" in text


def test_help_of_one_subcommand_shows_its_usage(shell: InteractiveShell) -> None:
    text = str(shell.run_line_magic("nbt", "help zz-echo"))
    assert text.startswith("usage:") and "--name" in text


def test_unknown_subcommand_is_a_usage_error(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="unknown subcommand 'frobnicate'"):
        shell.run_line_magic("nbt", "frobnicate")


def test_bad_flag_is_a_usage_error_with_the_usage_line(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match=r"unrecognized arguments: --nope(.|\n)*usage: %nbt zz-echo"):
        shell.run_line_magic("nbt", "zz-echo a --nope")


def test_usage_error_in_a_cell_shows_no_traceback(shell: InteractiveShell, capsys: Any) -> None:
    result = shell.run_cell("%nbt frobnicate")
    assert isinstance(result.error_in_exec, UsageError)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert "unknown subcommand" in captured.out + captured.err


def test_line_and_cell_results_are_stored_under_name(shell: InteractiveShell) -> None:
    shell.run_line_magic("nbt", "zz-echo a b")
    assert shell.user_ns["_nbt"] == {"words": ["a", "b"], "cell": None}
    shell.run_cell_magic("nbt", "zz-echo --name mine", "x = 1\n")
    assert shell.user_ns["mine"] == {"words": [], "cell": "x = 1\n"}


def test_cell_function_runs_the_cell_and_returns_the_last_value(shell: InteractiveShell) -> None:
    call = MagicCall(shell=shell, line="", cell="a = 20\nb = a + 1\nb * 2\n")
    assert call.cell_function()() == 42
    assert shell.user_ns["b"] == 21


def test_wrong_mode_is_a_usage_error(shell: InteractiveShell) -> None:
    register(Subcommand(name="zz-line", summary="test-only", mode="line", handler=lambda a, c: None))
    with pytest.raises(UsageError, match="is a line magic"):
        shell.run_cell_magic("nbt", "zz-line", "pass\n")


def test_nbt_errors_show_as_one_line(shell: InteractiveShell, capsys: Any) -> None:
    from nbtoolkit.core.errors import TraceError

    def _fail(args: Any, call: MagicCall) -> None:
        raise TraceError("cannot read /nowhere.json: no such file; pass a trace file or folder")

    register(Subcommand(name="zz-fail", summary="test-only", handler=_fail))
    result = shell.run_cell("%nbt zz-fail")
    assert isinstance(result.error_in_exec, TraceError)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "TraceError: cannot read /nowhere.json" in text
    assert "Traceback" not in text


def test_profile_cell_end_to_end_stores_a_trace(shell: InteractiveShell) -> None:
    """%%nbt profile on a tiny training step: the real profiler, a real Trace in the namespace."""
    import nbtoolkit as nbt

    shell.run_cell(
        "import torch\n"
        "from torch import nn\n"
        "tiny = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))\n"
        "opt = torch.optim.SGD(tiny.parameters(), lr=0.1)\n"
        "x, y = torch.randn(8, 16), torch.randn(8, 1)\n"
        "def train_step():\n"
        "    opt.zero_grad()\n"
        "    loss = nn.functional.mse_loss(tiny(x), y)\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    return loss.item()\n",
        store_history=False,
    ).raise_error()
    result = shell.run_cell("%%nbt profile --steps 2 --name prof\ntrain_step()\n", store_history=False)
    result.raise_error()
    trace = shell.user_ns["prof"]
    assert isinstance(trace, nbt.Trace)
    assert result.result is trace  # the magic's value is displayed as the cell's output
    assert len(trace.steps) == 2
    names = set(trace.top_operators(100)["name"])
    assert any(name in names for name in ("aten::addmm", "aten::mm", "aten::linear"))
    bundle = trace._repr_mimebundle_()
    assert bundle["text/plain"]
    assert "text/html" in bundle
