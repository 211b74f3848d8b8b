#!/usr/bin/env bash
# Run the weights and models tests against the oldest stack we support: transformers 4.46 + huggingface_hub 0.26
# (+ tokenizers 0.20, diffusers 0.31: diffusers 0.39 needs huggingface_hub >= 0.34), laid over the main venv.
#
#   ci/old-stack.sh                 # build the overlay if needed (about 10 s, from PyPI), run the tests
#   PYTHON=/tmp/venv/bin/python OVERLAY=/tmp/overlay-old ci/old-stack.sh -x -q
#
# The overlay is a `pip install --target ... --no-deps` folder put first on PYTHONPATH: nothing in the venv is
# changed, torch and numpy stay the venv's. The download tests start child interpreters, which inherit
# PYTHONPATH and so use the old huggingface_hub too (test_the_child_runs_the_installed_huggingface_hub checks it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
OVERLAY="${OVERLAY:-/tmp/overlay-old}"
PINS=("transformers==4.46.3" "huggingface_hub==0.26.5" "tokenizers<0.21" "diffusers==0.31.0")

check() {
  PYTHONPATH="$OVERLAY" "$PY" - <<'PY'
import diffusers, huggingface_hub, transformers
assert huggingface_hub.__version__ == "0.26.5", huggingface_hub.__version__
assert transformers.__version__ == "4.46.3", transformers.__version__
assert diffusers.__version__ == "0.31.0", diffusers.__version__
print(f"old stack: huggingface_hub {huggingface_hub.__version__}, transformers {transformers.__version__}, "
      f"diffusers {diffusers.__version__}")
PY
}

if ! check 2>/dev/null; then
  rm -rf "$OVERLAY"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$OVERLAY" "${PINS[@]}"
  check
fi

cd "$REPO"
PYTHONPATH="$OVERLAY:$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m pytest tests/test_weights.py tests/test_models.py \
  -p no:cacheprovider "$@"
