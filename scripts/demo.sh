#!/usr/bin/env bash
# Execute every walkthrough notebook headless on the CPU and export it to HTML.
# Results: out/notebooks/*.ipynb (executed) and out/html/*.html.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
export RAY_USAGE_STATS_ENABLED=0
# DeepSpeed JIT-builds a CPU op on first use; give this checkout its own build folder, so a
# build killed elsewhere (a stale lock in ~/.cache/torch_extensions) can never hang it.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/out/torch_extensions}"
mkdir -p out/notebooks out/html
run() {
  if [ "$(id -u)" = "0" ] && unshare --net true 2>/dev/null; then
    unshare --net bash -c 'ip link set lo up && exec "$@"' _ "$@"
  else
    "$@"
  fi
}
# The HTML export leaves out the saved widget state (the executed notebooks keep it): with it,
# nbconvert's page draws each widget with JavaScript fetched from unpkg, so nothing shows offline
# (and the timeline widgets need their kernel to draw anyway); without it, the page shows the
# static form every nbtoolkit widget and figure carries in its output. Executing with
# store_widget_state=False instead is not an option: nbclient then fails on Output widgets.
for nb in notebooks/[0-9]*.ipynb; do
  name=$(basename "$nb" .ipynb)
  echo "[demo] executing $nb"
  run jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 \
      --output-dir out/notebooks "$nb" >/dev/null
  jupyter nbconvert --to html --ClearMetadataPreprocessor.enabled=True \
      --ClearMetadataPreprocessor.clear_cell_metadata=False \
      "--ClearMetadataPreprocessor.preserve_nb_metadata_mask={'language_info','kernelspec'}" \
      --output-dir out/html "out/notebooks/$name.ipynb" >/dev/null
done
echo "[demo] executed notebooks: out/notebooks/  HTML exports: out/html/"
