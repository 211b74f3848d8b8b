"""The pipeline object: the loaded models of one MuseTalk version on one device, and the jobs that use them.

:class:`MuseTalkPipeline` (made with :meth:`MuseTalkPipeline.from_pretrained`, as in diffusers) checks the weights
folder once and loads each model the first time a step needs it: UNet, VAE, whisper and its feature extractor,
the positional encoding, face parsing and the landmark backend. Every job reuses them: :meth:`~MuseTalkPipeline.
lipsync` (the offline job), :meth:`~MuseTalkPipeline.preview` (one frame before a full run) and
:meth:`~MuseTalkPipeline.prepare_avatar` (an avatar that generates from the same loaded models). The frames of
every clip are rendered by :mod:`nbhelpers.engine`; every clip is described by :class:`nbhelpers.result.ClipResult`.

The offline job's body is numbered steps matching the notebook headings (media, faces, gpu, models, audio, latents,
parsing, generate/blending, encode). It reproduces the official offline pipeline (``scripts/inference.py``,
reference §2-§8) and fixes the official bugs that lose frames or drift (reference §11):

- Q6: frames without a face no longer shift the latent index: latents are indexed by source frame.
- Q7: a frame without a face is written unchanged instead of being skipped (which cut the video short).
- Q8: every input is converted to constant 25 fps at ingest, so the frame count matches the audio.
- Q17: crop boxes are clamped to the frame (see :func:`nbhelpers.faces.crop_box`).
- Q24: the video is encoded once (libx264 CRF 18) with the audio muxed by explicit stream mapping.
- Q25: frames are streamed to local disk (``FrameStore``), never all held in RAM, and only the source frames the
  audio reaches are decoded.
- Q1: the VAE posterior is sampled from a seeded generator, so runs are reproducible.

``nbh.lipsync(...)``, ``nbh.preview(...)`` and ``nbh.prepare_avatar(...)`` remain as one-call conveniences that make
a pipeline for the call.
"""

from __future__ import annotations

import functools
import html
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import InferenceConfig
from .constants import FPS, SAMPLE_RATE
from .engine import FRAMES_ON_GPU_FRACTION, SourceFaces, Timings, flush_denormals
from .errors import InputError, MediaError, NbHelpersError, NoFaceError
from .framestore import FrameStore, output_frame_count
from .result import ClipResult

# Fields of the pipeline's own: a job's config may leave them empty (the pipeline's are used) but not change them.
PIPELINE_FIELDS = ("version", "device", "fp16")
FACE_BATCH_GPU = 32  # frames decoded and handed to the landmark backend at a time on a GPU (it splits them further)
FACE_BATCH_CPU = 8
STREAM_PIECE = 64  # source frames the offline job prepares at a time while the encoder writes the previous ones


# ------------------------------------------------------------------------------------------------------------------
# Checks


def _as_input_path(value: Any, name: str) -> Path:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise InputError(f"{name} is required: give the path of a file; got {value!r}.")
    path = Path(os.fspath(value)).expanduser()
    if not path.exists():
        raise InputError(f"{name} {str(path)!r} does not exist. Check the path (upload the file first in "
                         "notebook 02_media, or give the full path).")
    if path.is_dir():
        raise InputError(f"{name} {str(path)!r} is a folder; give a video, image or audio file.")
    return path


def _check_media(value: Any, name: str, stream: str, fix: str):
    from . import media

    path = _as_input_path(value, name)
    try:
        info = media.probe(path)
    except MediaError as exc:
        what = "as a video or image" if stream == "video" else ""
        raise InputError(f"{name} {str(path)!r} could not be read{' ' + what if what else ''}: {exc}") from exc
    if not getattr(info, f"has_{stream}"):
        raise InputError(f"{name} {str(path)!r} has no {stream} stream{fix}")
    return path, info


def check_video(video: Any):
    """Check that ``video`` is a readable file with a video stream (or a photo).

    Returns:
        ``(path, media_info)``.

    Raises:
        InputError: Missing, a folder, unreadable, or without a video stream.
    """
    return _check_media(video, "video", "video", "; give a face video or photo.")


def check_audio(audio: Any):
    """Check that ``audio`` is a readable file with an audio stream.

    Returns:
        ``(path, media_info)``.

    Raises:
        InputError: Missing, a folder, unreadable, or without an audio stream.
    """
    return _check_media(audio, "audio", "audio", ". Give a speech file (wav, mp3, m4a, ogg, flac) or a video that "
                        "carries sound.")


def speech_frames(waveform: np.ndarray, what: str = "audio") -> int:
    """Output frames of a 16 kHz waveform, ``floor(seconds x 25)``, checked to be at least one.

    Raises:
        InputError: The audio lasts less than one frame (0.04 s).
    """
    n_out = output_frame_count(len(waveform))
    if n_out < 1:
        raise InputError(f"{what} lasts {len(waveform) / SAMPLE_RATE:.3f} s, shorter than one frame (1/{FPS} s); "
                         "give at least 0.04 s of speech.")
    return n_out


def output_path_for(output: Any, video_path: Path, audio_path: Path) -> Path:
    """The output MP4 path: ``output``, or ``results/<video>_<audio>.mp4`` in the working directory.

    Raises:
        InputError: ``output`` does not end in ``.mp4``, is a folder or inside a file, or is the job's own video or
            audio (writing it would replace the input).
    """
    if output is None:
        path = Path.cwd() / "results" / f"{video_path.stem}_{audio_path.stem}.mp4"
        _check_not_an_input(path, video_path, audio_path)
        return path
    path = Path(os.fspath(output)).expanduser()
    _check_not_an_input(path, video_path, audio_path)
    if path.suffix.lower() != ".mp4":
        raise InputError(f"output must end in .mp4; got {str(path)!r}.")
    if path.is_dir():
        raise InputError(f"output {str(path)!r} is a folder; give the path of the .mp4 file to write.")
    blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise InputError(f"output {str(path)!r} cannot be written: {str(blocked)!r} is a file, not a folder. Give an "
                         "output path inside a folder.")
    return path


