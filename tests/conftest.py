"""Fixtures shared by every test.

The autouse fixture ``no_instrument_left_active`` asserts after each test that nothing
nbtoolkit may have turned on is still on: the torch profiler, global module hooks,
Python-level profilers/tracers, and the structured-trace log handlers. A capture that
forgets to clean up on an exception fails the test that exercised it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Import torch once before any test: its import installs torch's own default log handlers,
# which must not look like handlers a test leaked. (nbtoolkit itself imports torch lazily;
# tests/foundation checks that in a subprocess.)
import torch
from IPython.core.interactiveshell import InteractiveShell

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    """An IPython shell with the extension loaded, for the magic tests of one module."""
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbtoolkit")
    yield ip
    ip.run_line_magic("unload_ext", "nbtoolkit")


def locate_or_skip(name: str) -> Path:
    """The local path of a real GPU artifact (nbtoolkit.core.datasets), or skip the test naming it.

    The artifact comes from NBT_DATA, ../shared/fixtures beside the checkout, the download cache
    or its pinned public origin; when none works (e.g. no network), the skip reason is the
    locator's one line: which artifact, and how to get it. A checksum mismatch is not a skip.
    """
    from nbtoolkit.core.datasets import locate_data
    from nbtoolkit.core.errors import DataUnavailableError

    try:
        return locate_data(name)
    except DataUnavailableError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def real_data() -> Callable[[str], Path]:
    """``real_data("traces/hta_cpu_only")``: a real GPU artifact's path; skips the test when unavailable."""
    return locate_or_skip


def _torch_instrument_state() -> dict[str, object]:
    from torch.nn.modules import module as nn_module

    state: dict[str, object] = {
        "profiler_enabled": bool(torch.autograd.profiler._is_profiler_enabled),
        "global_forward_hooks": len(nn_module._global_forward_hooks),
        "global_forward_pre_hooks": len(nn_module._global_forward_pre_hooks),
        "global_backward_hooks": len(nn_module._global_backward_hooks),
        "global_backward_pre_hooks": len(getattr(nn_module, "_global_backward_pre_hooks", {})),
    }
    return state


def _logging_state() -> dict[str, object]:
    names = ["torch._logging.structured", "torch.__trace", "torch._dynamo", "torch._inductor"]
    state: dict[str, object] = {}
    for name in names:
        logger = logging.getLogger(name)
        # pytest's own capture handlers come and go per test phase: not ours to check.
        handlers = tuple(h for h in logger.handlers if type(h).__name__ != "LogCaptureHandler")
        state[name] = (handlers, logger.level, logger.propagate, logger.disabled)
    return state


@pytest.fixture(autouse=True)
def no_instrument_left_active() -> Iterator[None]:
    before_torch = _torch_instrument_state()
    before_logging = _logging_state()
    before_profile = sys.getprofile()
    before_trace = sys.gettrace()
    yield
    after_torch = _torch_instrument_state()
    defaults: dict[str, object] = {"profiler_enabled": False}
    leaked = {k: v for k, v in after_torch.items() if before_torch.get(k, defaults.get(k, 0)) != v}
    assert not leaked, f"an instrument was left active after the test: {leaked}"
    assert _logging_state() == before_logging, "log handlers were added or removed and not restored"
    assert sys.getprofile() is before_profile, "a Python profiler was left installed (sys.setprofile)"
    assert sys.gettrace() is before_trace, "a Python tracer was left installed (sys.settrace)"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Stands in for /etc in the link tests: a folder that must stay exactly as it is."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "passwd").write_text("root:x:0:0\n")
    return folder


def folder_state(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes: equal before and after means untouched."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
