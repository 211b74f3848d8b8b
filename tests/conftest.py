"""Shared fixtures. Real media come from ../shared/data (test use only, never copied into the repository)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("NBHELPERS_PROGRESS", "0")  # before helpers imports the package

from helpers import FACE_VIDEO, SHARED_DATA, SPEECH  # noqa: E402


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
    if not (SHARED_DATA / FACE_VIDEO).is_file():
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
def face_clip(shared_data, make_media):
    """``face_clip(n_frames, start_s=0)``: that many frames of the real face video from ``start_s``, re-encoded
    near-losslessly (H.264, crf 12, no sound) -> Path, made once per session."""

    def _cut(n_frames: int, start_s: float = 0) -> Path:
        seek = ["-ss", str(start_s)] if start_s else []
        return make_media(f"face-{n_frames}f-{start_s}s.mp4", *seek, "-i", str(shared_data / FACE_VIDEO),
                          "-frames:v", str(n_frames), "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")

    return _cut


@pytest.fixture(scope="session")
def speech_clip(shared_data, make_media):
    """``speech_clip(seconds, start_s=0, *ffmpeg_output_options, suffix="wav")``: a cut of the real short speech
    -> Path (the source's 16 kHz mono WAV unless options say otherwise), made once per session."""

    def _cut(seconds: float, start_s: float = 0, *options: str, suffix: str = "wav") -> Path:
        seek = ["-ss", str(start_s)] if start_s else []
        tag = hashlib.sha1(repr(options).encode()).hexdigest()[:8]
        name = f"speech-{start_s}s-{seconds}s-{tag}.{suffix}"
        return make_media(name, *seek, "-i", str(shared_data / SPEECH), "-t", str(seconds), *options)

    return _cut


@pytest.fixture(scope="session")
def lavfi_video(make_media):
    """``lavfi_video(source="testsrc", size="64x48", *, frames=None, seconds=None, rate=25)``: a synthetic H.264
    yuv420p clip from one of ffmpeg's lavfi sources (``"testsrc"``, ``"color=c=gray"``, ...) -> Path; ``rate``
    may be a fraction such as ``"30000/1001"``."""

    def _make(source: str = "testsrc", size: str = "64x48", *, frames: int | None = None,
              seconds: float | None = None, rate: int | str = 25) -> Path:
        spec = f"{source}{':' if '=' in source else '='}size={size}:rate={rate}"
        spec += "" if seconds is None else f":duration={seconds}"
        count = [] if frames is None else ["-frames:v", str(frames)]
        name = f"{source.replace('=', '-')}-{size}-{str(rate).replace('/', '_')}-{frames}f-{seconds}s.mp4"
        return make_media(name, "-f", "lavfi", "-i", spec, *count, "-c:v", "libx264", "-pix_fmt", "yuv420p")

    return _make


@pytest.fixture(scope="session")
def lavfi_tone(make_media):
    """``lavfi_tone(seconds, frequency=220, sample_rate=16000)``: a sine WAV from ffmpeg's lavfi -> Path."""

    def _make(seconds: float, frequency: int = 220, sample_rate: int = 16000) -> Path:
        return make_media(f"sine-{frequency}-{sample_rate}-{seconds}s.wav", "-f", "lavfi", "-i",
                          f"sine=frequency={frequency}:sample_rate={sample_rate}:duration={seconds}")

    return _make


@pytest.fixture(scope="session")
def grey_clip(lavfi_video):
    """1 s of flat grey 128x128 at 25 fps: a video without a face, for jobs stopped before their first frame."""
    return lavfi_video("color=c=gray", "128x128", seconds=1)


@pytest.fixture(scope="session")
def tone_1s(lavfi_tone):
    """1 s of a 220 Hz sine at 16 kHz."""
    return lavfi_tone(1)


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """A complete tiny-model weights tree in the official layout (random weights), made once per session."""
    pytest.importorskip("torch")
    from nbhelpers.testing import make_tiny_weights

    return make_tiny_weights(tmp_path_factory.mktemp("weights") / "models")


@pytest.fixture(scope="session")
def tiny_models(tiny_weights):
    """The tiny UNet, VAE, whisper and positional encoding loaded on the CPU once per session (read-only use)."""
    from nbhelpers import models

    return models.load_models(tiny_weights)


@pytest.fixture(scope="module")
def tiny_vae():
    """A seeded random AutoencoderKL with sd-vae-ft-mse's interface and 8 channels a block (one per module)."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, block_out_channels=(8, 8, 8, 8),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        sample_size=256).eval()
