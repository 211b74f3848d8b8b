"""Media in and out over ffmpeg pipes: probing, 25 fps frame reading, audio decoding, video writing and muxing.

Every ffmpeg call here:

- uses imageio-ffmpeg's ffmpeg binary (:func:`ffmpeg_exe`), so nothing depends on an ffmpeg on PATH; the system
  one is used only when you ask for it (``ffmpeg_exe(prefer_system=True)``, e.g. for an NVENC build);
- is an argument list (no shell, so paths with spaces, quotes or non-ASCII letters are safe), with absolute paths;
- gets ``-nostdin`` and ``stdin=DEVNULL`` (ffmpeg never waits on a prompt in a notebook), except the writer, whose
  stdin is the frame pipe;
- has its standard error drained by a thread (a full pipe never blocks it) and, on failure, raises
  :class:`~nbhelpers.errors.FFmpegError` carrying the last lines ffmpeg printed.

Frames are ``(H, W, 3) uint8`` **BGR** arrays (OpenCV order, as the official pipeline reads them with
``cv2.imread``), streamed from a pipe so a long video never sits in RAM. Audio comes out as float32 mono at 16 kHz,
the same samples as the official ``librosa.load(path, sr=16000)``.

This module imports no torch, OpenCV or librosa (the Python 3.13 "notorch" CI job runs its tests).

Layout (made by ``tools/split_modules.py`` from the former ``nbhelpers/media.py``; each submodule's docstring says
what it owns):

- :mod:`nbhelpers.media.ffmpeg`: the ffmpeg binary and its processes: finding it, its version, and running it over
  pipes safely.
- :mod:`nbhelpers.media.probing`: probing: what a media file holds (streams, fps, duration, rotation), parsed from
  ffmpeg's own output.
- :mod:`nbhelpers.media.video`: reading video: frames at a constant 25 fps, photos as one frame, upright and without
  alpha.
- :mod:`nbhelpers.media.audio`: decoding audio: any file to 16 kHz mono float32, natively where possible, else
  through ffmpeg.
- :mod:`nbhelpers.media.writer`: writing video: the encoder choice and the writer that pipes frames and audio into
  an MP4.

Every name of the former module is importable from here, private ones included. The package is one namespace with
its submodules: setting a name on it (``monkeypatch.setattr(media, name, value)``) sets it in every submodule that
holds it, so code that looks the name up at call time sees the new value.
"""

# ruff: noqa: F401 (re-exports)  Made by tools/split_modules.py; edit the submodules, not this list.
from __future__ import annotations

import collections
import functools
import html
import os
import re
import selectors
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from .. import _namespace
from ..constants import ENCODERS, FPS, SAMPLE_RATE
from ..errors import FallbackWarning, FFmpegError, InputError, MediaError, MissingDependencyError
from .audio import _decode_native, _ffmpeg_decode, _soundfile_read, _wav_header, audio_duration, load_audio
from .ffmpeg import (
    _ALPHA_PIX_FMTS,
    _CHANNEL_LAYOUTS,
    _IMAGE_CODECS,
    _KILL_WAIT_S,
    _PCM_FORMATS,
    _PIPE_CHUNK,
    _STDERR_TAIL_LINES,
    _WRITER_SUFFIXES,
    SYNTHETIC_TAG,
    WRITER_STALL_TIMEOUT_S,
    _bundled_ffmpeg,
    _existing_file,
    _parse_version,
    _passthrough,
    _Process,
    _run,
    _tail,
    ffmpeg_exe,
    ffmpeg_version,
)
from .probing import (
    _DURATION_RE,
    _EXIF_ROTATION,
    _MATRIX_RE,
    _ROTATE_TAG_RE,
    _STREAM_RE,
    MediaInfo,
    StreamInfo,
    _channel_count,
    _count_packets,
    _exif_orientation,
    _fps_text,
    _parse_ffmpeg_info,
    _parse_rate,
    _parse_stream,
    _replace,
    _rotation_cw,
    _split_top,
    probe,
)
from .video import (
    VideoReader,
    _apply_orientation,
    _check_background,
    _check_fps,
    _flatten_alpha,
    _FrameStream,
    _has_alpha,
    _progress_frames,
    frames_at,
    load_video,
    read_frame,
)
from .writer import (
    _PROBE_SIZE,
    ENCODER_SETTINGS,
    EncoderChoice,
    VideoWriter,
    _probe_cache,
    _probe_lock,
    _Stalled,
    choose_encoder,
    convert_to_25fps,
    demo_inputs,
    nvenc_probe,
    padded_size_note,
)

__all__ = [
    "ENCODER_SETTINGS",
    "EncoderChoice",
    "SYNTHETIC_TAG",
    "MediaInfo",
    "StreamInfo",
    "VideoReader",
    "VideoWriter",
    "audio_duration",
    "choose_encoder",
    "convert_to_25fps",
    "demo_inputs",
    "ffmpeg_exe",
    "ffmpeg_version",
    "nvenc_probe",
    "padded_size_note",
    "frames_at",
    "load_audio",
    "load_video",
    "probe",
    "read_frame",
]

_SUBMODULES = ("ffmpeg", "probing", "video", "audio", "writer")

_namespace.share(__name__, _SUBMODULES)
