"""Real artifacts recorded on GPUs by other projects, and the one place that finds them.

Traces, CUDA allocator snapshots and TORCH_TRACE compile logs from real GPU runs are
public data of other projects: this repository does not ship them. Tests, walkthroughs
and benchmarks ask for one by its registry name (``traces/hta_trace_filter_2rank``,
``memory/kk_memory_files_memory_ctx128_fullstep.pickle``: a file, or a folder of files)
and :func:`locate_data` looks, in this order:

1. the folder named by the ``NBT_DATA`` environment variable (laid out like the registry
   names: ``traces/``, ``memory/``, ``compile_logs/``, ``reference/``);
2. ``../shared/fixtures`` beside a source checkout (the project's own machines);
3. the download cache (``NBT_DATA_CACHE``, else the user's cache folder, e.g.
   ``~/.cache/nbtoolkit``), then a download from the artifact's public origin: a URL
   pinned to a commit, checked against the registry's sha256 by pooch. ``NBT_DATA_DOWNLOAD=0``
   forbids downloading.

When none of these has it, :class:`~nbtoolkit.core.errors.DataUnavailableError` says which
artifact and how to get it, in one line (tests skip with that line as the reason). A
download whose bytes do not match the pinned sha256 is a :class:`~nbtoolkit.core.errors.DataError`:
the origin changed, and the file is not used.

The registry (``nbtoolkit/data/registry.csv``) lists every artifact with its sha256, its
pinned URL (empty where no public copy exists, e.g. outputs of reference tools run on our
machines), its origin and its license.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nbtoolkit.core.errors import DataError, DataUnavailableError, NbtUsageError

__all__ = ["Artifact", "DataRegistry", "data_folders", "locate_data"]

REGISTRY_FILE = Path(__file__).parents[1] / "data" / "registry.csv"
# A source checkout (editable install) has the repository root two levels above this file;
# the project's own machines keep the fixtures beside it.
CHECKOUT_FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
# Seconds to wait for a server before giving up: an offline machine fails at once (no
# route), a machine behind a silent firewall must not hang a test session.
DOWNLOAD_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Artifact:
    """One file of the registry: where it came from and how to check it."""

    name: str  # path relative to the data folder, forward slashes
    sha256: str
    url: str  # pinned to a commit; "" where no public copy exists
    origin: str
    license: str


def data_folders() -> list[Path]:
    """The folders searched before the download cache: ``NBT_DATA``, then ``../shared/fixtures``."""
    folders = []
    if os.environ.get("NBT_DATA"):
        folders.append(Path(os.environ["NBT_DATA"]).expanduser())
    if CHECKOUT_FIXTURES.is_dir():
        folders.append(CHECKOUT_FIXTURES)
    return folders


def _default_cache() -> Path:
    if os.environ.get("NBT_DATA_CACHE"):
        return Path(os.environ["NBT_DATA_CACHE"]).expanduser()
    import pooch

    return Path(pooch.os_cache("nbtoolkit"))


def _download_allowed() -> bool:
    return os.environ.get("NBT_DATA_DOWNLOAD", "1").strip().lower() not in {"0", "false", "no", "off"}


class DataRegistry:
    """Artifacts by name, and the search for them (folders, cache, pinned download).

    ``folders``, ``cache_dir`` and ``download`` default to the environment (see the module
    docstring) at the time of each :meth:`locate`, so a test or a notebook can change
    ``NBT_DATA`` without building a new registry.
    """

    def __init__(
        self,
        artifacts: Iterable[Artifact],
        *,
        folders: Sequence[Path] | None = None,
        cache_dir: Path | None = None,
        download: bool | None = None,
    ) -> None:
        self._artifacts = {a.name: a for a in artifacts}
        self._folders = folders
        self._cache_dir = cache_dir
        self._download = download

    @classmethod
    def from_csv(cls, path: Path = REGISTRY_FILE, **options: object) -> DataRegistry:
        """Read a registry file (columns ``name, sha256, url, origin, license``)."""
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        fields = Artifact.__annotations__
        artifacts = (Artifact(**{k: (row.get(k) or "").strip() for k in fields}) for row in rows)
        return cls(artifacts, **options)  # type: ignore[arg-type]

    def names(self) -> list[str]:
        """Every file the registry knows, sorted."""
        return sorted(self._artifacts)

    def artifacts(self, name: str) -> list[Artifact]:
        """The files a name stands for: the file itself, or every file under a folder name."""
        key = name.strip("/")
        if key in self._artifacts:
            return [self._artifacts[key]]
        prefix = key + "/"
        return [a for n, a in sorted(self._artifacts.items()) if n.startswith(prefix)]

    def locate(self, name: str) -> Path:
        """The local path of artifact ``name`` (a file or a folder), downloading it if need be.

        Raises :class:`DataUnavailableError` (one line: which artifact, what was tried, how to
        get it) when no folder has it and it cannot be downloaded, and :class:`DataError` when a
        downloaded file does not match its pinned sha256.
        """
        if not isinstance(name, str) or not name.strip("/"):
            raise NbtUsageError(f"an artifact name is a path such as 'traces/hta_cpu_only', got {name!r}")
        key = name.strip("/")
        if ".." in Path(key).parts:
            raise NbtUsageError(f"an artifact name stays inside the data folder, got {name!r}")
        folders = list(self._folders) if self._folders is not None else data_folders()
        for folder in folders:
            candidate = folder / key
            if candidate.exists():
                return candidate
        wanted = self.artifacts(key)
        if folders:
            not_found = f"is not in {', '.join(str(f) for f in folders)}"
        else:
            not_found = "is in no data folder (NBT_DATA unset, no ../shared/fixtures beside a checkout)"
        if not wanted:
            raise DataUnavailableError(
                f"real data {key!r} {not_found} and not in nbtoolkit's registry of downloadable "
                "artifacts: point NBT_DATA at a folder that holds it"
            )
        no_copy = [a.name for a in wanted if not a.url]
        if no_copy:
            raise DataUnavailableError(
                f"real data {key!r} {not_found}, and {len(no_copy)} of its files have no public copy "
                f"to download (e.g. {no_copy[0]}): set NBT_DATA=/path/to/fixtures to a folder that holds it"
            )
        cache = self._cache_dir if self._cache_dir is not None else _default_cache()
        download = self._download if self._download is not None else _download_allowed()
        if not download and not all((cache / a.name).is_file() for a in wanted):
            raise DataUnavailableError(
                f"real data {key!r} {not_found} nor in the download cache {cache}, and "
                "NBT_DATA_DOWNLOAD=0 forbids downloading it: set NBT_DATA=/path/to/fixtures "
                "or allow the download"
            )
        for artifact in wanted:
            _fetch(artifact, cache, key)
        return cache / key


def _fetch(artifact: Artifact, cache: Path, requested: str) -> Path:
    """Download one artifact into ``cache`` (pooch checks the sha256 and reuses a good copy)."""
    import pooch
    import requests

    target = cache / artifact.name
    try:
        pooch.retrieve(
            artifact.url,
            known_hash=f"sha256:{artifact.sha256}",
            fname=target.name,
            path=target.parent,
            downloader=pooch.HTTPDownloader(progressbar=False, timeout=DOWNLOAD_TIMEOUT_S),
        )
    except requests.exceptions.RequestException as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DataUnavailableError(
            f"real data {requested!r} could not be downloaded from {artifact.url} ({reason}): "
            "set NBT_DATA=/path/to/fixtures to a folder that holds it, or retry with network access"
        ) from None
    except ValueError as exc:  # pooch: the downloaded bytes do not match the known hash
        raise DataError(
            f"{artifact.name} downloaded from {artifact.url} does not match its pinned sha256 "
            f"{artifact.sha256[:12]}… ({str(exc).splitlines()[0][:160]}): the origin changed; the file was "
            "not kept. Report it, or set NBT_DATA to a folder with the original file"
        ) from None
    except OSError as exc:
        raise DataUnavailableError(
            f"real data {requested!r} could not be stored in the cache {cache} ({exc}): "
            "set NBT_DATA_CACHE to a writable folder, or NBT_DATA to a folder that holds it"
        ) from None
    return target


_DEFAULT: DataRegistry | None = None


def default_registry() -> DataRegistry:
    """The registry shipped in the package (read once)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = DataRegistry.from_csv(REGISTRY_FILE)
    return _DEFAULT


def locate_data(name: str) -> Path:
    """The local path of a real artifact (trace, snapshot, compile log; a file or a folder).

    Looks in ``NBT_DATA``, then ``../shared/fixtures`` beside a checkout, then the download
    cache, then downloads it from its pinned public origin (checked by sha256). Raises
    ``DataUnavailableError`` with a one-line reason and what to do when none of these works::

        trace = nbt.load_trace(nbt.locate_data("traces/hta_trace_filter_2rank"))
    """
    return default_registry().locate(name)
