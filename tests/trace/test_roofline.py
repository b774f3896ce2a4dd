"""nbt.roofline: op FLOP formulas against torch's own counter, a CPU step recorded in this session
(shapes and the live FLOP counter agree), real GPU traces (rates below the device's peaks),
and collective bandwidths with nccl-tests' factors.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

import nbtoolkit as nbt
from nbtoolkit.metrics.device_bandwidth import lookup_bandwidth
from nbtoolkit.metrics.device_peaks import lookup_peak
from nbtoolkit.trace.collective_bandwidth import bus_factor, normalize_collective
from nbtoolkit.trace.op_costs import op_class, op_cost
from tests._python import run_python
from tests.trace.conftest import CPU_STEP_SCRIPT


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def test_gemm_formulas_equal_torchs_counter():
    a, b, bias = torch.randn(64, 128), torch.randn(128, 32), torch.randn(32)
    assert op_cost("aten::mm", [[64, 128], [128, 32]], ["float", "float"]).flops == _counted(lambda: a @ b)
    addmm = op_cost("aten::addmm", [[32], [64, 128], [128, 32], [], []], ["float"] * 3 + ["Scalar"] * 2)
    assert addmm.flops == _counted(lambda: torch.addmm(bias, a, b))
    x, y = torch.randn(4, 16, 8), torch.randn(4, 8, 12)
    assert op_cost("aten::bmm", [[4, 16, 8], [4, 8, 12]], ["float", "float"]).flops == _counted(lambda: x @ y)
    bmm = op_cost("aten::bmm", [[4, 16, 8], [4, 8, 12]], ["c10::BFloat16"] * 2)
    assert bmm.precision == "bf16" and bmm.op_class == "GEMM"
    assert bmm.bytes == 2 * (4 * 16 * 8 + 4 * 8 * 12 + 4 * 16 * 12)  # read a, b; write the output


@pytest.mark.parametrize(("stride", "padding"), [(1, 1), (2, 0), (2, 3)])
def test_conv_formula_equals_torchs_counter(stride, padding):
    x, w = torch.randn(2, 3, 17, 17, requires_grad=True), torch.randn(8, 3, 3, 3, requires_grad=True)
    concrete = ["", "", "", f"[{stride}, {stride}]", f"[{padding}, {padding}]", "[1, 1]", "False", "[0, 0]",
                "1"]
    dims = [[2, 3, 17, 17], [8, 3, 3, 3], [], [], [], [], [], [], []]
    types = ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]
    forward = op_cost("aten::convolution", dims, types, concrete)
    assert forward.flops == _counted(lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=padding))
    out = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding)
    grad = torch.ones_like(out)
    backward = op_cost("aten::convolution_backward", [list(out.shape), [2, 3, 17, 17], [8, 3, 3, 3]],
                       ["float"] * 3)
    def forward_and_backward():
        torch.autograd.grad(torch.nn.functional.conv2d(x, w, stride=stride, padding=padding), (x, w), grad)

    both = _counted(forward_and_backward)
    assert backward.flops == both - forward.flops


def test_attention_formulas_follow_each_entry_points_layout():
    b, h, seq, kv, d = 2, 4, 33, 47, 16
    expected = sdpa_flop_count([b, h, seq, d], [b, h, kv, d], [b, h, kv, d])
    bhld = [[b, h, seq, d], [b, h, kv, d], [b, h, kv, d]]
    sdpa = op_cost("aten::_scaled_dot_product_flash_attention", bhld, ["c10::BFloat16"] * 3)
    flash = op_cost("aten::_flash_attention_forward", [[b, seq, h, d], [b, kv, h, d], [b, kv, h, d]],
                    ["c10::BFloat16"] * 3)
    assert sdpa.flops == flash.flops == expected
    assert sdpa.op_class == flash.op_class == "attention"


def test_memory_and_elementwise_costs():
    lookup = op_cost("aten::embedding", [[30522, 512], [1, 141]], ["c10::BFloat16", "long int"])
    assert lookup.op_class == "memory" and lookup.flops == 0
    assert lookup.bytes == 2 * 141 * 512 * 2 + 141 * 8  # the gathered rows, not the table
    add = op_cost("aten::add", [[8, 64], [8, 64], []], ["float", "float", "Scalar"])
    add_ = op_cost("aten::add_", [[8, 64], [8, 64], []], ["float", "float", "Scalar"])
    assert add.flops == add_.flops == 8 * 64
    assert add.bytes - add_.bytes == 8 * 64 * 4  # in place: no separate output
    assert op_cost("aten::empty", [[], []], ["ScalarList", "Scalar"]) is None
    names = ("aten::native_layer_norm", "aten::_softmax", "aten::sum", "aten::gelu")
    assert [op_class(n) for n in names] == ["normalization", "softmax", "reduction", "elementwise"]


def test_device_tables():
    bw, source = lookup_bandwidth("NVIDIA H100 80GB HBM3")
    assert bw == 3350e9 and "H100" in source
    assert lookup_bandwidth("NVIDIA A100-SXM4-80GB")[0] > lookup_bandwidth("NVIDIA A100-SXM4-40GB")[0]
    assert lookup_bandwidth("Some CPU") is None


# The session's CPU training step (tests/trace/conftest.py), profiled with shapes, stacks and
# torch's FLOP counter; the step metrics travel beside the trace in a pickle.
RECORD = CPU_STEP_SCRIPT.replace(
    "trace_path=trace_path)", "trace_path=trace_path, record_shapes=True, with_stack=True, metrics=True)"
) + textwrap.dedent(
    """
    import pickle
    with open(saved_folder + "/metrics.pkl", "wb") as out:
        pickle.dump(trace.step_metrics, out)
    """
)


@pytest.fixture(scope="module")
def shaped_cpu_trace(tmp_path_factory):
    """A CPU MLP step profiled with shapes, stacks and torch's FLOP counter (metrics=True)."""
    import pickle

    assert "record_shapes=True" in RECORD
    folder = tmp_path_factory.mktemp("roofline")
    trace_file, saved = folder / "step.json", folder / "profiled"
    metrics_file = saved / "metrics.pkl"
    run_python("-c", RECORD, str(trace_file), str(saved),
               env={"OMP_NUM_THREADS": "1"})
    trace = nbt.load_trace(trace_file)
    trace.step_metrics = pickle.loads(Path(metrics_file).read_bytes())
    return trace


