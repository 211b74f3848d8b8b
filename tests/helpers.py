"""Plain helpers the test files share: paths, independent decodes, subprocess runs, stand-ins and fake reports.

Fixtures live in conftest.py; what a test imports (``from helpers import decode_frames``) lives here. Nothing here
imports torch or another heavy library at module level: the Python 3.13 job runs the ``notorch`` tests only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from nbhelpers.gpu import GpuReport

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REFERENCE = SHARED / "reference"  # the official checkpoints' key lists and configs, read in place
SHARED_DATA = Path(os.environ.get("NBHELPERS_SHARED_DATA", SHARED / "data"))
FACE_VIDEO = "face-sing-576x768-25fps.mp4"  # in SHARED_DATA: 550 frames of 576x768 at 25 fps, no sound
FACE_SIZE = (576, 768)  # (W, H) of FACE_VIDEO
SPEECH = "speech-en-short.wav"  # in SHARED_DATA


def ffmpeg_exe() -> str:
    """imageio-ffmpeg's binary: the one the package uses, and the ``ffmpeg`` fixture's."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


# ------------------------------------------------------------------------------------------------ independent decodes


def passthrough(ffmpeg: str) -> list[str]:
    """ffmpeg's output option for "no frame duplication or dropping" (renamed in ffmpeg 5.1)."""
    from nbhelpers.media import ffmpeg_version

    return ["-fps_mode", "passthrough"] if ffmpeg_version(ffmpeg) >= (5, 1) else ["-vsync", "passthrough"]


def decode_frames(path, size: tuple[int, int] = FACE_SIZE, *, indices=None, start_s: float | None = None,
                  n_frames: int | None = None, ffmpeg: str | None = None) -> np.ndarray:
    """(N, H, W, 3) uint8 BGR frames of ``path`` decoded by a plain ffmpeg command, independent of nbhelpers.media.

    ``size`` is the (W, H) of the frames. ``indices`` picks source frames by number (in that order, repeats
    allowed); else ``start_s`` seeks (accurately) and ``n_frames`` limits the count; none of them: every frame.
    """
    ffmpeg = ffmpeg or ffmpeg_exe()
    seek = [] if start_s is None else ["-ss", str(start_s)]
    if indices is not None:
        wanted = sorted(set(int(i) for i in indices))
        expr = "+".join(f"eq(n\\,{i})" for i in wanted)
        picks = ["-vf", f"select={expr}", *passthrough(ffmpeg)]
    else:
        picks = [] if n_frames is None else ["-frames:v", str(n_frames)]
    raw = subprocess.run([ffmpeg, "-v", "error", *seek, "-i", str(path), "-map", "0:v:0", *picks, "-f", "rawvideo",
                          "-pix_fmt", "bgr24", "-"], check=True, capture_output=True, stdin=subprocess.DEVNULL).stdout
    width, height = size
    frames = np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)
    if indices is not None:
        order = {i: k for k, i in enumerate(wanted)}
        frames = frames[[order[int(i)] for i in indices]]
    return frames.copy()


def face_frames(indices) -> np.ndarray:
    """Frames of the shared face video by number, (N, 768, 576, 3) uint8 BGR (decoded by ffmpeg directly)."""
    return decode_frames(SHARED_DATA / FACE_VIDEO, indices=indices)


def decode_audio(path, sample_rate: int = 16000, ffmpeg: str | None = None) -> np.ndarray:
    """The first audio stream of ``path`` as mono float32 at ``sample_rate``, decoded by a plain ffmpeg command."""
    out = subprocess.run([ffmpeg or ffmpeg_exe(), "-v", "error", "-i", str(path), "-map", "0:a:0", "-ac", "1", "-ar",
                          str(sample_rate), "-f", "f32le", "-"], check=True, capture_output=True,
                         stdin=subprocess.DEVNULL).stdout
    return np.frombuffer(out, np.float32)


# ------------------------------------------------------------------------------------------------ other processes


