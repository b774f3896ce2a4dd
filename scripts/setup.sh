#!/usr/bin/env bash
# Create the virtual environment and install nbtoolkit with every extra, torch pinned by
# constraints.txt (a CPU build here; an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip setuptools wheel
echo "[setup] torch (pinned by constraints.txt)"
"${PIP[@]}" install -q -c constraints.txt torch
# DeepSpeed builds from source against the installed torch: without --no-build-isolation
# its build environment would fetch a second, unpinned (CUDA) torch.
echo "[setup] deepspeed against the pinned torch"
"${PIP[@]}" install -q -c constraints.txt --no-build-isolation "deepspeed>=0.14"
echo "[setup] nbtoolkit[dev] (editable)"
"${PIP[@]}" install -q -c constraints.txt -e ".[dev]"

# The browser test drives Debian's chromium (never a browser that a tool downloads).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian's chromium for the browser test"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "[setup] chromium not found and cannot be installed (not root): the browser test will say so"
  fi
fi
"$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (nbtoolkit)" >/dev/null
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, nbtoolkit; print("torch", torch.__version__, "nbtoolkit", nbtoolkit.__version__)')"
