"""The other environments we promise, each checked in its own interpreter (run last; a few minutes, needs PyPI).

- Python 3.13 with no torch: every ``notorch`` test (``ci/py313-notorch.sh``).
- transformers 4.46 + huggingface_hub 0.26 + diffusers 0.31: the weights and models tests (``ci/old-stack.sh``).
- Colab's Python 3.13 and preinstalled versions: the snapshot resolves as it stands, and installing the package
  with its ``[colab]`` extra changes none of torch, numpy, transformers, huggingface_hub, opencv or ipywidgets;
  environment.yml's pip part resolves (``ci/colab-resolve.sh``).
- environment.yml for real: Python 3.11, PyPI's torch 2.1.2 + torchvision 0.16.2, its pip part; the stack imports
  and the tiny models are built and run (``ci/colab-resolve.sh conda --import``).
- Colab's stack for real (Python 3.13, torch 2.11, numpy 2.1.3, transformers 5.15, IPython 7.34, ipykernel
  6.17.1, opencv 5.0...): the setup cell installs the package from a local git tag, then the package tests without
  a GPU and the quickstart and 04 notebooks in CI mode (``ci/colab-stack.sh``).
- The README's first command in a fresh venv: torch comes first and, without a GPU, is a CPU build
  (``tools/install.sh``), then the demo runs or stops within seconds naming what is missing.
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


def _python(version: str) -> str | None:
    import glob

    for cand in [shutil.which(f"python{version}"),
                 *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))]:
        if cand and subprocess.run([cand, "-c", "import sys; print(sys.version)"], capture_output=True).returncode == 0:
            return cand
    return None


def test_environment_yml_installs_imports_and_builds_the_tiny_models():
    if _python("3.11") is None:
        pytest.skip("Python 3.11 is not installed")
    _need_disk(7.0, "the conda recipe's pip install with PyPI's torch 2.1.2 (5 GB)")
    out = _run(["bash", "ci/colab-resolve.sh", "conda", "--import"], timeout=1500)
    assert "tiny models built and run" in out and "torch 2.1.2" in out and " OK in " in out, out[-3000:]


def test_colab_stack_runs_the_tests_and_notebooks_after_the_setup_cell_install(built):
    if _python("3.13") is None:
        pytest.skip("Python 3.13 is not installed")
    _need_disk(10.0, "Colab's stack with PyPI's torch 2.11 and its CUDA libraries (6.5 GB)")
    built.append(str(ENV_ROOT / "venv-colab-stack"))
    out = _run(["bash", "ci/colab-stack.sh", built[-1]], timeout=1800)
    assert "setup cell: Colab's stack unchanged" in out  # and no onnxruntime among the new packages (the script checks)
    assert "torch 2.11.0" in out and "IPython 7.34.0, ipykernel 6.17.1" in out
    import re

    summary = [line for line in out.splitlines() if re.search(r"\d+ passed", line)]
    assert summary and not re.search(r"\d+ (failed|errors?)\b", summary[-1]), out[-4000:]
    assert re.search(r"colab-stack: \[\d+ s\] done", out), out[-2000:]


def test_the_readme_install_command_gets_torch_first_and_a_cpu_build_without_a_gpu(built, tmp_path):
    """The README's first command, as written, in a fresh venv: it installed the CUDA build of torch 2.14 and every
    CUDA 13 library (6.7 GB, 5.5 min) when the advice to install torch first sat in a paragraph below it."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## On a fresh machine"):]
    command = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    assert command == "bash tools/install.sh dlib && python -m nbhelpers demo --download --backend dlib"
    _need_disk(3.0, "a fresh venv with the CPU build of torch (2 GB)")
    venv_dir = ENV_ROOT / "venv-readme"
    built.append(str(venv_dir))
    shutil.rmtree(venv_dir, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv_dir)], check=True)
    # As a person with the venv activated: its bin first on PATH; the command runs in a shell, exactly as written.
    activated = {"VIRTUAL_ENV": str(venv_dir), "PATH": f"{venv_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
                 "HF_HUB_OFFLINE": "1", "NBHELPERS_WEIGHTS": str(tmp_path / "weights")}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NBHELPERS_MODE", "PYTHONHOME")}
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env={**env, **activated}, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=1500)
    out = proc.stdout + proc.stderr
    has_gpu = shutil.which("nvidia-smi") is not None
    probe = subprocess.run([str(venv_dir / "bin" / "python"), "-c",
                            "import torch; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True)
    assert probe.returncode == 0, out[-3000:]
    version, cuda = probe.stdout.split()
    if not has_gpu:
        assert cuda == "None", f"no GPU here, but the command installed torch {version} for CUDA {cuda}"
        size_gib = sum(p.stat().st_size for p in venv_dir.rglob("*") if p.is_file()) / 2**30
        assert size_gib < 3.0, f"the venv holds {size_gib:.1f} GiB"
    # Offline (HF_HUB_OFFLINE) the demo stops within seconds naming the weights and `demo --tiny`; online it runs.
    assert proc.returncode == 0 or (proc.returncode == 2 and "demo --tiny" in out), out[-3000:]


def test_mmpose_backend_matches_dwpose_onnx_in_its_own_overlay(built):
    from helpers import FACE_VIDEO, SHARED_DATA

    if not (SHARED_DATA / FACE_VIDEO).is_file():  # without them most mmpose tests skip, and this check needs them all
        pytest.skip(f"real test media not found at {SHARED_DATA}: the mmpose overlay check compares on them")
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
