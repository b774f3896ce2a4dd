"""%nbt metrics STEP in a real IPython shell."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt


@pytest.fixture(scope="module")
def shell(shell: InteractiveShell) -> InteractiveShell:
    """The shared shell (tests/conftest.py) with a step function defined in it."""
    shell.run_cell(
        "import torch\n"
        "lin = torch.nn.Linear(32, 32)\n"
        "opt = torch.optim.SGD(lin.parameters(), lr=0.1)\n"
        "x = torch.randn(16, 32)\n"
        "def step():\n"
        "    opt.zero_grad(); loss = lin(x).square().mean(); loss.backward(); opt.step(); return loss\n",
        store_history=False,
    ).raise_error()
    return shell


def test_metrics_magic_stores_the_result(shell: InteractiveShell) -> None:
    result = shell.run_line_magic("nbt", "metrics step --tokens 16 --steps 2 --warmup 0 --peak-flops 1e12 "
                                         "--model lin --name m")
    assert isinstance(result, nbt.StepMetrics)
    assert shell.user_ns["m"] is result
    # forward 2·16·32·32, backward only the weight gradient (x needs no gradient): the same again
    assert result.model_flops == 2 * (2 * 16 * 32 * 32)
    assert result.tokens_per_step == 16 and result.steps == 2
    assert result.peak_source == "given: peak_flops=1e+12 FLOP/s"
    assert result.parameters == 32 * 32 + 32


def test_metrics_magic_unknown_variable(shell: InteractiveShell) -> None:
    with pytest.raises(nbt.NbtUsageError, match="no step function named 'nope'"):
        shell.run_line_magic("nbt", "metrics nope")


def test_metrics_magic_bad_number(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="invalid int value"):
        shell.run_line_magic("nbt", "metrics step --tokens many")


def test_metrics_magic_error_is_one_line(shell: InteractiveShell) -> None:
    shell.run_cell("def idle():\n    return torch.ones(3).sum()\n", store_history=False).raise_error()
    with pytest.raises(nbt.MetricsError) as info:
        shell.run_line_magic("nbt", "metrics idle")
    assert info.value._render_traceback_() == [f"MetricsError: {info.value}"]


def test_the_magic_module_and_the_model_import_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, nbtoolkit.metrics.magic, nbtoolkit.metrics.step_metrics\n"
        "import nbtoolkit.metrics.device_peaks\n"
        "heavy = [m for m in ('torch', 'pandas', 'plotly') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
