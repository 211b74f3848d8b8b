"""`python -m nbhelpers demo --tiny`: see the tool work with no network and no weights (issue 14 item 2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, run_cli


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI offline and without a default weights folder."""
    return run_cli(*args, env={"HF_HUB_OFFLINE": "1", "NBHELPERS_PROGRESS": "0"}, unset=("NBHELPERS_WEIGHTS",),
                   cwd=cwd, timeout=timeout)


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

    # bars are not turned off here: into a pipe they print plain lines
    proc = run_cli("demo", "--tiny", "--backend", "dlib", env={"HF_HUB_OFFLINE": "1"}, cwd=tmp_path, timeout=600,
                   unset=("NBHELPERS_WEIGHTS", "NBHELPERS_PROGRESS", "NBHELPERS_MODE"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "\x1b[" not in proc.stderr + proc.stdout and "\r" not in proc.stderr  # no cursor code, no redraw
    assert re.search(r"^generate: 100%.* 25/25 ", proc.stderr, re.M), proc.stderr[-3000:]  # one line as it ends
    out = tmp_path / "results" / "demo-tiny-noise.mp4"
    assert out.is_file() and f"-> {out}" in proc.stdout
    assert "tiny RANDOM weights" in proc.stdout and "colour noise, not lip-sync" in proc.stdout
    info = media.probe(out)
    assert info.frame_count == 25 and info.has_audio  # the first 1.0 s of the demo speech at 25 fps
    assert not list(tmp_path.glob("nbhelpers-demo-*"))


@pytest.mark.slow
def test_demo_tiny_makes_the_unet_of_the_version_asked_for(tmp_path):
    """Tiny weights are made for one version; --version v1 gets a v1 UNet, so the demo runs MuseTalk 1.0's layout."""
    pytest.importorskip("torch")
    pytest.importorskip("dlib")
    pytest.importorskip("skimage")
    proc = _cli("demo", "--tiny", "--version", "v1", "--backend", "dlib", "-o", "v1.mp4", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"v1\.mp4: 25 frames .*; v1, ", proc.stdout), proc.stdout


def test_an_offline_download_names_demo_tiny_once(tmp_path):
    pytest.importorskip("skimage")
    proc = _cli("demo", "--download", "--backend", "dlib", "--weights", str(tmp_path / "weights"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach the weight hosts" in proc.stderr and proc.stderr.count("demo --tiny") == 1


@pytest.mark.slow
def test_sigterm_during_a_job_removes_the_partial_output_and_the_frame_store(tmp_path):
    """`timeout`, docker stop, Ray and systemd send SIGTERM, not Ctrl-C: the job unwinds the same way (exit 143),
    leaving no hidden .partial file beside the output and no frame store in the temporary folder."""
    import signal
    import time

    pytest.importorskip("torch")
    pytest.importorskip("dlib")
    pytest.importorskip("skimage")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NBHELPERS_PROGRESS": "0",
           "TMPDIR": str(tmp_path / "tmp")}
    env.pop("NBHELPERS_WEIGHTS", None)
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "nbhelpers", "demo", "--tiny", "--backend", "dlib"], cwd=tmp_path,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    results = tmp_path / "results"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and not list(results.glob(".*partial*")):
        time.sleep(0.05)
    assert proc.poll() is None, "the job ended before its output file was started: " + proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "terminated" in err and "Traceback" not in err
    assert not list(results.glob(".*partial*")) and not list(results.glob("*.mp4"))
    assert not list((tmp_path / "tmp").glob("nbhelpers-frames-*"))
