"""The accelerators nbt.fit predicts for: memory, dense peaks, and the links collectives run over.

Dense FLOP/s peaks come from :mod:`nbtoolkit.metrics.device_peaks` (one table of peaks in the
project, each with its datasheet); this table adds what a fit needs beside them: the memory a
rank has, and the bandwidth of the links between ranks. Bandwidths are per GPU and per
direction (a datasheet's "900 GB/s NVLink" is both directions together: 450 GB/s each way),
since a ring collective sends and receives at once.

``devices`` strings read ``"8xH100-80GB"`` (8 cards) or ``"H100-80GB"`` (one); a :class:`Card`
of your own is accepted wherever a name is (``devices=(16, Card(...))``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["CARDS", "Card", "known_cards", "parse_devices"]

GiB = 2**30
G = 1e9


@dataclass(frozen=True)
class Card:
    """One accelerator.

    ``memory_bytes``: what its datasheet calls its memory (torch reports a little less as total:
    an H100 80GB shows 79.2 GiB; the fit's fixed margin covers it). ``flops``: dense peak FLOP/s by
    precision (``bf16``, ``fp16``, ``fp32``, ``tf32``). ``intra_node_Bps``: bytes/s per direction
    between cards of one node (NVLink where the cards have it, else PCIe); ``network_Bps``: per
    card and direction between nodes (a typical fabric, change it for yours);
    ``cards_per_node``: how many share the fast link. ``source``: where each figure comes from.
    """

    name: str
    memory_bytes: int
    flops: dict[str, float]
    intra_node_Bps: float
    network_Bps: float = 50 * G  # 400 Gb/s InfiniBand NDR / RoCE per GPU, the common cluster fabric
    cards_per_node: int = 8
    source: str = "given"
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s in ``precision`` (fp32 falls back on tf32 where only that is given)."""
        if precision in self.flops:
            return self.flops[precision]
        raise NbtUsageError(
            f"card {self.name} has no {precision} peak in its table (it has {sorted(self.flops)}): "
            f"choose another amp, or give a Card with flops={{{precision!r}: ...}}"
        )


def _peaks(device_name: str) -> dict[str, float]:
    from nbtoolkit.metrics.device_peaks import lookup_device

    entry = lookup_device(device_name)
    assert entry is not None, device_name  # every card below is in the peak table
    return dict(entry.flops)


def _card(name: str, device_name: str, memory_gib: float, intra_Bps: float, source: str, *,
          aliases: tuple[str, ...] = (), cards_per_node: int = 8) -> Card:
    return Card(
        name=name, memory_bytes=int(memory_gib * GiB), flops=_peaks(device_name), intra_node_Bps=intra_Bps,
        cards_per_node=cards_per_node, source=source, aliases=aliases,
    )


# name -> Card. Peaks: metrics/device_peaks.py (datasheet named there). Memory and links:
CARDS: dict[str, Card] = {c.name: c for c in (
    # NVIDIA H100 datasheet, SXM column: 80 GB HBM3; NVLink 900 GB/s (450 each way).
    _card("H100-80GB", "NVIDIA H100 80GB HBM3", 80, 450 * G,
          "NVIDIA H100 datasheet (SXM: 80 GB, NVLink 900 GB/s)",
          aliases=("H100", "H100-SXM", "H100-SXM-80GB")),
    # NVIDIA H100 datasheet, PCIe column: 80 GB HBM2e; PCIe Gen5 128 GB/s (64 each way); NVLink
    # bridges join pairs only, so eight cards talk over PCIe.
    _card("H100-PCIe", "NVIDIA H100 PCIe", 80, 64 * G,
          "NVIDIA H100 datasheet (PCIe: 80 GB, PCIe Gen5 128 GB/s)", aliases=("H100-PCIe-80GB",)),
    # NVIDIA H200 datasheet, SXM column: 141 GB HBM3e; NVLink 900 GB/s.
    _card("H200", "NVIDIA H200", 141, 450 * G,
          "NVIDIA H200 datasheet (SXM: 141 GB, NVLink 900 GB/s)", aliases=("H200-141GB", "H200-SXM")),
    # NVIDIA A100 datasheet, SXM columns: 80 GB HBM2e / 40 GB HBM2; NVLink 600 GB/s (300 each way).
    _card("A100-80GB", "NVIDIA A100-SXM4-80GB", 80, 300 * G,
          "NVIDIA A100 datasheet (SXM: 80 GB, NVLink 600 GB/s)", aliases=("A100-SXM-80GB",)),
    _card("A100-40GB", "NVIDIA A100-SXM4-40GB", 40, 300 * G,
          "NVIDIA A100 datasheet (SXM: 40 GB, NVLink 600 GB/s)", aliases=("A100", "A100-SXM-40GB")),
    # NVIDIA A100 datasheet, PCIe column: 80 GB; PCIe Gen4 64 GB/s (32 each way).
    _card("A100-PCIe-80GB", "NVIDIA A100 PCIe 80GB", 80, 32 * G,
          "NVIDIA A100 datasheet (PCIe: 80 GB, PCIe Gen4 64 GB/s)"),
    # NVIDIA L4 datasheet: 24 GB GDDR6; PCIe Gen4 x16 64 GB/s; no NVLink.
    _card("L4", "NVIDIA L4", 24, 32 * G,
          "NVIDIA L4 datasheet (24 GB, PCIe Gen4 64 GB/s)", aliases=("L4-24GB",)),
    # NVIDIA L40S datasheet: 48 GB GDDR6; PCIe Gen4 x16 64 GB/s; no NVLink.
    _card("L40S", "NVIDIA L40S", 48, 32 * G,
          "NVIDIA L40S datasheet (48 GB, PCIe Gen4 64 GB/s)", aliases=("L40S-48GB",)),
    # NVIDIA HGX B200 datasheet: 1,440 GB for 8 GPUs (180 each); NVLink 1.8 TB/s per GPU.
    _card("B200", "NVIDIA B200", 180, 900 * G,
          "NVIDIA HGX B200 datasheet (180 GB per GPU, NVLink 1.8 TB/s)", aliases=("B200-180GB",)),
)}


def known_cards() -> list[str]:
    return sorted(CARDS)


def _lookup(name: str) -> Card:
    wanted = name.strip().lower()
    for card in CARDS.values():
        if wanted == card.name.lower() or wanted in (a.lower() for a in card.aliases):
            return card
    raise NbtUsageError(
        f"unknown card {name!r}: known cards are {', '.join(known_cards())}; for another card pass "
        "nbtoolkit.capacity.cards.Card(name=..., memory_bytes=..., flops={'bf16': ...}, intra_node_Bps=...)"
    )


def parse_devices(devices: Any) -> tuple[int, Card]:
    """``"8xH100-80GB"`` -> (8, the H100 card); ``"H100"`` -> (1, ...); ``(n, Card)`` or a Card as given."""
    if isinstance(devices, Card):
        return 1, devices
    if isinstance(devices, tuple) and len(devices) == 2 and isinstance(devices[1], (Card, str)):
        count, card = devices
        card = card if isinstance(card, Card) else _lookup(card)
    elif isinstance(devices, str):
        match = re.fullmatch(r"\s*(?:(\d+)\s*[x×*]\s*)?(.+?)\s*", devices)
        assert match is not None  # the pattern matches any non-empty text
        count = int(match.group(1) or 1)
        card = _lookup(match.group(2))
    else:
        raise NbtUsageError(
            f"devices must read like '8xH100-80GB' or be (count, Card), got {devices!r}"
        )
    if not isinstance(count, int) or count < 1:
        raise NbtUsageError(f"the number of devices must be a positive whole number, got {count!r}")
    return count, card
