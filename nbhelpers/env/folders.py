"""The workbook's folders and inputs: work, media and weights folders, and the clips a notebook uses."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import gpu, weights
from ..config import InferenceConfig
from ..constants import FPS
from ..errors import FFmpegError, InputError, MediaError
from ..hashing import atomic_path
from .modes import (
    AUDIO_SUFFIXES,
    CI_CLIP_SECONDS,
    SHARED_AUDIO,
    SHARED_AUDIO_2,
    SHARED_VIDEO,
    WORKBOOK_AUDIO,
    WORKBOOK_VIDEO,
    run_mode,
)


@functools.lru_cache(maxsize=1)
def _source_fingerprint() -> str:
    """A short hash of this package's source files, so CI caches made by older code are never reused."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def work_dir(mode: str | None = None) -> Path:
    """The workbook's own folder for media, avatars and results, created: ``NBHELPERS_WORKDIR``, else
    ``/content/musetalk-workbook`` on Colab, ``~/musetalk-workbook`` locally, a temporary folder in CI mode."""
    mode = run_mode(mode)
    if os.environ.get("NBHELPERS_WORKDIR"):
        folder = Path(os.environ["NBHELPERS_WORKDIR"]).expanduser()
    elif mode == "ci":
        folder = Path(tempfile.gettempdir()) / f"nbhelpers-ci-{_source_fingerprint()}"
    elif mode == "colab":
        folder = Path("/content/musetalk-workbook")
    else:
        folder = Path.home() / "musetalk-workbook"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def media_dir(mode: str | None = None) -> Path:
    """``work_dir(mode)/media``: where ``02_media`` leaves the 25 fps video and the audio (created)."""
    folder = work_dir(mode) / "media"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _weights_path(mode: str) -> Path:
    return work_dir(mode) / "tiny-weights" / "models" if mode == "ci" else weights.default_dir()


def weights_dir(mode: str | None = None, *, download: bool = True) -> Path:
    """The weights folder of this mode, with the files in it: in CI mode a tiny random-weights tree made once by
    :func:`nbhelpers.testing.make_tiny_weights`; else :func:`nbhelpers.weights.default_dir`, into which the default
    set is downloaded when files are missing unless ``download`` is False (WeightsError when that fails)."""
    mode = run_mode(mode)
    folder = _weights_path(mode)
    if mode != "ci":
        if download:
            weights.download(directory=folder)
        return folder
    marker = folder.parent / ".complete"
    if not marker.is_file():
        from .. import testing  # numpy and the model modules: imported only in CI mode

        testing.make_tiny_weights(folder)
        marker.write_text("made by nbhelpers.testing.make_tiny_weights\n", encoding="utf-8")
    return folder


def shared_data_dir() -> Path | None:
    """The project's test media folder, or None: ``NBHELPERS_SHARED_DATA`` when set, else the ``data`` folder of
    the first ``shared`` folder found walking up from the current folder."""
    env = os.environ.get("NBHELPERS_SHARED_DATA")
    candidates = [Path(env).expanduser()] if env else [p / "shared" / "data" for p in (Path.cwd(), *Path.cwd().parents)]
    return next((folder for folder in candidates if (folder / SHARED_VIDEO).is_file()), None)


def workbook_inputs(mode: str | None = None, video: str | os.PathLike | None = None,
                    audio: str | os.PathLike | None = None, *,
                    uploads: Sequence[str | os.PathLike] = ()) -> tuple[Path, Path]:
    """The ``(video, audio)`` paths a notebook works on.

    Given paths win, then ``uploads`` (the first audio file by suffix is the audio, the first other file the video).
    Otherwise: in CI mode the first :data:`CI_CLIP_SECONDS` of the test video and speech (the packaged demo if absent);
    elsewhere what ``02_media`` left in :func:`media_dir`, else :func:`nbhelpers.media.demo_inputs`. InputError when a
    given path does not exist; FFmpegError when cutting the CI clips failed."""
    mode = run_mode(mode)
    for name, value in (("video", video), ("audio", audio)):
        if value not in (None, "") and not Path(value).expanduser().is_file():
            raise InputError(f"{name} {str(value)!r} does not exist. Give the path of a file (upload it in "
                             "02_media, or copy it to Drive and use its /content/drive/MyDrive/... path), or "
                             "leave it empty to use the sample.")
    uploaded = [Path(p) for p in uploads]
    audios = [p for p in uploaded if p.suffix.lower() in AUDIO_SUFFIXES]
    others = [p for p in uploaded if p not in audios]
    video = Path(video).expanduser() if video else next(iter(others), None)
    # an uploaded audio file, else the second of the other uploads
    audio = Path(audio).expanduser() if audio else next(iter(audios + others[1:]), None)
    if video is None or audio is None:
        default_video, default_audio = _default_inputs(mode)
        return video or default_video, audio or default_audio
    return video, audio


