"""Input checks of a job (offline, avatar, batch), run before any frame is decoded or any model loads.

Each message names the parameter, shows the value, states the rule and says what to do next.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from . import gpu, media, restore, weights
from .config import InferenceConfig, parse_face
from .constants import FPS, SAMPLE_RATE
from .errors import InputError, NoFaceError, SilentAudioWarning, plural
from .faces.boxes import boxes_count_message, single_box, user_boxes
from .framestore import expected_frames, output_frame_count
from .media.inputs import check_input, check_path_type


def check_video(video: Any):
    """``(path, media_info)`` of ``video``; InputError unless it is a readable video or photo file."""
    return check_input(video, "video")


def check_audio(audio: Any):
    """``(path, media_info)`` of ``audio``; InputError (NoAudioError without sound) unless a readable sound file."""
    return check_input(audio, "audio")


def check_speech_seconds(seconds: float | None, what: str = "audio") -> None:
    """InputError when ``seconds`` (a waveform's length, or a probe's duration) is under one frame; None passes."""
    if seconds is not None and seconds < 1.0 / FPS:
        raise InputError(f"{what} lasts {seconds:.3f} s, shorter than one frame (1/{FPS} s); give at least 0.04 s of "
                         "speech.")


def speech_frames(waveform: np.ndarray, what: str = "audio") -> int:
    """Output frames of a 16 kHz waveform, ``floor(seconds x 25)``; InputError under one frame (0.04 s)."""
    check_speech_seconds(len(waveform) / SAMPLE_RATE, what)
    return output_frame_count(len(waveform))


SILENT_DBFS = -60.0  # audio whose loudest sample is below this is called silent (the live session's threshold too)


def warn_if_silent(waveform: np.ndarray, what: str = "audio") -> bool:
    """Warn (:class:`~nbhelpers.errors.SilentAudioWarning`) when ``waveform`` is silent: its loudest sample is
    below :data:`SILENT_DBFS`. The job goes on; returns whether it warned."""
    peak = float(np.max(np.abs(waveform))) if len(waveform) else 0.0
    if peak >= 10.0 ** (SILENT_DBFS / 20.0):
        return False
    level = ("digital silence (every sample is 0)" if peak == 0.0
             else f"its loudest sample is {20 * np.log10(peak):.0f} dBFS")
    warnings.warn(f"{what} is silent: {level}. The job goes on, but the mouth will barely move; check that it is "
                  "the right file and track (a muted recording, or the wrong channel).", SilentAudioWarning,
                  stacklevel=3)
    return True


def names_folder(output: Any) -> bool:
    """True when the output path ``output`` names a folder to write into: an existing folder, or text that ends in
    a path separator (``-o results/new/``; the folder is made when the file is written)."""
    if isinstance(output, str) and output.endswith(("/", os.sep)):
        return True
    return isinstance(output, (str, os.PathLike)) and Path(os.fspath(output)).expanduser().is_dir()


def output_path_for(output: Any, video_path: Path, audio_path: Path) -> Path:
    """The output MP4 path: ``output``, ``<output>/<video>_<audio>.mp4`` when ``output`` names a folder
    (:func:`names_folder`), or ``results/<video>_<audio>.mp4`` in the working directory (None). InputError when it
    does not end in ``.mp4``, is a folder or inside a file, or is the job's own video or audio."""
    name = f"{video_path.stem}_{audio_path.stem}.mp4"
    if output is None:
        output = Path.cwd() / "results" / name
    check_path_type(output, "output")
    path = Path(os.fspath(output)).expanduser()
    if names_folder(output):  # a folder to write into, as results/ is by default
        path = path / name
    for kind, source in (("video", video_path), ("audio", audio_path)):
        if _same_file(path, Path(source)):
            raise InputError(f"output {str(path)!r} is the job's {kind}: writing it would replace the input. Give "
                             "another output path.")
    if path.suffix.lower() != ".mp4":
        raise InputError(f"output must end in .mp4 or be an existing folder; got {str(path)!r}.")
    if path.is_dir():
        raise InputError(f"output {str(path)!r} is a folder; give the path of the .mp4 file to write.")
    blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise InputError(f"output {str(path)!r} cannot be written: {str(blocked)!r} is a file, not a folder. Give an "
                         "output path inside a folder.")
    media.check_writable(path.parent)
    return path