def _same_file(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` name one file (a link or another spelling of the path included)."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _check_not_an_input(output: Path, video_path: Path, audio_path: Path) -> None:
    for kind, source in (("video", video_path), ("audio", audio_path)):
        if _same_file(output, Path(source)):
            raise InputError(f"output {str(output)!r} is the job's {kind}: writing it would replace the input. Give "
                             "another output path.")


def check_weights_dir(weights_dir: Any, version: str, landmark_backend: str = "auto") -> Path:
    """The weights folder, checked for the presence of every file a job of ``version`` opens (cheap: no file is
    read; :meth:`MuseTalkPipeline.check_weights` looks inside them).

    Raises:
        WeightsError: The folder does not exist, or files are missing (names them and gives the download command
            for that folder).
    """
    from . import weights

    weights_path = Path(weights_dir).expanduser() if weights_dir is not None else weights.default_dir()
    if not weights_path.is_dir() or weights.missing_files(weights_path,
                                                          weights.required_files(version, parsing=True)):
        weights.check_job_files(weights_path, version, landmark_backend)  # raises, naming the folder or the files
    return weights_path


def check_inputs(video: Any, audio: Any, output: Any = None, *, config: InferenceConfig,
                 weights_dir: Any = None, boxes: Any = None) -> tuple[Path, Path, Path, Path, Any, Any]:
    """Validate every input of a job before any frame is decoded or any model loads.

    Args:
        video: Face video or photo path.
        audio: Speech file path (any format ffmpeg reads, or a video with an audio stream).
        output: Output MP4 path, or None for ``results/<video>_<audio>.mp4`` in the working directory.
        config: Settings (already validated by :class:`InferenceConfig`).
        weights_dir: Folder of the weights (official ``models/`` layout), or None for the default.
        boxes: User crop boxes or None, checked by :func:`check_boxes` (per-frame boxes against the video's
            frame count).

    Returns:
        ``(video, audio, output, weights_dir, video_info, audio_info)``.

    Raises:
        InputError: A file is missing, is not media, has no video/audio stream, or the output is not ``.mp4``;
            per-frame boxes are not one per 25 fps frame of the video, or a box does not fit the frame.
        NoGpuError: ``config.device`` names a CUDA device this runtime does not have.
        WeightsError: Weight files are missing (names them and gives the download command), the restorer's too.
        MissingDependencyError: ``config.restore`` is set and spandrel is not installed.
    """
    from . import gpu

    gpu.check_device(config.device)
    video_path, video_info = check_video(video)
    weights_path = check_weights_dir(weights_dir, config.version, config.landmark_backend)
    audio_path, audio_info = check_audio(audio)
    output_path = output_path_for(output, video_path, audio_path)
    if boxes is None and config.landmark_backend == "boxes":
        raise InputError("landmark_backend='boxes' needs boxes=: one (x1, y1, x2, y2) for the clip or one per frame.")
    check_boxes(boxes, video_path, video_info)
    if config.restore is not None:
        from .restore import check_available

        check_available(config.restore, weights_path)
    return video_path, audio_path, output_path, weights_path, video_info, audio_info


def given_boxes(boxes: Any) -> Any:
    """The ``boxes`` argument of a job in one form: None, one box, or a per-frame list or array.

    A list (or (1, 4) array) holding exactly one box becomes that box (it means that box for every frame, as a
    bare ``(x1, y1, x2, y2)`` does: :func:`nbhelpers.faces.boxes.single_box`); any other iterable that is not a
    list, tuple or array (a generator) is read into a list, so that it can be checked and then used.
    """
    from .faces.boxes import single_box

    if boxes is None:
        return None
    if not isinstance(boxes, (list, tuple, np.ndarray)):
        boxes = list(boxes)
    one = single_box(boxes)
    return one if one is not None else boxes



def no_face_in_rotated_video(exc: Exception, video_info: Any) -> Exception:
    """``exc`` (a :class:`~nbhelpers.errors.NoFaceError`) with a note when the video carries a rotation tag: its
    frames are turned upright as a player shows them (:mod:`nbhelpers.media.video`), so a face stored upright in a
    wrongly tagged file lies on its side. Returns ``exc`` itself for an untagged video or another error.

    Args:
        exc: The error the face tracking raised.
        video_info: The video's :class:`~nbhelpers.media.MediaInfo` (its ``rotation``, clockwise degrees).
    """
    rotation = int(getattr(video_info, "rotation", 0) or 0)
    if not isinstance(exc, NoFaceError) or not rotation:
        return exc
    return NoFaceError(f"{exc} The video is tagged to be shown turned {rotation} degrees clockwise, and its frames "
                       "were turned so: if the face lies on its side when the video is played, the tag is wrong; "
                       "correct it (ffmpeg's -display_rotation input option) or give the crop box yourself.")

def check_boxes(boxes: Any, video: Any, video_info: Any = None) -> Any:
    """Check crop boxes given by hand against the face video before any frame is decoded or any model loads.

    One box for the whole clip (a bare ``(x1, y1, x2, y2)``, or a list holding just that box) is checked against
    the frame size. Per-frame boxes need exactly one entry, a box or None (no face), for each 25 fps frame of the
    whole video, numbered as :func:`nbhelpers.media.load_video` yields them (a job whose audio reaches only the
    first frames still takes one entry per video frame and uses the first ones); the video's frames are counted
    for this, by one fast counting decode (about 0.4 s for 22 s of 576x768 video), and every box is checked.

    Args:
        boxes: None, one box, a one-box list, or per-frame boxes (see :func:`nbhelpers.faces.user_boxes`), in
            full-frame pixels of the upright video.
        video: Path of the face video or photo (already checked by :func:`check_video`).
        video_info: Its :class:`~nbhelpers.media.MediaInfo` (for the frame size), or None to probe it.

    Returns:
        :func:`given_boxes` of ``boxes``: None, the one box, or the per-frame boxes.

    Raises:
        InputError: Per-frame boxes whose count is not the video's frame count at 25 fps (the message gives both
            counts and what to pass), or a box outside the frame, inverted or smaller than 16 pixels.

    Source: no official counterpart: the official ``--use_saved_coord`` reuses a pickled per-frame box list
    unchecked (scripts/inference.py:151-160, reference §3.3).
    """
    from . import media
    from .faces.boxes import boxes_count_message, single_box, user_boxes

    boxes = given_boxes(boxes)
    if boxes is None:
        return None
    if single_box(boxes) is not None:
        info = video_info if video_info is not None else media.probe(video, count_frames=False)
        user_boxes(boxes, 1, (int(info.height), int(info.width)))
        return boxes
    n_frames, shape = _counted_frames(video)
    if len(boxes) != n_frames:
        raise InputError(boxes_count_message(len(boxes), n_frames, f"video {str(video)!r}"))
    user_boxes(boxes, n_frames, shape)
    return boxes


def _counted_frames(video: Any) -> tuple[int, tuple[int, int]]:
    """``(25 fps frames, (height, width))`` of a video file by a counting decode, remembered for the same file
    unchanged (path, size and modification time): ``nbh.lipsync()`` checks its inputs before it makes a pipeline
    and the pipeline's job checks them again, and per-frame boxes need the count each time."""
    path = Path(video).resolve()
    st = path.stat()
    return _count_frames_of(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _count_frames_of(path: str, size: int, mtime_ns: int) -> tuple[int, tuple[int, int]]:
    from . import media

    with media.load_video(path) as reader:
        return int(reader.frame_count), (int(reader.height), int(reader.width))


def _one_frame_boxes(boxes: Any, frame_index: int) -> Any:
    """The boxes argument for one frame: a single box stays; per-frame boxes give that frame's."""
    from .faces.boxes import single_box

    if boxes is None or single_box(boxes) is not None:
        return boxes
    if not 0 <= int(frame_index) < len(boxes):
        raise InputError(f"boxes has {len(boxes)} entries (one per frame), none for frame_index {frame_index}. Give "
                         "one (x1, y1, x2, y2) for every frame, or one entry, a box or None, per frame.")
    return [boxes[int(frame_index)]]


# ------------------------------------------------------------------------------------------------------------------
# Preview result


@dataclass(frozen=True)
class Preview:
    """The inpainting of one frame, shown before a full run (figure with four panels in a notebook).

    Attributes:
        frame: (H, W, 3) uint8 BGR source frame (25 fps numbering).
        result: (H, W, 3) uint8 BGR frame after repainting and blending.
        face_256: (256, 256, 3) uint8 BGR generated crop (the UNet output decoded by the VAE; restored when the
            settings ask for a face restorer).
        crop_box: ``(x1, y1, x2, y2)`` crop box in frame pixels; the lower half of it is repainted.
        landmarks: (68, 2) float32 landmarks, or None when boxes were given.
        mask: (2s, 2s) uint8 feathered blend mask over the expanded square ``square``.
        square: ``(xs, ys, xe, ye)`` expanded square.
        audio: Where the audio tokens came from (a file's first frame, or seeded random tokens).
    """

    frame: np.ndarray
    result: np.ndarray
    face_256: np.ndarray
    crop_box: tuple[int, int, int, int]
    landmarks: np.ndarray | None
    mask: np.ndarray
    square: tuple[int, int, int, int]
    audio: str

    def figure(self):
        """A matplotlib Figure (no pyplot): source with box and landmarks, blend mask, generated crop, result."""
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle

        fig = Figure(figsize=(12, 3.6), dpi=90)
        axes = fig.subplots(1, 4)
        x1, y1, x2, y2 = self.crop_box
        axes[0].imshow(self.frame[:, :, ::-1])
        axes[0].add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, color="lime", lw=1.5))
        axes[0].axhline((y1 + y2) / 2, xmin=0, xmax=1, color="yellow", lw=0.6, ls="--")
        if self.landmarks is not None:
            axes[0].scatter(self.landmarks[:, 0], self.landmarks[:, 1], s=2, c="cyan")
        axes[0].set_title("crop box (green), midline (yellow)")
        overlay = self.frame[:, :, ::-1].astype(np.float32) / 255
        xs, ys, xe, ye = self.square
        h, w = overlay.shape[:2]
        cx0, cy0, cx1, cy1 = max(xs, 0), max(ys, 0), min(xe, w), min(ye, h)
        m = self.mask[cy0 - ys:cy1 - ys, cx0 - xs:cx1 - xs].astype(np.float32) / 255
        overlay[cy0:cy1, cx0:cx1, 0] = overlay[cy0:cy1, cx0:cx1, 0] * (1 - m) + m
        axes[1].imshow(overlay)
        axes[1].set_title("blend mask (red)")
        axes[2].imshow(self.face_256[:, :, ::-1])
        axes[2].set_title("generated crop 256x256")
        axes[3].imshow(self.result[:, :, ::-1])
        axes[3].set_title("result")
        pad = max(x2 - x1, y2 - y1)
        for ax in (axes[0], axes[1], axes[3]):
            ax.set_xlim(max(x1 - pad // 2, 0), min(x2 + pad // 2, w))
            ax.set_ylim(min(y2 + pad // 2, h), max(y1 - pad // 2, 0))
        for ax in axes:
            ax.set_xticks([])
            ax.set_yticks([])
        fig.tight_layout()
        return fig

    def _repr_png_(self) -> bytes:
        import io

        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()

    def __repr__(self) -> str:
        return (f"Preview(crop_box={self.crop_box}, square={self.square}, frame={self.frame.shape[1]}x"
                f"{self.frame.shape[0]}, audio={self.audio!r})")


# ------------------------------------------------------------------------------------------------------------------
# The pipeline object


class MuseTalkPipeline:
    """The models of one MuseTalk version on one device, loaded once, and the jobs that use them.

    Make it with :meth:`from_pretrained`. Each model is loaded the first time a step needs it and then kept, so
    a preview, several offline jobs, an avatar's preparation and its clips read each weight file once. In a
    notebook it shows what is loaded, the device, the precision and the GPU memory it holds.

    Attributes:
        weights_dir: The weights folder (official ``models/`` layout).
        version: ``"v15"`` or ``"v1"``.
        device: The torch device every model runs on.
        dtype: ``torch.float16`` (CUDA) or ``torch.float32``.
        config: Default settings of the jobs, with device, precision and the planner's reasons filled in.
    """

    def __init__(self, weights_dir: Path, config: InferenceConfig):
        import torch

        self.weights_dir = Path(weights_dir)
        self.config = config
        self.version = config.version
        self.device = torch.device(config.device or "cpu")
        self.dtype = torch.float16 if config.fp16 else torch.float32
        self._loaded: dict[str, Any] = {}
        self._checked: dict[str, tuple[int, int]] = {}  # weight file -> (size, mtime_ns) when last found usable

    # -- construction --------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, weights_dir: str | os.PathLike | None = None, *, version: str = "v15",
                        device: str | None = None, torch_dtype: Any = None, landmark_backend: str = "auto",
                        config: InferenceConfig | None = None) -> MuseTalkPipeline:
        """Check a weights folder and make a pipeline over it; no model is loaded yet.

        The device and precision are chosen once here (:func:`nbhelpers.gpu.plan`: CUDA and fp16 when a usable GPU
        is there, else the CPU and fp32), unless given. Every weight file of the version is checked for presence
        and sniffed for content (an HTML page or a git-lfs pointer saved under a weight's name is caught here, in
        a second, before any frame is decoded); the check is remembered per file size and modification time.

        Args:
            weights_dir: The weights folder; None = :func:`nbhelpers.weights.default_dir`.
            version: ``"v15"`` (default) or ``"v1"``.
            device: ``"cuda"``, ``"cuda:N"``, ``"cpu"``; None picks CUDA when usable.
            torch_dtype: ``torch.float16`` or ``torch.float32``; None = fp16 on CUDA, fp32 on the CPU.
            landmark_backend: Default landmark backend of the jobs (``"auto"``, ``"dwpose-onnx"``, ``"mmpose"``,
                ``"dlib"``).
            config: Default settings of the jobs; ``version``, ``device`` and precision given here win over it.

        Returns:
            A :class:`MuseTalkPipeline`.

        Raises:
            InputError: An unknown version, device, dtype or backend.
            NoGpuError: ``device`` asks for CUDA and none is usable.
            WeightsError: The folder does not exist, files are missing or not weight files (each named, with the
                download command).
        """
        import torch

        from . import gpu

        base = config or InferenceConfig()
        fp16 = base.fp16
        if torch_dtype is not None:
            if torch_dtype not in (torch.float16, torch.float32):
                raise InputError(f"torch_dtype must be torch.float16, torch.float32 or None (automatic); got "
                                 f"{torch_dtype!r}.")
            fp16 = torch_dtype == torch.float16
        changes: dict[str, Any] = {"version": version, "fp16": fp16}
        if device is not None:
            changes["device"] = str(device)
        if landmark_backend != "auto" or config is None:
            changes["landmark_backend"] = landmark_backend
        base = base.replace(**changes)
        gpu.check_device(base.device)
        weights_path = check_weights_dir(weights_dir, base.version, base.landmark_backend)
        # Device and precision only: the batch size is planned per job, from its frames, so a user batch_size is
        # left out here (else its warnings came twice, at load and at the job, and for a batch not yet cut to the
        # job's length). Silent: this plan knows neither the frame size (it would assume 1920x1080) nor the
        # length, so its CPU note came before each job's own, a second and wrong one (a new user's trial).
        plan = gpu.plan(kind="lipsync", config=base.replace(batch_size=None), n_frames=None,
                        weights=_weights_kind(weights_path), warn=False)
        planned = plan.config.replace(batch_size=base.batch_size)
        planned.reasons.update(plan.config.reasons)
        if base.batch_size is not None:  # the plan's batch reason is about a batch this config does not hold
            planned.reasons.pop("batch_size", None)
        pipe = cls(weights_path, planned)
        pipe.check_weights()
        return pipe

    def check_weights(self, landmark_backend: str | None = None) -> None:
        """Look inside every weight file a job opens (this version, face parsing and the landmark backend's files)
        before any frame is decoded; later calls only compare each file's size and modification time.

        Args:
            landmark_backend: The job's backend (default the pipeline's): ``"auto"`` checks the files of the
                backend the automatic choice takes; ``"dlib"`` and ``"boxes"`` open no landmark file.

        Raises:
            WeightsError: Files are missing or not weight files (an HTML page, a git-lfs pointer, cut off), each
                named, with the download command for this folder (:func:`nbhelpers.weights.check_job_files`).
        """
        from . import weights

        backend = landmark_backend or self.config.landmark_backend
        entries = weights.job_files(self.version, backend, parsing=True, directory=self.weights_dir)
        keys = []
        for entry in entries:
            path = next((self.weights_dir / p for p in (entry.path, *entry.alternates)
                         if (self.weights_dir / p).is_file()), None)
            st = path.stat() if path is not None else None
            keys.append((entry.path, st.st_size if st else -1, st.st_mtime_ns if st else -1))
        if all(self._checked.get(k[0]) == k[1:] for k in keys):
            return
        weights.check_job_files(self.weights_dir, self.version, backend)
        self._checked.update({k[0]: k[1:] for k in keys})

    # -- the models, loaded on first use ---------------------------------------------------------------------------

    def _get(self, name: str, load: Callable[[], Any]) -> Any:
        """The loaded model ``name``, loaded by ``load()`` on first use.

        Every load holds :data:`nbhelpers.models.LOAD_LOCK` from start to end, as nbhelpers' loaders do: a thread
        asking for a model another one is loading waits for that load, and no two of our models are built at once
        in the process, whichever pipeline loads them. Building at once is not safe: where accelerate is installed (Colab, the GPU machine's
        image), diffusers' ``from_pretrained`` builds the model under accelerate's ``init_empty_weights``, which
        replaces ``torch.nn.Module.register_parameter`` for the whole process while it runs
        (``accelerate/big_modeling.py``, ``init_on_device``), so a module built in another thread meanwhile gets
        parameters on the meta device ("Cannot copy out of meta tensor" when it is moved). Measured on the
        development machine with accelerate 1.x: 16,340 of 151,338 ``nn.Linear`` built in a second thread during
        20 s of VAE and whisper loads had meta weights; a batch worker restarted after a crash failed a job so on
        the GPU machine (its preload thread and a job's thread loading at once).
        """
        from .models import LOAD_LOCK

        if name in self._loaded:
            return self._loaded[name]
        with LOAD_LOCK:
            if name not in self._loaded:
                with flush_denormals(self.device):
                    self._loaded[name] = load()
        return self._loaded[name]

    def warm_up(self, batch_size: int) -> None:
        """Run the UNet and the VAE decoder once on zeros at ``batch_size`` frames, and whisper on 1 s of silence,
        loading those models first if needed. CUDA only: on the CPU nothing is loaded or run.

        A new process's first CUDA calls load their kernels and make the cuBLAS and cuDNN handles; a clip rendered
        at the same batch afterwards starts at full speed. The outputs are discarded; GPU memory of one batch is
        used while it runs. Thread-safe with jobs running at the same time (they share the loaded models).

        Raises:
            InputError: ``batch_size`` is not a positive whole number.
        """
        import torch

        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InputError(f"batch_size must be a positive whole number; got {batch_size!r}.")
        if self.device.type != "cuda":
            return
        from .constants import CROP_SIZE
        from .latents import decode, unet_step

        unet, vae = self.unet, self.vae
        cfg = unet.config
        side = CROP_SIZE // 2 ** (len(vae.config.block_out_channels) - 1)  # the latent of a 256x256 crop: 32
        with torch.inference_mode():
            latents = torch.zeros(batch_size, int(cfg.in_channels), side, side, device=self.device, dtype=self.dtype)
            tokens = torch.zeros(batch_size, 50, int(cfg.cross_attention_dim), device=self.device, dtype=self.dtype)
            decode(unet_step(unet, self.pe, latents, tokens), vae)
            self.features(np.zeros(SAMPLE_RATE, dtype=np.float32))
        torch.cuda.synchronize(self.device)

    def preload(self, kind: str = "avatar", *, restore: str | None = None) -> list[str]:
        """Load now the models that jobs of ``kind`` use, instead of at their first use; returns what is loaded.

        ``"avatar"`` (preparing avatars and generating from them) and ``"lipsync"`` both load the VAE, the face
        parser, the UNet, whisper with its feature extractor and the positional encoding; ``"lipsync"`` adds the
        landmark backend of the pipeline's config (none for ``"boxes"``). ``restore`` adds that face restorer.
        Thread-safe: a job that asks for a model while this loads it waits for the same load
        (the batch workers load in a thread while their first avatar is prepared).

        Raises:
            InputError: An unknown ``kind``. Whatever loading a model raises (:class:`WeightsError`,
                :class:`CheckpointError`, a missing dependency).
        """
        if kind not in ("avatar", "lipsync"):
            raise InputError(f"kind must be 'avatar' or 'lipsync'; got {kind!r}.")
        self.vae, self.face_parser, self.unet, self.whisper, self.feature_extractor, self.pe  # noqa: B018 - loads
        if kind == "lipsync" and self.config.landmark_backend not in ("boxes",):
            self.landmarks()
        if restore is not None:
            self.restorer(restore)
        return self.loaded

    @property
    def unet(self):
        """The MuseTalk ``UNet2DConditionModel`` (loaded on first use)."""
        from . import models

        return self._get("unet", lambda: models.load_unet(self.weights_dir, self.version, self.device, self.dtype))

    @property
    def vae(self):
        """The sd-vae-ft-mse ``AutoencoderKL`` (loaded on first use)."""
        from . import models

        return self._get("vae", lambda: models.load_vae(self.weights_dir, self.device, self.dtype))

    @property
    def whisper(self):
        """The whisper-tiny model; the pipeline uses its encoder (loaded on first use)."""
        from . import models

        return self._get("whisper", lambda: models.load_whisper(self.weights_dir, self.device, self.dtype))

    @property
    def feature_extractor(self):
        """Whisper's log-mel feature extractor (CPU, loaded on first use)."""
        from . import models

        return self._get("feature_extractor", lambda: models.load_feature_extractor(self.weights_dir))

    @property
    def pe(self):
        """The positional encoding of the whisper tokens (384, 5000)."""
        from .constants import WHISPER_DIM
        from .models import PositionalEncoding

        return self._get("pe", lambda: PositionalEncoding(WHISPER_DIM, 5000).to(self.device, self.dtype).eval())

    @property
    def face_parser(self):
        """BiSeNet face parsing (:class:`nbhelpers.parsing.FaceParser`, loaded on first use)."""
        from .parsing import FaceParser

        return self._get("face_parser", lambda: FaceParser(self.weights_dir, device=self.device, dtype=self.dtype))

    @property
    def models(self):
        """UNet, VAE, whisper, feature extractor and positional encoding as one :class:`nbhelpers.models.Models`."""
        from . import models, weights

        return models.Models(unet=self.unet, vae=self.vae, whisper=self.whisper,
                             feature_extractor=self.feature_extractor, pe=self.pe, device=self.device,
                             dtype=self.dtype, version=self.version, weights_dir=self.weights_dir,
                             tiny=weights.is_tiny(self.weights_dir))

    def restorer(self, name: str):
        """The face restorer ``name`` (``"gfpgan"``, ``"restoreformer"``, ``"codeformer"``), loaded on first use.

        Raises what :func:`nbhelpers.restore.load_restorer` raises (missing spandrel or weights, a wrong file).
        """
        from . import restore

        restore.check_name(name)
        return self._get(f"restorer:{name}", lambda: restore.load_restorer(name, self.weights_dir, self.device,
                                                                           self.dtype))

    def models_for(self, config: InferenceConfig):
        """:attr:`models` with the face restorer of ``config`` (``restore``, ``restore_strength``) attached, or
        none when ``config.restore`` is None: what the engine renders a job with."""
        bundle = self.models
        if config.restore is not None:
            bundle.restorer = self.restorer(config.restore).at(config.restore_strength)
        return bundle

    def landmarks(self, backend: Any = None):
        """The landmark backend ``backend`` (a name, default the pipeline's; or an object, returned as is).

        Backends made here are kept for later jobs. Raises what :func:`nbhelpers.faces.get_backend` raises.
        """
        from . import faces

        backend = backend or self.config.landmark_backend
        if not isinstance(backend, str):
            return backend
        key = f"landmarks:{backend}"
        return self._get(key, lambda: faces.get_backend(backend, weights_dir=self.weights_dir, device=str(self.device)))

    @property
    def loaded(self) -> list[str]:
        """Names of the components loaded so far."""
        return list(self._loaded)

    # -- steps shared by the jobs ----------------------------------------------------------------------------------

    def job_config(self, config: InferenceConfig | None = None, *, boxes: Any = None) -> InferenceConfig:
        """A job's settings: ``config`` (default the pipeline's) with this pipeline's version, device and precision,
        and its landmark backend when ``config`` leaves it at ``"auto"``.

        Raises:
            InputError: ``config`` asks for another version, device or precision than the pipeline holds.
        """
        config = config or self.config
        if boxes is not None and config.landmark_backend != "boxes":
            config = config.replace(landmark_backend="boxes")
        mine = {"version": self.version, "device": self.config.device, "fp16": self.config.fp16}
        clash = [f"{k}={getattr(config, k)!r} (this pipeline: {v!r})" for k, v in mine.items()
                 if getattr(config, k) is not None and getattr(config, k) != v]
        if clash:
            raise InputError(f"the settings ask for {', '.join(clash)}. A pipeline keeps its models on one device in "
                             "one precision and version: make another with MuseTalkPipeline.from_pretrained(...), or "
                             "move this one with pipe.to(device).")
        if config.landmark_backend == "auto":  # no preference: the pipeline's (whose files it checked)
            mine["landmark_backend"] = self.config.landmark_backend
        filled = config.replace(**mine)
        filled.reasons.update({k: v for k, v in self.config.reasons.items() if k in PIPELINE_FIELDS})
        filled.reasons.update(config.reasons)
        return filled

    def plan(self, kind: str, config: InferenceConfig, n_frames: int | None, frame_size: tuple[int, int] | None,
             source_frames: int | None = None, landmark_backend: str | None = None):
        """The batch size of one job on this pipeline's device (:func:`nbhelpers.gpu.plan`); returns its config.

        ``landmark_backend`` names the backend the job really built (for the CPU time estimate and the face
        models); None takes the config's. The models this pipeline already holds on the GPU that the job's stages
        count (:meth:`_resident_gib`) are passed as ``loaded_gib``, so that a second job on this pipeline gets the
        plan of the first instead of a smaller batch."""
        from . import gpu

        backend = landmark_backend or config.landmark_backend
        return gpu.plan(kind=kind, config=config, n_frames=n_frames, frame_size=frame_size,
                        weights=_weights_kind(self.weights_dir), source_frames=source_frames,
                        landmark_backend=landmark_backend, loaded_gib=self._resident_gib(kind, backend)).config

    def _resident_gib(self, kind: str, landmark_backend: str) -> float:
        """GiB that the loaded models which every stage of a ``kind`` job counts hold on this pipeline's GPU.

        The memory model (:func:`nbhelpers.gpu.stage_memory`) counts in every stage: for ``"lipsync"`` the UNet,
        VAE, whisper (with the positional encoding), BiSeNet and the GPU face models of ``landmark_backend``
        (none for ``"dlib"`` and ``"boxes"``); for ``"realtime"`` and ``"clip"`` the UNet, VAE and whisper. ``"avatar"`` loads
        its models one stage at a time, so none is counted in every stage: 0. Face restorers and other
        backends are not in the model, so their memory stays taken. Parameters and buffers, each storage once
        (:func:`nbhelpers.gpu.module_bytes`); 0 on the CPU.
        """
        from . import gpu

        if self.device.type != "cuda" or kind not in ("lipsync", "realtime", "clip"):
            return 0.0
        names = ["unet", "vae", "whisper", "pe"]
        if kind == "lipsync":
            names.append("face_parser")
            if landmark_backend not in ("dlib", "boxes"):
                names += [n for n, obj in self._loaded.items() if n.startswith("landmarks:")
                          and landmark_backend in (n.split(":", 1)[1], getattr(obj, "name", None))]
        held = [self._loaded[n] for n in names if n in self._loaded]
        return gpu.module_bytes(*held, device=self.device) / 2**30

    def features(self, waveform: np.ndarray):
        """Whisper features of a 16 kHz mono waveform: (T, 50, 384) on the device, T = floor(seconds x 25).

        Source: ``musetalk/utils/audio_processor.py`` (reference §5), through :func:`nbhelpers.audio.whisper_features`.
        """
        from .audio import whisper_features

        with flush_denormals(self.device):
            return whisper_features(waveform, self.whisper, fps=FPS, feature_extractor=self.feature_extractor)

    # -- jobs ------------------------------------------------------------------------------------------------------

    def lipsync(self, video: str | os.PathLike, audio: str | os.PathLike, output: str | os.PathLike | None = None, *,
                config: InferenceConfig | None = None, boxes: Any = None, backend: Any = None,
                frame_callback: Callable[[int, np.ndarray], None] | None = None) -> ClipResult:
        """Lip-sync a face video (or photo) to a speech file and write an MP4.

        The output has ``floor(audio seconds x 25)`` frames at 25 fps and the source resolution; source frames
        cycle forward and back (0..N-1, N-1..0, ...) as the official code does, so audio longer than the video
        loops it and shorter audio uses its first frames (only those are decoded and tracked). Frames without a
        face are written unchanged (counted in ``no_face_frames``). The input audio is muxed in by explicit
        stream mapping.

        Args:
            video: Face video (any container ffmpeg reads, any frame rate: converted to 25 fps) or a photo.
            audio: Speech (wav, mp3, m4a, ogg, flac, or a video with sound), any sample rate and channel count.
            output: Path of the MP4 to write (default ``results/<video>_<audio>.mp4``). Written under a temporary
                name and renamed when complete.
            config: :class:`InferenceConfig`; default the pipeline's. Batch size is planned when left empty.
            boxes: Crop boxes given by hand instead of detecting faces, in source pixels: one ``(x1, y1, x2, y2)``
                for the whole clip (bare, or a list holding just that box), or exactly one entry per 25 fps frame
                of the whole video (None for a frame without a face; audio that reaches only the first frames uses
                their entries). Per-frame boxes of another length are refused before anything heavy runs, with
                the video's frame count (:func:`check_boxes`).
            backend: A landmark backend object or name; default ``config.landmark_backend``.
            frame_callback: Called as ``frame_callback(t, frame)`` with each finished (H, W, 3) uint8 BGR frame
                before it is encoded (for tests and previews).

        Returns:
            :class:`~nbhelpers.result.ClipResult` (shows the video inline in a notebook).

        Raises:
            InputError: A file is missing or unreadable, has no video or audio stream, or an option is invalid
                (before anything heavy runs).
            WeightsError: Weight files are missing or corrupt (names them and gives the download command).
            NoFaceError: No frame has a face (before the UNet loads): pass ``boxes=`` or another clip.
            DiskSpaceError: The local disk cannot hold the decoded frames (checked before decoding).
            FFmpegError: ffmpeg failed (its stderr is in the message).

        Source: ``scripts/inference.py:85-249`` (reference §2-§8), with the fixes listed in the module docstring.
        """
        from . import faces, media
        from .engine import run
        from .faces.track import is_single_box
        from .framestore import check_disk_for_frames, expected_frames

        t0 = time.perf_counter()
        track_memory = self.device.type == "cuda" and os.environ.get("NBHELPERS_STAGE_MEMORY", "") == "1"
        timings = Timings(peak_gib={} if track_memory else None)
        boxes = given_boxes(boxes)
        config = self.job_config(config, boxes=boxes)

        # 1. check inputs: files, streams and weights, before anything heavy
        with timings.stage("checks"):
            video_path, audio_path, output_path, _, video_info, _ = check_inputs(
                video, audio, output, config=config, weights_dir=self.weights_dir, boxes=boxes)
            self.check_weights(config.landmark_backend)

        # 2. media: audio at 16 kHz; then only the 25 fps frames the audio reaches, streamed to local disk
        with timings.stage("media"):
            waveform = media.load_audio(audio_path)
        n_out = speech_frames(waveform, f"audio {str(audio_path)!r}")
        with timings.stage("media"):
            reader = media.load_video(video_path)
        # The ping-pong over n_out output frames uses source frames 0..min(n_out, N)-1 only, so a short clip over a
        # long video decodes, tracks, encodes and parses only those (the official code prepares every frame).
        check_disk_for_frames(min(n_out, expected_frames(video_info, n_out)), reader.height, reader.width)
        n_src = min(n_out, expected_frames(video_info, n_out))  # an upper estimate until decoding ends
        if boxes is not None and not is_single_box(boxes):  # one per video frame (checked in check_inputs)
            boxes = list(boxes)
            if len(boxes) > n_out:  # one box per video frame, but the audio reaches only the first n_out frames
                boxes = boxes[:n_out]
        store = FrameStore(reader.height, reader.width)
        job = _StreamedJob(self, config, store, n_out, boxes, timings)
        try:
            # 3. the landmark backend (or the boxes given), built first so that the plan's CPU time estimate
            # counts the face tracking this job really does
            # (with boxes given no detector runs, so none is built or loaded)
            given = boxes is not None or config.landmark_backend == "boxes"
            with timings.stage("faces"):
                detector = "auto" if given else self.landmarks(backend or config.landmark_backend)
            tracking = "boxes" if given else getattr(detector, "name", None)
            # 4. gpu: batch size from free memory (user overrides kept), from the probed size and frame count
            with timings.stage("plan"):
                config = job.config = self.plan("lipsync", config, n_out, (reader.height, reader.width),
                                                source_frames=n_src, landmark_backend=tracking)
            batch = int(config.batch_size or 8)
            # 5. the tracker and the whisper features, one (50, 384) block per output frame, before the first
            # frame is decoded
            with timings.stage("faces"):
                if self.device.type == "cuda":
                    fit_face_batches(detector, (reader.height, reader.width), self.device,
                                     loaded_gib=self._resident_gib("lipsync", tracking or ""))
                job.tracker = faces.FaceTracker(
                    detector, config, boxes=boxes, weights_dir=self.weights_dir,
                    batch_size=FACE_BATCH_GPU if self.device.type == "cuda" else FACE_BATCH_CPU)
            with flush_denormals(self.device):
                with timings.stage("audio"):
                    features = self.features(waveform)
                if features.shape[0] != n_out:
                    raise NbHelpersError(f"internal: {features.shape[0]} feature frames for {n_out} output frames")

                # 6-10. decode, faces, latents, blend material, generation and paste-back piece by piece: the
                # encoder writes piece k while piece k+1 is prepared (see _StreamedJob)
                with timings.stage("encoder_start"):
                    encoder = media.choose_encoder(config.encoder)
                    writer = media.VideoWriter(output_path, store.width, store.height, fps=FPS, audio=audio_path,
                                               encoder=encoder)
                decoded = job.decode_ahead(reader)
                with writer:
                    run(job.pieces(decoded), features, None, batch, n_out, writer, frame_callback=frame_callback,
                        timings=timings, desc="lipsync")
                    finish = time.perf_counter()
                timings.add("encoder_finish", time.perf_counter() - finish)
                final = Path(writer.path) if hasattr(writer, "path") else output_path
        except NoFaceError as exc:
            raise no_face_in_rotated_video(exc, video_info) from None
        finally:
            job.close()
            reader.close()
            store.close()
        track = job.track
        return ClipResult(output=final, n_frames=n_out, source_frames=track.n_frames, no_face_frames=track.n_no_face,
                          fps=FPS, duration_s=len(waveform) / SAMPLE_RATE, config=job.config, backend=track.backend,
                          timings=dict(timings.seconds), wall_s=time.perf_counter() - t0, kind="lipsync",
                          notes=self._notes((store.width, store.height) if final is not None else None),
                          stats={f"peak_gib_{k}": round(v, 3) for k, v in (timings.peak_gib or {}).items()})

    def preview(self, video: str | os.PathLike, *, config: InferenceConfig | None = None, boxes: Any = None,
                audio: str | os.PathLike | None = None, frame_index: int = 0, backend: Any = None) -> Preview:
        """Repaint one frame with the current settings, to check the crop box and mask before a full run.

        Runs the same steps as :meth:`lipsync` on a single 25 fps frame, through the same engine: faces (or the
        boxes given), latents, parsing, UNet + decode and blending (the CPU blend, bit-exact with the official
        one). With ``audio`` the tokens of its first output frame are used; without, seeded random tokens stand
        in, as the official app's "Test Inpainting" button does with unseeded ones (``app.py:35-123``), so the
        mouth shape is arbitrary but the crop, mask and blend are the real ones.

        Args:
            video: Face video or photo.
            config: Settings (default the pipeline's).
            boxes: One crop box ``(x1, y1, x2, y2)`` (bare, or a list holding just that box) or per-frame boxes
                (the entry of ``frame_index`` is used), as for :meth:`lipsync`.
            audio: Optional speech file.
            frame_index: Which 25 fps frame to preview (default the first).
            backend: Landmark backend object or name (default ``config.landmark_backend``).

        Returns:
            :class:`Preview` (a four-panel figure in a notebook).

        Raises:
            InputError: Missing or unreadable files, a frame index past the end, or invalid options.
            WeightsError: Missing weight files.
            NoFaceError: No face in that frame (pass ``boxes=``).
        """
        import torch

        from . import faces, media
        from .blending import materials_for_frames
        from .engine import repaint
        from .latents import encode_frames

        boxes = given_boxes(boxes)
        config = self.job_config(config, boxes=boxes)
        from . import gpu

        gpu.check_device(config.device)
        video_path, _ = check_video(video)
        audio_path = check_audio(audio)[0] if audio is not None else None
        self.check_weights(config.landmark_backend)
        frames = media.frames_at(video_path, [int(frame_index)])
        if len(frames) != 1:
            raise InputError(f"frame_index {frame_index} is past the end of {str(video_path)!r}.")
        frame = np.ascontiguousarray(frames[0])[None]
        given = boxes is not None or config.landmark_backend == "boxes"  # then no detector is built or loaded
        detector = "auto" if given else self.landmarks(backend or config.landmark_backend)
        track = faces.track(frame, backend=detector, config=config, boxes=_one_frame_boxes(boxes, frame_index),
                            weights_dir=self.weights_dir)
        box = tuple(int(v) for v in track.crop_boxes[0])
        with flush_denormals(self.device):
            latents = encode_frames(frame, track.crop_boxes, [0], self.vae, seed=config.seed,
                                    mode=config.latent_mode, progress=False)
            if audio_path is not None:
                feats = self.features(media.load_audio(audio_path))[:1]
                source_text = f"first frame of {audio_path.name}"
            else:
                g = torch.Generator().manual_seed(int(config.seed))
                feats = torch.randn((1, 50, 384), generator=g).to(device=self.device, dtype=self.dtype)
                source_text = f"random tokens (seed {config.seed})"
            material = materials_for_frames(frame, track.crop_boxes, [0], self.face_parser, config,
                                            progress=False)[0]
            source = SourceFaces.from_materials(frame, [0], latents, [material])
            result, faces_256 = repaint(source, feats, self.models_for(config), np.arange(1), cpu_blend=True)
        lms = None if not np.isfinite(track.landmarks[0]).all() else track.landmarks[0].astype(np.float32)
        return Preview(frame=frame[0], result=np.array(result[0]), face_256=faces_256[0].cpu().numpy(), crop_box=box, landmarks=lms,
                       mask=material.mask, square=tuple(int(v) for v in material.square), audio=source_text)

    def prepare_avatar(self, video: str | os.PathLike, directory: str | os.PathLike, *,
                       config: InferenceConfig | None = None, boxes: Any = None, rebuild: bool = False,
                       backend: Any = None):
        """Prepare (or load) the avatar of a face video with this pipeline's models; see
        :func:`nbhelpers.avatar.prepare_avatar` (``boxes``: one box for every frame, bare or as a list holding
        just that box, or exactly one entry per 25 fps frame of the video). The avatar generates its clips with
        the same loaded models."""
        from .avatar import prepare_avatar

        return prepare_avatar(video, directory, config=config, boxes=boxes, rebuild=rebuild, backend=backend,
                              pipeline=self)

    def load_avatar(self, directory: str | os.PathLike, *, config: InferenceConfig | None = None,
                    check: bool = True):
        """Load a prepared avatar that generates with this pipeline's models; see :meth:`nbhelpers.avatar.Avatar.load`."""
        from .avatar import Avatar

        return Avatar.load(directory, config=config, check=check, pipeline=self)

    # -- device and memory -----------------------------------------------------------------------------------------

    def to(self, device: str | Any) -> MuseTalkPipeline:
        """Move the pipeline to ``device`` (fp16 on CUDA, fp32 on the CPU). Returns self.

        The UNet, VAE, whisper and positional encoding move; the face parser and landmark backends are released
        and rebuilt on the new device when next used.

        Raises:
            InputError: An unknown device. NoGpuError: CUDA asked and none usable.
        """
        import torch

        from . import gpu

        gpu.check_device(str(device))
        dev = torch.device(device)
        fp16 = dev.type == "cuda"
        dtype = torch.float16 if fp16 else torch.float32
        for name in ("unet", "vae", "whisper", "pe"):
            if name in self._loaded:
                self._loaded[name] = gpu.cast_and_move(self._loaded[name], dev, dtype)
        for name in [n for n in self._loaded if n == "face_parser" or n.startswith(("landmarks:", "restorer:"))]:
            gpu.release(self._loaded.pop(name))
        self.device, self.dtype = dev, dtype
        self.config = self.config.replace(device=str(dev), fp16=fp16)
        return self

    def release(self) -> float:
        """Drop every loaded model and empty the CUDA cache; returns GiB freed on the GPU. The pipeline stays
        usable: models are loaded again when next needed."""
        from . import gpu

        loaded = list(self._loaded.values())
        for obj in loaded:
            close = getattr(obj, "close", None)
            if callable(close) and not hasattr(obj, "parameters"):
                try:
                    close()
                except Exception:  # noqa: BLE001 - releasing must not fail
                    pass
        self._loaded.clear()
        return gpu.release(*loaded)

    def __enter__(self) -> MuseTalkPipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _notes(self, size: tuple[int, int] | None = None) -> tuple[str, ...]:
        """The notes of a clip's summary: random test weights, and (``size`` = the frames' width, height) frames
        padded to an even size by the writer (:func:`nbhelpers.media.padded_size_note`)."""
        from . import media, weights

        notes = ["(random test weights: the mouth is noise)"] if weights.is_tiny(self.weights_dir) else []
        padded = media.padded_size_note(*size) if size is not None else None
        return tuple(notes + ([padded] if padded else []))

    def _gpu_gib(self) -> float | None:
        import torch

        if self.device.type != "cuda":
            return None
        return torch.cuda.memory_allocated(self.device) / 2**30

    def _rows(self) -> list[tuple[str, str]]:
        names = ["unet", "vae", "whisper", "feature_extractor", "pe", "face_parser"]
        names += [n for n in self._loaded if n.startswith(("landmarks:", "restorer:"))]
        rows = [("weights", str(self.weights_dir)), ("version", self.version), ("device", str(self.device)),
                ("precision", "fp16" if self.config.fp16 else "fp32")]
        rows += [(n, "loaded" if n in self._loaded else "not loaded yet") for n in names]
        gib = self._gpu_gib()
        if gib is not None:
            rows.append(("GPU memory held", f"{gib:.2f} GiB"))
        return rows

    def __repr__(self) -> str:
        loaded = ", ".join(self._loaded) or "nothing loaded yet"
        return (f"MuseTalkPipeline({self.version} on {self.device}, {'fp16' if self.config.fp16 else 'fp32'}, "
                f"{self.weights_dir}; {loaded})")

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in self._rows())
        return f"<table><caption>MuseTalkPipeline</caption>{body}</table>"


DWPOSE_GIB_PER_FRAME = 0.034  # DWPose fp16 with the flip test: 1.09 GiB at 32 frames (H200, 2026-11-30 bench)
FACES_SHARE = 0.5  # share of the memory left beside the models that the face models' batches may take
PIECE_ON_GPU_FRACTION = 0.05  # a piece's frames go to the GPU once when they take under this share of free memory


def fit_face_batches(detector: Any, frame_hw: tuple[int, int], device: Any, *, loaded_gib: float = 0.0) -> None:
    """Size the landmark backend's GPU batches (S3FD frames, DWPose frames) to the memory this job leaves them.

    The offline job detects faces with the UNet, VAE and whisper resident (or about to be), so on a small card
    (or under ``set_per_process_memory_fraction``) the detector's default batches would push the job over it.
    Sets ``detector.face_detector.batch_size`` and ``detector.pose.batch_size`` where the backend has them
    (DWPose backends); other backends are left alone.

    Args:
        detector: A landmark backend object.
        frame_hw: (H, W) of the frames, pixels.
        device: The CUDA device.
        loaded_gib: GiB of this job's models already on the GPU (:meth:`MuseTalkPipeline._resident_gib`): added
            back to the free memory, as the planner does, so that the first and a later job get the same batches
            (and so the same shapes, whose cuDNN plans the first job built).

    Source: the planner's memory model (:class:`nbhelpers.gpu.MemoryModel`: ``s3fd_bytes_per_pixel``,
    ``core_fixed_gib``, ``workspace_gib``) and :data:`DWPOSE_GIB_PER_FRAME`, measured on the H200.
    """
    from .faces.dwpose_torch import DEFAULT_BATCH, S3FD_GPU_BATCH
    from .gpu import MEMORY_MODEL, usable_bytes

    usable = usable_bytes(device)
    if usable is None:
        return
    mm = MEMORY_MODEL
    # the planner's budget (its workspace and safety margin), less the models every stage holds
    budget = (usable / 2**30 + max(0.0, float(loaded_gib)) - mm.workspace_gib) * (1.0 - mm.safety_fraction)
    left = budget - mm.core_fixed_gib - mm.bisenet_weights_gib - mm.s3fd_weights_gib - mm.dwpose_gib
    share = max(0.0, left) * FACES_SHARE
    s3fd_frame = mm.s3fd_bytes_per_pixel * frame_hw[0] * frame_hw[1] / 2**30
    face_detector, pose = getattr(detector, "face_detector", None), getattr(detector, "pose", None)
    if face_detector is not None and hasattr(face_detector, "batch_size"):
        face_detector.batch_size = int(min(S3FD_GPU_BATCH, max(1, share // s3fd_frame)))
    if pose is not None and hasattr(pose, "batch_size"):
        pose.batch_size = int(min(DEFAULT_BATCH["cuda"], max(1, share // DWPOSE_GIB_PER_FRAME)))


class _Window:
    """Frames ``offset .. offset + n - 1`` of a clip, indexed by their clip index (a piece of the offline job)."""

    def __init__(self, frames: Any, offset: int):
        self.frames, self.offset = frames, int(offset)
        self.device = getattr(frames, "device", None)

    def __len__(self) -> int:
        return self.offset + len(self.frames)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            if not self.offset <= index < len(self):
                raise IndexError(f"frame {index} is not in this piece ({self.offset}..{len(self) - 1})")
            return self.frames[int(index) - self.offset]
        if isinstance(index, slice) and index.step in (None, 1):
            start = self.offset if index.start is None else index.start
            stop = len(self) if index.stop is None else index.stop
            if not self.offset <= start <= stop <= len(self):
                raise IndexError(f"frames {start}..{stop - 1} are not in this piece ({self.offset}..{len(self) - 1})")
            return self.frames[start - self.offset:stop - self.offset]
        return self.frames[index - self.offset]  # an index array or tensor (GPU frames)


class _StreamedJob:
    """The offline job's frames in pieces: decode, track, encode latents and make blend material for
    :data:`STREAM_PIECE` source frames, then hand their output frames to the engine, while the encoder thread
    writes the previous piece. Output frame t < N uses source frame t, so a piece's outputs need only it.

    With ``smooth_boxes`` > 1 the crop boxes are final only once the whole clip is tracked, so every frame is
    tracked first and the clip is then prepared and rendered as one piece (no overlap with the encoder).
    Frames before the first face are written unchanged without loading a model; a clip with no face at all
    raises :class:`~nbhelpers.errors.NoFaceError` when its last frame is tracked (no model loaded, the partial
    output removed).
    """

    def __init__(self, pipe: MuseTalkPipeline, config: InferenceConfig, store: FrameStore, n_out: int, boxes: Any,
                 timings: Timings):
        self.pipe, self.config, self.store, self.n_out, self.timings = pipe, config, store, n_out, timings
        self.boxes = boxes
        self.tracker: Any = None
        self.track: Any = None
        self.models: Any = None
        self.rows: list[int] = []  # latent row of each source frame so far, -1 without a face
        self.crop = np.zeros((0, 4), dtype=np.int32)
        self.latents: Any = None
        self.materials: list[Any] = []
        self._next_offset = 0
        self._decoder: _DecodeAhead | None = None

    def decode_ahead(self, reader: Any) -> _DecodeAhead:
        """Start decoding the frames the job needs (the first ``min(n_out, N)``) in pieces, one piece ahead."""
        self._decoder = _DecodeAhead(reader, self.n_out, STREAM_PIECE, self.store, self.timings)
        return self._decoder

    def pieces(self, decoded: Any):
        """Yield :class:`~nbhelpers.engine.Piece` covering output frames 0..n_out-1 in order."""
        from .engine import Piece

        t = self.timings
        streamed = self.config.smooth_boxes <= 1
        written = 0
        for arr in decoded:  # (b, H, W, 3) pieces, already in the frame store
            offset = self._next_offset
            self._next_offset += len(arr)
            frames_device = self._upload(arr) if streamed else None  # once: faces, parsing and the paste-back
            with t.stage("faces"):
                crop, has = self.tracker.add(arr, frames_device=frames_device)
            self.crop = np.concatenate([self.crop, crop])
            if not streamed:
                self.rows.extend([-1] * len(arr))
                continue
            face_frames = offset + np.flatnonzero(has)
            frames_device = self._prepare(_Window(arr, offset), face_frames, arr, frames_device)
            stop = min(self.n_out, offset + len(arr))
            if stop > written:
                if self.models is None or not has[written - offset:stop - offset].any():
                    yield Piece(written, stop - written, frames=arr[written - offset:stop - offset])
                else:
                    window = _Window(arr, offset)
                    source = self._source(window, None if frames_device is None else _Window(frames_device, offset))
                    yield Piece(written, stop - written, source=source, models=self.models)
                written = stop
        with t.stage("store"):
            self.store.finish()  # every piece was written by the decoding thread before it was handed over
        with t.stage("faces"):
            self.track = self.tracker.finish()  # NoFaceError for a clip without any face
        if len(self.store) != self.track.n_frames:
            raise MediaError(f"internal: decoded {len(self.store)} frames but tracked {self.track.n_frames}")
        if not streamed:  # smoothed crop boxes: prepare the whole clip now
            self.crop = self.track.crop_boxes
            self.rows = [-1] * len(self.store)
            self._prepare(self.store, np.flatnonzero(self.track.has_face), None, None)
        if written < self.n_out:  # the rest of the ping-pong (or, smoothed, every frame) from the whole clip
            with t.stage("upload"):
                source = self._source(self.store, None)
            yield Piece(written, self.n_out - written, source=source, models=self.models)

    def _upload(self, arr: np.ndarray) -> Any:
        """A piece's frames on the GPU when they take at most PIECE_ON_GPU_FRACTION of its usable memory, else
        None (on the CPU too)."""
        if self.pipe.device.type != "cuda":
            return None
        from .gpu import to_device, usable_bytes

        if arr.nbytes >= PIECE_ON_GPU_FRACTION * (usable_bytes(self.pipe.device) or 0):
            return None
        with self.timings.stage("upload"):
            return to_device(arr, self.pipe.device)

    def _prepare(self, frames: Any, face_frames: np.ndarray, arr: Any, frames_device: Any):
        """Latents and blend material of ``face_frames`` (clip indices), with the piece's frames on the GPU
        (``frames_device``, or None); returns ``frames_device``."""
        from .blending import materials_for_frames
        from .latents import encode_frames

        t, config = self.timings, self.config
        if arr is not None:
            self.rows.extend([-1] * len(arr))
        if face_frames.size == 0:
            return frames_device
        if self.models is None:
            with t.stage("models"):  # loaded once per pipeline: no time here on a second job
                self.models = self.pipe.models_for(config)
        batch = int(config.batch_size or 8)
        with t.stage("latents"):  # crop, resize and encode (indexed by source frame: Q6)
            latents = encode_frames(frames, self.crop, face_frames, self.models.vae, seed=config.seed,
                                    mode=config.latent_mode, batch_size=batch, progress=False)
        with t.stage("parsing"):  # feathered mask + expanded square; on CUDA the parsing stays on the GPU
            parser = self.pipe.face_parser
            parser.batch_size = batch
            window = None if frames_device is None else _Window(frames_device, frames.offset)
            materials = materials_for_frames(frames, self.crop, face_frames, parser, config, progress=False,
                                             frames_device=window)
        import torch

        first = len(self.materials)
        for k, i in enumerate(face_frames):
            self.rows[int(i)] = first + k
        self.latents = latents if self.latents is None else torch.cat([self.latents, latents])
        self.materials.extend(materials)
        return frames_device

    def _source(self, frames: Any, frames_device: Any) -> SourceFaces:
        rows = np.asarray(self.rows[:len(frames)], dtype=np.int64)
        m = self.materials
        source = SourceFaces(frames=frames, latent_row=rows, latents=self.latents, boxes=[x.box for x in m],
                             masks=[x.mask for x in m], squares=[x.square for x in m], frames_device=frames_device)
        # masks on the GPU once; the whole clip's frames too when they fit (a piece's were uploaded with it, or
        # stay on the host: the paste-back then copies each batch's frames)
        whole_clip = frames is self.store
        return source.to_device(self.pipe.device, frames_fraction=FRAMES_ON_GPU_FRACTION if whole_clip else 0.0)

    def close(self) -> None:
        if self._decoder is not None:
            self._decoder.close()
        if self.tracker is not None:
            self.tracker.close()


class _DecodeAhead:
    """The first ``n`` frames of a video in pieces of ``piece`` frames, decoded in a thread one piece ahead of the
    job, each piece appended to the frame store there.

    ffmpeg writes decoded frames into a pipe of 64 KiB, so without a reader it stops within a frame; reading in a
    thread lets it decode the next piece while the job's thread waits on the GPU (the reads and the store's disk
    writes release the GIL). The wait of the job's thread for a piece is timed as ``decode``. An error in the
    thread (ffmpeg failed, the disk filled up) is raised in the job's thread at the piece it would have given.
    """

    def __init__(self, reader: Any, n: int, piece: int, store: FrameStore, timings: Timings):
        import queue
        import threading

        self._reader, self._left, self._piece, self._store, self._timings = reader, int(n), int(piece), store, timings
        self._queue: Any = queue.Queue(maxsize=1)  # one piece ahead: bounded host memory
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbhelpers-decode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._left > 0 and not self._stop.is_set():
                arr = self._reader.read_batch(min(self._piece, self._left))
                if len(arr) == 0:
                    break
                self._store.append_batch(arr)
                self._left -= len(arr)
                self._put(arr)
            self._put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the job's thread, raised there
            self._put(exc)

    def _put(self, item: Any) -> None:
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        while True:
            start = time.perf_counter()
            item = self._queue.get()
            self._timings.add("decode", time.perf_counter() - start)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the thread (it ends at its next piece) and drop what it decoded ahead."""
        import queue

        self._stop.set()
        deadline = time.monotonic() + 30.0  # a read in progress ends with its piece (or when ffmpeg is stopped)
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:
                self._queue.get(timeout=0.1)
            except queue.Empty:
                pass
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass


def _weights_kind(weights_path: Path) -> str:
    from . import weights

    return "tiny" if weights.is_tiny(weights_path) else "full"


# ------------------------------------------------------------------------------------------------------------------
# One-call conveniences


def _pipeline_for(config: InferenceConfig, weights_dir: Any) -> MuseTalkPipeline:
    return MuseTalkPipeline.from_pretrained(weights_dir, version=config.version, config=config)


def lipsync(video: str | os.PathLike, audio: str | os.PathLike, output: str | os.PathLike | None = None, *,
            version: str | None = None, boxes: Any = None, config: InferenceConfig | None = None,
            weights_dir: str | os.PathLike | None = None, backend: Any = None,
            frame_callback: Callable[[int, np.ndarray], None] | None = None) -> ClipResult:
    """Lip-sync a face video (or photo) to a speech file in one call: a pipeline is made for it and released.

    For several jobs, make one :class:`MuseTalkPipeline` and call its :meth:`~MuseTalkPipeline.lipsync`: the models
    load once. Arguments, result and errors are those of :meth:`MuseTalkPipeline.lipsync`, plus:

    Args:
        video: Face video or photo.
        audio: Speech file.
        output: Output MP4 (default ``results/<video>_<audio>.mp4``).
        version: ``"v15"`` or ``"v1"``; overrides ``config.version`` when given.
        boxes: Crop boxes given by hand: one for the clip (bare, or a list holding just that box) or one per 25 fps
            frame of the video (see :meth:`MuseTalkPipeline.lipsync`).
        config: :class:`InferenceConfig`; missing device, precision and batch size are planned from the GPU.
        weights_dir: Folder of the weights in the official layout (default :func:`nbhelpers.weights.default_dir`).
        backend: A landmark backend object or name.
        frame_callback: ``frame_callback(t, frame)`` per finished frame.

    Returns:
        :class:`~nbhelpers.result.ClipResult`.

    Raises:
        InputError, WeightsError, NoFaceError, DiskSpaceError, FFmpegError: see :meth:`MuseTalkPipeline.lipsync`.
    """
    config = config or InferenceConfig()
    if version is not None and version != config.version:
        config = config.replace(version=version)
    boxes = given_boxes(boxes)
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    check_inputs(video, audio, output, config=config, weights_dir=weights_dir, boxes=boxes)
    with _pipeline_for(config, weights_dir) as pipe:
        return pipe.lipsync(video, audio, output, config=config, boxes=boxes, backend=backend,
                            frame_callback=frame_callback)


def preview(video: str | os.PathLike, config: InferenceConfig | None = None, *,
            weights_dir: str | os.PathLike | None = None, boxes: Any = None,
            audio: str | os.PathLike | None = None, frame_index: int = 0, backend: Any = None) -> Preview:
    """One-call :meth:`MuseTalkPipeline.preview` (a pipeline is made for it and released).

    Args:
        video: Face video or photo.
        config: Settings (default :class:`InferenceConfig`).
        weights_dir: Weights folder (default :func:`nbhelpers.weights.default_dir`).
        boxes: One crop box (bare, or a list holding just that box) or per-frame boxes.
        audio: Optional speech file.
        frame_index: Which 25 fps frame to preview.
        backend: Landmark backend object or name.

    Returns:
        :class:`Preview`.

    Raises:
        InputError, WeightsError, NoFaceError: see :meth:`MuseTalkPipeline.preview`.
    """
    config = config or InferenceConfig()
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    from . import gpu

    gpu.check_device(config.device)
    check_video(video)
    with _pipeline_for(config, weights_dir) as pipe:
        return pipe.preview(video, config=config, boxes=boxes, audio=audio, frame_index=frame_index,
                            backend=backend)


def describe_boxes(boxes: Sequence[Any] | None) -> str:
    """One line describing user boxes (for logs)."""
    if boxes is None:
        return "detected"
    from .faces.boxes import single_box

    return "one box for the clip" if single_box(boxes) is not None else f"{len(boxes)} boxes given"


# Kept for code written against the first releases: both names are the one result type.
LipsyncResult = ClipResult

__all__ = ["ClipResult", "LipsyncResult", "MuseTalkPipeline", "Preview", "check_audio", "check_boxes", "check_inputs",
           "check_video", "check_weights_dir", "given_boxes", "lipsync", "output_path_for", "preview"]
