"""FSDP2 on a 2-rank local cluster: per-rank memory of the shards, the overlap of its collectives,
and the graph breaks of a model compiled per block.

Real ranks, a real gloo group, real ``fully_shard``, real AdamW and real torch.compile; the
model is small (4 residual MLP blocks and a head) so that each test runs in seconds.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.integrations.fsdp2.profile import fsdp2_graph_breaks, fsdp2_memory, fsdp2_overlap
from nbtoolkit.integrations.fsdp2.rank import make_step
from nbtoolkit.integrations.fsdp2.wrap import ShardSettings

pytestmark = [pytest.mark.slow]

WIDTH, HIDDEN, BLOCKS = 64, 256, 4


class Block(torch.nn.Module):
    def __init__(self, planted_break: bool = False) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, WIDTH)
        self.planted_break = planted_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.planted_break:
            x = x * float(x.abs().mean())  # PLANTED BREAK: .item() on a tensor leaves the graph
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(torch.nn.Module):
    def __init__(self, planted_break: bool = False) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(planted_break and i == 1) for i in range(BLOCKS)])
        self.head = torch.nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _model() -> Net:
    return Net()


def _model_with_break() -> Net:
    return Net(planted_break=True)


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(16, WIDTH, generator=g), torch.randn(16, 8, generator=g)


# ---- the CPU overlap definition, written again independently of nbtoolkit.trace (plain lists) ----
_COMM = ("gloo:", "c10d", "nccl:", "record_param_comms", "ProcessGroup", "_c10d", "hccl:")


def _union(spans: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _intersect(x: list[list[float]], y: list[list[float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        total += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _minus(x: list[list[float]], y: list[list[float]]) -> list[tuple[float, float]]:
    out = []
    for a, b in x:
        cursor = a
        for c, d in y:
            if d <= cursor or c >= b:
                continue
            if c > cursor:
                out.append((cursor, c))
            cursor = max(cursor, d)
        if cursor < b:
            out.append((cursor, b))
    return out


def _overlap_pct_of_file(path: Any) -> float:
    """gloo calls' union, against the union of each main thread's operators outside collectives,
    within the profiled steps (the definition in nbtoolkit/trace/overlap.py's docstring)."""
    import gzip
    import json

    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)

    def spans(chosen: list[dict[str, Any]]) -> list[list[float]]:
        clipped = [(max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in chosen]
        return _union([(a, b) for a, b in clipped if b > a])

    comm = spans([e for e in events if e["name"].startswith("gloo:")])
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    compute: list[tuple[float, float]] = []
    for lane in {(e["pid"], e["tid"]) for e in ops if not e["name"].startswith(_COMM)}:
        on = [e for e in events if (e["pid"], e["tid"]) == lane]
        working = spans([e for e in on if e.get("cat") == "cpu_op" and not e["name"].startswith(_COMM)])
        compute += _minus(working, spans([e for e in on if e["name"].startswith(_COMM)]))
    return 100 * _intersect(comm, _union(compute)) / sum(b - a for a, b in comm)


def test_each_rank_holds_its_shard_of_parameters_gradients_and_adamw_state(cluster: Any) -> None:
    result = fsdp2_memory(cluster, _model, _batch)
    table = result.table
    shown = table.to_string()
    unsharded = sum(p.numel() * p.element_size() for p in _model().parameters())
    assert (table["unsharded_model_bytes"] == unsharded).all(), shown
    share = unsharded / 2
    for row in table.itertuples():
        assert abs(row.parameter / share - 1) < 0.01, shown
        assert abs(row.gradient / share - 1) < 0.01, shown
        assert abs(row.optimizer_state / (2 * share) - 1) < 0.01, shown  # AdamW: two moments
        # the gathered parameters are their own category: at least the largest block, whole
        block_bytes = sum(p.numel() * p.element_size() for p in Block().parameters())
        assert row.unsharded_parameter >= block_bytes, shown
        assert row.unsharded_gradient > 0, shown
    # the timelines themselves are the ranks' (RankMemory), with the new categories in them
    assert len(result.memory) == 2
    categories = set(result.memory[0].events["category"].astype(str))
    assert {"parameter", "gradient", "optimizer_state", "unsharded_parameter"} <= categories
    assert "FSDP2 memory per rank" in repr(result)


def _llama() -> Any:
    """A tiny HF Llama (4 decoder layers, 180,800 parameters): FSDP2 shards each decoder layer
    and the root (embeddings, final norm, head), whose sizes differ, so gloo's buffers of one
    size are freed and others allocated at their addresses."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def _token_batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(rank))
    return ids, ids


def _next_token_loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1), targets[:, 1:].flatten())


def test_shards_of_a_llama_are_exact_in_every_measurement(cluster: Any) -> None:
    """About one recording in six on a rank, gloo frees a buffer on its own thread, unrecorded;
    torch's profiler then took the next allocation at that address for the old (gathered)
    parameter and counted it as a parameter until the end (rank 0: 1.73x its share). Such a
    storage is split into its allocations again and the steps are recorded again, so the shards
    are exact in every recording that missed no free. When every recording of a rank missed one,
    the last is kept and says so: its split can still leave a reused block in a shard's category
    (CI once saw rank 1's parameters at 1.18x their share), so only the note is checked there."""
    pytest.importorskip("transformers", reason="transformers (for the HF Llama) is not installed")
    share = sum(p.numel() * p.element_size() for p in _llama().parameters()) / 2
    runs = 4
    for run in range(runs):
        result = fsdp2_memory(cluster, _llama, _token_batch, loss_fn=_next_token_loss)
        table = result.table
        shown = f"run {run + 1} of {runs}\n{table.to_string()}\n{[t.notes for t in result.memory]}"
        assert (table["per_rank_share_bytes"] == share).all(), shown
        for row, timeline in zip(table.itertuples(), result.memory, strict=True):
            said = any("did not record" in note for note in timeline.notes)
            # a kept recording that missed a free says so
            assert said == (timeline.reused_storages > 0), shown
            if said:
                continue
            assert abs(row.parameter / share - 1) < 0.01, shown
            assert abs(row.gradient / share - 1) < 0.01, shown
            assert abs(row.optimizer_state / (2 * share) - 1) < 0.01, shown


def test_cluster_memory_of_a_sharded_model_in_the_ranks_namespace(cluster: Any) -> None:
    """The notebook's own path: a model sharded in a cell, then ``cluster.memory`` of its step."""
    cluster.run_cell(
        "from tests.cluster.test_fsdp2 import _model, _batch\n"
        "from nbtoolkit.integrations.fsdp2.rank import build_sharded, make_step\n"
        "fsdp_model, fsdp_opt = build_sharded(_model)\n"
        "fsdp_step = make_step(fsdp_model, fsdp_opt, _batch)\n"
        "fsdp_step()\n"
    )
    memory = cluster.memory("fsdp_step()", model="fsdp_model", optimizer="fsdp_opt")
    share = sum(p.numel() * p.element_size() for p in _model().parameters()) / 2
    peaks = memory.peaks()
    assert len(peaks) == 2
    for timeline in memory:
        by_category = timeline.category_peaks().set_index("category")["peak_bytes"]
        assert abs(by_category["parameter"] / share - 1) < 0.01, by_category.to_string()
        assert by_category["unsharded_parameter"] > 0, by_category.to_string()


def test_fsdp2_collectives_are_recognised_and_their_overlap_measured(cluster: Any, tmp_path: Any) -> None:
    steps = 2
    result = fsdp2_overlap(cluster, _model, _batch, steps=steps, save_dir=tmp_path)
    calls = result.collectives()
    shown = f"{calls.to_string()}\n{result.overlap.to_string()}"
    assert set(calls["collective"]) == {"all_gather", "reduce_scatter"}, shown
    # as many calls as FSDP2 says it made (its record_function ranges in the same trace)
    names = result.trace.events[0]["name"].astype(str)
    gathers = int(names.str.match(r"FSDP::all_gather( \(|$)").sum())
    reduces = int(names.str.startswith("FSDP::post_backward_reduce").sum())
    rank0 = calls[calls["rank"] == 0].set_index("collective")
    assert rank0.loc["all_gather", "calls_per_step"] * steps == gathers, shown
    assert rank0.loc["reduce_scatter", "calls_per_step"] * steps == reduces == (BLOCKS + 1) * steps, shown
    overlap = result.overlap
    assert (overlap["comm_time_us"] > 0).all() and overlap["overlap_pct"].between(0, 100).all(), shown
    assert (overlap["method"] == "cpu-gloo").all()
    for rank in (0, 1):  # the same number from the same trace, computed independently
        independent = _overlap_pct_of_file(tmp_path / f"rank{rank}.json.gz")
        assert abs(overlap.set_index("rank").loc[rank, "overlap_pct"] - independent) < 0.1, shown
    # HTA 0.5 has no overlap for CPU ranks (it counts GPU kernels only): NaN on these very traces,
    # which is why the CPU definition is nbtoolkit's own (trace/overlap.py)
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (hta) is not installed")
    theirs = hta.TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    assert len(theirs) == 2 and theirs["comp_comm_overlap_pctg"].isna().all(), theirs.to_string()

    # keeping each block gathered from forward to backward saves the backward's all-gathers
    kept = fsdp2_overlap(
        cluster, _model, _batch, steps=steps, settings=ShardSettings(reshard_after_forward=False)
    )
    kept_calls = kept.collectives().set_index(["rank", "collective"])
    assert kept_calls.loc[(0, "all_gather"), "calls_per_step"] < rank0.loc["all_gather", "calls_per_step"]


def test_a_break_planted_in_a_sharded_block_is_found_at_its_line(cluster: Any) -> None:
    result = fsdp2_graph_breaks(cluster, _model_with_break, _batch)
    source, first = inspect.getsourcelines(Block.forward)
    planted = first + next(i for i, line in enumerate(source) if "PLANTED BREAK" in line)
    assert set(result.reports) == {0, 1}
    for rank, report in result.reports.items():
        assert not report.error, report.error
        breaks = report.breaks
        lines = set(breaks.loc[breaks["user_file"].astype(str).str.endswith("test_fsdp2.py"), "user_line"])
        assert planted in lines, f"rank {rank}: {breaks[['gb_type', 'user_file', 'user_line']].to_string()}"
    assert "compiled per block" in repr(result)


def test_a_model_that_is_not_sharded_is_refused() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(NbtUsageError, match="fully_shard"):
        make_step(model, optimizer, _batch)
