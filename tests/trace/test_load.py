"""load_trace on real Kineto traces: ranks, devices, steps, collectives, save/load round trip."""

from __future__ import annotations

import pandas as pd
import pytest

import nbtoolkit as nbt


def test_folder_of_two_ranks(real_data):
    trace = nbt.load_trace(real_data("traces/hta_trace_filter_2rank"))
    assert trace.ranks == [0, 1]
    assert trace.info[0].backend == "nccl" and trace.info[0].world_size == 128
    frame = trace.events[0]
    assert isinstance(frame["name"].dtype, pd.CategoricalDtype)
    assert frame["ts"].is_monotonic_increasing
    assert (frame["stream"] >= 0).sum() > 1000  # kernels, memcpys, memsets
    assert set(trace.steps["step"]) == {551, 552}
    assert trace.has_gpu_kernels


def test_rank_from_file_name_when_distributed_info_is_missing(real_data):
    trace = nbt.load_trace(real_data("traces/hta_mtia_inference_trace"))
    assert trace.ranks == [0]
    assert any("file name" in note for note in trace._notes())
    trace = nbt.load_trace(real_data("traces/param_dlrm_8rank"))
    assert trace.ranks == list(range(8))  # worker0 ... worker7, from distributedInfo or names


def test_rank_unknown_is_zero_with_a_note(real_data):
    trace = nbt.load_trace(real_data("traces/hta_rank_unavailable"))
    assert trace.ranks == [0]
    assert any("rank unknown" in note for note in trace._notes())


def test_collective_metadata(real_data):
    trace = nbt.load_trace(real_data("traces/hta_nccl_parser_config"))
    coll = trace.collectives[0]
    assert len(coll) > 0
    assert set(coll["collective"]) >= {"allreduce"}
    rows = trace.events[0].iloc[coll["row"].to_numpy()]
    assert (rows["dur"] >= 0).all()
    assert coll["in_msg_nelems"].notna().all()


def test_cpu_only_gloo_trace(real_data):
    trace = nbt.load_trace(real_data("traces/hta_cpu_only"))
    assert trace.ranks == [34]
    assert trace.info[34].backend == "gloo"
    assert trace.device_type == "cpu"
    assert not trace.has_gpu_kernels
    assert trace.events[34]["name"].astype(str).str.startswith("gloo:").any()


def test_device_types(real_data):
    assert nbt.load_trace(real_data("traces/hta_mtia_single_rank")).device_type == "mtia"
    assert nbt.load_trace(real_data("traces/hta_amd_trace")).device_type == "rocm"
    assert nbt.load_trace(real_data("traces/tracelens_h100_bert")).device_type == "cuda"


def test_non_trace_json_in_folder_is_skipped_with_a_note(real_data):
    trace = nbt.load_trace(real_data("traces/hta_execution_trace"))
    assert trace.ranks == [0]
    assert any("benchmark_simple_add_et" in note for note in trace.notes)


def test_save_load_round_trip(real_data, tmp_path):
    trace = nbt.load_trace(real_data("traces/hta_nccl_parser_config"))
    folder = trace.save(tmp_path / "saved")
    again = nbt.Trace.load(folder)
    assert again.ranks == trace.ranks
    pd.testing.assert_frame_equal(again.events[0], trace.events[0])
    pd.testing.assert_frame_equal(again.collectives[0], trace.collectives[0])
    assert again.info[0] == trace.info[0]
    assert repr(again) == repr(trace)


def test_summary_is_deterministic_and_shows_kernels(real_data):
    a = nbt.load_trace(real_data("traces/hta_trace_filter_2rank"))
    b = nbt.load_trace(real_data("traces/hta_trace_filter_2rank"))
    assert repr(a) == repr(b)
    text = repr(a)
    assert "Top kernels by total time" in text and "rank 1" in text


def test_html_escapes_trace_text(tmp_path):
    import json

    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "<script>alert(1)</script>",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 5,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#0",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 10,
        },
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    html = nbt.load_trace(path)._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


@pytest.mark.parametrize(
    "folder", ["hta_nccl_parser_config", "param_dlrm_8rank", "hta_critical_path_alexnet"]
)
def test_chunked_streaming_equals_whole_document_decoding(real_data, monkeypatch, folder):
    from nbtoolkit.trace import _kineto_json, kineto

    monkeypatch.setattr(_kineto_json, "CHUNK_BYTES", 64 * 1024)  # many chunks, splits inside every file
    streamed = nbt.load_trace(real_data(f"traces/{folder}"))

    def no_streaming(file, columns):
        raise _kineto_json.StreamingFallback

    monkeypatch.setattr(kineto, "stream_file", no_streaming)
    whole = nbt.load_trace(real_data(f"traces/{folder}"))
    assert streamed.ranks == whole.ranks
    for rank in whole.ranks:
        pd.testing.assert_frame_equal(streamed.events[rank], whole.events[rank])
        pd.testing.assert_frame_equal(streamed.collectives[rank], whole.collectives[rank])
        assert streamed.info[rank] == whole.info[rank]


def test_loading_restores_the_garbage_collector(real_data, tmp_path):
    import gc

    assert gc.isenabled()
    nbt.load_trace(real_data("traces/hta_cpu_only"))
    assert gc.isenabled()
    with pytest.raises(nbt.TraceError):
        nbt.load_trace(tmp_path / "no-such-folder")
    assert gc.isenabled()


def test_unknown_event_phase_is_read_by_the_permissive_decoder(tmp_path):
    import json

    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
        {"ph": "Z", "name": "from a newer profiler", "pid": 1, "tid": 1, "ts": 1},
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    trace = nbt.load_trace(path)
    assert list(trace.events[0]["name"]) == ["aten::mm"]


def test_real_traces_take_the_streaming_path(real_data, monkeypatch):
    from nbtoolkit.trace import kineto

    def must_not_fall_back(file):
        raise AssertionError(f"{file} fell back to whole-document decoding")

    monkeypatch.setattr(kineto, "read_bytes", must_not_fall_back)
    for folder in ["hta_mtia_inference_trace", "tracelens_b200_r0", "param_dlrm_8rank", "hta_cpu_only"]:
        assert nbt.load_trace(real_data(f"traces/{folder}")).ranks


def test_combine_per_rank_traces(real_data):
    import pickle

    both = nbt.load_trace(real_data("traces/hta_trace_filter_2rank"))
    rank0 = nbt.load_trace(real_data("traces/hta_trace_filter_2rank/sampled_rank-0.json.gz"))
    rank1 = nbt.load_trace(real_data("traces/hta_trace_filter_2rank/sampled_rank-1.json.gz"))
    combined = nbt.Trace.combine([pickle.loads(pickle.dumps(rank1)), rank0])  # as shipped back from workers
    assert combined.ranks == [0, 1]
    pd.testing.assert_frame_equal(combined.events[1], both.events[1])
    pd.testing.assert_frame_equal(nbt.temporal_breakdown(combined), nbt.temporal_breakdown(both))
    with pytest.raises(nbt.TraceError, match="rank 0 appears in two"):
        nbt.Trace.combine([rank0, rank0])
    with pytest.raises(nbt.TraceError, match="no traces"):
        nbt.Trace.combine([])
