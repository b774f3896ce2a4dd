"""The table nbt.fit returns: one row per configuration, the recommended one, and how to check it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.capacity.cards import Card
from nbtoolkit.capacity.step_time import ASSUMPTIONS
from nbtoolkit.capacity.strategies import CATEGORIES
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes, format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FitResult", "FitSetup"]


@dataclass(frozen=True)
class FitSetup:
    """What the prediction was made for (kept so that ``verify`` runs the same configuration)."""

    make_model: Callable[[], Any]
    make_batch: Callable[[int], Any]
    world: int
    card: Card
    optimizer: str
    loss_fn: Callable[[Any, Any], Any] | None
    blocks: Sequence[str] | None
    parameter_count: int
    zero_bucket: int


@dataclass(repr=False)
class FitResult(Result):
    """``frame``: one row per configuration (byte columns per category, ``fits``, ``headroom_bytes``,
    the roofline ``step_time_s``, ``recommended``); ``setup``: what was asked."""

    frame: pd.DataFrame
    setup: FitSetup

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], setup: FitSetup) -> FitResult:
        import pandas as pd

        frame = pd.DataFrame(rows)
        fitting = frame[frame["fits"]]
        frame["recommended"] = False
        if not fitting.empty:
            frame.loc[fitting["samples_per_s"].idxmax(), "recommended"] = True
        return cls(frame=frame, setup=setup)

    @property
    def recommended(self) -> pd.Series | None:
        """The row with the highest predicted samples/s among those that fit with the margin, or None."""
        chosen = self.frame[self.frame["recommended"]]
        return None if chosen.empty else chosen.iloc[0]

    def verify(self, cluster: Any, rows: Sequence[int] | None = None, *, steps: int = 2) -> Any:
        """Run ``rows`` (indexes of ``frame``; default the recommended row) for a few steps on the
        cluster's ranks and return the table with measured per-rank peaks beside the predicted ones."""
        from nbtoolkit.capacity.verify import verify_rows

        return verify_rows(self, cluster, rows, steps=steps)

    def reading(self) -> str:
        card, world = self.setup.card, self.setup.world
        best = self.recommended
        fits = int(self.frame["fits"].sum())
        head = (f"{fits} of {len(self.frame)} configurations fit {world} x {card.name} "
                f"({format_bytes(card.memory_bytes)} each)")
        if best is None:
            short = self.frame.loc[self.frame["headroom_bytes"].idxmax()]
            return (f"{head}; none fits: the closest, {_label(short)}, needs "
                    f"{format_bytes(-int(short['headroom_bytes']))} more per rank")
        step = format_seconds(float(best["step_time_s"]))
        return (f"{head}; recommended: {_label(best)} (predicted {step} "
                f"per step, {format_bytes(int(best['headroom_bytes']))} to spare per rank)")

    def _display_frame(self) -> pd.DataFrame:
        import pandas as pd

        f = self.frame
        shown = pd.DataFrame({
            "configuration": [_label(r) for _, r in f.iterrows()],
            **{c.replace("_", " "): [format_bytes(v) for v in f[f"{c}_bytes"]] for c in CATEGORIES},
            "margin": [format_bytes(v) for v in f["allocator_margin_bytes"]],
            "needed": [format_bytes(v) for v in f["needed_bytes"]],
            "fits": ["yes" if ok else f"no, {format_bytes(-h)} short"
                     for ok, h in zip(f["fits"], f["headroom_bytes"], strict=True)],
            "step (estimate)": [format_seconds(v) for v in f["step_time_s"]],
            "": ["<- recommended" if r else "" for r in f["recommended"]],
        })
        return shown

    def _notes(self) -> list[str]:
        return [
            *ASSUMPTIONS,
            ("margin: 5% of the peak for the caching allocator's fragmentation plus 1 GiB for the CUDA "
             "context, cuBLAS workspace and NCCL buffers"),
            f"card figures: {self.setup.card.source}",
        ]

    def _text(self) -> str:
        import pandas as pd

        with pd.option_context("display.width", 250, "display.max_columns", 30):
            table = self._display_frame().to_string(index=False)
        notes = "\n".join(f"- {n}" for n in self._notes())
        return f"FitResult: {self.reading()}\n{table}\n{notes}"

    def _html(self) -> str:
        notes = "".join(f"<li>{escape(n)}</li>" for n in self._notes())
        return (f"<div class='nbt-fit'><b>FitResult</b>: {escape(self.reading())}"
                f"{html_table(self._display_frame(), max_rows=200)}<ul>{notes}</ul></div>")


def _label(row: Any) -> str:
    recompute = "" if row["recompute"] == "none" else f", recompute {row['recompute']}"
    if row["recompute"] == "auto":
        recompute += (f" ({row['recomputed_blocks']} of {row['blocks']} blocks)" if row["blocks"]
                      else " (no repeated blocks: none)")
    return f"{row['strategy']}, micro-batch {row['micro_batch']}, {row['amp']}{recompute}"