def _same_file(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` name one file (a link or another spelling of the path included)."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def check_weights_dir(weights_dir: Any, version: str, landmark_backend: str = "auto") -> Path:
    """The weights folder (None: the default), checked for the presence of every file a job of ``version`` opens
    (WeightsError naming the folder or files); no file is read (:meth:`MuseTalkPipeline.check_weights` does)."""
    weights_path = weights.resolve_dir(weights_dir)
    if not weights_path.is_dir() or weights.missing_files(weights_path,
                                                          weights.required_files(version, parsing=True)):
        weights.check_job_files(weights_path, version, landmark_backend)  # raises, naming the folder or the files
    return weights_path


def check_inputs(video: Any, audio: Any, output: Any = None, *, config: InferenceConfig,
                 weights_dir: Any = None, boxes: Any = None) -> tuple[Path, Path, Path, Path, Any, Any]:
    """Validate every input of a job (the ``output`` path as :func:`output_path_for`, ``boxes`` as
    :func:`check_boxes`); returns ``(video, audio, output, weights_dir, video_info, audio_info)``.

    Raises:
        InputError: A file is missing, not media or without the stream; a bad output path or boxes.
        NoGpuError: ``config.device`` names a CUDA device this runtime does not have.
        WeightsError: Weight files are missing, the restorer's too.
        MissingDependencyError: ``config.restore`` is set and spandrel is not installed.
    """
    gpu.check_device(config.device)
    video_path, video_info = check_video(video)
    audio_path, audio_info = check_audio(audio)
    output_path = output_path_for(output, video_path, audio_path)
    if boxes is None and config.landmark_backend == "boxes":
        raise InputError("landmark_backend='boxes' needs boxes=: one (x1, y1, x2, y2) for the clip or one per frame.")
    check_boxes(boxes, video_path, video_info)
    check_face(config.face, video_info)
    # the job's own inputs before the weights folder: a typo costs no download
    weights_path = check_weights_dir(weights_dir, config.version, config.landmark_backend)
    if config.restore is not None:
        restore.check_available(config.restore, weights_path)
    return video_path, audio_path, output_path, weights_path, video_info, audio_info


def check_face(face: Any, video_info: Any) -> None:
    """InputError when ``face`` (``InferenceConfig.face``) is a point outside the frame of ``video_info`` (a
    :class:`~nbhelpers.media.MediaInfo`, upright size), a box that does not overlap it, or names a frame (``@N``)
    past the video's end."""
    choice = parse_face(face)
    if choice.kind not in ("point", "box"):
        return
    n_frames = expected_frames(video_info, choice.frame + 1)
    if choice.frame >= n_frames:
        raise InputError(f"face={face!r} names frame {choice.frame}, but the video has {plural(n_frames, 'frame')} at "
                         f"25 fps (0 to {n_frames - 1}). Give a frame of the video after '@', or leave '@' out for "
                         "frame 0.")
    w, h = int(video_info.width), int(video_info.height)
    x1, y1, x2, y2 = choice.box or choice.point * 2
    if x2 < 0 or y2 < 0 or x1 >= w or y1 >= h:
        raise InputError(f"face={face!r} lies outside the frame: the video is {w}x{h} pixels (x from 0 to "
                         f"{w - 1}, y from 0 to {h - 1}). Give a point x,y or a box x1,y1,x2,y2 on the face, in "
                         "pixels of the frame.")


def given_boxes(boxes: Any) -> Any:
    """The ``boxes`` argument in one form: None, one box, or a per-frame list or array. A list or (1, 4) array of
    one box becomes that box (:func:`nbhelpers.faces.boxes.single_box`); a generator is read into a list; InputError
    for text, a flat sequence of numbers not four long, or a per-frame entry that is not None or four numbers."""
    if boxes is None:
        return None
    if isinstance(boxes, (str, bytes)):
        raise InputError(f"boxes must be numbers, not text: give boxes=(x1, y1, x2, y2) in pixels, e.g. "
                         f"({str(boxes).strip('()[] ')}); got {boxes!r}.")
    if not isinstance(boxes, (list, tuple, np.ndarray)):
        boxes = list(boxes)
    numbers = [isinstance(v, (int, float, np.number)) for v in boxes]
    if len(boxes) not in (0, 4) and all(numbers):
        raise InputError(f"boxes must be four numbers (x1, y1, x2, y2) in pixels, or a list with one box (or None) "
                         f"per frame; got {plural(len(boxes), 'number')}: {boxes!r}.")
    bad = None if all(numbers) else next((i for i, b in enumerate(boxes) if numbers[i] or isinstance(
        b, (list, tuple, np.ndarray)) and len(b) != 4), None)
    if bad is not None:  # one frame's entry: None (no face) or four numbers
        raise InputError(f"boxes[{bad}] is {boxes[bad]!r}: a box is four numbers (x1, y1, x2, y2) in pixels; give "
                         "one box, or a list with one box (or None) per frame.")
    one = single_box(boxes)
    return one if one is not None else boxes


def no_face_in_rotated_video(exc: Exception, video_info: Any) -> Exception:
    """``exc``, a :class:`~nbhelpers.errors.NoFaceError`, with a note when ``video_info.rotation`` (clockwise
    degrees) is set: frames are turned upright as a player shows them, so a wrongly tagged face lies on its side.
    Returns ``exc`` itself for an untagged video or another error."""
    rotation = int(getattr(video_info, "rotation", 0) or 0)
    if not isinstance(exc, NoFaceError) or not rotation:
        return exc
    return NoFaceError(f"{exc} The video is tagged to be shown turned {rotation} degrees clockwise, and its frames "
                       "were turned so: if the face lies on its side when the video is played, the tag is wrong; "
                       "correct it (ffmpeg's -display_rotation input option) or give the crop box yourself.")


def check_boxes(boxes: Any, video: Any, video_info: Any = None) -> Any:
    """Check hand-given crop boxes (full-frame pixels of the upright ``video``, whose ``video_info`` is probed when
    None) and return :func:`given_boxes` of them. One box (bare or a one-box list) is checked against the frame size;
    per-frame boxes (:func:`nbhelpers.faces.user_boxes`) need one entry, a box or None, per 25 fps frame of the whole
    video, counted by one decode. InputError otherwise, or for a box outside the frame, inverted or under 16 px.
    The official ``--use_saved_coord`` reuses pickled boxes unchecked (scripts/inference.py:151-160)."""
    boxes = given_boxes(boxes)
    if boxes is None:
        return None
    if single_box(boxes) is not None:
        info = video_info if video_info is not None else media.probe(video, count_frames=False)
        user_boxes(boxes, 1, (int(info.height), int(info.width)))
        return boxes
    path = Path(video).resolve()
    n_frames, shape = _count_frames_of(str(path), path.stat().st_size, path.stat().st_mtime_ns)
    if len(boxes) != n_frames:
        raise InputError(boxes_count_message(len(boxes), n_frames, f"video {str(video)!r}"))
    user_boxes(boxes, n_frames, shape)
    return boxes


@functools.lru_cache(maxsize=32)
def _count_frames_of(path: str, size: int, mtime_ns: int) -> tuple[int, tuple[int, int]]:
    """``(25 fps frames, (height, width))`` of a video by a counting decode, cached by path, size and mtime
    (``nbh.lipsync()`` and its pipeline's job both check the boxes)."""
    with media.load_video(path) as reader:
        return int(reader.frame_count), (int(reader.height), int(reader.width))


def one_frame_boxes(boxes: Any, frame_index: int) -> Any:
    """Boxes for one frame: a single box stays, per-frame boxes give that frame's (InputError past the end)."""
    if boxes is None or single_box(boxes) is not None:
        return boxes
    if not 0 <= int(frame_index) < len(boxes):
        raise InputError(f"boxes has {len(boxes)} entries (one per frame), none for frame_index {frame_index}. Give "
                         "one (x1, y1, x2, y2) for every frame, or one entry, a box or None, per frame.")
    return [boxes[int(frame_index)]]


__all__ = ["check_audio", "check_boxes", "check_face", "check_inputs", "check_path_type", "check_speech_seconds",
           "check_video", "check_weights_dir", "given_boxes", "no_face_in_rotated_video", "one_frame_boxes",
           "names_folder", "output_path_for", "speech_frames", "warn_if_silent"]
