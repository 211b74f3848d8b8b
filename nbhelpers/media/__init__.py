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

This package imports no torch, OpenCV or librosa (the Python 3.13 "notorch" CI job runs its tests).
Submodules: :mod:`.ffmpeg` (the binary and its processes), :mod:`.probing` (what a file holds), :mod:`.video`
(frames at 25 fps), :mod:`.audio` (16 kHz mono), :mod:`.writer` (the encoder choice and the MP4 writer).
"""

from __future__ import annotations

from .audio import audio_duration, load_audio
from .ffmpeg import SYNTHETIC_TAG, WRITER_STALL_TIMEOUT_S, ffmpeg_exe, ffmpeg_version
from .probing import MediaInfo, StreamInfo, probe
from .video import VideoReader, frames_at, load_video, read_frame
from .writer import (
    ENCODER_SETTINGS,
    EncoderChoice,
    VideoWriter,
    choose_encoder,
    convert_to_25fps,
    demo_inputs,
    nvenc_probe,
    padded_size_note,
)

__all__ = [
    "ENCODER_SETTINGS",
    "SYNTHETIC_TAG",
    "WRITER_STALL_TIMEOUT_S",
    "EncoderChoice",
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
    "frames_at",
    "load_audio",
    "load_video",
    "nvenc_probe",
    "padded_size_note",
    "probe",
    "read_frame",
]
