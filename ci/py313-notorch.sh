#!/usr/bin/env bash
# Run every test marked `notorch` under Python 3.13 in a venv that has no torch at all (Colab's Python; proves
# that media, weights, the planner, env and ui work, and import, before and without torch).
#
#   bash ci/py313-notorch.sh [VENV_DIR [PYTEST_ARGS...]]   (default /tmp/venv-py313-notorch; PYTHON=python3.13)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-/tmp/venv-py313-notorch}"
if [ $# -gt 0 ]; then shift; fi  # the rest of the arguments go to pytest
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  # pyenv's shim answers only when 3.13 is selected, so prefer the interpreter itself.
  for cand in python3.13 "$HOME"/.pyenv/versions/3.13*/bin/python3.13 /usr/bin/python3.13; do
    if "$cand" -c "import sys; assert sys.version_info[:2] == (3, 13)" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi
[ -n "$PY" ] || { echo "Python 3.13 not found (set PYTHON=/path/to/python3.13)" >&2; exit 2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
if [ ! -f "$VENV/.notorch-ok" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  # The package without its heavy dependencies (torch, diffusers, transformers), plus what notorch tests use.
  "$VENV/bin/python" -m pip install -q -c "$REPO/ci/constraints-colab.txt" --no-deps -e "$REPO"
  "$VENV/bin/python" -m pip install -q -c "$REPO/ci/constraints-colab.txt" numpy imageio-ffmpeg soundfile soxr \
    "huggingface_hub>=0.23" gdown tqdm Pillow opencv-python-headless matplotlib ipywidgets scikit-image librosa \
    pyyaml pytest pytest-timeout nbformat
  touch "$VENV/.notorch-ok"
fi
"$VENV/bin/python" -c "import importlib.util, sys; assert importlib.util.find_spec('torch') is None, 'torch found'; print('Python', sys.version.split()[0], 'without torch')"
cd "$REPO"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -m notorch -q tests "$@"
