"""The real-data locator: a folder, a checked download (from a server on loopback), or a clear 'no'."""

from __future__ import annotations

import csv
import functools
import hashlib
import http.server
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.datasets import (
    CHECKOUT_FIXTURES,
    REGISTRY_FILE,
    Artifact,
    DataRegistry,
    data_folders,
    default_registry,
)
from nbtoolkit.core.errors import DataError, DataUnavailableError, NbtUsageError

CONTENT = b'{"traceEvents": []}\n' * 50
SHA = hashlib.sha256(CONTENT).hexdigest()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 serving tmp_path/www; yields its base URL."""
    root = tmp_path / "www"
    (root / "traces").mkdir(parents=True)
    (root / "traces" / "rank0.json").write_bytes(CONTENT)
    (root / "traces" / "rank1.json").write_bytes(CONTENT)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep the test output clean
            pass

    handler = functools.partial(Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _registry(base: str, tmp_path: Path, *, sha: str = SHA, folders: list[Path] | None = None,
              download: bool = True) -> DataRegistry:
    artifacts = [
        Artifact(f"traces/demo/rank{r}.json", sha, f"{base}/traces/rank{r}.json", "made by this test", "MIT")
        for r in (0, 1)
    ]
    return DataRegistry(artifacts, folders=folders or [], cache_dir=tmp_path / "cache", download=download)


def test_a_folder_is_used_as_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    (folder / "traces" / "demo").mkdir(parents=True)
    # Not the registry's bytes: a folder is the user's own, and trusted as it is.
    (folder / "traces" / "demo" / "rank0.json").write_text("{}")
    registry = _registry("http://127.0.0.1:9", tmp_path, folders=[tmp_path / "empty", folder], download=False)
    assert registry.locate("traces/demo") == folder / "traces" / "demo"
    assert registry.locate("traces/demo/rank0.json").read_text() == "{}"


def test_nbt_data_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBT_DATA", str(tmp_path))
    assert data_folders()[0] == tmp_path
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "mine.pickle").write_bytes(b"x")
    assert nbt.locate_data("memory/mine.pickle") == tmp_path / "memory" / "mine.pickle"


def test_download_is_checked_cached_and_reused(server: str, tmp_path: Path) -> None:
    registry = _registry(server, tmp_path)
    folder = registry.locate("traces/demo")
    assert folder == tmp_path / "cache" / "traces" / "demo"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json", "rank1.json"]
    assert (folder / "rank1.json").read_bytes() == CONTENT
    # The cache answers without the server (pooch checks the hash of what it holds).
    offline = _registry("http://127.0.0.1:9", tmp_path, download=False)
    assert offline.locate("traces/demo/rank0.json").read_bytes() == CONTENT


def test_a_wrong_checksum_is_an_error_and_the_file_is_not_kept(server: str, tmp_path: Path) -> None:
    registry = _registry(server, tmp_path, sha="0" * 64)
    expected = r"rank0\.json downloaded from http://127\.0\.0\.1:\d+/traces/rank0\.json does not match"
    with pytest.raises(DataError, match=expected + r" its pinned sha256 000000000000") as info:
        registry.locate("traces/demo")
    assert not isinstance(info.value, DataUnavailableError)  # tests fail on it rather than skip
    assert not (tmp_path / "cache" / "traces" / "demo" / "rank0.json").exists()


def test_neither_folder_nor_download_says_what_to_do(tmp_path: Path) -> None:
    no_folder = r"real data 'traces/demo' is in no data folder .*"
    with pytest.raises(DataUnavailableError, match=no_folder + r"NBT_DATA_DOWNLOAD=0 "
                                                   r"forbids downloading it: set NBT_DATA="):
        _registry("http://127.0.0.1:9", tmp_path, download=False).locate("traces/demo")
    # Nothing listens on the port: the download fails at once, and the message names the URL.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    expected = rf"could not be downloaded from {re.escape(dead)}/traces/rank0"
    with pytest.raises(DataUnavailableError, match=expected):
        _registry(dead, tmp_path).locate("traces/demo/rank0.json")
    no_copy = DataRegistry([Artifact("reference/x.csv", SHA, "", "our machines", "")], folders=[],
                           cache_dir=tmp_path, download=True)
    with pytest.raises(DataUnavailableError, match=r"have no public copy .*reference/x\.csv.*NBT_DATA="):
        no_copy.locate("reference")
    with pytest.raises(DataUnavailableError, match=r"not in nbtoolkit's registry"):
        no_copy.locate("traces/unknown")


def test_bad_names_are_usage_errors(tmp_path: Path) -> None:
    registry = _registry("http://127.0.0.1:9", tmp_path)
    for bad in ["", "/", "../secrets", "traces/../../x"]:
        with pytest.raises(NbtUsageError, match="artifact name"):
            registry.locate(bad)
    with pytest.raises(NbtUsageError, match="artifact name"):
        registry.locate(None)  # type: ignore[arg-type]


def test_a_missing_artifact_skips_the_test_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tests/conftest.py's real_data turns 'unavailable' into a skip whose reason names the artifact."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tests_conftest", Path(__file__).parents[1] / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    monkeypatch.setenv("NBT_DATA_DOWNLOAD", "0")
    monkeypatch.setenv("NBT_DATA_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("nbtoolkit.core.datasets.data_folders", list)
    reason = r"real data 'traces/hta_cpu_only' is in no data folder .*NBT_DATA="
    with pytest.raises(pytest.skip.Exception, match=reason):
        conftest.locate_or_skip("traces/hta_cpu_only")


def test_the_shipped_registry_is_well_formed() -> None:
    with open(REGISTRY_FILE, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and list(rows[0]) == ["name", "sha256", "url", "origin", "license"]
    names = [row["name"] for row in rows]
    assert names == sorted(set(names))
    for row in rows:
        assert re.fullmatch(r"[0-9a-f]{64}", row["sha256"]), row
        assert row["origin"], row
        if row["url"]:  # pinned: a full commit, never a branch name
            pinned = r"https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[0-9a-f]{40}/\S+"
            assert re.fullmatch(pinned, row["url"]), row
            assert row["license"], row
    assert len(default_registry().artifacts("traces/hta_trace_filter_2rank")) == 2


def test_the_registry_matches_our_data_folder() -> None:
    """On machines with the fixtures: every file is registered with the right checksum."""
    shared = CHECKOUT_FIXTURES
    if not shared.is_dir():
        pytest.skip(f"no fixtures folder {shared} beside this checkout (the project's machines have it)")
    registry = default_registry()
    files = [p for p in shared.rglob("*") if p.is_file() and p.name != "README.md"]
    on_disk = {p.relative_to(shared).as_posix(): p for p in files}
    assert sorted(on_disk) == registry.names()
    for name, path in on_disk.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == registry.artifacts(name)[0].sha256, name
