"""How long `%load_ext nbtoolkit` takes in a fresh IPython shell, side by side with `import torch`.

Each measurement runs in a fresh Python process (nothing cached in sys.modules), five times;
we print the median and spread of each and their ratio, plus which heavy modules the
extension pulled in (it must pull in none).

    python benchmarks/load_time.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

LOAD_EXT = """
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t0 = time.perf_counter()
shell.run_line_magic("load_ext", "nbtoolkit")
elapsed = time.perf_counter() - t0
# Subcommand modules are discovered on the first %nbt call: time that too, since a user pays it.
t1 = time.perf_counter()
shell.run_line_magic("nbt", "help")
first_call = time.perf_counter() - t1
HEAVY = ("torch", "ray", "deepspeed", "plotly", "pandas")
heavy = [m for m in HEAVY if m in sys.modules]
print(json.dumps({"seconds": elapsed, "first_call": first_call, "heavy": heavy}))
"""

IMPORT_TORCH = """
import json, time
t0 = time.perf_counter()
import torch
print(json.dumps({"seconds": time.perf_counter() - t0, "heavy": []}))
"""


def _measure(code: str, runs: int, key: str = "seconds") -> tuple[list[float], list[str]]:
    times: list[float] = []
    heavy: list[str] = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        record = json.loads(out.stdout.strip().splitlines()[-1])
        times.append(record[key])
        heavy = record["heavy"]
    return times, heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    # Interleave is unnecessary: each run is a fresh process; measure both in the same invocation.
    ext_times, heavy = _measure(LOAD_EXT, runs)
    first_times, _ = _measure(LOAD_EXT, runs, key="first_call")
    torch_times, _ = _measure(IMPORT_TORCH, runs)
    ext_median, torch_median = statistics.median(ext_times), statistics.median(torch_times)
    print(f"%load_ext nbtoolkit : median {ext_median * 1e3:7.1f} ms  "
          f"(min {min(ext_times) * 1e3:.1f}, max {max(ext_times) * 1e3:.1f}) over {runs} fresh processes")
    print(f"first %nbt help     : median {statistics.median(first_times) * 1e3:7.1f} ms  "
          "(discovers and imports every subcommand module)")
    print(f"import torch        : median {torch_median * 1e3:7.1f} ms  "
          f"(min {min(torch_times) * 1e3:.1f}, max {max(torch_times) * 1e3:.1f}) over {runs} fresh processes")
    print(f"ratio load_ext / import torch: {ext_median / torch_median:.3f}")
    print(f"heavy modules imported by %load_ext: {heavy or 'none'}")
    print(f"goal <= 300 ms: {'met' if ext_median <= 0.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
