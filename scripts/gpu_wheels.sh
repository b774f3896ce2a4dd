#!/usr/bin/env bash
# Download into .whl/ (git-ignored) the wheels scripts/gpu_truth.sh needs on the device machine:
# Python 3.12, manylinux x86_64, binary wheels only, for the packages in scripts/gpu_wheels.txt.
# The device machine has no network; the device tool carries .whl/ beside the working tree,
# and tree plus wheels must stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download --disable-pip-version-check -q --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl -r scripts/gpu_wheels.txt
wheels=$(du -sb .whl | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$(( (wheels + tree) / 1048576 ))
echo "[gpu-wheels] $(ls .whl | wc -l) wheels, $(( wheels / 1048576 )) MiB; with the tracked tree ${total} MiB (limit 64)"
if [ "$total" -ge 64 ]; then
  echo "[gpu-wheels] over the device tool's 64 MiB: drop a package from scripts/gpu_wheels.txt" >&2
  exit 1
fi