def test_cpu_step_shapes_agree_with_the_live_flop_counter(shaped_cpu_trace):
    roof = nbt.roofline(shaped_cpu_trace)
    check = roof.flop_check.set_index("op")
    for op in ("aten::addmm", "aten::mm"):  # forward Linear layers, their backward products
        assert check.loc[op, "counter_flops"] > 0
        assert check.loc[op, "shape_flops"] == pytest.approx(check.loc[op, "counter_flops"], rel=1e-9)
    gemm = roof.by_class[roof.by_class["op_class"] == "GEMM"].iloc[0]
    steps = len(shaped_cpu_trace.steps)
    assert gemm["flops"] == pytest.approx(check["counter_flops"].sum() * steps, rel=1e-9)
    assert gemm["time_us"] > 0
    assert gemm["tflops_per_s"] == pytest.approx(gemm["flops"] / gemm["time_us"] / 1e6)
    # no memory roof on a CPU; the compute roof is the peak the live step measured
    assert roof.bandwidth is None and roof.by_class["bound"].eq("").all()
    peak = shaped_cpu_trace.step_metrics.peak_flops
    assert gemm["peak_tflops"] == pytest.approx(peak / 1e12)
    assert gemm["pct_of_roof"] == pytest.approx(100 * gemm["tflops_per_s"] * 1e12 / peak)
    assert any("live step" in s for s in roof.sources)
    modules = set(roof.by_module["module"])
    assert {"Linear_0", "Linear_1"} <= modules
    ops = roof.ops
    in_linear0 = ops[(ops["module"] == "Linear_0").to_numpy()]
    gemm_flops = in_linear0.loc[in_linear0["op_class"] == "GEMM", "flops"].sum()
    assert gemm_flops == pytest.approx(2 * 32 * 128 * 256 * steps, rel=1e-9)  # its forward addmm
    assert roof.by_module.set_index("module").loc["Linear_0", "flops"] >= gemm_flops
    assert "Roofline of rank 0" in repr(roof) and "<table" in roof._repr_html_()


