#!/usr/bin/env bash
# Run the whole suite (unit, integration, notebooks through nbval) and the linters.
# As root, everything runs inside a private network namespace with only loopback up,
# so no test can reach beyond this machine, and Ray binds to 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
export PYTHONDONTWRITEBYTECODE=1
# Keep Ray and torch quiet and local.
export RAY_USAGE_STATS_ENABLED=0
export RAY_DISABLE_DOCKER_CPU_WARNING=1

echo "[test] ruff"
ruff check nbtoolkit tests benchmarks
echo "[test] mypy"
mypy

PYTEST=(python -m pytest tests notebooks --nbval --nbval-current-env
        --nbval-sanitize-with notebooks/nbval_sanitize.cfg "$@")

if [ "$(id -u)" = "0" ] && unshare --net true 2>/dev/null; then
  echo "[test] running inside a private network namespace (loopback only)"
  exec unshare --net bash -c 'ip link set lo up && exec "$@"' _ "${PYTEST[@]}"
else
  echo "[test] WARNING: cannot create a private network namespace (needs root and unshare);"
  echo "[test]          running without one: tests still target only 127.0.0.1"
  exec "${PYTEST[@]}"
fi
