"""A roofline estimate of one step's time: the traced FLOPs at the card's dense peak, plus the
strategy's collectives at the links' bandwidth.

It is an estimate with stated assumptions (:data:`ASSUMPTIONS`), meant to rank configurations,
not to promise a time: real steps reach a fraction of the peak (40-60% MFU is good for large
transformers), and real collectives overlap partly with compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbtoolkit.capacity.cards import Card
from nbtoolkit.capacity.strategies import communication_bytes
from nbtoolkit.capacity.tracing import StepTrace

__all__ = ["ASSUMPTIONS", "StepTime", "step_time"]

ASSUMPTIONS = (
    ("step time is a roofline estimate, not a measurement: every traced FLOP (forward, backward, "
     "recompute) runs at the card's dense peak for the dtype that carried most FLOPs (real steps reach "
     "40-60% of it), and memory-bound ops cost nothing beyond that"),
    ("collectives are rings at the slowest link's bandwidth per direction (NVLink/PCIe within a node of "
     "cards_per_node cards, the network beyond) and do not overlap compute (an upper bound on their cost)"),
)

_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    communication_s: float
    link: str

    @property
    def total_s(self) -> float:
        return self.compute_s + self.communication_s


def step_time(trace: StepTrace, card: Card, strategy: str, world: int, amp: str | None) -> StepTime:
    """Compute at the dense peak plus the strategy's collectives at the slowest link."""
    precision = _PRECISION.get(trace.flops_dtype, "fp32")
    compute = trace.hardware_flops / card.peak(precision)
    within = world <= card.cards_per_node
    bandwidth = card.intra_node_Bps if within else card.network_Bps
    link = "within a node" if within else "across nodes"
    communication = communication_bytes(trace, strategy, world, amp) / bandwidth
    return StepTime(compute_s=compute, communication_s=communication, link=link)
