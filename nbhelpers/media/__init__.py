"""Media in and out over ffmpeg pipes: probing, 25 fps frame reading, audio decoding, video writing and muxing.

ffmpeg (imageio-ffmpeg's binary, :func:`ffmpeg_exe`) runs with an argument list, absolute paths and ``-nostdin``
(but the writer, fed on stdin); a thread drains its stderr, whose last lines a failure's
:class:`~nbhelpers.errors.FFmpegError` carries. Frames are ``(H, W, 3) uint8`` BGR; audio is float32 mono at 16
kHz, the samples of the official ``librosa.load(path, sr=16000)``. No torch, OpenCV or librosa is imported.
"""

from __future__ import annotations

from .audio import audio_duration, cut_audio, load_audio
from .ffmpeg import SYNTHETIC_TAG, WRITER_STALL_TIMEOUT_S, ffmpeg_exe, ffmpeg_version
from .folders import check_writable, missing_folders, remove_empty, write_problem
from .inputs import check_input
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

__all__ = ["ENCODER_SETTINGS", "SYNTHETIC_TAG", "WRITER_STALL_TIMEOUT_S", "EncoderChoice", "MediaInfo", "StreamInfo",
           "VideoReader", "VideoWriter", "audio_duration", "check_input", "check_writable", "choose_encoder",
           "convert_to_25fps", "cut_audio", "demo_inputs", "ffmpeg_exe", "ffmpeg_version", "frames_at", "load_audio",
           "load_video", "missing_folders", "nvenc_probe", "padded_size_note", "probe", "read_frame", "remove_empty",
           "write_problem"]
