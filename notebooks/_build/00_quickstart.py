"""Builds the walkthrough notebook beside this folder (cells only); execute it afterwards:

    python notebooks/_build/NAME.py && jupyter nbconvert --to notebook --execute --inplace notebooks/NAME.ipynb
"""
from _cells import code, md, write

cells = [
md("""# nbtoolkit quick start

This walkthrough profiles one training step of a tiny model on the CPU and shows how to read the result.
Everything here also works in a plain Python script through `import nbtoolkit as nbt`; the `%nbt` magics
are thin calls of that API.

**Step 1 — load the extension.** It is fast: it imports neither torch nor any plotting library until a
subcommand needs them."""),
code("%load_ext nbtoolkit"),
md("`%nbt help` lists every subcommand with one line each; `%nbt help SUB` shows the arguments of one."),
code("%nbt help"),
md("""**Step 2 — a training step.** A small MLP, an optimizer, and a `step()` function that runs forward,
backward and the optimizer once. This is the shape every nbtoolkit measurement takes: a zero-argument
callable that runs one step."""),
code("""import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
inputs, targets = torch.randn(64, 256), torch.randint(0, 10, (64,))

def step():
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.item()

print(f"{sum(p.numel() for p in model.parameters()):,} parameters")"""),
md("""**Step 3 — profile it.** `%%nbt profile` runs the cell under `torch.profiler`: one unprofiled warm-up
run, then `--steps` profiled runs, each marked as a `ProfilerStep`. The result is a `Trace`: step times and
the operators that took the most time. It is stored in `_nbt` (or under `--name`)."""),
code("""# NBVAL_IGNORE_OUTPUT
%%nbt profile --steps 3 --name tr
step()"""),
md("The `Trace` is plain data: its frames can be queried directly. These counts do not depend on timing:"),
code("""print("ranks:", tr.ranks)
print("profiled steps:", len(tr.steps))
print("device:", tr.device_type)
ops = set(tr.top_operators(50)["name"])
print("saw the matmuls:", bool({"aten::addmm", "aten::mm"} & ops))
print("saw AdamW's update (addcdiv_):", "aten::addcdiv_" in ops)"""),
md("""**Step 4 — where does the time go?** `nbt.temporal_breakdown` splits each rank's time into compute,
non-compute and idle (HolisticTraceAnalysis' definition on GPU traces). On a CPU trace, compute is operator
time on the main thread."""),
code("""# NBVAL_IGNORE_OUTPUT
import nbtoolkit as nbt
nbt.temporal_breakdown(tr)"""),
code("""b = nbt.temporal_breakdown(tr).iloc[0]
print("the three parts add up to 100%:", abs(b.idle_pct + b.compute_pct + b.non_compute_pct - 100) < 0.5)"""),
md("""**Step 5 — the timeline.** `%nbt trace` shows the per-rank lanes (compute, communication, memory), the
steps and the breakdowns in one view. The same view works on trace files from GPU clusters."""),
code("""# NBVAL_IGNORE_OUTPUT
%nbt trace tr --name trace_view"""),
md("""**Step 6 — share it.** `%nbt report` writes every result in this notebook into one self-contained HTML
file (tables and interactive figures, no server needed), ready to attach to a review or a ticket."""),
code("""# NBVAL_IGNORE_OUTPUT
%nbt report quickstart-report.html trace_view --title "Quick start profile\""""),
md("""## Where next
- `01_graph_breaks.ipynb`: why `torch.compile` does not help, and how to fix graph breaks;
- `02_memory.ipynb`: where the memory goes, by category, layer and phase;
- `03_recompute.ipynb`: activation recomputation chosen under a memory budget;
- `04_cluster.ipynb`: the same on a 2-rank cluster, with communication/compute overlap;
- `05_capstone.ipynb`: one model from slow and out of memory to fast and fitting."""),
]
write(cells, "00_quickstart")
