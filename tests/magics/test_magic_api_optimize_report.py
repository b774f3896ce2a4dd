"""%nbt plan shows what plan_recompute gives; %nbt report writes what report writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from tests.optimize._models import make_gpt


def test_plan_magic_chooses_what_plan_recompute_chooses(shell: InteractiveShell) -> None:
    model, step = make_gpt(hidden=[64, 128])
    shell.user_ns.update(gpt=model, train_step=step)
    from_magic = shell.run_line_magic("nbt", "plan gpt train_step --budget 1GB")
    from_api = nbt.plan_recompute(model, step, "1GB")
    assert type(from_magic) is type(from_api)
    # Times differ between runs; the bytes measured and the blocks chosen do not.
    assert from_magic.blocks == from_api.blocks
    assert from_magic.baseline_peak_bytes == from_api.baseline_peak_bytes > 0
    assert list(from_magic.candidates["block"]) == list(from_api.candidates["block"])


def test_report_magic_writes_what_report_writes(
    shell: InteractiveShell, tmp_path: Path, assert_same_display: Callable[..., None]
) -> None:
    from nbtoolkit.cluster.state import ClusterStatus

    status = ClusterStatus(
        {"address": "127.0.0.1:1", "origin": "connected", "world_size": 1, "backend": "gloo", "master": None},
        [{"rank": 0, "state": "idle", "pid": 1, "ip": "127.0.0.1", "device": "cpu", "cells_run": 0,
          "busy_s": None, "cause": None}],
    )  # fmt: skip
    shell.user_ns["status"] = status
    path = tmp_path / "report.html"
    from_magic = shell.run_line_magic("nbt", f"report {path} status")
    magic_file = path.read_text()
    from_api = nbt.report(("status", status), path=path)
    assert_same_display(from_magic, from_api, mask=r"\d[\d,.]* ?[KM]?i?B")  # the time stamp may differ
    assert "rank" in magic_file and magic_file.count("<section") == path.read_text().count("<section") == 1
