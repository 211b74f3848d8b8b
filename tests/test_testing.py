"""nbhelpers.testing: the tiny weights tree without the optional extras, and its file modes."""

from __future__ import annotations

import json
import os
import sys
import warnings

import pytest
from helpers import ROOT

torch = pytest.importorskip("torch")

from nbhelpers import testing  # noqa: E402
from nbhelpers.faces import dwpose_onnx  # noqa: E402


@pytest.fixture
def two_writers(monkeypatch):
    """Only the real DWPose ONNX writer and a cheap JSON writer are registered (no model building)."""

    def write_json(directory):
        (directory / "extra").mkdir(exist_ok=True)
        (directory / "extra" / "x.json").write_text("{}")

    monkeypatch.setattr(testing, "WRITERS", {"dwpose-onnx": testing.write_tiny_dwpose_onnx, "extra": write_json})


def test_a_dlib_only_install_makes_the_tree_without_any_onnx_warning(two_writers, monkeypatch, tmp_path):
    """The ``[dlib]`` extra has no onnx: the default tree leaves the DWPose ONNX model out in silence and says so in
    tiny.json (issue 14: make_tiny_weights and the cold CI-mode quickstart warned that onnx was missing)."""
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` now raises ImportError, as without the package
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        root = testing.make_tiny_weights(tmp_path / "models")
    marker = json.loads((root / testing.TINY_MARKER).read_text())
    assert marker["writers"] == ["extra"]
    assert marker["left_out"] == {"dwpose-onnx": "needs onnx (pip install onnx)"}
    assert not (root / dwpose_onnx.ONNX_FILE).exists() and (root / "extra" / "x.json").is_file()
    # Asked for by name, the writer runs and says itself why it wrote nothing.
    with pytest.warns(UserWarning, match="onnx package is not installed"):
        testing.make_tiny_weights(tmp_path / "asked", writers=["dwpose-onnx"])


def test_with_onnx_the_default_tree_has_the_onnx_model(two_writers, tmp_path):
    pytest.importorskip("onnx")
    root = testing.make_tiny_weights(tmp_path / "models")
    assert (root / dwpose_onnx.ONNX_FILE).is_file()
    assert json.loads((root / testing.TINY_MARKER).read_text())["left_out"] == {}


def test_every_file_of_the_tree_has_the_same_mode(tmp_path):
    """safetensors writes its files 0600; the tree's other files are 0644: all get 0644 less the umask."""
    root = testing.make_tiny_weights(tmp_path / "models", writers=["vae", "whisper"])
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.relative_to(root).as_posix(): p.stat().st_mode & 0o777 for p in root.rglob("*") if p.is_file()}
    assert "sd-vae/diffusion_pytorch_model.safetensors" in modes and "whisper/config.json" in modes
    assert set(modes.values()) == {0o644 & ~umask}, modes


# ------------------------------------------------------------------------------------------ the temp folder of a run

INNER_TEST = '''
import os, subprocess, sys
from nbhelpers import env


def test_writes_where_a_notebook_run_writes(tmp_path):
    (env.work_dir("ci") / "video.bin").write_bytes(bytes(2_000_000))  # the CI work folder, as the notebooks
    (tmp_path / "out.bin").write_bytes(bytes(2_000_000))
    # a child that ends without its cleanup (a killed kernel): its frame store stays
    code = ("import os, numpy as np; from nbhelpers.framestore import FrameStore; s = FrameStore(64, 64); "
            "[s.append(np.zeros((64, 64, 3), np.uint8)) for _ in range(100)]; s.finish(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True)
'''


def test_a_green_run_leaves_nothing_sizeable_in_the_temp_folder(tmp_path):
    """A green run left about 450 MB in the temp folder: pytest's base folder, nbhelpers-ci-*, nbhelpers-frames-*.
    A run with this conftest and pyproject.toml, under a fresh TMPDIR, must leave (almost) nothing there."""
    import shutil
    import subprocess

    root = ROOT
    project = tmp_path / "project"
    project.mkdir()
    for name in ("conftest.py", "helpers.py"):  # the conftest imports its paths from helpers
        shutil.copy(root / "tests" / name, project / name)
    (project / "test_inner.py").write_text(INNER_TEST)
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(root), "NBHELPERS_MODE": "ci"}
    env.pop("NBHELPERS_WORKDIR", None)
    env.pop("NBHELPERS_KEEP_TMPDIR", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-c",
                           str(root / "pyproject.toml"), "--rootdir", str(project), str(project / "test_inner.py")],
                          cwd=project, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    left = {p.relative_to(temp).as_posix(): p.stat().st_size for p in temp.rglob("*") if p.is_file()}
    assert sum(left.values()) < 100_000, left
    assert not [p for p in temp.rglob("nbhelpers-*")], sorted(left)
