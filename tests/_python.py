"""Run Python in a fresh process from a test, and fail with the end of its output if it fails.

Recordings (profiler traces, TORCH_TRACE logs, a gloo run), fresh-interpreter imports and code
that could hang are run this way: a crash or a hang then cannot take the test process with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["run_module_function", "run_python"]


def run_python(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with ``env`` added to this process's environment; asserts it exited with 0."""
    done = subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, f"python {' '.join(args)[:200]} failed:\n{output}"
    return done


def run_module_function(
    path: Path, function: str = "run", *, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Import the module file ``path`` in a fresh process and call its ``function()``."""
    code = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location({path.stem!r}, {str(path)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        f"module.{function}()\n"
    )
    return run_python("-c", code, env=env, timeout=timeout)
