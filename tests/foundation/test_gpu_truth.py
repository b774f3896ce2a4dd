"""The GPU truth script's plumbing, proven on the CPU: every check runs, records and archives.

``scripts/gpu_truth.sh --cpu`` runs each of its checks on the CPU (what needs CUDA is said in
the record's remarks or as "not run" with the reason), so that on a lent GPU the script can
only fail on what the GPU shows. Here it runs whole, in a fresh process, as the device call
runs it; its JSON and archive are then read back. ``unpack_wheels`` (how the device machine,
which has no pip guarantee and no network, gets the carried wheels) is tested on a wheel made
here.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = {"1a", "1b", "2", "3", "4", "5", "6", "7", "8", "9", "10"}
#: checks with nothing to run on a CPU: offloading saved activations to host memory (9) is planned
#: and applied on CUDA only, and nbt.fit's prediction (10) is of a GPU allocator's peak, so on the
#: CPU they are "not run", saying why
CUDA_ONLY = {"9", "10"}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str]:
    out = tmp_path_factory.mktemp("gpu-truth")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_truth.sh"), "--cpu", "--out", str(out), "--deadline-s", "240"],
        capture_output=True,
        text=True,
        timeout=420,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        check=False,
    )
    output = done.stdout + done.stderr
    assert (out / "gpu_truth.json").is_file(), output[-3000:]
    return json.loads((out / "gpu_truth.json").read_text()), out, output


@pytest.mark.slow
def test_every_check_runs_on_the_cpu_and_passes(cpu_run: tuple[dict, Path, str]) -> None:
    results, _, output = cpu_run
    assert results["environment"]["mode"] == "cpu" and results["environment"]["card"] is None
    names = {record["check"].split()[0]: record for record in results["checks"]}
    assert set(names) == CHECKS
    failed = {
        name: record["why"]
        for name, record in names.items()
        if record["status"] != "passed" and name not in CUDA_ONLY
    }
    assert not failed, (failed, output[-2000:])
    for name in CUDA_ONLY:
        assert names[name]["status"] == "not run" and "CUDA only" in names[name]["why"], names[name]
    ran = len(CHECKS) - len(CUDA_ONLY)
    assert results["summary"] == {"passed": ran, "failed": 0, "not run": len(CUDA_ONLY)}
    for record in results["checks"]:
        if record["check"].split()[0] not in CUDA_ONLY:
            assert record["reference"] and record["numbers"] and record["seconds"] >= 0
    # the numbers the GPU run compares, present on the CPU too
    memory = names["1a"]["numbers"]
    assert memory["categories_at_peak"] == memory["timeline_total_peak"] > 0
    assert memory["memtracker_total"] > 0
    assert names["2"]["numbers"]["exported_stats"] == names["2"]["numbers"]["exported_memory_viz"]
    assert any("needs CUDA" in remark for remark in names["2"]["numbers"]["remarks"])
    # MFU is never above 100%: a CPU peak measured under load and beaten gives no MFU (issue 39)
    mfu = names["5"]["numbers"]["mfu"]
    assert (mfu is None or 0 < mfu <= 1) and "measured" in names["5"]["numbers"]["peak_source"]
    assert names["8"]["numbers"]["counted_at_full_zoom_out"] == names["8"]["numbers"]["indexed_events"]
    assert f"{ran} passed, 0 failed, {len(CUDA_ONLY)} not run" in output


@pytest.mark.slow
def test_the_artifacts_come_back_as_one_small_archive(cpu_run: tuple[dict, Path, str]) -> None:
    results, out, _ = cpu_run
    archive = out / results["archive"]
    assert archive.stat().st_size <= 16 * 1024**2
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "profile_trace.json.gz" in names and "exported_snapshot.pickle" in names
    assert any(name.endswith(".log") for name in names)  # a TORCH_TRACE compile log
    assert set(names) == set(results["archived"])


@pytest.mark.slow
def test_a_failing_check_is_recorded_not_fatal(tmp_path: Path) -> None:
    """--only runs one check; one that cannot find its input says 'not run' and why; exit code 0."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_truth.sh"), "--cpu", "--out", str(tmp_path), "--only", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = json.loads((tmp_path / "gpu_truth.json").read_text())
    (record,) = results["checks"]
    assert record["status"] == "not run" and "check 6" in record["why"]
    assert done.returncode == 0


def test_unpack_wheels_keeps_executable_bits_and_skips_done_wheels(tmp_path: Path) -> None:
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("unpack_wheels", ROOT / "scripts" / "unpack_wheels.py")
    assert spec and spec.loader
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    wheels = tmp_path / "whl"
    wheels.mkdir()
    wheel = wheels / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "VALUE = 42\n")
        solver = zipfile.ZipInfo("demo/bin/solver")
        solver.external_attr = 0o755 << 16
        archive.writestr(solver, "#!/bin/sh\necho solved\n")
    site = tmp_path / "site"
    assert module.unpack(wheels, site) == [wheel.name]
    assert (site / "demo" / "__init__.py").read_text() == "VALUE = 42\n"
    assert os.access(site / "demo" / "bin" / "solver", os.X_OK)
    assert not os.access(site / "demo" / "__init__.py", os.X_OK)
    assert module.unpack(wheels, site) == []  # unpacked once
