#!/usr/bin/env bash
# Build a separate venv in which the `mmpose` landmark backend runs on the CPU, without compiled mmcv ops.
#
# Why a separate venv: mmpose imports torchvision, and PyPI's torchvision does not load beside the CPU torch of
# the main CI venv; full mmcv cannot be built here (no OpenMMLab download server, and mmcv's source does not
# compile against new torch). The recipe below is the one measured in shared/reference/environment-notes.md
# ("OpenMMLab"): torch 2.14.1 + torchvision 0.29.1, mmengine, mmcv-lite 2.1.0 (mmcv without compiled ops),
# mmdet 3.3.0, mmpose 1.3.2 without its dependencies (chumpy does not build), xtcocotools rebuilt from source
# against numpy 2, json_tricks, munkres. At run time nbhelpers.faces._mmcv_ops_stub stands in for `mmcv.ops`.
#
# Usage:  bash ci/mmpose-env.sh [VENV_DIR]          (default /tmp/venv-mmpose; PYTHON=python3.11 by default)
# Then:   VENV_DIR/bin/python -m pytest -p no:cacheprovider tests/test_mmpose.py     (from the repository root)
#         VENV_DIR/bin/python bench/landmarks_cpu.py                                 (CPU landmark frames/s)
# Cost measured here (2 cores, no pip cache, machine shared with other jobs): about 2 minutes and 6 GB of disk
# (torch 2.14.1 is the CUDA build, which runs on the CPU). The tests then take about 1 minute of CPU.
# The script is idempotent: a venv that finished before (marker file .mmpose-env-ok) is kept as it is.
set -euo pipefail

VENV="${1:-/tmp/venv-mmpose}"
PY="${PYTHON:-python3.11}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MARK="$VENV/.mmpose-env-ok"

if [[ -f "$MARK" ]]; then
    echo "mmpose-env: $VENV already built ($(cat "$MARK")); remove it to rebuild."
    exit 0
fi

START=$SECONDS
step() { echo "mmpose-env: [$((SECONDS - START)) s] $*"; }

step "creating $VENV with $PY"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)

# Constraints for every step: keep numpy 2.x and OpenCV 4.x (the Colab line), and torch at the pair that has a
# matching torchvision on this machine.
CONS="$VENV/mmpose-constraints.txt"
cat > "$CONS" <<'EOF'
torch==2.14.1
torchvision==0.29.1
numpy>=2,<3
opencv-python<5
opencv-python-headless<5
setuptools<81
EOF

step "build tools (setuptools<81: mmcv-lite and xtcocotools still import pkg_resources)"
"${PIP[@]}" -c "$CONS" "setuptools<81" wheel "cython>=3" "numpy>=2,<3"

step "torch 2.14.1 + torchvision 0.29.1"
"${PIP[@]}" -c "$CONS" torch==2.14.1 torchvision==0.29.1

step "mmengine, mmcv-lite 2.1.0, mmdet 3.3.0"
"${PIP[@]}" -c "$CONS" mmengine "mmcv-lite==2.1.0" "mmdet==3.3.0"

step "the dependencies mmpose really uses (json_tricks, munkres, scipy, matplotlib, pillow)"
"${PIP[@]}" -c "$CONS" json_tricks munkres scipy matplotlib pillow

step "xtcocotools 1.14.3 from source against this numpy (its wheel breaks with numpy 2)"
"${PIP[@]}" -c "$CONS" --no-binary xtcocotools --no-build-isolation "xtcocotools==1.14.3"

step "our package's own needs for the landmark tests (onnx export/run, OpenCV, pytest)"
"${PIP[@]}" -c "$CONS" opencv-python-headless onnx onnxruntime onnxscript tqdm pytest pytest-timeout

step "mmpose 1.3.2 last, with --no-deps (pip then says 'mmpose requires chumpy': expected; chumpy does not build"
step "  on current Python/numpy and only serves SMPL body models, which the landmark model never uses)"
"${PIP[@]}" -c "$CONS" --no-deps "mmpose==1.3.2"

step "checking that mmpose imports with our mmcv.ops stand-in"
(cd "$HERE/.." && "$VENV/bin/python" - <<'EOF'
from nbhelpers.faces import mmpose_backend
info = mmpose_backend.mmpose_available()
print("mmpose-env:", info)
if not info.ok:
    raise SystemExit(f"mmpose does not import: {info.reason}")
EOF
)

ELAPSED=$((SECONDS - START))
echo "built in ${ELAPSED} s on $(nproc) cores, $("$VENV/bin/python" --version)" > "$MARK"
step "done: $(cat "$MARK")"
