"""The datasheet table, looked up with the device names real GPU traces carry."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from nbtoolkit.metrics.device_peaks import (
    DEVICE_PEAKS,
    known_devices,
    lookup_device,
    lookup_peak,
    precision_of,
)

# (trace in ../shared/fixtures/traces, table entry torch's device name must map to, or None)
TRACES = [
    ("hta_triton_example/triton_example.json.gz", "NVIDIA A100"),
    ("tracelens_h100_bert/gaunernst_bert-small-uncased__1016001.json.gz", "NVIDIA H100 SXM"),
    ("tracelens_b200_r0/eager_trace.json.gz", "NVIDIA B200"),
    ("tracelens_mi300_rccl_r0/resnet_act_checkpoint.json.gz", "AMD Instinct MI300X"),
    ("param_resnet_rtx2080ti/linear_kineto.json.gz", "NVIDIA GeForce RTX 2080 Ti"),
    ("hta_amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", None),  # "AMD Radeon Graphics"
]


def _device_name(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    trace = orjson.loads(raw)
    names = [d["name"] for d in trace.get("deviceProperties", []) if "name" in d]
    assert names, f"{path} has no deviceProperties"
    return str(names[0])


@pytest.mark.parametrize(("trace", "entry"), TRACES)
def test_device_names_from_real_traces_map_to_their_entry(real_data: Callable[[str], Path], trace: str,
                                                          entry: str | None) -> None:
    name = _device_name(real_data(f"traces/{trace}"))
    found = lookup_device(name)
    assert (found.name if found else None) == entry, name


@pytest.mark.parametrize(
    ("device", "precision", "tflops"),
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312),  # A100 datasheet, dense
        ("NVIDIA A100-PCIE-40GB", "tf32", 156),
        ("NVIDIA A100-PG509-200", "fp32", 19.5),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),  # half of the 1,979 "with sparsity"
        ("NVIDIA H100 PCIe", "fp16", 756.5),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA B200", "bf16", 2250),
        ("AMD Instinct MI300X", "bf16", 1307.4),
        ("Tesla V100-SXM2-32GB", "fp16", 125),
        ("Tesla V100-PCIE-16GB", "fp32", 14),
        ("NVIDIA L4", "bf16", 121),  # half of the 242 "with sparsity"
        ("NVIDIA L4", "tf32", 60),
        ("NVIDIA L4", "fp32", 30.3),
        ("NVIDIA L40S", "bf16", 362.05),  # the datasheet's own dense figure
        ("NVIDIA L40", "bf16", 181.05),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5),
        ("NVIDIA H100 80GB HBM3", "fp32", 67),
        ("NVIDIA H100 PCIe", "tf32", 378),
        ("NVIDIA H100 PCIe", "fp32", 51),
        ("NVIDIA H200", "fp32", 67),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA GH200 480GB", "bf16", 989.5),
        ("NVIDIA A10", "bf16", 125),
        ("NVIDIA A40", "bf16", 149.7),
        ("Tesla T4", "fp16", 65),
    ],
)
def test_dense_peaks(device: str, precision: str, tflops: float) -> None:
    found = lookup_peak(device, precision)
    assert found is not None
    assert found[0] == pytest.approx(tflops * 1e12)
    assert found[1].startswith("table: ") and f"{precision} dense" in found[1]


@pytest.mark.parametrize(
    "device",
    ["NVIDIA GB200", "NVIDIA A10G", "NVIDIA GeForce RTX 3090 Ti", "AMD Radeon Graphics", "cpu", ""],
)
def test_lookalike_and_unknown_names_are_not_guessed(device: str) -> None:
    assert lookup_device(device) is None


def test_a_precision_the_device_lacks_is_unknown() -> None:
    assert lookup_peak("Tesla V100-SXM2-16GB", "bf16") is None  # Volta has no bf16 tensor cores
    assert lookup_peak("Tesla T4", "tf32") is None


def test_precision_of_torch_dtypes() -> None:
    assert precision_of("torch.bfloat16") == "bf16"
    assert precision_of("float16") == "fp16"
    assert precision_of("float32") == "fp32"
    assert precision_of("float32", tf32=True) == "tf32"
    assert precision_of("float64") is None
    assert precision_of("float8_e4m3fn") is None


def test_every_entry_is_consistent() -> None:
    for _pattern, entry in DEVICE_PEAKS:
        assert all(v > 1e12 for v in entry.flops.values()), entry.name
        if "bf16" in entry.flops:
            assert entry.flops["bf16"] == entry.flops["fp16"], entry.name
        if "tf32" in entry.flops:  # tensor-core TF32 is never slower than plain FP32
            assert entry.flops["tf32"] >= entry.flops["fp32"], entry.name
            assert entry.flops["bf16"] >= entry.flops["tf32"], entry.name
    assert len(known_devices()) == len(DEVICE_PEAKS)
