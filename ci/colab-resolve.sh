#!/usr/bin/env bash
# Dry-run resolve checks of the install recipes (about a minute; needs PyPI, downloads no torch):
#   1. Colab: Colab's preinstalled versions (ci/colab-preinstalled.txt) must resolve together as they stand (about
#      2 min: pip reads every pin's metadata); then `pip install ".[colab]"` (the setup cell) on Python 3.13 with
#      them must resolve and must not install or change torch, numpy, transformers, huggingface_hub, opencv or
#      ipywidgets; the [colab] extra must hold floors only.
#   2. conda: the pip part of environment.yml on its conda packages (Python 3.11, torch 2.1.2, numpy 1.26) must
#      resolve without moving torch or numpy. With --import it is then installed for real on PyPI's torch 2.1.2
#      and torchvision 0.16.2, the stack imported and the tiny models built and run (2.5 GB of downloads, a few
#      minutes). conda itself is not run (see docs/environments.md).
# Exits non-zero on any violation. Usage: bash ci/colab-resolve.sh [colab|conda] [--import] [--python PATH] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3 || command -v python)
exec "$PY" ci/resolve_check.py "$@"
