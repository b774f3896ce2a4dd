"""%nbt metrics shows what step_metrics gives for the same step."""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt


def test_metrics_magic_counts_what_step_metrics_counts(shell: InteractiveShell) -> None:
    shell.run_cell(
        "import torch\n"
        "layer = torch.nn.Linear(32, 16, bias=False)\n"
        "def linear_step():\n"
        "    layer(torch.randn(8, 32)).sum().backward()\n"
    ).raise_error()
    from_magic = shell.run_line_magic("nbt", "metrics linear_step --steps 1 --warmup 0 --peak-flops 1e12")
    from_api = nbt.step_metrics(shell.user_ns["linear_step"], steps=1, warmup=0, peak_flops=1e12)
    assert type(from_magic) is type(from_api)
    # Step times differ between runs; the FLOPs of the step do not.
    assert from_magic.model_flops == from_api.model_flops == 2 * 2 * 8 * 32 * 16
    assert from_magic.hardware_flops == from_api.hardware_flops
    assert repr(from_magic).splitlines()[0].split(":")[0] == repr(from_api).splitlines()[0].split(":")[0]
