"""Input checks of a job, run before any frame is decoded or any model loads.

Every check names the parameter, shows the value received, states the rule and says what to do next
(CONTRIBUTING: "Validate before expensive work"). The offline job, the avatar and the batch all start here.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from . import gpu, media, restore, weights
from .config import InferenceConfig
from .constants import FPS, SAMPLE_RATE
from .errors import InputError, MediaError, NoFaceError
from .faces.boxes import boxes_count_message, single_box, user_boxes
from .framestore import output_frame_count


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

    gpu.check_device(config.device)
    video_path, video_info = check_video(video)
    weights_path = check_weights_dir(weights_dir, config.version, config.landmark_backend)
    audio_path, audio_info = check_audio(audio)
    output_path = output_path_for(output, video_path, audio_path)
    if boxes is None and config.landmark_backend == "boxes":
        raise InputError("landmark_backend='boxes' needs boxes=: one (x1, y1, x2, y2) for the clip or one per frame.")
    check_boxes(boxes, video_path, video_info)
    if config.restore is not None:
        restore.check_available(config.restore, weights_path)
    return video_path, audio_path, output_path, weights_path, video_info, audio_info


def given_boxes(boxes: Any) -> Any:
    """The ``boxes`` argument of a job in one form: None, one box, or a per-frame list or array.

    A list (or (1, 4) array) holding exactly one box becomes that box (it means that box for every frame, as a
    bare ``(x1, y1, x2, y2)`` does: :func:`nbhelpers.faces.boxes.single_box`); any other iterable that is not a
    list, tuple or array (a generator) is read into a list, so that it can be checked and then used.
    """
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
    for this by one fast counting decode, and every box is checked.

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
    unchecked (scripts/inference.py:151-160).
    """
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
    with media.load_video(path) as reader:
        return int(reader.frame_count), (int(reader.height), int(reader.width))


def one_frame_boxes(boxes: Any, frame_index: int) -> Any:
    """The boxes argument for one frame: a single box stays; per-frame boxes give that frame's."""
    if boxes is None or single_box(boxes) is not None:
        return boxes
    if not 0 <= int(frame_index) < len(boxes):
        raise InputError(f"boxes has {len(boxes)} entries (one per frame), none for frame_index {frame_index}. Give "
                         "one (x1, y1, x2, y2) for every frame, or one entry, a box or None, per frame.")
    return [boxes[int(frame_index)]]


__all__ = ["check_audio", "check_boxes", "check_inputs", "check_video", "check_weights_dir", "given_boxes",
           "no_face_in_rotated_video", "one_frame_boxes", "output_path_for", "speech_frames"]
