"""%%nbt graphs shows what capture_graphs gives; %nbt compile-log what load_compile_log gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt

SETUP = """
import torch

@torch.compile(backend="eager")
def broken(x):
    y = x.sin()
    print("a graph break")
    return y.cos()
"""


@pytest.fixture(scope="module", autouse=True)
def _torch_compile_initialised() -> None:
    import torch

    # torch's first torch.compile installs its own LazyTraceHandler (one-time init, not ours)
    torch.compile(lambda x: x + 1, backend="eager")(torch.zeros(1))


def test_graphs_magic_finds_what_capture_graphs_finds(shell: InteractiveShell) -> None:
    shell.run_cell(SETUP).raise_error()
    cell = "broken(torch.ones(4))\n"
    options = "--steps 1 --no-eager --no-cost"
    from_magic = shell.run_cell_magic("nbt", f"graphs {options}", cell)
    shell.run_cell("torch._dynamo.reset()").raise_error()  # compile again, as the magic did
    from_api = nbt.capture_graphs(
        lambda: shell.user_ns["broken"](shell.user_ns["torch"].ones(4)),
        steps=1,
        eager_baseline=False,
        measure_cost=False,
    )
    assert type(from_magic) is type(from_api)
    # Compile times differ between runs; the graphs and the breaks (and their reasons) do not.
    assert len(from_magic.graphs) == len(from_api.graphs) >= 2
    assert list(from_magic.breaks["reason"]) == list(from_api.breaks["reason"])
    assert len(from_magic.breaks) >= 1


def test_compile_log_magic_shows_what_load_compile_log_gives(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    from nbtoolkit.core.errors import CompileLogError

    missing = tmp_path / "missing.log"
    with pytest.raises(CompileLogError) as from_magic:
        shell.run_line_magic("nbt", f"compile-log {missing}")
    with pytest.raises(CompileLogError) as from_api:
        nbt.load_compile_log(missing)
    assert str(from_magic.value) == str(from_api.value)
