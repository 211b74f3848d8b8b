"""Shared fixtures. Real media come from ../shared/data (test use only, never copied into the repository)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("NBHELPERS_SHARED_DATA", ROOT.parent / "shared" / "data"))

os.environ.setdefault("NBHELPERS_PROGRESS", "0")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """Point the temp folder of this run, and of every process it starts, inside pytest's base temp folder.

    The CI-mode work folder (``nbhelpers-ci-*``: tiny weights, clips, avatars, videos), frame stores
    (``nbhelpers-frames-*``) of processes that end without cleaning up (notebook kernels, killed children) and
    pip's unpacking all follow ``TMPDIR``. pytest removes its base folder after a green run
    (``tmp_path_retention_policy = "failed"`` in pyproject.toml) and keeps it after a failure, so a green run
    leaves nothing behind (it left about 450 MB) and a red one keeps everything to look at. The notebook kernels
    inherit the variable, so they share one CI work folder per run. ``NBHELPERS_KEEP_TMPDIR=1`` opts out.
    """
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or os.environ.get("NBHELPERS_KEEP_TMPDIR") == "1":
        return
    folder = factory.getbasetemp() / "tmp"
    folder.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real test media (../shared/data); skips the test when it is absent."""
    if not (SHARED_DATA / "face-sing-576x768-25fps.mp4").is_file():
        pytest.skip(f"real test media not found at {SHARED_DATA} (set NBHELPERS_SHARED_DATA to the shared/data "
                    "folder); these files are licensed for testing only and are not in the repository")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ffmpeg() -> str:
    """Path of imageio-ffmpeg's ffmpeg binary (the one the package uses)."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    return imageio_ffmpeg.get_ffmpeg_exe()


@pytest.fixture(scope="session")
def make_media(ffmpeg, tmp_path_factory):
    """Build a synthetic clip with ffmpeg: ``make_media(name, *ffmpeg_args)`` -> Path (cached per session)."""
    folder = tmp_path_factory.mktemp("lavfi")
    cache: dict[tuple, Path] = {}

    def _make(name: str, *args: str) -> Path:
        key = (name, *args)
        if key not in cache:
            out = folder / name
            subprocess.run([ffmpeg, "-v", "error", "-y", *args, str(out)], check=True,
                           stdin=subprocess.DEVNULL)
            cache[key] = out
        return cache[key]

    return _make


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """A complete tiny-model weights tree in the official layout (random weights), made once per session."""
    pytest.importorskip("torch")
    from nbhelpers.testing import make_tiny_weights

    return make_tiny_weights(tmp_path_factory.mktemp("weights") / "models")


def have(exe: str) -> bool:
    return shutil.which(exe) is not None
