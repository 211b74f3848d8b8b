"""Input files of a job: is a path a readable video (or photo) or a readable sound file? Messages name the
parameter, show the path as given and say what to do next."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import InputError, MediaError, NoAudioError
from .ffmpeg import INPUT_TAKES
from .probing import MediaInfo, probe
from .video import no_video_error

__all__ = ["check_input", "check_path_type"]


def check_path_type(value: Any, name: str) -> None:
    """InputError naming ``name`` unless ``value`` is a str or os.PathLike (an int or a list is not a path)."""
    if not isinstance(value, (str, os.PathLike)):
        raise InputError(f"{name} must be a file path (a str or pathlib.Path); got {type(value).__name__} "
                         f"{value!r}. Pass the path in quotes, as in \"clip.mp4\".")


def _input_path(value: Any, name: str) -> Path:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise InputError(f"{name} is required: give the path of a file; got {value!r}.")
    check_path_type(value, name)
    path = Path(os.fspath(value)).expanduser()
    if not path.exists():
        raise InputError(f"{name} {str(path)!r} does not exist. Check the path (upload the file first in "
                         "notebook 02_media, or give the full path).")
    if path.is_dir():
        raise InputError(f"{name} {str(path)!r} is a folder; give {INPUT_TAKES.get(name, 'a media file')}.")
    return path


def check_input(value: Any, stream: str) -> tuple[Path, MediaInfo]:
    """``(path, media info)`` of the file ``value`` (``~`` expanded, otherwise as given) for ``stream`` ``"video"``
    (a video or photo) or ``"audio"`` (anything with sound). Raises InputError when it is not a path, is missing, a
    folder, unreadable or without a video stream; :class:`~nbhelpers.errors.NoAudioError` without sound."""
    path = _input_path(value, stream)
    try:
        info = probe(path)
    except MediaError as exc:
        what = " as a video or image" if stream == "video" else ""
        raise InputError(f"{stream} {str(path)!r} could not be read{what}: {exc}") from exc
    if stream == "video" and not info.has_video:
        raise no_video_error(path, info)
    if stream == "audio" and not info.has_audio:
        raise NoAudioError("audio", str(path), info)
    return path, info
