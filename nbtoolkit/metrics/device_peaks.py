"""Dense peak FLOP/s of known accelerators, looked up by the name torch reports.

The denominator of MFU/HFU is the device's peak rate for the precision the matrix
products ran in. Vendors' datasheets quote tensor-core rates "with sparsity" (2:4
structured sparsity, twice the dense rate) next to or instead of dense rates; a
training step's matrix products are dense, so every number here is the DENSE peak.
Where a datasheet gives only the sparse figure (marked ``*`` there), the dense one is
half of it, and the comment says so.

Precisions (the keys of :attr:`DevicePeak.flops`):

``bf16``, ``fp16``
    tensor-core rate with FP32 accumulation (what torch's matmuls use).
``tf32``
    FP32 matmuls on tensor cores, which torch uses when
    ``torch.backends.cuda.matmul.allow_tf32`` is on or
    ``torch.get_float32_matmul_precision()`` is not ``"highest"``.
``fp32``
    plain FP32 (non-tensor-core) rate, torch's default for FP32 matmuls on NVIDIA.
    On AMD Instinct the figure is the FP32 *matrix* rate.

A device that is not here, or a precision a known device has no figure for (V100 has
no bf16 tensor cores), returns None: the caller measures the peak instead
(``nbtoolkit.metrics.measure``). Pure functions, no torch import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "DEVICE_PEAKS",
    "DevicePeak",
    "known_devices",
    "lookup_device",
    "lookup_peak",
    "precision_of",
]

T = 1e12  # TFLOP/s -> FLOP/s


@dataclass(frozen=True)
class DevicePeak:
    """One accelerator: its display name, dense peak FLOP/s per precision, and the source."""

    name: str
    flops: dict[str, float]
    source: str


# (pattern matched against the lower-cased device name, entry). First match wins, so
# specific names (``h100 nvl``, ``h100 pcie``) come before the generic one (``h100``).
DEVICE_PEAKS: tuple[tuple[str, DevicePeak], ...] = (
    # NVIDIA GH200 Grace Hopper Superchip datasheet: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*
    # (* with sparsity, dense = half). Same Hopper GPU as H100/H200 SXM.
    (r"gh200", DevicePeak("NVIDIA GH200", {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T,
                                           "fp16": 989.5 * T}, "NVIDIA GH200 datasheet")),
    # NVIDIA H200 datasheet, H200 NVL column: FP32 60 TF, TF32 835 TF*, BF16/FP16 1,671 TF*.
    (r"h200 nvl", DevicePeak("NVIDIA H200 NVL", {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T,
                                                 "fp16": 835.5 * T}, "NVIDIA H200 datasheet")),
    # NVIDIA H200 datasheet, H200 SXM column: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*.
    (r"h200", DevicePeak("NVIDIA H200 SXM", {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T,
                                             "fp16": 989.5 * T}, "NVIDIA H200 datasheet")),
    # NVIDIA H100 datasheet, H100 NVL column: FP32 60 TF, TF32 835 TF*, BF16/FP16 1,671 TF*.
    (r"h100 nvl", DevicePeak("NVIDIA H100 NVL", {"fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T,
                                                 "fp16": 835.5 * T}, "NVIDIA H100 datasheet")),
    # NVIDIA H100 datasheet, H100 PCIe column: FP32 51 TF, TF32 756 TF*, BF16/FP16 1,513 TF*.
    (r"h100.*pcie", DevicePeak("NVIDIA H100 PCIe", {"fp32": 51 * T, "tf32": 378 * T, "bf16": 756.5 * T,
                                                    "fp16": 756.5 * T}, "NVIDIA H100 datasheet")),
    # NVIDIA H100 datasheet, H100 SXM column: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*.
    # torch names the SXM part "NVIDIA H100 80GB HBM3".
    (r"h100", DevicePeak("NVIDIA H100 SXM", {"fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T,
                                             "fp16": 989.5 * T}, "NVIDIA H100 datasheet")),
    # NVIDIA HGX B200 datasheet (8 GPUs): FP32 600 TF, TF32 18 PF*, FP16/BF16 36 PF* -> per GPU
    # FP32 75 TF, TF32 1.125 PF, BF16/FP16 2.25 PF dense. (GB200 parts run faster: not matched.)
    (r"(?<!g)b200", DevicePeak("NVIDIA B200", {"fp32": 75 * T, "tf32": 1125 * T, "bf16": 2250 * T,
                                               "fp16": 2250 * T}, "NVIDIA HGX B200 datasheet")),
    # NVIDIA A100 datasheet (40 GB and 80 GB, SXM and PCIe alike): FP32 19.5 TF, TF32 156 TF,
    # BF16/FP16 312 TF (dense; 312/624 with sparsity). Also Meta's "A100-PG509-200" boards.
    (r"a100", DevicePeak("NVIDIA A100", {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T,
                                         "fp16": 312 * T}, "NVIDIA A100 datasheet")),
    # AMD Instinct MI325X datasheet: same compute as MI300X (FP32 matrix 163.4 TF, TF32 653.7 TF,
    # BF16/FP16 1,307.4 TF dense).
    (r"mi325x", DevicePeak("AMD Instinct MI325X", {"fp32": 163.4 * T, "tf32": 653.7 * T,
                                                   "bf16": 1307.4 * T, "fp16": 1307.4 * T},
                           "AMD Instinct MI325X datasheet")),
    # AMD Instinct MI300X datasheet: FP32 matrix 163.4 TF, TF32 653.7 TF, BF16/FP16 1,307.4 TF
    # (dense; 1,307.4/2,614.9 with sparsity).
    (r"mi300x", DevicePeak("AMD Instinct MI300X", {"fp32": 163.4 * T, "tf32": 653.7 * T,
                                                   "bf16": 1307.4 * T, "fp16": 1307.4 * T},
                           "AMD Instinct MI300X datasheet")),
    # NVIDIA V100S datasheet: FP32 16.4 TF, tensor (FP16) 130 TF. No BF16, no TF32 on Volta.
    (r"v100s", DevicePeak("NVIDIA V100S PCIe", {"fp32": 16.4 * T, "fp16": 130 * T},
                          "NVIDIA V100 datasheet")),
    # NVIDIA V100 datasheet, PCIe column: FP32 14 TF, tensor (FP16) 112 TF.
    (r"v100.*pcie", DevicePeak("NVIDIA V100 PCIe", {"fp32": 14 * T, "fp16": 112 * T},
                               "NVIDIA V100 datasheet")),
    # NVIDIA V100 datasheet, SXM2 column: FP32 15.7 TF, tensor (FP16) 125 TF.
    (r"v100", DevicePeak("NVIDIA V100 SXM2", {"fp32": 15.7 * T, "fp16": 125 * T},
                         "NVIDIA V100 datasheet")),
    # NVIDIA L40S datasheet: FP32 91.6 TF, TF32 183 | 366* TF, BF16/FP16 362.05 | 733* TF (the
    # datasheet gives the dense figure itself, a little under half the sparse one).
    (r"\bl40s\b", DevicePeak("NVIDIA L40S", {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362.05 * T,
                                             "fp16": 362.05 * T}, "NVIDIA L40S datasheet")),
    # NVIDIA L40 datasheet: FP32 90.5 TF, TF32 90.5 | 181* TF, BF16/FP16 181.05 | 362.1* TF.
    (r"\bl40\b", DevicePeak("NVIDIA L40", {"fp32": 90.5 * T, "tf32": 90.5 * T, "bf16": 181.05 * T,
                                           "fp16": 181.05 * T}, "NVIDIA L40 datasheet")),
    # NVIDIA L4 datasheet: FP32 30.3 TF, TF32 120 TF*, BF16/FP16 242 TF*.
    (r"\bl4\b", DevicePeak("NVIDIA L4", {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T,
                                         "fp16": 121 * T}, "NVIDIA L4 datasheet")),
    # NVIDIA A40 datasheet: FP32 37.4 TF, TF32 74.8 TF, BF16/FP16 149.7 TF (dense).
    (r"\ba40\b", DevicePeak("NVIDIA A40", {"fp32": 37.4 * T, "tf32": 74.8 * T, "bf16": 149.7 * T,
                                           "fp16": 149.7 * T}, "NVIDIA A40 datasheet")),
    # NVIDIA A10 datasheet: FP32 31.2 TF, TF32 62.5 TF, BF16/FP16 125 TF (dense). Not the A10G.
    (r"\ba10\b", DevicePeak("NVIDIA A10", {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T,
                                           "fp16": 125 * T}, "NVIDIA A10 datasheet")),
    # NVIDIA T4 datasheet: FP32 8.1 TF, FP16 (mixed precision) 65 TF. No BF16, no TF32.
    (r"\bt4\b", DevicePeak("NVIDIA T4", {"fp32": 8.1 * T, "fp16": 65 * T}, "NVIDIA T4 datasheet")),
    # NVIDIA Ada GPU architecture whitepaper, RTX 4090: FP32 82.6 TF, TF32 82.6 TF,
    # BF16/FP16 tensor with FP32 accumulate 165.2 TF (dense).
    (r"rtx 4090", DevicePeak("NVIDIA GeForce RTX 4090", {"fp32": 82.6 * T, "tf32": 82.6 * T,
                                                        "bf16": 165.2 * T, "fp16": 165.2 * T},
                             "NVIDIA Ada architecture whitepaper")),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090: FP32 35.6 TF, TF32 35.6 TF, BF16/FP16 tensor with
    # FP32 accumulate 71 TF (dense). The 3090 Ti is faster: not matched.
    (r"rtx 3090(?! ti)", DevicePeak("NVIDIA GeForce RTX 3090", {"fp32": 35.6 * T, "tf32": 35.6 * T,
                                                               "bf16": 71 * T, "fp16": 71 * T},
                                    "NVIDIA GA102 whitepaper")),
    # NVIDIA Turing architecture whitepaper, RTX 2080 Ti (reference clocks): FP32 13.4 TF,
    # FP16 tensor with FP32 accumulate 53.8 TF. No BF16, no TF32.
    (r"rtx 2080 ti", DevicePeak("NVIDIA GeForce RTX 2080 Ti", {"fp32": 13.4 * T, "fp16": 53.8 * T},
                                "NVIDIA Turing architecture whitepaper")),
)

_PRECISION_OF_DTYPE = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}


def precision_of(dtype: str, *, tf32: bool = False) -> str | None:
    """The table's precision key for a torch dtype name (``"bfloat16"`` -> ``"bf16"``).

    ``float32`` maps to ``"tf32"`` when ``tf32`` is true (FP32 matmuls allowed on tensor
    cores), else ``"fp32"``. Other dtypes (float64, float8, integers) have no key: None.
    """
    name = dtype.removeprefix("torch.")
    key = _PRECISION_OF_DTYPE.get(name)
    if key == "fp32" and tf32:
        return "tf32"
    return key


def lookup_device(device_name: str) -> DevicePeak | None:
    """The table entry whose pattern matches ``device_name`` (as ``torch.cuda.get_device_name``
    returns it, e.g. ``"NVIDIA A100-SXM4-80GB"``, ``"NVIDIA H100 80GB HBM3"``), or None."""
    lowered = " ".join(device_name.lower().replace("_", " ").split())
    for pattern, entry in DEVICE_PEAKS:
        if re.search(pattern, lowered):
            return entry
    return None


def lookup_peak(device_name: str, precision: str) -> tuple[float, str] | None:
    """(dense peak FLOP/s, source text) of that device in that precision, or None if unknown.

    The source text reads ``"table: NVIDIA A100 bf16 dense (312 TFLOP/s, NVIDIA A100 datasheet)"``.
    """
    entry = lookup_device(device_name)
    if entry is None or precision not in entry.flops:
        return None
    flops = entry.flops[precision]
    return flops, f"table: {entry.name} {precision} dense ({flops / T:,.1f} TFLOP/s, {entry.source})"


def known_devices() -> list[dict[str, object]]:
    """Every table entry as a record: ``device``, one column per precision (TFLOP/s), ``source``."""
    records: list[dict[str, object]] = []
    for _pattern, entry in DEVICE_PEAKS:
        record: dict[str, object] = {"device": entry.name}
        for key in ("bf16", "fp16", "tf32", "fp32"):
            record[f"{key}_tflops"] = entry.flops[key] / T if key in entry.flops else None
        record["source"] = entry.source
        records.append(record)
    return records
