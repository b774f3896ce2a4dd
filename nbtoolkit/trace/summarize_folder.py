"""``summarize_traces``: a folder of hundreds of rank traces, read in parallel, kept small.

What ``nbt.load_trace(folder)`` runs for a folder of many ranks (:mod:`nbtoolkit.trace.load`: its
RankFolderTrace answers from the summary this returns); called directly it also offers
``on_error="skip"`` and a cache folder of one's choice.

Each rank's trace is parsed in a worker process (at most one per core: parsing is CPU-bound
and holds the GIL), summarized there (:func:`~nbtoolkit.trace.summarize_rank.summarize_trace`:
overlap by rank and step, steps, spans) and only the summary, a few KB, comes back. Without a
cache to write or critical paths to find, the worker summarizes with numpy alone
(:mod:`nbtoolkit.trace.summarize_rank_lean`: the same records, several times faster, and the
worker never imports pandas); a file that path does not read goes through the pandas path. The
parent never holds the events of more than the ranks a worker is reading, so its memory does
not grow with the number of ranks; the workers' peak is that of the largest rank file.

Workers are forked from a process with a single thread that has not imported torch, Ray
or another runtime with threads of its own (a script); anywhere else (a notebook kernel,
which runs several threads) they start with ``forkserver`` (``spawn`` where it is missing).
Each worker reads many files.

With ``cache=True`` each rank's summary and events are kept in a cache folder
(:mod:`nbtoolkit.trace.trace_cache`), so a second call reads only the summaries (near-instant)
and ``summary.load_ranks([...])`` reads the chosen ranks' events from Parquet.

Bad input at scale: a rank file that is corrupt, truncated or not a trace is named in
``summary.failed`` (with the reason) and the rest is kept (``on_error="raise"`` raises the
first instead); ranks below the world size that no file holds are listed in
``summary.missing_ranks``. Two files of the same rank, or files of different jobs, raise.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from nbtoolkit.core.cache_folder import DEFAULT_CACHE_NAME, usable_cache_folder
from nbtoolkit.core.errors import NbtUsageError, TraceError
from nbtoolkit.core.paths import user_path
from nbtoolkit.trace.summarize_rank import summarize_trace
from nbtoolkit.trace.trace_cache import cache_key, read_events, read_summary, write_rank

if TYPE_CHECKING:
    from os import PathLike

    from nbtoolkit.trace.summary import TraceSummary

__all__ = ["RankOutcome", "summarize_files", "summarize_traces", "trace_files_of"]

#: below this many files the parent reads them itself: starting workers costs more
_MIN_FILES_FOR_WORKERS = 3


class RankOutcome(NamedTuple):
    """What reading one rank file gave: its summary records, or why not (``kind``: corrupt / not-a-trace).

    ``records`` is ``TraceSummary.to_records()``: plain data, cheap to pickle, combined once.
    """

    file: str
    records: dict[str, Any] | None
    kind: str = ""
    reason: str = ""


def summarize_traces(
    path: str | PathLike[str] | Iterable[str | PathLike[str]],
    *,
    workers: int | None = None,
    cache: bool = False,
    cache_dir: str | PathLike[str] | None = None,
    on_error: Literal["skip", "raise"] = "skip",
    include_last_step: bool = False,
    critical_path: bool = False,
) -> TraceSummary:
    """Per-rank overlap, steps and straggler inputs of a folder of rank traces, read in parallel.

    Args:
        path: a folder of per-rank ``.json``/``.json.gz`` traces (or a list of files).
        workers: processes that parse (default: the cores this process may use; 1 reads
            in this process).
        cache: keep each rank's summary and events in ``cache_dir`` (default
            ``<folder>/.nbt-cache``); a second call then reads only the summaries.
        cache_dir: where to cache (implies ``cache=True``).
        on_error: ``"skip"`` (default) names a corrupt rank file in ``summary.failed`` and goes
            on; ``"raise"`` raises its TraceError.
        include_last_step: keep the last ProfilerStep (HTA's ``include_last_profiler_step``).
        critical_path: also find each rank's critical path where it is read
            (``summary.critical_path``: ``nbt.critical_path_by_rank``'s frame; about 0.15 s of CPU
            per rank, several times the rest).

    Returns a :class:`~nbtoolkit.trace.summary.TraceSummary`: ``.overlap`` equals
    ``nbt.comm_comp_overlap(nbt.load_trace(path))``, ``nbt.stragglers(summary)`` equals
    ``nbt.stragglers(nbt.load_trace(path))``.
    """
    files, root, skipped = trace_files_of(path)
    if on_error not in ("skip", "raise"):
        raise NbtUsageError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
    folder: Path | None = None
    notes = []
    if cache_dir is not None:
        folder = user_path(cache_dir, error=TraceError)
    elif cache:
        folder = (root if root.is_dir() else root.parent) / DEFAULT_CACHE_NAME
    if folder is not None:
        folder, refused = usable_cache_folder(folder)
        if refused:
            notes.append(f"did not cache: {refused}")
    outcomes = _run_all(files, folder, include_last_step, _worker_count(workers, len(files)), critical_path)
    if skipped:
        notes.append(
            f"skipped {len(skipped)} file(s) that are not .json/.json.gz traces: "
            + ", ".join(sorted(skipped)[:10])
            + (" ..." if len(skipped) > 10 else "")
        )
    return combine_outcomes(
        root, outcomes, on_error=on_error, notes=notes, cache_dir=folder, critical_path=critical_path
    )


def summarize_files(
    files: list[str], *, cache_dir: str | None = None, include_last_step: bool = False, workers: int = 1
) -> list[RankOutcome]:
    """Summarize the given files here (or with ``workers`` processes): what a cluster node runs."""
    folder = user_path(cache_dir, error=TraceError) if cache_dir else None
    if folder is not None:
        folder, _ = usable_cache_folder(folder)  # a link or a file: no cache on this node
    return _run_all([Path(f) for f in files], folder, include_last_step, _worker_count(workers, len(files)))


def combine_outcomes(
    root: Path,
    outcomes: list[RankOutcome],
    *,
    on_error: str,
    notes: list[str],
    cache_dir: Path | None,
    redo: Callable[[str, list[str]], dict[str, Any]] | None = None,
    critical_path: bool = False,
) -> TraceSummary:
    """The job's summary from the ranks' outcomes: failures named, missing ranks listed, job checked.

    ``redo(file, labels)`` summarizes one file again with the job's ProfilerStep labels
    (:mod:`nbtoolkit.trace.summarize_rank`); default: here, from the cache or the file.
    """
    from nbtoolkit.trace._kineto_ranks import check_same_job, rank_from_file_name
    from nbtoolkit.trace.summary import TraceSummary

    good = [o for o in outcomes if o.records is not None]
    failed = {o.file: o.reason for o in outcomes if o.kind == "corrupt"}
    notes.extend(f"skipped {Path(o.file).name}: {o.reason}" for o in outcomes if o.kind == "not-a-trace")
    if failed and on_error == "raise":
        file, reason = sorted(failed.items())[0]
        raise TraceError(f"{file}: {reason}")
    if not good:
        detail = "; ".join(f"{Path(f).name}: {r}" for f, r in sorted(failed.items())[:3]) or (
            notes[-1] if notes else "no files"
        )
        raise TraceError(f"{root}: no rank trace could be read ({detail})")
    # HTA's last-step rule counts the labels of the whole job: redo ranks that decided alone
    labels = sorted({label for o in good if o.records for label in o.records["step_labels"]})
    records = []
    for o in good:
        assert o.records is not None
        alone = len(o.records["step_labels"]) >= 2
        if alone != (len(labels) >= 2) and not o.records["include_last_step"]:
            records.append((redo or _redo_here(cache_dir, critical_path))(o.file, labels))
        else:
            records.append(o.records)
    summary = TraceSummary.from_records(records, notes=notes)
    check_same_job(root, summary.info)
    summary.failed = failed
    world = summary.world_size
    if world:
        named = {rank_from_file_name(Path(f).name) for f in failed}
        summary.missing_ranks = sorted(set(range(world)) - set(summary.info) - named)
    summary.cache_dir = str(cache_dir) if cache_dir else None
    return summary


def trace_files_of(
    path: str | PathLike[str] | Iterable[str | PathLike[str]],
) -> tuple[list[Path], Path, list[str]]:
    """The trace files to read, the folder they are in, and the names of other files skipped."""
    from nbtoolkit.core.inputs import is_path

    if is_path(path):
        root = user_path(path, error=TraceError)
        if not root.exists():
            raise TraceError(f"{root}: no such file or folder; give a folder of per-rank traces")
        if root.is_file():
            return [root], root, []
        files, skipped = [], []
        for entry in sorted(root.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_file() and entry.name.endswith((".json", ".json.gz")):
                files.append(entry)
            else:
                skipped.append(entry.name)
        if not files:
            raise TraceError(f"{root}: folder holds no .json/.json.gz trace files")
        return files, root, skipped
    if isinstance(path, Iterable) and not isinstance(path, str | bytes):
        entries = list(path)
        odd = next((p for p in entries if not is_path(p)), None)
        if odd is not None:
            raise NbtUsageError(
                f"summarize_traces() takes a list of trace file paths; one entry is a {type(odd).__name__}"
            )
        files = [user_path(p, error=TraceError) for p in entries]
        if not files:
            raise NbtUsageError("summarize_traces() got an empty list of files")
        return files, files[0].parent, []
    raise NbtUsageError(
        f"summarize_traces() takes a folder of rank traces or a list of files, got {type(path).__name__}"
    )


# ------------------------------------------------------------------------ workers
def _worker_count(workers: int | None, files: int) -> int:
    if workers is not None and workers < 1:
        raise NbtUsageError(f"workers must be at least 1, got {workers}")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    wanted = cores if workers is None else workers
    return 1 if files < _MIN_FILES_FOR_WORKERS else max(1, min(wanted, files))


def _run_all(
    files: list[Path],
    cache_dir: Path | None,
    include_last_step: bool,
    workers: int,
    critical_path: bool = False,
) -> list[RankOutcome]:
    outcomes: dict[str, RankOutcome] = {}
    if cache_dir is not None:  # cached summaries are read here: no worker to start for them
        for f in files:
            try:
                cached = read_summary(cache_dir, cache_key(f), include_last_step)
            except OSError:
                cached = None
            if cached is not None and (not critical_path or "critical_path" in cached):
                outcomes[str(f)] = RankOutcome(str(f), cached)
    jobs = [
        (str(f), str(cache_dir) if cache_dir else None, include_last_step, critical_path)
        for f in files
        if str(f) not in outcomes
    ]
    done = _read_jobs(jobs, workers)
    outcomes.update((o.file, o) for o in done)
    return [outcomes[str(f)] for f in files]


def _read_jobs(jobs: list[tuple[str, str | None, bool, bool]], workers: int) -> list[RankOutcome]:
    """Run the jobs in this process and ``workers - 1`` worker processes, all pulling from one list.

    Starting workers takes a second or more (a fresh interpreter importing pandas); this
    process starts reading at once, from the end of the list, while the workers take chunks
    from the front. A chunk this process wants is taken back from the pool by cancelling its
    future, which succeeds only while no worker has started it: no file is read twice.
    """
    if len(jobs) < _MIN_FILES_FOR_WORKERS or workers == 1:
        return [_summarize_one(*job) for job in jobs]
    size = max(1, min(8, len(jobs) // (workers * 8)))
    chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
    results: list[list[RankOutcome] | None] = [None] * len(chunks)
    context = _context()
    if context.get_start_method() == "fork":
        # the readers, imported before the fork so the workers share them
        import nbtoolkit.trace.kineto
        import nbtoolkit.trace.summarize_rank_lean  # noqa: F401
    caching = any(job[1] for job in jobs)
    critical_paths = any(job[3] for job in jobs)
    pool = ProcessPoolExecutor(
        max_workers=max(1, workers - 1),
        mp_context=context,
        initializer=_lean_worker,
        initargs=(critical_paths and not caching,),
    )
    try:
        futures = [pool.submit(_summarize_chunk, chunk) for chunk in chunks]
        for i in reversed(range(len(chunks))):
            if not futures[i].cancel():
                break  # a worker has it, and every chunk before it
            results[i] = _summarize_chunk(chunks[i])
        for i, future in enumerate(futures):
            if results[i] is None:
                results[i] = future.result()
    except BrokenProcessPool:
        pool.shutdown(wait=False, cancel_futures=True)
        raise TraceError(
            "a worker process reading the traces died (killed, or out of memory on a large rank file); "
            "read with fewer processes (workers=1 reads in this one)"
        ) from None
    except BaseException:
        # Ctrl-C: drop the chunks not started rather than read them all
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [o for part in results if part for o in part]


def _lean_worker(keep_pyarrow_out: bool) -> None:
    """Keep pyarrow out of a worker that summarizes with pandas only: a third of its memory (~35 of ~120 MB).

    Workers that neither cache nor find critical paths summarize without pandas (the lean path:
    nothing to keep out). Those that find critical paths build frames: pandas 3 imports pyarrow
    when it is installed (for its string columns) and falls back to Python strings without it;
    a summary holds no string column that needs pyarrow, and the numbers are the same
    (tests/trace/test_scale.py). A worker that writes the Parquet cache needs it; so does one
    forked after the parent imported pandas (it has it already).
    """
    import sys

    if keep_pyarrow_out and "pandas" not in sys.modules and "pyarrow" not in sys.modules:
        sys.modules["pyarrow"] = None  # type: ignore[assignment]  # import pyarrow -> ImportError


def _summarize_chunk(chunk: list[tuple[str, str | None, bool, bool]]) -> list[RankOutcome]:
    return [_summarize_one(*job) for job in chunk]


def _context() -> multiprocessing.context.BaseContext:
    """``fork`` where it is safe, else ``forkserver`` (``spawn`` where that is missing).

    Forking is safe in a process with one thread that has not imported torch or Ray (a
    script, a batch job): the worker then starts at once and shares the parent's imported
    modules. A notebook kernel runs several threads (and usually has torch), so it gets the
    forkserver: a bare process from which each worker forks, then imports the reader itself.
    """
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and _fork_is_safe():
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        # nothing preloaded (not even __main__): a bare server costs ~12 MB instead of ~35, and
        # each worker imports what it reads with once, for many files
        ctx.set_forkserver_preload([])
        return ctx
    return multiprocessing.get_context("spawn")


def _fork_is_safe() -> bool:
    """One thread alive, and no runtime that keeps state a fork would break (CUDA, Ray, gRPC)."""
    import sys
    import threading

    risky = ("torch", "ray", "grpc", "deepspeed", "jax", "tensorflow")
    return threading.active_count() == 1 and not any(name in sys.modules for name in risky)


def _summarize_one(
    file: str, cache_dir: str | None, include_last_step: bool, critical_path: bool = False
) -> RankOutcome:
    """Read (or find in the cache) one rank file and summarize it; runs in a worker."""
    from nbtoolkit.trace._kineto_json import NotATrace
    from nbtoolkit.trace.kineto import load_rank_file

    path = Path(file)
    folder = Path(cache_dir) if cache_dir else None
    key = None
    damaged: list[str] = []
    if folder is not None:
        try:
            key = cache_key(path)
        except OSError as exc:
            return RankOutcome(file, None, "corrupt", f"cannot be read ({exc.strerror or exc})")
        cached = read_summary(folder, key, include_last_step, damaged)
        if cached is not None and (not critical_path or "critical_path" in cached):
            return RankOutcome(file, cached)
    if folder is None and not critical_path:
        outcome = _summarize_lean(path, include_last_step)
        if outcome is not None:
            return outcome
    try:
        trace = load_rank_file(path)
    except (NotATrace, TraceError) as exc:
        return _failed(file, exc)
    records = summarize_trace(
        trace, include_last_step=include_last_step, critical_path=critical_path
    ).to_records()
    if folder is not None and key is not None:
        write_rank(folder, key, records, trace)
    if damaged:  # said once, in this summary; the cache just written holds no such note
        note = f"the cached summary {damaged[0]}; read {path.name} again"
        records = {**records, "notes": [*records["notes"], note]}
    return RankOutcome(file, records)


def _summarize_lean(path: Path, include_last_step: bool) -> RankOutcome | None:
    """The rank's outcome by the lean path (same records, same errors as the pandas path's);
    None for a file only the pandas path reads (``LeanUnsupported``).
    """
    from nbtoolkit.trace._kineto_json import NotATrace
    from nbtoolkit.trace.summarize_rank_lean import LeanUnsupported, summarize_rank_file

    file = str(path)
    try:
        return RankOutcome(file, summarize_rank_file(path, include_last_step=include_last_step))
    except LeanUnsupported:
        return None
    except (NotATrace, TraceError) as exc:
        return _failed(file, exc)


def _failed(file: str, exc: Exception) -> RankOutcome:
    """The outcome of a file either reader refused: not a trace (skipped) or corrupt (named)."""
    from nbtoolkit.trace._kineto_json import NotATrace

    if isinstance(exc, NotATrace):
        return RankOutcome(file, None, "not-a-trace", str(exc))
    return RankOutcome(file, None, "corrupt", _reason(str(exc), file))


def _reason(message: str, file: str) -> str:
    """The error without the file name in front (the summary names the file)."""
    return message[len(file) + 2 :] if message.startswith(file + ": ") else message


def _redo_here(
    cache_dir: Path | None, critical_path: bool = False
) -> Callable[[str, list[str]], dict[str, Any]]:
    def redo(file: str, labels: list[str]) -> dict[str, Any]:
        from nbtoolkit.trace.kineto import load_rank_file

        path = Path(file)
        trace = read_events(cache_dir, cache_key(path)) if cache_dir else None
        trace = trace if trace is not None else load_rank_file(path)
        return summarize_trace(trace, step_labels=labels, critical_path=critical_path).to_records()

    return redo
