#!/usr/bin/env bash
# Dry-run resolve checks of the install recipes (about a minute; needs PyPI, downloads no torch):
#   1. Colab: `pip install -r requirements-colab.txt .` on Python 3.13 with Colab's preinstalled versions
#      (ci/colab-preinstalled.txt) must resolve and must not install or change torch, numpy, transformers,
#      huggingface_hub, opencv or ipywidgets; requirements-colab.txt must hold floors only.
#   2. conda: the pip part of environment.yml on its conda packages (Python 3.11, torch 2.1.2, numpy 1.26) must
#      resolve without moving torch or numpy. conda itself is not run (see docs/environments.md).
# Exits non-zero on any violation. Usage: bash ci/colab-resolve.sh [colab|conda] [--python PATH] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3 || command -v python)
exec "$PY" ci/resolve_check.py "$@"
