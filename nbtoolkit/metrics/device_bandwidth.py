"""Peak DRAM (HBM/GDDR) bandwidth of the accelerators in :mod:`nbtoolkit.metrics.device_peaks`.

The roofline's memory roof. Figures are the vendors' datasheet numbers in bytes per second
(1 GB/s = 1e9 B/s), keyed by the display name of the device's entry in the peak table, so a
device is matched by one set of patterns. Where one name covers parts with different memory
(A100 40 GB / 80 GB, H100/H200 PCIe and NVL), the device name torch reports decides.
"""

from __future__ import annotations

import re

from nbtoolkit.metrics.device_peaks import lookup_device

__all__ = ["MEMORY_BANDWIDTH", "lookup_bandwidth"]

G = 1e9

# display name -> [(pattern on the lower-cased device name or "" for any, bytes/s, source)]
MEMORY_BANDWIDTH: dict[str, list[tuple[str, float, str]]] = {
    "NVIDIA GH200": [("", 4000 * G, "NVIDIA GH200 datasheet (HBM3)")],
    "NVIDIA H200 NVL": [("", 4800 * G, "NVIDIA H200 datasheet")],
    "NVIDIA H200 SXM": [("", 4800 * G, "NVIDIA H200 datasheet")],
    "NVIDIA H100 NVL": [("", 3900 * G, "NVIDIA H100 datasheet")],
    "NVIDIA H100 PCIe": [("", 2000 * G, "NVIDIA H100 datasheet")],
    "NVIDIA H100 SXM": [("", 3350 * G, "NVIDIA H100 datasheet")],
    "NVIDIA B200": [("", 8000 * G, "NVIDIA HGX B200 datasheet")],
    # A100 datasheet: 40 GB HBM2 1,555 GB/s; 80 GB PCIe 1,935 GB/s; 80 GB SXM 2,039 GB/s
    "NVIDIA A100": [("80gb.*pcie|pcie.*80gb", 1935 * G, "NVIDIA A100 datasheet (80 GB PCIe)"),
                    ("80gb", 2039 * G, "NVIDIA A100 datasheet (80 GB SXM)"),
                    ("", 1555 * G, "NVIDIA A100 datasheet (40 GB)")],
    "AMD Instinct MI325X": [("", 6000 * G, "AMD Instinct MI325X datasheet")],
    "AMD Instinct MI300X": [("", 5300 * G, "AMD Instinct MI300X datasheet")],
    "NVIDIA V100S PCIe": [("", 1134 * G, "NVIDIA V100 datasheet")],
    "NVIDIA V100 PCIe": [("", 900 * G, "NVIDIA V100 datasheet")],
    "NVIDIA V100 SXM2": [("", 900 * G, "NVIDIA V100 datasheet")],
    "NVIDIA L40S": [("", 864 * G, "NVIDIA L40S datasheet")],
    "NVIDIA L4": [("", 300 * G, "NVIDIA L4 datasheet")],
    "NVIDIA A40": [("", 696 * G, "NVIDIA A40 datasheet")],
    "NVIDIA A10": [("", 600 * G, "NVIDIA A10 datasheet")],
    "NVIDIA T4": [("", 320 * G, "NVIDIA T4 datasheet")],
    "NVIDIA GeForce RTX 4090": [("", 1008 * G, "NVIDIA Ada architecture whitepaper")],
    "NVIDIA GeForce RTX 3090": [("", 936 * G, "NVIDIA GA102 whitepaper")],
    "NVIDIA GeForce RTX 2080 Ti": [("", 616 * G, "NVIDIA Turing architecture whitepaper")],
}


def lookup_bandwidth(device_name: str) -> tuple[float, str] | None:
    """(peak DRAM bytes/s, source text) of the device torch names ``device_name``, or None."""
    entry = lookup_device(device_name)
    if entry is None or entry.name not in MEMORY_BANDWIDTH:
        return None
    lowered = device_name.lower()
    for pattern, value, source in MEMORY_BANDWIDTH[entry.name]:
        if not pattern or re.search(pattern, lowered):
            return value, f"table: {entry.name} {value / G:,.0f} GB/s ({source})"
    return None
