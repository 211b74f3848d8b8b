#!/usr/bin/env bash
# Build an overlay in which the `mmpose` landmark backend runs on the CPU, beside the test venv's own torch.
#
# The overlay is a `pip install --target ... --no-deps` folder put first on PYTHONPATH (as ci/old-stack.sh does):
# nothing in the venv changes, torch, numpy and OpenCV stay the venv's. It holds mmengine, mmcv-lite 2.1.0 (mmcv
# without compiled ops; at run time nbhelpers.faces._mmcv_ops_stub stands in for `mmcv.ops`), mmdet 3.3.0 and
# mmpose 1.3.2 without their dependencies (mmpose's chumpy does not build on current Python and only serves SMPL
# body models), xtcocotools built from source against this numpy (its wheel breaks with numpy 2), json_tricks,
# munkres, setuptools < 81 (mmcv-lite and xtcocotools import pkg_resources) and ci/torchvision-shim.
#
# Why a shim for torchvision: PyPI's torchvision for Linux x86_64 is a CUDA build that does not import beside the
# CPU torch ("operator torchvision::nms does not exist"), and a matching CUDA torch + torchvision is 5.5 GB more
# disk, which CI machines do not always have (a CI run ran out of disk on it). mmpose imports torchvision on the
# landmark path only for a visualiser; see ci/torchvision-shim/torchvision/__init__.py.
#
# Usage:  PYTHON=.venv/bin/python bash ci/mmpose-env.sh [OVERLAY_DIR]      (default /tmp/overlay-mmpose)
# Then:   PYTHONPATH=OVERLAY_DIR .venv/bin/python -m pytest tests/test_mmpose.py        (from the repository root)
# Cost measured here (2 cores): about 30-45 s and 75 MB with an empty pip cache. Idempotent: an overlay that
# finished before (marker file .mmpose-env-ok, which names the base Python) is kept as it is; a folder that holds
# anything else is refused, never emptied.
set -euo pipefail

OVERLAY="${1:-/tmp/overlay-mmpose}"
PY="${PYTHON:-python}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MARK="$OVERLAY/.mmpose-env-ok"
command -v "$PY" >/dev/null || {
    echo "mmpose-env: no Python '$PY'; set PYTHON to the test venv's python, e.g. PYTHON=.venv/bin/python" >&2; exit 2; }
BASE="$("$PY" -c 'import sys; print(sys.prefix)')"

if [[ -f "$MARK" ]] && grep -qF "base $BASE" "$MARK"; then
    echo "mmpose-env: $OVERLAY already built ($(head -1 "$MARK")); remove it to rebuild."
    exit 0
fi

START=$SECONDS
step() { echo "mmpose-env: [$((SECONDS - START)) s] $*"; }

for module in torch numpy cv2; do
    "$PY" -c "import $module" 2>/dev/null || {
        echo "mmpose-env: $PY cannot import $module; point PYTHON at the test venv's python" >&2; exit 2; }
done
if [[ -e "$OVERLAY" ]]; then
    if [[ -f "$MARK" || -f "$OVERLAY/.mmpose-env-building" ]]; then
        rm -rf "$OVERLAY"  # an overlay of ours, for another base Python or from an interrupted build
    elif [[ -n "$(ls -A "$OVERLAY" 2>/dev/null)" || ! -d "$OVERLAY" ]]; then
        echo "mmpose-env: $OVERLAY exists and is not an overlay built by this script; give a new or empty folder" >&2
        exit 2
    fi
fi
mkdir -p "$OVERLAY"
touch "$OVERLAY/.mmpose-env-building"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
PIP=("$PY" -m pip install --quiet --no-deps --target "$OVERLAY")

step "base: $("$PY" -c 'import sys, torch, numpy; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}")')"
step "mmengine, mmcv-lite 2.1.0, mmdet 3.3.0, mmpose 1.3.2 and their pure-Python needs, without dependencies"
# The base's own packages are never shadowed: only what it lacks goes into the overlay.
MISSING=$("$PY" - <<'EOF'
import importlib.util
wanted = {"addict": "addict", "yapf": "yapf", "termcolor": "termcolor", "json_tricks": "json_tricks",
          "munkres": "munkres", "rich": "rich", "markdown_it": "markdown-it-py", "mdurl": "mdurl",
          "pygments": "pygments", "platformdirs": "platformdirs", "yaml": "pyyaml", "scipy": "scipy",
          "matplotlib": "matplotlib", "PIL": "pillow", "packaging": "packaging", "shapely": "shapely",
          "terminaltables": "terminaltables"}
print(" ".join(pkg for mod, pkg in wanted.items() if importlib.util.find_spec(mod) is None))
EOF
)
# shellcheck disable=SC2086
"${PIP[@]}" mmengine "mmcv-lite==2.1.0" "mmdet==3.3.0" "mmpose==1.3.2" "setuptools<81" $MISSING

step "xtcocotools 1.14.3 from source against the base's numpy"
# Its setup.py imports numpy without declaring it, so the build runs without isolation: the base's numpy plus
# Cython and setuptools < 81 from a throwaway folder on PYTHONPATH (pip's build subprocess inherits it).
BUILD="$OVERLAY/.build-tools"
"${PIP[@]/$OVERLAY/$BUILD}" "setuptools<81" "cython>=3" wheel
PYTHONPATH="$BUILD${PYTHONPATH:+:$PYTHONPATH}" "${PIP[@]}" --no-build-isolation --no-binary xtcocotools \
    "xtcocotools==1.14.3"
rm -rf "$BUILD"

step "the torchvision stand-in (ci/torchvision-shim)"
cp -r "$HERE/torchvision-shim/torchvision" "$OVERLAY/"

step "checking that mmpose imports with our mmcv.ops stand-in"
(cd "$HERE/.." && PYTHONPATH="$OVERLAY${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'EOF'
from nbhelpers.faces import mmpose_backend
info = mmpose_backend.mmpose_available()
print("mmpose-env:", info)
if not info.ok:
    raise SystemExit(f"mmpose does not import: {info.reason}")
EOF
)

printf 'built in %s s on %s cores, %s MB\nbase %s\n' "$((SECONDS - START))" "$(nproc)" \
    "$(du -sm "$OVERLAY" | cut -f1)" "$BASE" > "$MARK"
rm -f "$OVERLAY/.mmpose-env-building"
step "done: $(head -1 "$MARK")"
