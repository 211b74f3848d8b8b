#!/usr/bin/env bash
# Install everything into a fresh virtual environment and run the whole test suite (package tests, the
# environment checks and every notebook in CI mode). This is the README's test command and what CI runs.
#
#   bash tools/dev-test.sh            # uses ./.venv (made if missing)
#   VENV=/tmp/v bash tools/dev-test.sh
#
# torch is installed first by tools/install.sh (the README's install step), so nothing that depends on it can pull
# another build: a CPU build without a GPU (the local wheel on the project's machines, else PyTorch's CPU index),
# PyPI's CUDA build with one; TORCH_SPEC overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off

start=$(date +%s)
free_gib() { df -Pk . | awk 'NR==2 {printf "%.1f", $4 / 1048576}'; }
echo "disk: $(free_gib) GiB free here at the start (a CI run peaks at about 4.2 GiB; the environment checks skip when short)"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PYTHON="$VENV/bin/python" bash tools/install.sh test
# The [restore] extra without its dependencies: spandrel requires torchvision, which would replace the CPU torch
# (tests/test_restore.py brings a test-only stand-in for the names spandrel imports). einops and typing_extensions
# are spandrel's only other needs besides torch, numpy and safetensors.
"$VENV/bin/python" -m pip install -q --no-deps "spandrel>=0.4" "spandrel-extra-arches>=0.2" "einops>=0.6" \
  "typing_extensions>=4.0"
echo "install: $(( $(date +%s) - start )) s, $(du -sm "$VENV" | cut -f1) MB in $VENV; disk: $(free_gib) GiB free"

# tests/test_browser.py runs the workbook in headless Chromium: Debian's package, installed here when this runs as
# root with apt (CI); elsewhere, without it, the test skips and says how to install it. NBHELPERS_BROWSER=0 opts out.
if [ "${NBHELPERS_BROWSER:-1}" != 0 ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null \
    && [ "$(id -u)" = 0 ]; then
  t=$(date +%s)
  { apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }; } >/dev/null 2>&1 \
    || echo "chromium: apt-get install failed; tests/test_browser.py will skip"
  echo "chromium: $(( $(date +%s) - t )) s to install"
fi

export NBHELPERS_MODE=ci NBHELPERS_PROGRESS=0 MPLBACKEND=Agg
exec "$VENV/bin/python" -m pytest -p no:cacheprovider --durations=25 --nbval-lax --nbval-current-env \
  tests notebooks "$@"
