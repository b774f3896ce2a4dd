"""The cluster magics call one function of the cluster API and show what it gives (no Ray here).

With a running cluster, tests/cluster/test_cluster.py checks the same for status, remote cells,
push and fetch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from nbtoolkit.cluster.cluster import Cluster
from nbtoolkit.cluster.commands import cluster_command
from nbtoolkit.cluster.state import COLLECTIVE_TIMEOUT_S
from nbtoolkit.core.errors import ClusterError, NbtUsageError


def _error_of(call: object) -> str:
    assert callable(call)
    with pytest.raises((ClusterError, NbtUsageError)) as info:
        call()
    return f"{type(info.value).__name__}: {info.value}"


def test_without_a_cluster_magic_and_api_fail_with_the_same_message(shell: InteractiveShell) -> None:
    for line, api in [
        ("cluster status", lambda: cluster_command("status")),
        ("pull x", lambda: Cluster.current().pull("x")),
        ("fetch /tmp/x", lambda: Cluster.current().fetch("/tmp/x")),
    ]:
        magic = _error_of(lambda line=line: shell.run_line_magic("nbt", line))
        assert magic == _error_of(api)
        assert "no cluster is running" in magic
    remote = _error_of(lambda: shell.run_cell_magic("nbt", "remote", "rank"))
    assert remote == _error_of(lambda: Cluster.current().run_cell("rank"))


def test_bad_lines_fail_in_the_api_with_the_message_the_magic_shows(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    cases = [
        ("cluster start many", lambda: cluster_command("start", "many")),
        ("cluster start 0", lambda: cluster_command("start", "0")),
        ("cluster connect", lambda: cluster_command("connect")),
        ("cluster status now", lambda: cluster_command("status", "now")),
        (
            f"cluster connect 127.0.0.1:1 --token-file {tmp_path / 'missing'}",
            lambda: Cluster.connect("127.0.0.1:1", token_file=tmp_path / "missing"),
        ),
    ]
    for line, api in cases:
        magic = _error_of(lambda line=line: shell.run_line_magic("nbt", line))
        assert magic == _error_of(api), line
    assert "positive integer" in _error_of(lambda: cluster_command("start", "many"))
    assert "does not exist" in _error_of(lambda: Cluster.connect("h:1", token_file=tmp_path / "missing"))
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    assert "is empty" in _error_of(lambda: Cluster.connect("h:1", token_file=empty))
    assert "not both" in _error_of(lambda: Cluster.connect("h:1", token="t", token_file=empty))


def test_the_timeout_default_is_the_api_constant(shell: InteractiveShell) -> None:
    import inspect

    text = " ".join(str(shell.run_line_magic("nbt", "help cluster")).split())
    assert f"(default {COLLECTIVE_TIMEOUT_S:g})" in text
    for function in (Cluster.local, Cluster.connect, cluster_command):
        assert inspect.signature(function).parameters["collective_timeout_s"].default == COLLECTIVE_TIMEOUT_S
