"""The other environments we promise, each checked in its own interpreter (run last; a few minutes, needs PyPI).

- Python 3.13 with no torch: every ``notorch`` test (``ci/py313-notorch.sh``).
- transformers 4.46 + huggingface_hub 0.26 + diffusers 0.31: the weights and models tests (``ci/old-stack.sh``).
- Colab's Python 3.13 and preinstalled versions: installing ``requirements-colab.txt`` and the package changes none
  of torch, numpy, transformers, huggingface_hub, opencv or ipywidgets; environment.yml's pip part resolves
  (``ci/colab-resolve.sh``).
- The exact-landmarks overlay (mmengine, mmcv-lite, mmdet, mmpose over this venv's torch): the mmpose backend
  against dwpose-onnx (``ci/mmpose-env.sh``, then ``tests/test_mmpose.py``).

Set NBHELPERS_SKIP_ENV_CHECKS=1 to skip them in a quick local run. With NBHELPERS_ENV_CLEANUP=1 (CI sets it) each
check removes what it built once it has run, so the disk holds one of them at a time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where the checks keep their venvs and overlay: $NBHELPERS_ENV_ROOT (CI sets a fresh folder), else /tmp (reused).
ENV_ROOT = Path(os.environ.get("NBHELPERS_ENV_ROOT", "/tmp"))

pytestmark = pytest.mark.skipif(os.environ.get("NBHELPERS_SKIP_ENV_CHECKS") == "1",
                                reason="NBHELPERS_SKIP_ENV_CHECKS=1")


def _run(args: list[str], timeout: float, env: dict | None = None) -> str:
    proc = subprocess.run(args, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    out = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines()
                    if "WARNING: Location" not in line)  # pip's notes about this machine's local indexes
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _need_disk(gib: float, what: str) -> None:
    """Skip, naming the shortfall, when the disk cannot hold what a check builds (CI machines vary; the rest of
    the suite has run by then). Both the env root and the temp folder count: pip unpacks under TMPDIR."""
    import tempfile

    ENV_ROOT.mkdir(parents=True, exist_ok=True)
    free = min(shutil.disk_usage(ENV_ROOT).free, shutil.disk_usage(tempfile.gettempdir()).free) / 2**30
    if free < gib:
        pytest.skip(f"{what} needs about {gib:.1f} GiB of free disk; only {free:.1f} GiB is free under {ENV_ROOT} "
                    "and the temp folder")


@pytest.fixture
def built():
    """Folders a check builds; removed afterwards when NBHELPERS_ENV_CLEANUP=1 (CI: disk is limited)."""
    paths: list[str] = []
    yield paths
    if os.environ.get("NBHELPERS_ENV_CLEANUP") == "1":
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


def test_notorch_tests_pass_on_python313_without_torch(built):
    import glob

    if not (shutil.which("python3.13") or glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13"))):
        pytest.skip("Python 3.13 is not installed")
    _need_disk(2.0, "the Python 3.13 venv (1.3 GB)")
    built.append(str(ENV_ROOT / "venv-py313-notorch"))
    out = _run(["bash", "ci/py313-notorch.sh", built[-1]], timeout=1200)
    assert "without torch" in out and " passed" in out


def test_weights_and_models_on_transformers4_hub0(built):
    _need_disk(0.5, "the old-stack overlay (140 MB)")
    built.append(str(ENV_ROOT / "overlay-old"))
    out = _run(["bash", "ci/old-stack.sh", "-q"], timeout=1200, env={"PYTHON": sys.executable, "OVERLAY": built[-1]})
    assert "old stack: huggingface_hub 0.26.5, transformers 4.46.3" in out and " passed" in out


def test_colab_and_conda_install_recipes_resolve():
    _need_disk(1.5, "the dry-run resolves (pip downloads the wheels it resolves into the temp folder)")
    out = _run(["bash", "ci/colab-resolve.sh"], timeout=1200)
    assert out.strip()


def test_mmpose_backend_matches_dwpose_onnx_in_its_own_overlay(built):
    overlay = os.environ.get("NBHELPERS_MMPOSE_OVERLAY", str(ENV_ROOT / "overlay-mmpose"))
    _need_disk(0.5, "the mmpose overlay (75 MB)")
    built.append(overlay)
    out = _run(["bash", "ci/mmpose-env.sh", overlay], timeout=1800, env={"PYTHON": sys.executable})
    assert "mmpose-env: Availability(ok=True" in out or "already built" in out
    out = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "tests/test_mmpose.py"],
               timeout=1200, env={"PYTHONPATH": f"{overlay}:{ROOT}"})
    # Every mmpose test ran: the only skip allowed is the no-mmcv check, which cannot run where mmcv is.
    assert " passed" in out and " failed" not in out and " error" not in out
    assert out.count("SKIPPED") <= 1 and ("SKIPPED" not in out or "mmcv is installed here" in out), out[-3000:]


def test_a_short_disk_skips_with_the_figures(monkeypatch):
    import collections

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 9.7 * 2**30, int(0.3 * 2**30)))
    with pytest.raises(pytest.skip.Exception, match=r"the Python 3.13 venv \(1.3 GB\) needs about 2.0 GiB of free "
                                                     r"disk; only 0.3 GiB is free"):
        _need_disk(2.0, "the Python 3.13 venv (1.3 GB)")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 0, 5 * 2**30))
    _need_disk(2.0, "anything")  # enough: no skip
