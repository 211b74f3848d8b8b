"""The clip under test: its sound as 16 kHz samples and its frames in batches, from a file or from arrays."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import media
from ..errors import InputError
from .mfcc import INT16_SCALE

__all__ = ["audio_samples", "check_video", "frame_batches", "frame_count", "is_path"]


def is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def audio_samples(video: Any, audio: Any) -> np.ndarray:
    """16 kHz float32 mono samples from ``audio`` (a path or an array), else from the video file's sound."""
    if audio is None:
        if not is_path(video):
            raise InputError("audio is None but video is an array of frames, which carries no sound: pass audio= "
                             "a speech file or a 16 kHz waveform.")
        return media.load_audio(media.check_input(video, "audio")[0])  # NoAudioError for a silent video
    if is_path(audio):
        return media.load_audio(media.check_input(audio, "audio")[0])
    arr = np.asarray(audio)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"audio must be a path or a 1-D 16 kHz waveform; got shape {arr.shape}, dtype {arr.dtype}.")
    return arr.astype(np.float32) if np.issubdtype(arr.dtype, np.floating) else arr.astype(np.float32) / INT16_SCALE


def check_video(video: Any) -> None:
    """Raise :class:`InputError` unless ``video`` is an existing file other than a photo (a still mouth has no sync
    to score), or (N, H, W, 3) uint8 frames."""
    if is_path(video):
        path, info = media.check_input(video, "video")  # missing, a folder, unreadable or sound only: as a job says it
        if info.is_image:
            raise InputError(f"video {str(path)!r} is a photo: a still mouth has no sync to score. Score a video of "
                             "the face speaking, such as the output of lipsync.")
        return
    arr = np.asarray(video) if not hasattr(video, "iter_batches") else None
    if arr is not None and (arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8):
        raise InputError(f"video must be a path or (N, H, W, 3) uint8 BGR frames; got shape {arr.shape}, dtype "
                         f"{arr.dtype}.")


def frame_batches(video: Any, batch: int = 32) -> Iterator[np.ndarray]:
    """Yield (n, H, W, 3) uint8 BGR batches of a path (at 25 fps) or an array."""
    if is_path(video):
        with media.load_video(video) as reader:
            yield from reader.iter_batches(batch)
        return
    arr = np.asarray(video)
    for i in range(0, arr.shape[0], batch):
        yield arr[i:i + batch]


def frame_count(video: Any) -> int:
    """Frames of a path (at 25 fps) or an array."""
    if is_path(video):
        with media.load_video(video) as reader:
            return int(reader.frame_count)
    return int(np.asarray(video).shape[0])
