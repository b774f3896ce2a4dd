"""``FitResult.verify``: run chosen rows on real ranks and put the measured per-rank peak beside the
predicted one.

Each row runs for a few steps on every rank of the cluster with the real strategy
(:mod:`nbtoolkit.capacity.verify_rank`); the measured peak is the largest rank's. Compared with
the prediction *before* the allocator margin (CPU ranks have no caching allocator and no CUDA
context: the margin is for GPUs), and for DDP without its reducer's buckets: they are allocated by
C++ when DDP is built, before the measured steps, and no Python object holds them, so the CPU
measurement (live Python tensors, then the profiler's allocations) cannot see them; on GPUs the
allocator does. gloo's own buffers (CPU-only copies, alive for as long as the other ranks take
to arrive) are not counted either: the rule every CPU rank's peak follows,
:func:`~nbtoolkit.integrations.rank_measure.cpu_peak_growth_bytes`. Rows in bf16 are refused: the CPU ranks'
steps run in the model's own precision, as the integrations do.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Verification", "verify_rows"]


class Verification(Result):
    """``frame``: the verified rows with ``compared_bytes`` (the prediction the measurement can see),
    ``measured_peak_bytes`` (largest rank), the per-rank peaks, and ``error``
    ((compared - measured) / measured)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def _display(self) -> pd.DataFrame:
        import pandas as pd

        f = self.frame
        return pd.DataFrame({
            "strategy": f["strategy"],
            "recompute": [
                r if r != "auto" else f"auto ({k} of {b})"
                for r, k, b in zip(f["recompute"], f["recomputed_blocks"], f["blocks"], strict=True)
            ],
            "micro batch": f["micro_batch"],
            "predicted": [format_bytes(v) for v in f["compared_bytes"]],
            "measured": [format_bytes(v) for v in f["measured_peak_bytes"]],
            "error": [f"{e:+.1%}" for e in f["error"]],
        })

    def reading(self) -> str:
        worst = self.frame["error"].abs().max()
        return f"{len(self.frame)} rows run on real ranks; predicted peaks within {worst:.1%} of measured"

    def _text(self) -> str:
        return f"Verification: {self.reading()}\n{self._display().to_string(index=False)}"

    def _html(self) -> str:
        return (f"<div class='nbt-fit'><b>Verification</b>: {escape(self.reading())}"
                f"{html_table(self._display())}</div>")


def verify_rows(fit: Any, cluster: Any, rows: Sequence[int] | None, *, steps: int) -> Verification:
    """``fit``: the FitResult (not imported here: it imports this module to verify itself)."""
    import pandas as pd

    from nbtoolkit.capacity.recompute_blocks import checkpointed_model_fn
    from nbtoolkit.capacity.tracing import default_loss
    from nbtoolkit.capacity.verify_rank import batch_for_rank, measure_on_rank

    setup = fit.setup
    if rows is None:
        best = fit.frame.index[fit.frame["recommended"]]
        if best.empty:
            raise NbtUsageError("no row fits, so there is no recommended row to verify: pass rows=[...]")
        rows = list(best)
    if cluster.world_size != setup.world:
        raise NbtUsageError(
            f"the prediction is for {setup.world} ranks and the cluster has {cluster.world_size}: "
            f"predict for devices=({cluster.world_size}, card) to verify on it"
        )
    measure = MeasureConfig(steps=steps, warmup=1)
    loss_fn = setup.loss_fn or default_loss
    out = []
    for index in rows:
        row = fit.frame.loc[index]
        if row["amp"] != "fp32":
            raise NbtUsageError(
                f"row {index} is in {row['amp']}: verify runs rows in full precision (amp=None) on CPU ranks"
            )
        model_fn = setup.make_model
        if int(row["recomputed_blocks"]):
            model_fn = checkpointed_model_fn(model_fn, setup.blocks, int(row["recomputed_blocks"]))
        batch_fn = functools.partial(batch_for_rank, setup.make_batch, int(row["micro_batch"]))
        strategy, micro, blocks = str(row["strategy"]), int(row["micro_batch"]), setup.blocks
        bucket = setup.zero_bucket
        results = cluster.run(functools.partial(
            measure_on_rank, strategy, model_fn, batch_fn, micro_batch=micro, measure=measure,
            loss_fn=loss_fn, blocks=blocks, zero_bucket=bucket,
        ))
        peaks = [int(r["peak_bytes"]) for r in results]
        measured = max(peaks)
        predicted = int(row["predicted_peak_bytes"])
        if strategy == "ddp":
            predicted -= int(row["communication_buckets_bytes"])  # see the module doc
        out.append({**row.to_dict(), "compared_bytes": predicted, "measured_peak_bytes": measured,
                    "measured_per_rank": peaks,
                    "measured_state_bytes": max(int(r["state_bytes"]) for r in results),
                    "error": (predicted - measured) / measured if measured else float("nan")})
    return Verification(pd.DataFrame(out))
