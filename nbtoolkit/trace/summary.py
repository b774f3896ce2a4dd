"""``TraceSummary``: what the analyses know about each rank of a large job, without its events.

At hundreds of ranks the events of every rank do not fit one process comfortably (HTA keeps
them all), and they need not: the overlap, the steps and the straggler numbers are per rank.
A TraceSummary holds those per-rank results, computed where each rank's trace was read (a
worker process, or the cluster node holding the file), and the metadata of every rank; the
events of a few chosen ranks are loaded again on demand (:meth:`TraceSummary.load_ranks`,
from the per-rank cache when there is one).

Frames (times in µs, one row per rank unless said):

- ``overlap``: ``comm_comp_overlap(trace)`` (rank, comm_time_us, overlap_time_us, overlap_pct,
  exposed_comm_us, method);
- ``overlap_by_step``: ``comm_comp_overlap(trace, by="iteration")`` (one row per rank and step);
- ``steps``: ``trace.steps`` (rank, step, ts, dur; one row per ProfilerStep);
- ``spans``: rank, first_us, last_us, events (the rank's first start, last end, event count);
- ``temporal``: ``temporal_breakdown(trace)`` (rank, idle/compute/non-compute µs and %, span).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.trace.records import FRAMES, RECORD_COLUMNS, SPAN_COLUMNS, RankInfo, records_problem

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import StragglerReport, Trace

__all__ = ["FRAMES", "RECORD_COLUMNS", "SPAN_COLUMNS", "TraceSummary", "records_problem"]


# eq: identity (frames have no truth value); repr: the Result text
@dataclass(repr=False, eq=False)
class TraceSummary(Result):
    """Per-rank analysis results of a (large) multi-rank trace; see the module docstring.

    Made by ``nbt.summarize_traces(folder)`` (local processes) or
    ``cluster.summarize_traces(pattern)`` (on the nodes holding the traces).
    """

    overlap: pd.DataFrame
    overlap_by_step: pd.DataFrame
    steps: pd.DataFrame
    spans: pd.DataFrame
    temporal: pd.DataFrame
    info: dict[int, RankInfo]
    step_labels: list[str] = field(default_factory=list)
    include_last_step: bool = False
    notes: list[str] = field(default_factory=list)
    #: trace file -> why it was skipped (corrupt, truncated, not a trace)
    failed: dict[str, str] = field(default_factory=dict)
    #: ranks below the world size that no file holds
    missing_ranks: list[int] = field(default_factory=list)
    #: where per-rank events were cached as Parquet (None: not cached)
    cache_dir: str | None = None
    #: ``nbt.critical_path_by_rank`` of every rank (its default step), when asked for
    #: (``critical_path=True``: about 0.15 s of CPU per rank, several times the rest of the summary)
    critical_path: pd.DataFrame | None = None

    # ----------------------------------------------------------------- access
    @property
    def ranks(self) -> list[int]:
        return sorted(self.info)

    @property
    def world_size(self) -> int | None:
        sizes = {i.world_size for i in self.info.values() if i.world_size is not None}
        return max(sizes) if sizes else None

    @property
    def sources(self) -> dict[int, str]:
        """rank -> the trace file it came from."""
        return {r: self.info[r].source for r in self.ranks}

    def stragglers(self, *, threshold_pct: float = 5.0) -> StragglerReport:
        """``nbt.stragglers`` of the summarized ranks (same numbers as on the full Trace)."""
        from nbtoolkit.trace.stragglers import summary_stragglers

        return summary_stragglers(self, threshold_pct=threshold_pct)

    def load_ranks(self, ranks: Iterable[int]) -> Trace:
        """The events of the chosen ranks as a Trace (from the cache when the summary has one)."""
        chosen = sorted(set(ranks))
        unknown = [r for r in chosen if r not in self.info]
        if unknown:
            raise TraceError(f"ranks {unknown} are not in this summary; ranks present: {_short(self.ranks)}")
        from nbtoolkit.trace.summary_ranks import load_summary_ranks

        return load_summary_ranks(self, chosen)

    def figures(self, *, top: int = 4) -> Any:
        """The scale views: rank x step heatmaps, overlap distribution, straggler ranking + lanes."""
        from nbtoolkit.trace.scale_views import summary_figures

        return summary_figures(self, top=top)

    # ---------------------------------------------------------------- records
    def to_records(self) -> dict[str, Any]:
        """Plain data (lists, dicts, numbers): what a worker or a node sends back, and the cache holds.

        Building DataFrames costs about a millisecond each; hundreds of ranks are combined from
        records and the frames are built once (:meth:`from_records`).
        """
        data: dict[str, Any] = {
            "include_last_step": self.include_last_step,
            "step_labels": list(self.step_labels),
            "notes": list(self.notes),
            "info": [self.info[r].to_json() for r in self.ranks],
        }
        for name in FRAMES:
            frame = getattr(self, name)
            # column by column: DataFrame.to_dict("list") costs several times more on small frames
            data[name] = {
                "columns": list(frame.columns),
                "data": {c: frame[c].tolist() for c in frame.columns},
            }
        if self.critical_path is not None:
            data["critical_path"] = self.critical_path.to_dict("records")
        return data

    @classmethod
    def from_records(cls, parts: Iterable[dict[str, Any]], *, notes: Iterable[str] = ()) -> TraceSummary:
        """One summary from the records of disjoint rank sets (:meth:`to_records`); frames built once."""
        import pandas as pd

        parts = list(parts)
        if not parts:
            raise TraceError("TraceSummary.from_records() got no records")
        info: dict[int, RankInfo] = {}
        for part in parts:
            for entry in part["info"]:
                rank_info = RankInfo.from_json(entry)
                if rank_info.rank in info:
                    raise TraceError(
                        f"rank {rank_info.rank} appears twice ({info[rank_info.rank].source} and "
                        f"{rank_info.source}); keep one trace per rank"
                    )
                info[rank_info.rank] = rank_info
        frames = {}
        for name in FRAMES:
            columns = parts[0][name]["columns"]
            merged: dict[str, list[Any]] = {c: [] for c in columns}
            for part in parts:
                for c in columns:
                    merged[c].extend(part[name]["data"].get(c, []))
            keys = ["rank", "step"] if "step" in columns else ["rank"]
            frame = pd.DataFrame(merged, columns=columns)
            frames[name] = frame.sort_values(keys, kind="stable", ignore_index=True) if len(frame) else frame
        all_notes = [n for p in parts for n in p["notes"]]
        paths = None
        if all("critical_path" in p for p in parts):  # kinds differ by rank: a kind absent is 0 %
            rows = [row for p in parts for row in p["critical_path"]]
            paths = pd.DataFrame(rows).fillna(0.0)
            paths = paths.sort_values("rank", ignore_index=True) if len(paths) else paths
        return cls(
            **frames,
            critical_path=paths,
            info=dict(sorted(info.items())),
            step_labels=sorted({label for p in parts for label in p["step_labels"]}),
            include_last_step=bool(parts[0]["include_last_step"]),
            notes=list(dict.fromkeys([*notes, *all_notes])),
        )

    # ---------------------------------------------------------------- combine
    @classmethod
    def combine(cls, parts: Iterable[TraceSummary], *, notes: Iterable[str] = ()) -> TraceSummary:
        """One summary from summaries of disjoint rank sets (e.g. one per worker or node)."""
        import pandas as pd

        parts = list(parts)
        if not parts:
            raise TraceError("TraceSummary.combine() got no summaries")
        info: dict[int, RankInfo] = {}
        for part in parts:
            for rank, rank_info in part.info.items():
                if rank in info:
                    raise TraceError(
                        f"rank {rank} appears twice ({info[rank].source} and {rank_info.source}); "
                        "keep one trace per rank"
                    )
                info[rank] = rank_info

        def cat(name: str, keys: list[str]) -> pd.DataFrame:
            frames = [getattr(p, name) for p in parts if len(getattr(p, name))]
            if not frames:
                return getattr(parts[0], name)
            return pd.concat(frames, ignore_index=True).sort_values(keys, ignore_index=True)

        all_notes = [n for p in parts for n in p.notes]
        return cls(
            overlap=cat("overlap", ["rank"]),
            overlap_by_step=cat("overlap_by_step", ["rank", "step"]),
            steps=cat("steps", ["rank", "step"]),
            spans=cat("spans", ["rank"]),
            temporal=cat("temporal", ["rank"]),
            info=dict(sorted(info.items())),
            step_labels=sorted({label for p in parts for label in p.step_labels}),
            include_last_step=parts[0].include_last_step,
            notes=list(dict.fromkeys([*notes, *all_notes])),
            failed={k: v for p in parts for k, v in p.failed.items()},
            missing_ranks=sorted({r for p in parts for r in p.missing_ranks}),
            cache_dir=parts[0].cache_dir,
        )

    # ---------------------------------------------------------------- display
    def _headline(self) -> str:
        ranks = self.ranks
        overlap = self.overlap["overlap_pct"].dropna()
        text = f"TraceSummary: {len(ranks)} rank(s)"
        if self.world_size:
            text += f" of world size {self.world_size}"
        if len(overlap):
            text += (
                f"; overlap {overlap.median():.1f} % median"
                f" (min {overlap.min():.1f} % on rank {int(self.overlap.loc[overlap.idxmin(), 'rank'])},"
                f" max {overlap.max():.1f} %)"
            )
        return text

    def _problems(self) -> list[str]:
        lines = [f"skipped {_name(f)}: {why}" for f, why in sorted(self.failed.items())]
        if self.missing_ranks:
            lines.append(f"missing ranks (no trace file): {_short(self.missing_ranks)}")
        return lines + list(self.notes)

    def _text(self) -> str:
        lines = [self._headline()]
        if len(self.info) >= 2:
            lines.append(self.stragglers()._headline())
        worst = self.overlap.sort_values("exposed_comm_us", ascending=False).head(5)
        if len(worst):
            lines.append("Most exposed communication:")
            lines += [
                f"  rank {int(r.rank):5d}  {r.exposed_comm_us / 1e3:10.3f} ms exposed  "
                f"{r.overlap_pct:5.1f} % overlap"
                for r in worst.itertuples(index=False)
            ]
        problems = self._problems()
        if problems:
            lines.append("Notes:")
            lines += [f"  - {p}" for p in problems]
        return "\n".join(lines)

    def _html(self) -> str:
        parts = [f"<div class='nbt-trace-summary'><b>{escape(self._headline())}</b>"]
        if len(self.info) >= 2:
            parts.append(f"<p>{escape(self.stragglers()._headline())}</p>")
        worst = self.overlap.sort_values("exposed_comm_us", ascending=False).head(10)
        parts.append("<p>Most exposed communication (µs)</p>" + html_table(worst, float_format="{:,.1f}"))
        problems = self._problems()
        if problems:
            parts.append("<ul>" + "".join(f"<li>{escape(p)}</li>" for p in problems) + "</ul>")
        parts.append("</div>")
        return "".join(parts)


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 16 else f"[{', '.join(map(str, ranks[:16]))}, ...] ({len(ranks)})"