def run_cli(*args, env: dict | None = None, unset=(), cwd=None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m nbhelpers ARGS`` in a child process that imports this checkout, its output captured as text;
    ``env`` adds to this process's environment and ``unset`` names variables the child does not get."""
    child = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    child["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), child.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "nbhelpers", *map(str, args)], env=child, cwd=cwd,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)


def loaded_by(code: str, modules) -> list[str]:
    """Which of ``modules`` a fresh interpreter of this checkout holds in sys.modules after running ``code``."""
    script = f"{code}\nimport sys\nprint(repr(sorted(m for m in {tuple(modules)!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - the list repr printed above


def fake_program(path: Path, script: str) -> str:
    """Write an executable stand-in (``script`` starts with its own ``#!`` line) and return its path."""
    path.write_text(script)
    path.chmod(0o755)
    return str(path)


def linked_copy(src: Path, dst: Path) -> Path:
    """A folder whose files are symbolic links to ``src``'s (cheap); replace a link to break or change one file
    without touching ``src``, which other tests share."""
    for f in Path(src).rglob("*"):
        if f.is_file():
            target = dst / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(f, target)
    return dst


# ------------------------------------------------------------------------------------------------ stand-ins


class StubDetector:
    """Stands in for the S3FD face detector: ``box`` for every frame, None for the frames listed in ``none``."""

    def __init__(self, box=(10.7, -3.2, 400.9, 500.5, 0.93), none=()):
        self.box, self.none, self.calls = box, set(none), 0

    def detect(self, frames):
        self.calls += 1
        return [None if i in self.none else self.box for i in range(len(frames))]


class BarRecorder:
    """Stands in for ``nbhelpers.progress.bar`` (patch it where the code looks it up): ``bars`` holds every bar made,
    each with the arguments it was made with (``args``, ``options``) and the count it reached (``n``)."""

    def __init__(self):
        self.bars: list[_Bar] = []

    def __call__(self, *args, **options):
        self.bars.append(_Bar(args, options))
        return self.bars[-1]


class _Bar:
    def __init__(self, args, options):
        self.args, self.options, self.n = args, options, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.n += n


def max_landmark_difference(a, b, frame_shape) -> float:
    """Two landmark backends' results on the same frames: the same face boxes and crop boxes wherever both found a
    face, None where either found none; returns the largest landmark difference in pixels."""
    from nbhelpers import faces

    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert (x is None) == (y is None)
        if x is None:
            continue
        worst = max(worst, float(np.abs(x.landmarks - y.landmarks).max()))
        np.testing.assert_array_equal(x.face_box, y.face_box)
        assert faces.crop_box(x.landmarks, x.face_box, frame_shape) == faces.crop_box(y.landmarks, y.face_box,
                                                                                        frame_shape)
    return worst


def gpu_card(name: str, total: float, free: float, cc=(7, 5), **fields) -> GpuReport:
    """A report of one CUDA GPU with ``total`` and ``free`` GiB, as gpu.report would read it through torch."""
    return GpuReport(has_gpu=True, device="cuda:0", name=name, compute_capability=cc, total_gib=total,
                     free_gib=free, **fields)


T4 = gpu_card("Tesla T4", 15.0, 14.7)  # Colab's free GPU with its CUDA context made
CPU_ONLY = GpuReport(host_ram_total_gib=12.7, host_ram_available_gib=10.0, torch_version="2.11.0")  # Colab's CPU


# ------------------------------------------------------------------------------------------------ engine material

ENGINE_BOX = (25, 30, 85, 100)  # the face box of engine_parts' frames


def engine_parts(n_frames: int, face_frames: list[int], n_tokens: int, seed: int, torch_seed: int,
                 hw: tuple[int, int] = (120, 110)):
    """What the render engine takes, made up: (frames, face_frames, latents, materials, features).

    ``n_frames`` random (H, W) = ``hw`` uint8 source frames of which ``face_frames`` have a face in ENGINE_BOX,
    a random latent row for each, their blend materials (a mask over the lower part of the face) and random
    whisper features for ``n_tokens`` output frames. Needs torch.
    """
    import torch

    from nbhelpers import blending

    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (n_frames, *hw, 3), dtype=np.uint8)
    torch.manual_seed(torch_seed)
    latents = torch.randn(len(face_frames), 8, 32, 32)
    square = blending.expanded_square(ENGINE_BOX)
    mask_512 = np.zeros((512, 512), np.uint8)
    mask_512[256:480, 60:450] = 255
    mask = blending.prepare_mask(mask_512, ENGINE_BOX, square)
    materials = [blending.BlendMaterial(mask=mask, square=square, box=ENGINE_BOX) for _ in face_frames]
    features = torch.randn(n_tokens, 50, 384)
    return frames, list(face_frames), latents, materials, features


def source_faces(parts, frames=None):
    """The engine's SourceFaces of ``engine_parts`` (``frames`` in place of its frames when given)."""
    from nbhelpers.engine import SourceFaces

    f, face_frames, latents, materials, _ = parts
    return SourceFaces.from_materials(f if frames is None else frames, face_frames, latents, materials)


def expected_frame(parts, models, t: int) -> np.ndarray:
    """Output frame ``t`` of ``engine_parts`` computed on its own: source frame cycle(t), its latent row, tokens t,
    the UNet and decode, the CPU blend; a frame without a face is the source frame."""
    from nbhelpers import blending
    from nbhelpers.framestore import cycle_index
    from nbhelpers.latents import decode, unet_step

    frames, face_frames, latents, materials, features = parts
    j = int(cycle_index(t, len(frames)))
    if j not in face_frames:
        return frames[j]
    row = face_frames.index(j)
    face = decode(unet_step(models.unet, models.pe, latents[row:row + 1], features[t:t + 1]), models.vae)[0]
    m = materials[row]
    return blending.blend_cpu(frames[j], face.numpy(), m.box, m.mask, m.square)