def _ci_clip(src: Path, name: str, seconds: float, kind: str = "audio") -> Path:
    """The first ``seconds`` of ``src``, cut once into ``clips/<name>-<milliseconds>ms<suffix>`` of the work dir
    (video: H.264 25 fps without audio; audio: PCM WAV)."""
    from .. import media  # numpy

    dst = work_dir("ci") / "clips" / f"{name}-{int(round(seconds * 1000))}ms{'.mp4' if kind == 'video' else '.wav'}"
    if dst.is_file() and dst.stat().st_size > 0:
        return dst
    codec = (["-an", "-vf", f"fps={FPS}", "-c:v", "libx264", "-preset", "veryfast", "-crf", "18", "-pix_fmt",
              "yuv420p"] if kind == "video" else ["-vn", "-c:a", "pcm_s16le"])
    with atomic_path(dst, f".tmp{dst.suffix}") as tmp:
        command = [media.ffmpeg_exe(), "-v", "error", "-y", "-i", str(src), "-t", f"{seconds:.3f}", *codec, str(tmp)]
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise FFmpegError(f"could not cut the first {seconds} s of {src}", command, done.returncode,
                              "\n".join(done.stderr.splitlines()[-40:]))
    return dst


def _default_inputs(mode: str) -> tuple[Path, Path]:
    from .. import media  # numpy

    if mode == "ci":
        shared = shared_data_dir()
        if shared is not None:
            return (_ci_clip(shared / SHARED_VIDEO, "face", CI_CLIP_SECONDS, "video"),
                    _ci_clip(shared / SHARED_AUDIO, "speech", CI_CLIP_SECONDS))
        photo, speech = media.demo_inputs(work_dir(mode) / "clips" / "demo")
        return photo, _ci_clip(speech, "demo-speech", CI_CLIP_SECONDS)
    folder = media_dir(mode)
    video = folder / WORKBOOK_VIDEO
    audios = sorted(folder.glob(WORKBOOK_AUDIO + ".*"))
    if video.is_file() and audios:
        return video, audios[0]
    photo, speech = media.demo_inputs(work_dir(mode) / "demo")
    return (video if video.is_file() else photo), (audios[0] if audios else speech)


def keep_audio(audio: str | os.PathLike, mode: str | None = None) -> Path:
    """Copy ``audio`` into :func:`media_dir` as ``audio<suffix>`` for the later notebooks, and return the copy;
    InputError when ``audio`` does not exist."""
    source = Path(audio).expanduser()
    if not source.is_file():
        raise InputError(f"audio {str(audio)!r} does not exist; give the path of your speech file.")
    folder = media_dir(mode)
    target = folder / (WORKBOOK_AUDIO + source.suffix.lower())
    if source.resolve() == target.resolve():
        return target
    for old in folder.glob(WORKBOOK_AUDIO + ".*"):
        old.unlink()
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    return target


def sample_audios(mode: str | None = None) -> list[Path]:
    """Two different speech clips for the realtime notebook: in CI mode the first :data:`CI_CLIP_SECONDS` of two test
    recordings (or the demo speech at two lengths); elsewhere the workbook audio and the demo speech."""
    from .. import media  # numpy

    mode = run_mode(mode)
    _, first = workbook_inputs(mode)
    if mode == "ci":
        shared = shared_data_dir()
        if shared is not None:
            return [first, _ci_clip(shared / SHARED_AUDIO_2, "sing", CI_CLIP_SECONDS)]
        _, speech = media.demo_inputs(work_dir(mode) / "clips" / "demo")
        return [first, _ci_clip(speech, "demo-speech", CI_CLIP_SECONDS / 2)]
    _, speech = media.demo_inputs(work_dir(mode) / "demo")
    return [first, speech]


def default_config(mode: str | None = None, **changes: Any):
    """The starting :class:`~nbhelpers.config.InferenceConfig` of a notebook with ``changes``: CI mode uses the
    ``dlib`` backend and the CPU, other modes the defaults."""
    mode = run_mode(mode)
    base = {"landmark_backend": "dlib", "device": "cpu"} if mode == "ci" else {}
    return InferenceConfig(**{**base, **changes})


def plan(kind: str = "lipsync", mode: str | None = None, **changes: Any):
    """:func:`nbhelpers.gpu.plan` of ``kind`` for this mode and :func:`default_config` with ``changes``: for the tiny
    test models in CI mode or when the mode's weights folder holds them (``NBHELPERS_WEIGHTS``), as ``python -m
    nbhelpers report`` plans."""
    mode = run_mode(mode)
    tiny = mode == "ci" or weights.is_tiny(_weights_path(mode))
    return gpu.plan(kind, config=default_config(mode, **changes), weights="tiny" if tiny else "full")


def upload(mode: str | None = None, directory: str | os.PathLike | None = None) -> list[Path]:
    """Colab's file picker (``colab`` mode only; elsewhere an empty list): the uploaded files, saved into ``directory``
    (default :func:`media_dir` ``/ "uploads"``), in upload order."""
    mode = run_mode(mode)
    if mode != "colab":
        return []
    from google.colab import files  # type: ignore[import-not-found]

    folder = Path(directory) if directory else media_dir(mode) / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    saved = []
    for name, data in files.upload().items():
        target = folder / Path(name).name
        with atomic_path(target) as tmp:
            tmp.write_bytes(data)
        saved.append(target)
    return saved


def media_seconds(path: str | os.PathLike) -> float:
    """Duration of a media file in seconds (:func:`nbhelpers.media.probe`); MediaError when the file cannot be probed
    or reports no duration."""
    from .. import media  # numpy

    seconds = media.probe(path).duration_s
    if seconds is None:
        raise MediaError(f"{path} reports no duration.")
    return seconds