@pytest.mark.parametrize("name", ["tracelens_h100_bert", "tracelens_mi300_rccl_r0", "tracelens_b200_r0"])
def test_gpu_traces_stay_under_their_roofs(real_data, name):
    trace = nbt.load_trace(real_data(f"traces/{name}"))
    roof = nbt.roofline(trace)
    assert len(roof.by_class) and roof.bandwidth
    table = roof.by_class
    # sums per class are the op rows' sums
    for cls, group in roof.ops.groupby("op_class"):
        assert table.loc[table["op_class"] == cls, "flops"].sum() == pytest.approx(group["flops"].sum())
    with_roof = table[table["peak_tflops"].notna() & (table["flops"] > 0)]
    assert len(with_roof)
    # physics: nothing computes faster than the device's peak
    assert (with_roof["tflops_per_s"] <= with_roof["peak_tflops"] * 1.001).all(), with_roof
    ridge = with_roof["peak_tflops"] * 1e12 / roof.bandwidth
    np.testing.assert_allclose(with_roof["ridge"], ridge)
    expected = np.where(with_roof["intensity"] >= ridge, "compute", "memory")
    assert list(with_roof["bound"]) == list(expected)
    device = trace.info[trace.ranks[0]].device_properties[0]["name"]
    for precision in set(with_roof["precision"]):
        assert with_roof.loc[with_roof["precision"] == precision, "peak_tflops"].iloc[0] * 1e12 == \
            lookup_peak(device, precision)[0]


def test_collective_bandwidth_uses_nccl_tests_factors(real_data):
    trace = nbt.load_trace(real_data("traces/tracelens_mi300_rccl_r0"))
    table = nbt.roofline(trace).collectives
    assert set(table["collective"]) >= {"all_reduce", "broadcast"}
    for row in table.itertuples(index=False):
        assert row.algbw_gbps == pytest.approx(row.size_bytes / (row.median_us * 1e-6) / 1e9)
        factor = 2 * (row.group_size - 1) / row.group_size if row.collective == "all_reduce" else 1.0
        assert row.busbw_gbps == pytest.approx(row.algbw_gbps * factor)
    names = ("_allgather_base", "reduce_scatter_tensor", "allreduce_coalesced", "all_to_all_single")
    normalized = [normalize_collective(n) for n in names]
    assert normalized == ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("all_reduce", 1) == 0.0 and math.isclose(bus_factor("broadcast", 4), 1.0)


@pytest.fixture(scope="module")
def gloo_shapes_folder(tmp_path_factory):
    """The 2-rank gloo DDP run of tests/trace/conftest.py, profiled with record_shapes=True."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.trace.conftest import WORKER, _free_port, _subprocess_env

    folder = tmp_path_factory.mktemp("ddp_shapes")
    script = folder / "worker.py.txt"
    script.write_text(WORKER.replace("warmup=1,", "warmup=1, record_shapes=True,"))
    port = str(_free_port())
    env = {k: v for k, v in _subprocess_env().items() if k in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS")}
    with ThreadPoolExecutor(2) as pool:  # both ranks at once: each waits for the other to join
        runs = [pool.submit(run_python, str(script), str(rank), "2", port, str(folder), env=env)
                for rank in range(2)]
        for run in runs:
            run.result()
    return folder


@pytest.mark.distributed
@pytest.mark.slow
def test_gloo_collective_bandwidth(gloo_shapes_folder):
    trace = nbt.load_trace(gloo_shapes_folder)
    for rank in (0, 1):
        table = nbt.roofline(trace, rank=rank).collectives
        reduce = table[table["collective"] == "all_reduce"]
        assert len(reduce) and (reduce["group_size"] == 2).all()
        # DDP's gradient buckets (bucket_cap_mb=0.25) of the 4 x (256x256 + 256) float32 parameters
        assert reduce["size_bytes"].max() <= 4 * 4 * (256 * 256 + 256)
        assert (reduce["size_bytes"] % (4 * 256) == 0).all()
        assert reduce["calls"].sum() >= 3  # at least one bucket per profiled step
        np.testing.assert_allclose(reduce["algbw_gbps"], reduce["size_bytes"] / (reduce["median_us"] * 1e3))
        np.testing.assert_allclose(reduce["busbw_gbps"], reduce["algbw_gbps"])  # n = 2: factor 1


def test_a_trace_profiled_in_this_process_keeps_its_shapes():
    """nbt.profile's temporary file is gone after loading; the shapes were read before it went."""
    a = torch.randn(48, 64)
    b = torch.randn(64, 32)
    trace = nbt.profile(lambda: a @ b, steps=2, warmup=1, record_shapes=True)
    roof = nbt.roofline(trace)
    gemm = roof.ops[roof.ops["op_class"] == "GEMM"]
    assert len(gemm) >= 2  # one product per profiled step
    assert (gemm["flops"] == 2 * 48 * 64 * 32).all()
