"""Run Python in a fresh process from a test, and fail with the end of its output if it fails.

Recordings (profiler traces, TORCH_TRACE logs, a gloo run), fresh-interpreter imports and code
that could hang are run this way: a crash or a hang then cannot take the test process with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["read_bounded", "run_module_function", "run_python"]


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


_BOUNDED_READ = """
import json, os, resource, sys, time, warnings
import nbtoolkit as nbt
from nbtoolkit.compile import log_reader as compile_log  # everything, before the limit
from nbtoolkit.trace import kineto
from nbtoolkit.memory import snapshot_reader as snapshot
from nbtoolkit.memory import snapshot_stream
import nbtoolkit.trace.critical_path_analysis
nbt.MemorySnapshot
warnings.simplefilter("ignore")
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size + int(sys.argv[3]), resource.RLIM_INFINITY))
start = time.perf_counter()
try:
    result = getattr(nbt, sys.argv[1])(sys.argv[2])
    out = {"outcome": "result", "type": type(result).__name__, "message": ""}
    if hasattr(result, "notes"):
        out["notes"] = [str(n) for n in result.notes]
    if hasattr(result, "info"):
        out["notes"] = out.get("notes", []) + [n for i in result.info.values() for n in i.notes]
except nbt.NbtError as exc:
    out = {"outcome": "error", "type": type(exc).__name__, "message": str(exc)}
out["seconds"] = time.perf_counter() - start
# VmHWM is this program's own peak: ru_maxrss would carry the parent's peak across exec, so a
# reader run from a large test session would seem to use what the session used
out["peak_rss"] = next(
    int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")
)
print("BOUNDED " + json.dumps(out))
"""


def read_bounded(
    reader: str,
    path: Path,
    *,
    extra_bytes: int = int(1.5 * 2**30),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> dict[str, object]:
    """``nbt.<reader>(path)`` in a fresh process whose address space may grow ``extra_bytes`` past its
    size after imports (``RLIMIT_AS``, as ``ulimit -v``): outcome ("result"/"error"), type, message,
    notes, seconds, peak_rss (bytes, the whole process). Anything but a result or an NbtError fails.
    """
    import json

    done = run_python("-c", _BOUNDED_READ, reader, str(path), str(extra_bytes), env=env, timeout=timeout)
    line = next(line for line in done.stdout.splitlines() if line.startswith("BOUNDED "))
    return json.loads(line.removeprefix("BOUNDED "))  # type: ignore[no-any-return]
