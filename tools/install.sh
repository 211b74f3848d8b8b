#!/usr/bin/env bash
# Install the workbook into the current Python environment, torch first, so that pip keeps that torch.
#
#   bash tools/install.sh [EXTRAS]        # EXTRAS e.g. dlib (default), onnx, test, "dlib,onnx"
#   PYTHON=.venv/bin/python bash tools/install.sh test
#
# torch: a torch >= 2.1 that is already installed is kept. Otherwise, with an NVIDIA GPU (nvidia-smi lists one),
# pip's default build from PyPI (CUDA). Without one, a CPU build: first a torch wheel that pip finds without an
# index (find-links, e.g. the project's machines keep the CPU build of torch 2.13 on local disk), else PyTorch's CPU
# index. Never PyPI's default build without a GPU: that is the CUDA build with every CUDA library (6.7 GB, 5.5 min).
# TORCH_SPEC overrides the choice, e.g. TORCH_SPEC="torch==2.11.0 --index-url https://download.pytorch.org/whl/cpu".
# Then the package itself, editable, with ci/constraints-colab.txt (the versions Colab has and CI tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
EXTRAS=${1:-dlib}
CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
pip_install() { "$PY" -m pip install -q "$@"; }
say() { echo "install: $*"; }

"$PY" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' 2>/dev/null || {
    echo "install: $PY is not Python 3.10 or later; set PYTHON to a suitable interpreter" >&2; exit 2; }
torch_version() { "$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null; }
have_torch() {
    "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as m, re
major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", m.version("torch")).groups())
raise SystemExit(0 if (major, minor) >= (2, 1) else 1)
EOF
}

if [ -n "${TORCH_SPEC:-}" ]; then
    say "torch from TORCH_SPEC: $TORCH_SPEC"
    # shellcheck disable=SC2086
    pip_install $TORCH_SPEC
elif have_torch; then
    say "keeping the installed torch $(torch_version)"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    say "an NVIDIA GPU is present: torch from PyPI (its CUDA build)"
    pip_install "torch>=2.1"
elif pip_install --no-index --no-deps "torch>=2.1" 2>/dev/null; then
    # A local wheel (find-links); its own dependencies then come from the configured indexes, torch stays.
    say "no GPU: the torch build found on local disk, $(torch_version)"
    pip_install "torch==$(torch_version)"
elif pip_install --retries 1 --timeout 30 "torch>=2.1" --index-url "$CPU_INDEX"; then
    say "no GPU: torch $(torch_version) from the CPU index $CPU_INDEX"
else
    echo "install: no GPU here, and no CPU build of torch was found (no local wheel; $CPU_INDEX did not answer)." \
         "Install a CPU build of torch >= 2.1 yourself, or set TORCH_SPEC, then run this again." >&2
    exit 2
fi
say "torch $(torch_version); now the workbook with [$EXTRAS]"
pip_install -c ci/constraints-colab.txt -e ".[$EXTRAS]"
say "done: $("$PY" -c 'import torch, nbhelpers; build = "CUDA " + torch.version.cuda if torch.version.cuda else "CPU build"; print(f"torch {torch.__version__} ({build}), nbhelpers {nbhelpers.__version__}")')"
