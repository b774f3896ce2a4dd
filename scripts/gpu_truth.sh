#!/usr/bin/env bash
# GPU truth: every CUDA path of nbtoolkit once, against torch's own numbers (scripts/gpu_truth.py).
#
# On a GPU machine that cannot download (the device tool's machine; README "On a GPU"):
#   bash scripts/gpu_wheels.sh                    # here, once: the wheels it lacks, into .whl/
#   bash scripts/gpu_truth.sh --out "$OUT"        # there, with .whl/ carried beside the tree
# On any machine with nbtoolkit installed (your own GPU, or --cpu for the plumbing):
#   bash scripts/gpu_truth.sh --out out/gpu-truth [--cpu]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ -x .venv/bin/python ] && [ -z "${NBT_GPU_TRUTH_SYSTEM_PYTHON:-}" ] && ! "$PYTHON" -c "import torch" 2>/dev/null; then
  PYTHON=.venv/bin/python  # this checkout's environment, where the system Python has no torch
fi
path="$PWD"
if compgen -G ".whl/*.whl" >/dev/null && ! "$PYTHON" -c "import msgspec, orjson, plotly, pulp, IPython" 2>/dev/null; then
  # The device machine: its own torch, numpy, pandas and pyarrow; the rest unpacked from .whl/
  # (only where they are missing: an environment that has them keeps its own builds).
  site=${NBT_GPU_SITE:-/tmp/nbt-gpu-site}
  "$PYTHON" scripts/unpack_wheels.py .whl "$site"
  path="$path:$site"
fi
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
echo "[gpu-truth] $("$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())')"
exec "$PYTHON" scripts/gpu_truth.py "$@"
