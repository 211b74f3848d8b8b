"""`python -m nbhelpers demo --tiny`: see the tool work with no network and no weights (issue 14 item 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NBHELPERS_PROGRESS": "0"}
    env.pop("NBHELPERS_WEIGHTS", None)
    return subprocess.run([sys.executable, "-m", "nbhelpers", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=timeout)


def test_the_missing_weights_message_names_demo_tiny(tmp_path):
    pytest.importorskip("skimage")
    empty = tmp_path / "weights"
    empty.mkdir()
    proc = _cli("demo", "--backend", "dlib", "--weights", str(empty), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "missing" in proc.stderr and "python -m nbhelpers demo --tiny" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_tiny_refuses_real_weight_options(tmp_path):
    proc = _cli("demo", "--tiny", "--download", cwd=tmp_path)
    assert proc.returncode == 2 and "--tiny makes its own random weights" in proc.stderr


@pytest.mark.slow
def test_demo_tiny_runs_offline_and_labels_its_output_as_noise(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("dlib")
    pytest.importorskip("skimage")
    from nbhelpers import media

    proc = _cli("demo", "--tiny", "--backend", "dlib", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "results" / "demo-tiny-noise.mp4"
    assert out.is_file() and f"-> {out}" in proc.stdout
    assert "tiny RANDOM weights" in proc.stdout and "colour noise, not lip-sync" in proc.stdout
    info = media.probe(out)
    assert info.frame_count == 25 and info.has_audio  # the first 1.0 s of the demo speech at 25 fps
    assert not list(tmp_path.glob("nbhelpers-demo-*"))


def test_an_offline_download_names_demo_tiny_once(tmp_path):
    pytest.importorskip("skimage")
    proc = _cli("demo", "--download", "--backend", "dlib", "--weights", str(tmp_path / "weights"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach the weight hosts" in proc.stderr and proc.stderr.count("demo --tiny") == 1
