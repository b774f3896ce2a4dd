"""How every cluster measurement (sweeps, ``FitResult.verify``) reads a CPU rank's peak from its
profiled trace (``rank_measure.cpu_peak_growth_bytes``): the growth of the profiler's running total
is counted from its value before the first memory event *in time*.

The trace lists events thread by thread (a rank's main thread, then autograd's, gloo's,
DeepSpeed's), so the first event in the file can come late in the step; counted from there, the
baseline included what the step held then (ZeRO-3's ViT read its whole parameters, 3.09 MiB, low).
"""

from __future__ import annotations

import gzip
import json
from typing import Any

MIB = 1 << 20


def _step() -> None:
    """Holds 4 MiB, then 1 MiB more for a moment: 5 MiB above where it started."""
    import torch

    held = torch.ones(MIB)  # 4 bytes each: 4 MiB
    transient = torch.ones(MIB // 4)
    del transient, held


def _profiled() -> dict[str, Any]:
    from nbtoolkit.cluster.rank_tools import profile_to_bytes

    return profile_to_bytes(_step, steps=1, warmup=0, profile_memory=True)


def _memory_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("name") == "[memory]"
            and e.get("args", {}).get("Device Type") == 0]


def test_cpu_peak_counts_growth_from_the_first_memory_event_in_time() -> None:
    from nbtoolkit.integrations.rank_measure import cpu_peak_growth_bytes

    profiled = _profiled()
    doc = json.loads(gzip.decompress(profiled["trace_gz"]))
    as_recorded = cpu_peak_growth_bytes(profiled["trace_gz"])
    assert as_recorded == 5 * MIB
    # the same events with the last allocation listed first, as a later thread's are in a rank's trace
    memory = _memory_events(doc)
    late = max((e for e in memory if e["args"]["Bytes"] > 0), key=lambda e: e["ts"])
    assert late["ts"] > min(e["ts"] for e in memory)
    others = [e for e in doc["traceEvents"] if e is not late]
    reordered = gzip.compress(json.dumps({**doc, "traceEvents": [late, *others]}).encode())
    assert cpu_peak_growth_bytes(reordered) == as_recorded


def _step_with_a_collective_copy() -> None:
    """Holds 4 MiB; inside a collective (as gloo's reduce-scatter does) 2 MiB more is made, still
    alive when 1 MiB is then allocated outside it: 7 MiB counting the copy, 5 without."""
    import torch

    held = torch.ones(MIB)
    with torch.profiler.record_function("c10d::_reduce_scatter_base_"):
        copy = torch.ones(MIB // 2)
    transient = torch.ones(MIB // 4)
    del transient, copy, held


def test_cpu_peak_leaves_out_what_a_collective_allocates() -> None:
    from nbtoolkit.cluster.rank_tools import profile_to_bytes
    from nbtoolkit.integrations.rank_measure import cpu_peak_growth_bytes

    profiled = profile_to_bytes(_step_with_a_collective_copy, steps=1, warmup=0, profile_memory=True)
    assert cpu_peak_growth_bytes(profiled["trace_gz"]) == 5 * MIB


def test_cpu_peak_leaves_out_an_allocation_whose_free_the_trace_lacks() -> None:
    """A buffer gloo's thread releases is freed where the profiler records nothing: the trace shows
    it allocated, never freed. Two steps of 4 MiB held and 1 MiB for a moment, with the first step's
    free of that 1 MiB gone from the trace, still peak 5 MiB (6 if that 1 MiB were counted as held)."""
    from nbtoolkit.cluster.rank_tools import profile_to_bytes
    from nbtoolkit.integrations.rank_measure import cpu_peak_growth_bytes

    profiled = profile_to_bytes(_step, steps=2, warmup=0, profile_memory=True)
    doc = json.loads(gzip.decompress(profiled["trace_gz"]))
    assert cpu_peak_growth_bytes(profiled["trace_gz"]) == 5 * MIB
    frees = sorted((e for e in _memory_events(doc) if e["args"]["Bytes"] == -MIB), key=lambda e: e["ts"])
    assert len(frees) == 2  # one per step
    missing = [e for e in doc["traceEvents"] if e is not frees[0]]
    without = gzip.compress(json.dumps({**doc, "traceEvents": missing}).encode())
    assert cpu_peak_growth_bytes(without) == 5 * MIB


KEPT: list[Any] = []


def _step_that_keeps() -> None:
    import torch

    KEPT.append(torch.ones(MIB // 2))  # 2 MiB, still held when the session ends


def test_cpu_peak_of_one_step_counts_what_it_still_holds_at_the_end() -> None:
    from nbtoolkit.cluster.rank_tools import profile_to_bytes
    from nbtoolkit.integrations.rank_measure import cpu_peak_growth_bytes

    profiled = profile_to_bytes(_step_that_keeps, steps=1, warmup=0, profile_memory=True)
    KEPT.clear()
    assert cpu_peak_growth_bytes(profiled["trace_gz"]) == 2 * MIB
