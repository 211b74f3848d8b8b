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
"""

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

from .constants import ENCODERS, FPS, SAMPLE_RATE
from .errors import FallbackWarning, FFmpegError, InputError, MediaError, MissingDependencyError

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
    "frames_at",
    "load_audio",
    "load_video",
    "probe",
    "read_frame",
]

SYNTHETIC_TAG = "Synthetic lip-sync video made with MuseTalk (nbhelpers)"
"""Written as the ``comment`` tag of every video :class:`VideoWriter` makes (and as the video track's handler
name), so that anyone can tell the file was generated."""

_STDERR_TAIL_LINES = 40  # lines of ffmpeg's stderr kept in an FFmpegError
WRITER_STALL_TIMEOUT_S = 120.0  # seconds a writing ffmpeg may take no frame data / show no progress: then stalled
_KILL_WAIT_S = 10.0  # seconds to wait for a killed ffmpeg to exit (one stuck on a dead mount may never exit)
_PIPE_CHUNK = 1 << 16  # bytes per write into ffmpeg's stdin (the size of a Linux pipe buffer)
_IMAGE_CODECS = {"png", "mjpeg", "jpeg2000", "bmp", "tiff", "webp", "targa", "ppm", "pgm", "pbm", "pam", "sgi",
                 "dpx", "exr", "qoi", "jpegxl", "pcx", "xbm", "xwd", "sunrast", "hdr", "photocd", "pgx"}
_ALPHA_PIX_FMTS = {"rgba", "bgra", "argb", "abgr", "pal8", "ya8", "ya16le", "ya16be", "rgba64le", "rgba64be",
                   "bgra64le", "bgra64be"}
_WRITER_SUFFIXES = {".mp4", ".mov", ".m4v", ".mkv"}
_PCM_FORMATS = {"WAV", "WAVEX", "RF64", "W64", "AIFF", "CAF", "FLAC", "AU"}  # libsndfile formats with exact counts
_CHANNEL_LAYOUTS = {"mono": 1, "stereo": 2, "downmix": 2, "quad": 4, "quad(side)": 4, "hexagonal": 6,
                    "octagonal": 8, "cube": 8, "hexadecagonal": 16, "binaural": 2}


# ---------------------------------------------------------------------------------------------------------------
# ffmpeg binary and process helpers
# ---------------------------------------------------------------------------------------------------------------

@functools.cache
def _bundled_ffmpeg() -> str:
    try:
        import imageio_ffmpeg
    except ImportError as exc:
        raise MissingDependencyError(
            "The package 'imageio-ffmpeg' (which ships the ffmpeg binary nbhelpers uses) is not installed. "
            "Install it with:\n    pip install imageio-ffmpeg") from exc
    try:
        return imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as exc:  # no binary for this platform and none on PATH
        raise MissingDependencyError(
            f"imageio-ffmpeg found no ffmpeg binary ({exc}). Reinstall it with `pip install --force-reinstall "
            "imageio-ffmpeg`, or install ffmpeg (apt-get install ffmpeg) and set IMAGEIO_FFMPEG_EXE to its path."
        ) from exc


def ffmpeg_exe(prefer_system: bool = False) -> str:
    """Path of the ffmpeg binary that nbhelpers runs.

    Args:
        prefer_system: False (default): imageio-ffmpeg's binary (ffmpeg 7-9 with libx264 and AAC; it honours the
            ``IMAGEIO_FFMPEG_EXE`` environment variable). True: the ``ffmpeg`` on PATH when there is one (e.g.
            Colab's ffmpeg 4.4 for ``h264_nvenc``), falling back to imageio-ffmpeg's.

    Returns:
        Absolute path of an ffmpeg executable.

    Raises:
        MissingDependencyError: imageio-ffmpeg is not installed or has no binary for this platform.

    Source: the official scripts prepend ``--ffmpeg_path`` to PATH and run ``ffmpeg`` from it
    (scripts/inference.py:23-39); we never depend on PATH.
    """
    if prefer_system:
        found = shutil.which("ffmpeg")
        if found:
            return found
    return _bundled_ffmpeg()


@functools.cache
def ffmpeg_version(exe: str | None = None) -> tuple[int, int]:
    """Major and minor version of an ffmpeg binary, e.g. ``(9, 0)``; git builds (``N-12345-g...``) give (99, 0).

    Args:
        exe: Path of the ffmpeg binary; None for :func:`ffmpeg_exe`.

    Returns:
        ``(major, minor)``; ``(0, 0)`` when the version line cannot be read.
    """
    exe = exe or ffmpeg_exe()
    try:
        out = subprocess.run([exe, "-hide_banner", "-version"], stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=60).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    return _parse_version(out)


def _parse_version(text: str) -> tuple[int, int]:
    match = re.search(r"ffmpeg version n?(\d+)\.(\d+)", text)
    if match:
        return int(match.group(1)), int(match.group(2))
    if re.search(r"ffmpeg version (N-|git-)", text):
        return (99, 0)
    return (0, 0)


def _passthrough(exe: str) -> list[str]:
    """Output option that passes frames through unchanged (no duplicate/drop by the muxer's sync)."""
    return ["-fps_mode", "passthrough"] if ffmpeg_version(exe) >= (5, 1) else ["-vsync", "passthrough"]


class _Process:
    """A running ffmpeg whose standard error a daemon thread drains into a bounded tail (so it never blocks)."""

    def __init__(self, args: list[str], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE):
        self.args = args
        try:
            self.popen = subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
        except OSError as exc:
            raise FFmpegError(f"Could not start ffmpeg ({args[0]!r}): {exc}. Reinstall imageio-ffmpeg "
                              "(pip install --force-reinstall imageio-ffmpeg).", args_list=args) from exc
        self._lines: collections.deque[str] = collections.deque(maxlen=400)
        self._thread = threading.Thread(target=self._drain, name="ffmpeg-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        stream = self.popen.stderr
        try:
            for raw in iter(stream.readline, b""):
                self._lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
        except (OSError, ValueError):  # pragma: no cover - stream closed under us during a kill
            pass

    def tail(self, lines: int = _STDERR_TAIL_LINES) -> str:
        self._thread.join(timeout=5)
        return "\n".join(list(self._lines)[-lines:])

    def wait(self) -> int:
        rc = self.popen.wait()
        self._thread.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.kill()
            except OSError:  # pragma: no cover - already gone
                pass
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            self.popen.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # stuck in the kernel (a dead network mount): leave it, never hang here
            return
        self._thread.join(timeout=5)

    def progress_mark(self, fallback: Path | None = None) -> tuple | None:
        """Something that changes while ffmpeg works: its CPU ticks and bytes written (Linux ``/proc``), else the
        size and time of ``fallback`` (the file it writes); None when neither can be read."""
        pid = self.popen.pid
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            mark: tuple = (fields[11], fields[12])  # utime, stime (fields 14 and 15 of proc(5))
            try:
                with open(f"/proc/{pid}/io", "rb") as f:
                    mark += tuple(line for line in f.read().splitlines() if line.startswith((b"wchar", b"rchar")))
            except OSError:
                pass
            return mark
        except (OSError, IndexError):
            pass
        if fallback is not None:
            try:
                st = fallback.stat()
                return (st.st_size, st.st_mtime_ns)
            except OSError:
                return None
        return None

    def error(self, message: str) -> FFmpegError:
        return FFmpegError(message, args_list=self.args, returncode=self.popen.returncode, stderr_tail=self.tail())


def _run(args: list[str], what: str, stdout=subprocess.PIPE) -> tuple[int, bytes, str]:
    """Run ffmpeg to completion; return (returncode, stdout bytes, stderr text)."""
    try:
        done = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE)
    except OSError as exc:
        raise FFmpegError(f"Could not start ffmpeg to {what} ({args[0]!r}): {exc}. Reinstall imageio-ffmpeg "
                          "(pip install --force-reinstall imageio-ffmpeg).", args_list=args) from exc
    return done.returncode, done.stdout or b"", done.stderr.decode("utf-8", "replace")


def _tail(text: str, lines: int = _STDERR_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _existing_file(path, param: str) -> Path:
    """Absolute Path of an existing regular file, or InputError that names the parameter."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{param} must be a path (str or pathlib.Path); got {type(path).__name__} {path!r}.")
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{param}: file not found: {str(p)!r}. Check the path (upload the file first on Colab, "
                         "or use nbhelpers.media.demo_inputs() for a demo photo and speech clip).")
    if not p.is_file():
        raise InputError(f"{param}: {str(p)!r} is not a file (a folder?). Give the path of one video, photo or "
                         "audio file.")
    return p.resolve()


# ---------------------------------------------------------------------------------------------------------------
# probe
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamInfo:
    """One stream of a media file, as ffmpeg reports it.

    Attributes:
        index: Stream index in the file (what ``-map 0:<index>`` selects).
        kind: ``"video"``, ``"audio"``, ``"subtitle"``, ``"data"`` or ``"attachment"``.
        codec: Decoder name, e.g. ``"h264"``, ``"aac"``, ``"png"``.
        language: ISO 639 code from the container, or None.
        width: Stored frame width in pixels (before rotation); None for non-video.
        height: Stored frame height in pixels (before rotation); None for non-video.
        pix_fmt: Pixel format, e.g. ``"yuv420p"``, ``"yuv420p10le"``, ``"rgba"``; None for non-video.
        fps: Average frame rate (frames per second) as reported (``29.97`` -> ``Fraction(30000, 1001)``); None when
            not reported.
        rotation: Degrees **clockwise** a player turns the stored picture to show it upright (0, 90, 180 or 270;
            the ``rotate`` tag convention of phones), from the display matrix or the ``rotate`` tag.
        sample_rate: Audio samples per second (Hz); None for non-audio.
        channels: Audio channel count; None for non-audio or an unknown layout.
        channel_layout: ffmpeg's layout name (``"mono"``, ``"stereo"``, ``"5.1"``); None for non-audio.
        attached_pic: True for cover art (an image stored as a video stream in an audio file).
        default: True when the stream carries the container's "default" flag.
        line: The stream line ffmpeg printed (for debugging).
    """

    index: int
    kind: str
    codec: str
    language: str | None = None
    width: int | None = None
    height: int | None = None
    pix_fmt: str | None = None
    fps: Fraction | None = None
    rotation: int = 0
    sample_rate: int | None = None
    channels: int | None = None
    channel_layout: str | None = None
    attached_pic: bool = False
    default: bool = False
    line: str = ""


@dataclass(frozen=True, repr=False)
class MediaInfo:
    """What a media file holds, read from ``ffmpeg -i`` (imageio-ffmpeg ships no ffprobe). Shows itself as a table
    in a notebook.

    Attributes:
        path: Absolute path of the file.
        container: ffmpeg's demuxer name, e.g. ``"mov,mp4,m4a,3gp,3g2,mj2"``, ``"wav"``, ``"png_pipe"``.
        duration_s: Container duration in seconds; None when unknown (single images).
        start_s: Start time of the container in seconds; None when not reported.
        bitrate_kbps: Overall bitrate in kb/s; None when not reported.
        streams: Every stream in the file.
        is_image: True for a single still picture (png, jpg, bmp, tif, webp...), detected from the content, not the
            file name; :func:`load_video` turns it into a one-frame clip.
        has_video: True when the file has a video stream that is not cover art.
        has_audio: True when the file has an audio stream.
        width: Width in pixels of the **upright** picture (after rotation) of the first video stream, i.e. the
            width of the frames :func:`load_video` yields; None without video.
        height: Height in pixels of the upright picture; None without video.
        fps: Average source frame rate (frames per second) of the first video stream; None without video.
        rotation: Clockwise degrees applied to show the first video stream upright (0, 90, 180, 270).
        pix_fmt: Pixel format of the first video stream (``"yuv420p10le"`` = 10-bit); None without video.
        video_codec: Codec of the first video stream; None without video.
        frame_count: Frames stored in the first video stream, counted exactly by demuxing (``probe(...,
            count_frames=True)``, the default); 1 for an image; None when not counted or without video. This is
            the *source* count; :attr:`VideoReader.frame_count` is the count at 25 fps.
        sample_rate: Native sample rate (Hz) of the first audio stream; None without audio.
        channels: Channel count of the first audio stream; None without audio.
        audio_codec: Codec of the first audio stream; None without audio.
        comment: The container's ``comment`` tag (e.g. :data:`SYNTHETIC_TAG`); None when absent.
        exif_orientation: EXIF orientation of a still (1 = upright ... 8, read with Pillow); 1 for videos. The
            reader applies it itself (as ``cv2.imread`` does), the same way whatever the ffmpeg version, and
            ``width``/``height``/``rotation`` describe the picture after it.
    """

    path: Path
    container: str
    duration_s: float | None
    start_s: float | None
    bitrate_kbps: int | None
    streams: tuple[StreamInfo, ...]
    is_image: bool
    has_video: bool
    has_audio: bool
    width: int | None
    height: int | None
    fps: Fraction | None
    rotation: int
    pix_fmt: str | None
    video_codec: str | None
    frame_count: int | None
    sample_rate: int | None
    channels: int | None
    audio_codec: str | None
    comment: str | None = None
    exif_orientation: int = 1

    @property
    def video_stream(self) -> StreamInfo | None:
        """The first video stream that is not cover art, or None."""
        return next((s for s in self.streams if s.kind == "video" and not s.attached_pic), None)

    @property
    def audio_stream(self) -> StreamInfo | None:
        """The first audio stream, or None."""
        return next((s for s in self.streams if s.kind == "audio"), None)

    def _rows(self) -> list[tuple[str, str]]:
        rows = [("file", self.path.name), ("container", self.container)]
        if self.duration_s is not None:
            rows.append(("duration", f"{self.duration_s:.3f} s"))
        if self.has_video:
            kind = "image" if self.is_image else "video"
            desc = f"{self.video_codec}, {self.width}x{self.height} px, {self.pix_fmt}"
            if not self.is_image and self.fps is not None:
                desc += f", {_fps_text(self.fps)} fps"
            if self.rotation:
                desc += f", rotated {self.rotation}° clockwise"
            if self.frame_count is not None and not self.is_image:
                desc += f", {self.frame_count} frames"
            rows.append((kind, desc))
        if self.has_audio:
            rows.append(("audio", f"{self.audio_codec}, {self.sample_rate} Hz, {self.channels} ch"))
        if self.comment:
            rows.append(("comment", self.comment))
        return rows

    def __repr__(self) -> str:
        return "MediaInfo(" + "; ".join(f"{k}: {v}" for k, v in self._rows()) + ")"

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                       f"{html.escape(str(v))}</td></tr>" for k, v in self._rows())
        return f"<table><caption style='text-align:left'><b>MediaInfo</b></caption>{body}</table>"


def _fps_text(fps: Fraction) -> str:
    return str(fps.numerator) if fps.denominator == 1 else f"{fps.numerator}/{fps.denominator} ({float(fps):.3f})"


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses or brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _parse_rate(text: str) -> Fraction | None:
    """'25' -> 25, '29.97' -> 30000/1001, '1k' -> 1000 (ffmpeg prints rates with at most 2 decimals)."""
    text = text.strip()
    mult = 1000 if text.endswith("k") else 1
    text = text.rstrip("k")
    try:
        value = Fraction(text) * mult
    except (ValueError, ZeroDivisionError):
        return None
    if value <= 0:
        return None
    if value.denominator != 1:  # NTSC-style rates N*1000/1001 print as e.g. 23.98, 29.97, 59.94, 119.88
        ntsc = round(value * Fraction(1001, 1000))
        if ntsc > 0 and abs(Fraction(ntsc * 1000, 1001) - value) < Fraction(1, 100):
            return Fraction(ntsc * 1000, 1001)
    return value


def _channel_count(layout: str) -> int | None:
    layout = layout.strip().lower()
    if layout in _CHANNEL_LAYOUTS:
        return _CHANNEL_LAYOUTS[layout]
    match = re.match(r"(\d+) channels", layout)
    if match:
        return int(match.group(1))
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", layout)
    if match:
        return sum(int(g) for g in match.groups() if g)
    return None


def _rotation_cw(ccw_degrees: float) -> int:
    """ffmpeg's display-matrix angle (counter-clockwise) -> clockwise degrees in [0, 360), snapped to 90s."""
    cw = (-ccw_degrees) % 360.0
    snapped = round(cw / 90.0) * 90
    if abs(cw - snapped) < 1.0:
        return int(snapped) % 360
    return int(round(cw)) % 360


_STREAM_RE = re.compile(r"^\s*Stream #(\d+):(\d+)(?:\[[^\]]*\])?(?:\(([^)]*)\))?: (\w+): (.*)$")
_DURATION_RE = re.compile(r"^\s*Duration: (N/A|(\d+):(\d+):(\d+(?:\.\d+)?))(?:, start: (-?\d+(?:\.\d+)?))?"
                          r"(?:, bitrate: (?:N/A|(\d+) kb/s))?")
_MATRIX_RE = re.compile(r"display\s?matrix\s*:\s*rotation of (-?\d+(?:\.\d+)?|-?nan) degrees", re.IGNORECASE)
_ROTATE_TAG_RE = re.compile(r"^\s*rotate\s*:\s*(-?\d+(?:\.\d+)?)\s*$")


def _parse_ffmpeg_info(text: str, path: Path, frame_count: int | None = None) -> MediaInfo | None:
    """Parse what ``ffmpeg -i <path>`` prints (ffmpeg 4.4 to 9). None when there is no ``Input #0`` block."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Input #0, ")), None)
    if start is None:
        return None
    head = re.match(r"Input #0, (.+?), from '", lines[start])
    container = head.group(1) if head else lines[start][len("Input #0, "):].split(",")[0]
    duration_s = start_s = bitrate = None
    comment = None
    streams: list[StreamInfo] = []
    blocks: list[tuple[re.Match, list[str]]] = []
    for line in lines[start + 1:]:
        if line.startswith(("Input #", "Output #", "At least one output", "Stream mapping")):
            break
        match = _STREAM_RE.match(line)
        if match and match.group(1) == "0":
            blocks.append((match, []))
            continue
        if blocks:
            blocks[-1][1].append(line)
            continue
        dur = _DURATION_RE.match(line)
        if dur:
            if dur.group(1) != "N/A":
                duration_s = int(dur.group(2)) * 3600 + int(dur.group(3)) * 60 + float(dur.group(4))
            if dur.group(5) is not None:
                start_s = float(dur.group(5))
            if dur.group(6) is not None:
                bitrate = int(dur.group(6))
            continue
        tag = re.match(r"^\s{4}comment\s*:\s?(.*)$", line)
        if tag and comment is None:
            comment = tag.group(1).strip()
    seen = set()
    for match, block in blocks:
        index = int(match.group(2))
        if index in seen:  # programs (mpegts) list a stream more than once
            continue
        seen.add(index)
        streams.append(_parse_stream(match, block))

    video = next((s for s in streams if s.kind == "video" and not s.attached_pic), None)
    audio = next((s for s in streams if s.kind == "audio"), None)
    is_image = False
    if video is not None:
        image_container = container.endswith("_pipe") or container == "image2"
        single = len([s for s in streams if s.kind in ("video", "audio")]) == 1
        is_image = single and (image_container or (video.codec in _IMAGE_CODECS and duration_s is None))
    width = height = None
    if video is not None and video.width is not None:
        width, height = video.width, video.height
        if video.rotation in (90, 270):
            width, height = height, width
    if is_image:
        frame_count = 1
    return MediaInfo(
        path=path, container=container, duration_s=duration_s, start_s=start_s, bitrate_kbps=bitrate,
        streams=tuple(streams), is_image=is_image, has_video=video is not None, has_audio=audio is not None,
        width=width, height=height, fps=video.fps if video else None, rotation=video.rotation if video else 0,
        pix_fmt=video.pix_fmt if video else None, video_codec=video.codec if video else None,
        frame_count=frame_count if video else None, sample_rate=audio.sample_rate if audio else None,
        channels=audio.channels if audio else None, audio_codec=audio.codec if audio else None, comment=comment,
    )


def _parse_stream(match: re.Match, block: list[str]) -> StreamInfo:
    index, language, kind, rest = int(match.group(2)), match.group(3), match.group(4).lower(), match.group(5)
    flags = re.findall(r"\(([a-z ]+)\)\s*$", rest)
    attached = "(attached pic)" in rest
    default = "(default)" in rest
    parts = _split_top(rest)
    codec = parts[0].split()[0] if parts else "unknown"
    info: dict = {"index": index, "kind": kind, "codec": codec, "language": language if language != "und" else None,
                  "attached_pic": attached, "default": default or "default" in flags,
                  "line": match.group(0).strip()}
    if kind == "video":
        size_at = None
        for i, part in enumerate(parts[1:], start=1):
            size = re.match(r"^(\d+)x(\d+)", part)
            if size and size_at is None:
                info["width"], info["height"] = int(size.group(1)), int(size.group(2))
                size_at = i
            rate = re.match(r"^(\d+(?:\.\d+)?k?) fps", part)
            if rate:
                info["fps"] = _parse_rate(rate.group(1))
            tbr = re.match(r"^(\d+(?:\.\d+)?k?) tbr", part)
            if tbr and "fps" not in info:
                info["fps"] = _parse_rate(tbr.group(1))
        if size_at is not None and size_at >= 2:
            info["pix_fmt"] = parts[1].split("(")[0].strip() or None
        rotation = 0
        matrix = rotate_tag = None
        for line in block:
            m = _MATRIX_RE.search(line)
            if m and "nan" not in m.group(1):
                matrix = float(m.group(1))
            t = _ROTATE_TAG_RE.match(line)
            if t:
                rotate_tag = float(t.group(1))
        if matrix is not None:
            rotation = _rotation_cw(matrix)
        elif rotate_tag is not None:
            rotation = _rotation_cw(-rotate_tag)
        info["rotation"] = rotation
    elif kind == "audio":
        for i, part in enumerate(parts[1:], start=1):
            hz = re.match(r"^(\d+) Hz$", part)
            if hz:
                info["sample_rate"] = int(hz.group(1))
                if i + 1 < len(parts):
                    info["channel_layout"] = parts[i + 1]
                    info["channels"] = _channel_count(parts[i + 1])
                break
    return StreamInfo(**info)


def probe(path, count_frames: bool = True) -> MediaInfo:
    """Read what a media file holds: streams, size, fps, duration, rotation, pixel format, audio rate.

    Parses the standard error of ``ffmpeg -i <path>`` (formats of ffmpeg 4.4 to 9), and counts the video frames
    exactly by demuxing without decoding (``ffmpeg -i <path> -map 0:<v> -c copy -f framecrc -``, one line per
    packet), which takes tens of milliseconds.

    Args:
        path: Video, image or audio file (str or Path; spaces and non-ASCII names are fine).
        count_frames: Count the source video frames exactly (:attr:`MediaInfo.frame_count`); False leaves it None
            and saves one ffmpeg run.

    Returns:
        A :class:`MediaInfo`. ``width``/``height`` are those of the upright picture (rotation applied) and
        ``rotation`` is in degrees clockwise.

    Raises:
        InputError: ``path`` does not exist or is a folder.
        FFmpegError: ffmpeg cannot read the file as media (e.g. a text file named ``.mp4``, a truncated download);
            the message carries ffmpeg's words.

    Source: no official counterpart; the official scripts read the fps with OpenCV's ``CAP_PROP_FPS``
    (scripts/inference.py:126) and decide image vs video by file extension (musetalk/utils/utils.py:33-41); we
    decide from the content.
    """
    p = _existing_file(path, "path")
    exe = ffmpeg_exe()
    args = [exe, "-nostdin", "-hide_banner", "-i", str(p)]
    _, _, text = _run(args, "probe a file")
    info = _parse_ffmpeg_info(text, p)
    if info is None:
        raise FFmpegError(
            f"ffmpeg cannot read {str(p)!r} as a video, image or audio file. Check that it is a complete media "
            "file (not a web page or a partial download); re-export or re-download it.",
            args_list=args, stderr_tail=_tail(text))
    if count_frames and info.has_video and not info.is_image:
        info = _replace(info, frame_count=_count_packets(exe, p, info.video_stream.index))
    if info.is_image and info.width:
        orientation = _exif_orientation(p)
        if orientation != 1:
            stored_w, stored_h = info.video_stream.width, info.video_stream.height
            swap = orientation >= 5
            info = _replace(info, exif_orientation=orientation, rotation=_EXIF_ROTATION[orientation],
                            width=stored_h if swap else stored_w, height=stored_w if swap else stored_h)
    return info


# EXIF orientation -> clockwise rotation of the upright picture (5 and 7 also mirror)
_EXIF_ROTATION = {1: 0, 2: 0, 3: 180, 4: 180, 5: 90, 6: 90, 7: 270, 8: 270}


def _exif_orientation(path: Path) -> int:
    """EXIF orientation tag (1-8) of a still, read with Pillow (header only); 1 when absent or unreadable."""
    try:
        from PIL import Image
    except ImportError:  # Pillow is a dependency; without it stills are used as stored
        return 1
    try:
        with Image.open(path) as image:
            value = int(image.getexif().get(0x0112, 1))
    except Exception:
        return 1
    return value if value in _EXIF_ROTATION else 1


def _apply_orientation(frames: np.ndarray, orientation: int) -> np.ndarray:
    """Turn (N, H, W, C) stored pixels upright for an EXIF orientation (Pillow's ``ImageOps.exif_transpose``)."""
    if orientation == 2:
        out = frames[:, :, ::-1]
    elif orientation == 3:
        out = frames[:, ::-1, ::-1]
    elif orientation == 4:
        out = frames[:, ::-1]
    elif orientation == 5:
        out = frames.transpose(0, 2, 1, 3)
    elif orientation == 6:
        out = frames.transpose(0, 2, 1, 3)[:, :, ::-1]
    elif orientation == 7:
        out = frames.transpose(0, 2, 1, 3)[:, ::-1, ::-1]
    elif orientation == 8:
        out = frames.transpose(0, 2, 1, 3)[:, ::-1]
    else:
        return frames
    return np.ascontiguousarray(out)


def _replace(info: MediaInfo, **changes) -> MediaInfo:
    import dataclasses

    return dataclasses.replace(info, **changes)


def _progress_frames(stdout: bytes) -> int | None:
    found = re.findall(rb"^frame=\s*(\d+)", stdout, flags=re.MULTILINE)
    return int(found[-1]) if found else None


def _count_packets(exe: str, path: Path, stream_index: int) -> int | None:
    """Packets (= frames) of one stream, by demuxing only: one framecrc line per packet (ffmpeg 7.0's progress
    report leaves out the frame count when stream copying, so it is not used here)."""
    args = [exe, "-nostdin", "-hide_banner", "-nostats", "-loglevel", "error", "-i", str(path),
            "-map", f"0:{stream_index}", "-c", "copy", "-f", "framecrc", "pipe:1"]
    rc, out, _ = _run(args, "count video frames")
    if rc != 0:
        return None
    return sum(1 for line in out.splitlines() if line and not line.startswith(b"#"))


# ---------------------------------------------------------------------------------------------------------------
# video reading
# ---------------------------------------------------------------------------------------------------------------

def _has_alpha(pix_fmt: str | None) -> bool:
    if not pix_fmt:
        return False
    return (pix_fmt in _ALPHA_PIX_FMTS or pix_fmt.startswith(("yuva", "gbrap", "ya"))
            or bool(re.match(r"^(rgba|bgra|argb|abgr)", pix_fmt)))


def _flatten_alpha(bgra: np.ndarray, background: tuple[int, int, int]) -> np.ndarray:
    """(..., 4) uint8 BGRA (straight alpha) over an opaque BGR colour -> (..., 3) uint8 BGR, rounded to nearest."""
    alpha = bgra[..., 3:4].astype(np.uint16)
    colour = bgra[..., :3].astype(np.uint16)
    bg = np.asarray(background, dtype=np.uint16)
    return ((colour * alpha + bg * (255 - alpha) + 127) // 255).astype(np.uint8)


def _check_fps(fps) -> Fraction:
    try:
        value = Fraction(fps) if not isinstance(fps, float) else Fraction(fps).limit_denominator(1001)
    except (TypeError, ValueError, ZeroDivisionError):
        value = None
    if value is None or value <= 0 or isinstance(fps, bool):
        raise InputError(f"fps must be a positive number of frames per second (MuseTalk uses {FPS}); got {fps!r}.")
    return value


def _check_background(background) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in background)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3 or any(not 0 <= v <= 255 for v in values):
        raise InputError(f"background must be a BGR colour of 3 integers in 0-255, e.g. (0, 0, 0) for black; got "
                         f"{background!r}.")
    return values  # type: ignore[return-value]


class _FrameStream:
    """One decode of a video through an ffmpeg pipe; reads whole frames."""

    def __init__(self, reader: VideoReader, extra_filter: str | None = None, max_frames: int | None = None):
        self.reader = reader
        self.channels = 4 if reader.has_alpha else 3
        self.width, self.height = reader._decoded_size
        self.frame_bytes = self.width * self.height * self.channels
        self.proc = _Process(reader._command(extra_filter, max_frames))
        self.done = False
        self.count = 0

    def read(self, n: int) -> np.ndarray:
        r = self.reader
        out = np.empty((n, self.height, self.width, self.channels), dtype=np.uint8)
        if self.done:
            return np.empty((0, r.height, r.width, 3), dtype=np.uint8)
        view = memoryview(out).cast("B")
        filled, want = 0, n * self.frame_bytes
        stdout = self.proc.popen.stdout
        while filled < want:
            got = stdout.readinto(view[filled:])
            if not got:
                break
            filled += got
        frames = filled // self.frame_bytes
        self.count += frames
        if filled < want:
            self.done = True
            rc = self.proc.wait()
            if rc != 0:
                raise self.proc.error(f"ffmpeg failed while decoding {str(r.path)!r} after {self.count} frames.")
            if filled % self.frame_bytes:
                raise self.proc.error(
                    f"ffmpeg returned a partial frame from {str(r.path)!r} ({filled % self.frame_bytes} of "
                    f"{self.frame_bytes} bytes); the frame size changed mid-stream? Convert the clip first with "
                    "nbhelpers.media.convert_to_25fps().")
            self.close()
        out = out[:frames]
        if self.channels == 4:
            out = _flatten_alpha(out, r.background)
        return _apply_orientation(out, r.info.exif_orientation)

    def close(self) -> None:
        self.done = True
        self.proc.kill()


class VideoReader:
    """Frames of a video (or one photo) at a constant frame rate, streamed from an ffmpeg pipe.

    Iterating yields ``(H, W, 3) uint8`` BGR frames from the first frame each time (every ``iter()`` runs its own
    decode, so you can loop twice). :meth:`read_batch` reads sequentially from a separate cursor. Use it as a
    context manager (or call :meth:`close`) to stop any ffmpeg still running.

    How frames are made (one ffmpeg command, ``-map 0:<first video stream>``):

    - **Constant 25 fps.** The ``fps`` filter re-times the decoded frames by their timestamps (round to nearest,
      duplicating or dropping frames), so 30, 29.97, 60, 18 fps and variable-frame-rate clips all come out as
      constant 25 fps covering the same duration: ``frame_count == round(D * 25)``, where D is the end of the
      last source frame (its timestamp plus its duration; an MP4's container duration can differ slightly), so
      the length is kept within one frame (tested for 30, 29.97, 60, 18 fps and VFR with ffmpeg 7.0 and 9.0;
      ffmpeg 4.2's ``fps`` filter ignores the last frame's duration and can give one frame fewer).
    - **Rotation.** ffmpeg's autorotation turns phone clips upright; :attr:`width`/:attr:`height` are the upright
      size.
    - **Any pixel format.** 10-bit, 4:2:2/4:4:4, odd sizes and RGB sources are converted by ffmpeg to bgr24.
    - **Alpha.** Sources with an alpha channel (PNG/WebP/ProRes 4444 ... or a palette with transparency) are decoded
      to BGRA and composited over :attr:`background` (black by default):
      ``out = round((colour * a + background * (255 - a)) / 255)``.
    - **Photos.** A single image (detected from the content) yields exactly one frame; the pipeline loops it. Its
      EXIF orientation is applied (as ``cv2.imread`` does in the official code), identically on every ffmpeg.

    Args:
        path: Video or photo file (any container or image format ffmpeg reads).
        fps: Output frame rate in frames per second (25 for MuseTalk).
        background: BGR colour (3 ints, 0-255) that transparent pixels are composited over.
        ffmpeg: Path of the ffmpeg binary; None for :func:`ffmpeg_exe`.

    Raises:
        InputError: Missing file, no video stream, or a bad ``fps``/``background``.
        FFmpegError: ffmpeg cannot read the file.

    Attributes:
        path: Absolute path of the source.
        info: :class:`MediaInfo` of the source.
        fps: Output frame rate (frames per second), a Fraction (25 by default).
        width: Frame width in pixels (upright).
        height: Frame height in pixels (upright).
        has_alpha: True when the source pixel format carries alpha (frames are flattened).
        background: BGR colour that transparent pixels are composited over.
    """

    def __init__(self, path, fps=FPS, *, background=(0, 0, 0), ffmpeg: str | None = None):
        self.path = _existing_file(path, "video")
        self.fps = _check_fps(fps)
        self.background = _check_background(background)
        self._exe = ffmpeg or ffmpeg_exe()
        self.info = probe(self.path, count_frames=False)
        if not self.info.has_video:
            what = "an audio file" if self.info.has_audio else "a file with no picture"
            raise InputError(f"video: {str(self.path)!r} is {what} (container {self.info.container!r}, no video "
                             "stream). Give a video or a photo of a face; audio goes in the audio argument.")
        if not self.info.width or not self.info.height:
            raise InputError(f"video: ffmpeg reports no frame size for {str(self.path)!r}; convert it to MP4 first.")
        self.width: int = self.info.width
        self.height: int = self.info.height
        self.has_alpha = _has_alpha(self.info.pix_fmt)
        stored = self.info.video_stream
        # what ffmpeg delivers: upright for videos (autorotation), as stored for stills (EXIF applied by us)
        self._decoded_size = (stored.width, stored.height) if self.info.is_image else (self.width, self.height)
        self._count: int | None = 1 if self.info.is_image else None
        self._cursor: _FrameStream | None = None
        self._streams: set[_FrameStream] = set()

    # -- ffmpeg command -------------------------------------------------------------------------------------------
    def _filters(self, extra: str | None) -> list[str]:
        chain = [] if self.info.is_image else [f"fps={self.fps.numerator}/{self.fps.denominator}"]
        if extra:
            chain.append(extra)
        return chain

    def _command(self, extra_filter: str | None = None, max_frames: int | None = None, null: bool = False):
        args = [self._exe, "-nostdin", "-hide_banner", "-nostats", "-loglevel", "error"]
        if self.info.is_image:
            args.append("-noautorotate")  # recent ffmpeg turns JPEGs by EXIF, older does not: we do it ourselves
        args += ["-i", str(self.path), "-map", f"0:{self.info.video_stream.index}"]
        chain = self._filters(extra_filter)
        if chain:
            args += ["-vf", ",".join(chain)]
        if self.info.is_image:
            max_frames = 1 if max_frames is None else min(max_frames, 1)
        if max_frames is not None:
            args += ["-frames:v", str(max_frames)]
        args += _passthrough(self._exe)
        if null:
            return args + ["-f", "null", "-progress", "pipe:1", "-"]
        return args + ["-f", "rawvideo", "-pix_fmt", "bgra" if self.has_alpha else "bgr24", "pipe:1"]

    # -- frame count ----------------------------------------------------------------------------------------------
    @property
    def frame_count(self) -> int:
        """Exact number of frames this reader yields (1 for a photo).

        For a video the count at the output fps is only known exactly from the decoded timestamps, so the first
        access runs one fast counting decode (``-vf fps=25 -f null``, no colour conversion or pipe: about 0.4 s for
        22 s of 576x768 video) and caches it; a completed iteration also records it.
        """
        if self._count is None:
            rc, out, err = _run(self._command(null=True), "count frames")
            count = _progress_frames(out)
            if rc != 0 or count is None:
                raise FFmpegError(f"ffmpeg could not decode {str(self.path)!r} to count its frames.",
                                  args_list=self._command(null=True), returncode=rc, stderr_tail=_tail(err))
            self._count = count
        return self._count

    def __len__(self) -> int:
        return self.frame_count

    # -- reading --------------------------------------------------------------------------------------------------
    def _open(self, extra_filter: str | None = None, max_frames: int | None = None) -> _FrameStream:
        stream = _FrameStream(self, extra_filter, max_frames)
        self._streams.add(stream)
        return stream

    def _release(self, stream: _FrameStream) -> None:
        stream.close()
        self._streams.discard(stream)

    def iter_batches(self, batch_size: int = 16) -> Iterator[np.ndarray]:
        """Yield ``(n, H, W, 3) uint8`` BGR batches (n = batch_size, the last one shorter) from the first frame.

        Args:
            batch_size: Frames per batch (>= 1).

        Yields:
            Arrays of consecutive frames; each array is new memory.

        Raises:
            FFmpegError: ffmpeg failed while decoding (message with its stderr tail).
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InputError(f"batch_size must be an integer >= 1; got {batch_size!r}.")
        stream = self._open()
        try:
            while True:
                batch = stream.read(batch_size)
                if len(batch):
                    yield batch
                if len(batch) < batch_size:
                    break
            self._count = stream.count
        finally:
            self._release(stream)

    def __iter__(self) -> Iterator[np.ndarray]:
        frame_bytes = self.width * self.height * (4 if self.has_alpha else 3)
        for batch in self.iter_batches(max(1, min(8, (64 << 20) // frame_bytes))):  # <= 64 MiB per read
            yield from batch

    def read_batch(self, n: int) -> np.ndarray:
        """Read the next ``n`` frames from the reader's cursor (which starts at frame 0).

        Args:
            n: Number of frames wanted (>= 1).

        Returns:
            ``(n', H, W, 3) uint8`` BGR with ``n' <= n``; ``n' == 0`` once every frame has been read.

        Raises:
            FFmpegError: ffmpeg failed while decoding.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InputError(f"n must be an integer >= 1; got {n!r}.")
        if self._cursor is None:
            self._cursor = self._open()
        batch = self._cursor.read(n)
        if self._cursor.done:
            if self._count is None and len(batch) < n:
                self._count = self._cursor.count
            self._streams.discard(self._cursor)
        return batch

    def rewind(self) -> None:
        """Move the :meth:`read_batch` cursor back to frame 0 (stops its ffmpeg)."""
        if self._cursor is not None:
            self._release(self._cursor)
            self._cursor = None

    def close(self) -> None:
        """Stop every ffmpeg this reader started. Safe to call twice."""
        for stream in list(self._streams):
            self._release(stream)
        self._cursor = None

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - GC safety net
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        count = self._count if self._count is not None else "?"
        kind = "photo" if self.info.is_image else "video"
        return (f"VideoReader({self.path.name!r}, {kind}, {self.width}x{self.height} px, {_fps_text(self.fps)} fps, "
                f"frames={count})")


def load_video(path, fps=FPS, *, background=(0, 0, 0), ffmpeg: str | None = None) -> VideoReader:
    """Open a video or a photo as a stream of upright BGR frames at constant ``fps`` (25 by default).

    Args:
        path: Any container ffmpeg reads (mp4, mov, mkv, webm, avi, gif...) or one image (png, jpg, bmp, tif,
            webp), detected from the content.
        fps: Output frame rate in frames per second; MuseTalk needs 25.
        background: BGR colour (3 ints, 0-255) that transparent pixels are composited over; black by default.
        ffmpeg: Path of the ffmpeg binary; None for :func:`ffmpeg_exe`.

    Returns:
        A :class:`VideoReader`; iterate it for ``(H, W, 3) uint8`` BGR frames. ``frame_count`` is exact (1 for a
        photo).

    Raises:
        InputError: The file is missing, is a folder, has no video stream, or an argument is invalid.
        FFmpegError: ffmpeg cannot read the file.

    Source: the official offline script extracts every frame with ``ffmpeg -i <video> %08d.png`` and keeps the
    source fps (scripts/inference.py:120-126, musetalk/utils/utils.py:43-47), so non-25 fps input drifts
    (reference §11 Q8); the Gradio app re-times uploads to 25 fps (app.py:432-472) and training data was made at 25
    fps (scripts/preprocess.py:98-99). We always re-time to 25 fps at ingest (failure kinds F4, F7, F15).
    """
    return VideoReader(path, fps, background=background, ffmpeg=ffmpeg)


def frames_at(path, indices: Sequence[int], fps=FPS, *, background=(0, 0, 0)) -> np.ndarray:
    """Decode chosen frames (numbered at ``fps``, as :func:`load_video` yields them) without piping the others.

    Args:
        path: Video or photo file.
        indices: Frame numbers (0-based, at ``fps``); any order, repeats allowed.
        fps: Frame rate the indices refer to (25 by default).
        background: BGR colour for transparent pixels.

    Returns:
        ``(len(indices), H, W, 3) uint8`` BGR, in the order of ``indices``; identical to the frames that iterating
        ``load_video(path, fps)`` yields at those positions.

    Raises:
        InputError: An index is negative, not an integer, or past the last frame (the message gives the count).
        FFmpegError: ffmpeg failed.

    Source: no official counterpart; the Gradio app's "Test Inpainting" previews only the first frame
    (app.py:35-123). Frames are picked after the ``fps`` filter with ``select``, so numbering matches the reader.
    """
    wanted = list(indices)
    if not wanted:
        raise InputError("indices must name at least one frame number; got an empty list.")
    for i in wanted:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or i < 0:
            raise InputError(f"indices must be integers >= 0 (frame numbers at {fps} fps); got {i!r}.")
    unique = sorted({int(i) for i in wanted})
    with VideoReader(path, fps, background=background) as reader:
        if len(unique) <= 200:
            expr = "+".join(f"eq(n\\,{i})" for i in unique)
            stream = reader._open(f"select={expr}", max_frames=len(unique))
            try:
                got = stream.read(len(unique))
            finally:
                reader._release(stream)
        else:
            keep = set(unique)
            picked, n = [], 0
            for batch in reader.iter_batches(16):
                for frame in batch:
                    if n in keep:
                        picked.append(frame)
                    n += 1
                if n > unique[-1]:
                    break
            got = np.stack(picked) if picked else np.empty((0, reader.height, reader.width, 3), np.uint8)
        if len(got) < len(unique):
            count = reader.frame_count
            raise InputError(f"indices: frame {unique[len(got)]} is past the last frame of {str(reader.path)!r}, "
                             f"which has {count} frames at {_fps_text(reader.fps)} fps (valid: 0-{count - 1}).")
    position = {i: k for k, i in enumerate(unique)}
    return got[[position[int(i)] for i in wanted]]


def read_frame(path, index: int = 0, fps=FPS, *, background=(0, 0, 0)) -> np.ndarray:
    """One frame of a video or photo at ``fps`` (for previews and tests).

    Args:
        path: Video or photo file.
        index: Frame number at ``fps`` (0-based).
        fps: Frame rate ``index`` refers to (25 by default).
        background: BGR colour for transparent pixels.

    Returns:
        ``(H, W, 3) uint8`` BGR.

    Raises:
        InputError: ``index`` is negative or past the last frame.
        FFmpegError: ffmpeg failed.

    Source: no official counterpart (see :func:`frames_at`).
    """
    return frames_at(path, [index], fps, background=background)[0]


# ---------------------------------------------------------------------------------------------------------------
# audio
# ---------------------------------------------------------------------------------------------------------------

def _soundfile_read(p: Path) -> tuple[np.ndarray, int] | None:
    """(channels-first float32 or 1-D, native rate) through libsndfile, exactly as librosa does; None if it can't."""
    try:
        import soundfile as sf
    except (ImportError, OSError):
        return None
    try:
        with sf.SoundFile(str(p)) as handle:
            rate = handle.samplerate
            data = handle.read(frames=-1, dtype="float32", always_2d=False).T
    except Exception:  # libsndfile cannot read this format (mp4/m4a/video...) -> ffmpeg
        return None
    return data, int(rate)


def _wav_header(buf: bytes) -> tuple[int, int, int] | None:
    """(channels, sample rate, offset of the sample data) from a streamed WAV header; None until complete."""
    if len(buf) < 12:
        return None
    if buf[:4] not in (b"RIFF", b"RF64") or buf[8:12] != b"WAVE":
        raise ValueError("not a WAV stream")
    pos, channels, rate = 12, None, None
    while pos + 8 <= len(buf):
        chunk, size = buf[pos:pos + 4], int.from_bytes(buf[pos + 4:pos + 8], "little")
        if chunk == b"data":
            if channels is None:
                raise ValueError("WAV data before fmt")
            return channels, rate, pos + 8
        if pos + 8 + size > len(buf):
            return None
        if chunk == b"fmt ":
            channels = int.from_bytes(buf[pos + 10:pos + 12], "little")
            rate = int.from_bytes(buf[pos + 12:pos + 16], "little")
        pos += 8 + size + (size & 1)
    return None


def _ffmpeg_decode(p: Path, info: MediaInfo) -> tuple[np.ndarray, int]:
    """Decode the first audio stream at its native rate to float32, mean-mixed to mono chunk by chunk."""
    exe = ffmpeg_exe()
    args = [exe, "-nostdin", "-hide_banner", "-nostats", "-loglevel", "error", "-i", str(p), "-map",
            f"0:{info.audio_stream.index}", "-vn", "-sn", "-dn", "-map_metadata", "-1", "-fflags", "+bitexact",
            "-c:a", "pcm_f32le", "-f", "wav", "pipe:1"]
    proc = _Process(args)
    stdout = proc.popen.stdout
    try:
        head = b""
        header = None
        while header is None:
            more = stdout.read1(65536) if hasattr(stdout, "read1") else stdout.read(65536)
            if not more:
                break
            head += more
            header = _wav_header(head)
        if header is None:
            proc.wait()
            raise proc.error(f"ffmpeg produced no audio samples from {str(p)!r}.")
        channels, rate, offset = header
        frame_bytes = 4 * channels
        pieces: list[np.ndarray] = []
        pending = head[offset:]
        while True:
            usable = len(pending) - len(pending) % frame_bytes
            if usable:
                block = np.frombuffer(pending[:usable], dtype="<f4").reshape(-1, channels)
                # librosa's to_mono: mean over the channel axis of the channels-first array
                pieces.append(block.astype(np.float32).T.mean(axis=0) if channels > 1
                              else block[:, 0].astype(np.float32))
                pending = pending[usable:]
            more = stdout.read(1 << 20)
            if not more:
                break
            pending += more
        rc = proc.wait()
        if rc != 0:
            raise proc.error(f"ffmpeg failed while decoding the audio of {str(p)!r}.")
    finally:
        proc.kill()
    mono = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return mono, rate


def _decode_native(path, param: str) -> tuple[np.ndarray, int, Path]:
    """Mono float32 at the native rate, as librosa.load(sr=None) gives it: (samples (L,), rate Hz, path)."""
    p = _existing_file(path, param)
    got = _soundfile_read(p)
    if got is not None:
        data, rate = got
        mono = np.mean(data, axis=tuple(range(data.ndim - 1))) if data.ndim > 1 else data
    else:
        info = probe(p, count_frames=False)
        if not info.has_audio:
            what = ("a photo" if info.is_image else "a video without sound" if info.has_video
                    else "a file with no audio or video streams (empty?)")
            raise InputError(f"{param}: {str(p)!r} has no audio stream (it is {what}; container "
                             f"{info.container!r}). Give a speech file (wav, mp3, m4a, ogg, flac) or a video that "
                             "has sound.")
        mono, rate = _ffmpeg_decode(p, info)
    if mono.size == 0:
        raise InputError(f"{param}: {str(p)!r} has an audio stream but no samples (0 s of sound). Record or export "
                         "the speech again, or use the demo clip from nbhelpers.media.demo_inputs().")
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate), p


def load_audio(path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Decode speech to a mono float32 waveform at ``sample_rate`` (16 kHz), the samples of ``librosa.load``.

    Steps (librosa 0.11's ``load(path, sr=16000)``, without needing librosa): read at the native rate with
    soundfile when libsndfile can read the file (wav, flac, ogg, mp3...), otherwise decode the first audio stream
    with ffmpeg at the native rate (m4a/aac, opus, a video's sound...; no resampling in ffmpeg); average the
    channels; resample with ``soxr.resample(..., quality="soxr_hq")``; fix the length to
    ``ceil(L * sample_rate / native_rate)`` samples (zero-padded or trimmed, as librosa's ``fix_length``).

    Args:
        path: Any file with an audio stream (wav, mp3, m4a, ogg, flac, or a video with sound).
        sample_rate: Output rate in Hz (16000 for Whisper).

    Returns:
        ``(L,) float32`` samples in [-1, 1] (nominal), mono, at ``sample_rate``.

    Raises:
        InputError: Missing file, no audio stream (e.g. a video without sound or a photo), zero samples, or a bad
            ``sample_rate``.
        FFmpegError: ffmpeg cannot read the file.
        MissingDependencyError: ``soxr`` is not installed and resampling is needed.

    Source: musetalk/utils/audio_processor.py:18 (``librosa.load(path, sr=16000)``); [librosa] core/audio.py:56-66,
    170-193 (soundfile first, mean to mono, ``soxr_hq``); reference §2.2.
    """
    if not isinstance(sample_rate, (int, np.integer)) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise InputError(f"sample_rate must be a positive integer in Hz (Whisper needs {SAMPLE_RATE}); got "
                         f"{sample_rate!r}.")
    mono, rate, _ = _decode_native(path, "audio")
    if rate == sample_rate:
        return mono
    try:
        import soxr
    except ImportError as exc:
        raise MissingDependencyError("The package 'soxr' (audio resampling) is not installed. Install it with:\n"
                                     "    pip install soxr") from exc
    n_out = int(np.ceil(mono.shape[-1] * (float(sample_rate) / rate)))  # librosa.resample's fix_length size
    out = soxr.resample(mono, rate, int(sample_rate), quality="soxr_hq")
    out = np.asarray(out, dtype=np.float32)
    if out.shape[0] > n_out:
        out = out[:n_out]
    elif out.shape[0] < n_out:
        out = np.pad(out, (0, n_out - out.shape[0]))
    return np.ascontiguousarray(out, dtype=np.float32)


def audio_duration(path) -> float:
    """Exact duration in seconds of the first audio stream (decoded samples / native rate).

    Args:
        path: Any file with an audio stream.

    Returns:
        Seconds (float). The pipeline writes ``floor(seconds * 25)`` video frames.

    Raises:
        InputError: Missing file, no audio stream or no samples.
        FFmpegError: ffmpeg cannot read the file.

    Source: the number of output frames follows the audio length (musetalk/utils/audio_processor.py:61-63,
    reference §5.3).
    """
    p = _existing_file(path, "audio")
    try:
        import soundfile as sf

        info = sf.info(str(p))
        # PCM containers state their sample count in the header; compressed ones are decoded to count exactly
        if info.format in _PCM_FORMATS and info.frames > 0 and info.samplerate > 0:
            return info.frames / info.samplerate
    except Exception:  # not readable by libsndfile -> decode with ffmpeg
        pass
    mono, rate, _ = _decode_native(p, "audio")
    return mono.shape[0] / rate


# ---------------------------------------------------------------------------------------------------------------
# video writing
# ---------------------------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------------------------
# Encoder setting: libx264 presets, or NVENC after a real one-frame test encode
# ---------------------------------------------------------------------------------------------------------------

ENCODER_SETTINGS = {  # setting -> (ffmpeg encoder, preset); "auto" picks nvenc when it works, else libx264
    "libx264": ("libx264", "medium"),
    "libx264-fast": ("libx264", "fast"),
    "libx264-faster": ("libx264", "faster"),
    "libx264-veryfast": ("libx264", "veryfast"),
    "libx264-superfast": ("libx264", "superfast"),
    "libx264-ultrafast": ("libx264", "ultrafast"),
    "nvenc": ("h264_nvenc", "p5"),
    "auto": ("h264_nvenc", "p5"),
}

_PROBE_SIZE = (256, 256)  # pixels of the test frame (NVENC's minimum is about 145x49)
_probe_cache: dict[str, tuple[bool, str]] = {}
_probe_lock = threading.Lock()


@dataclass(frozen=True)
class EncoderChoice:
    """What an ``encoder`` setting resolved to.

    Attributes:
        setting: The setting asked for (one of :data:`nbhelpers.constants.ENCODERS`).
        codec: ffmpeg encoder used: ``"libx264"`` or ``"h264_nvenc"``.
        preset: Its preset (``"medium"``, ``"veryfast"``, ..., ``"p5"`` for NVENC).
        ffmpeg: The ffmpeg binary to run it with; None = :func:`ffmpeg_exe` (imageio-ffmpeg's).
        reason: Why this was chosen (the NVENC test encode's result for ``auto`` / ``nvenc``).
    """

    setting: str
    codec: str
    preset: str
    ffmpeg: str | None = None
    reason: str = ""


def nvenc_probe(ffmpeg: str | None = None, timeout: float = 30.0) -> tuple[bool, str]:
    """Whether ``h264_nvenc`` really encodes with this ffmpeg here: one 256x256 black frame, encoded to nothing.

    Listing the encoder proves little (imageio-ffmpeg 0.8's ffmpeg lists ``h264_nvenc`` but fails on drivers
    older than its NVENC API, and a GPU may have no encoder unit), so a real frame is encoded. The answer is
    cached per binary for the life of the process.

    Args:
        ffmpeg: Path of the ffmpeg binary; None = :func:`ffmpeg_exe` (imageio-ffmpeg's).
        timeout: Seconds before the test encode counts as failed.

    Returns:
        ``(True, "")`` when the frame was encoded, else ``(False, reason)`` with ffmpeg's last error line (or why
        it could not run).

    Source: shared/reference/environment-notes.md (NVENC on the H200 and Colab's 580 drivers).
    """
    exe = ffmpeg or ffmpeg_exe()
    with _probe_lock:
        if exe in _probe_cache:
            return _probe_cache[exe]
        width, height = _PROBE_SIZE
        args = [exe, "-hide_banner", "-nostats", "-loglevel", "error", "-f", "rawvideo", "-pixel_format", "bgr24",
                "-video_size", f"{width}x{height}", "-framerate", "25", "-i", "pipe:0", "-frames:v", "1",
                "-c:v", "h264_nvenc", "-pix_fmt", "yuv420p", "-f", "null", "-"]
        try:
            done = subprocess.run(args, input=bytes(width * height * 3), capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            result = (False, f"the test encode did not finish within {timeout:g} s")
        except OSError as exc:
            result = (False, f"{exe!r} could not be run ({exc})")
        else:
            lines = [ln.strip() for ln in done.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
            # the encoder's own lines ("[h264_nvenc @ 0x...] Cannot load libcuda.so.1", "Driver does not support
            # the required nvenc API version ...") say why; ffmpeg's later lines only report the consequences
            own = [re.sub(r"^\[h264_nvenc @ [^]]*\]\s*", "", ln) for ln in lines if ln.startswith("[h264_nvenc")]
            text = " ".join(own[:3]) or (lines[0] if lines else f"ffmpeg exited with code {done.returncode}")
            result = (True, "") if done.returncode == 0 else (False, text)
        _probe_cache[exe] = result
        return result


def choose_encoder(setting: str = "libx264", *, ffmpegs: Sequence[str] | None = None,
                   probe: Any = None, warn: bool = True) -> EncoderChoice:
    """Resolve an ``encoder`` setting to an ffmpeg encoder, preset and binary.

    * ``"libx264"`` (default; the official offline job): CRF 18, preset ``medium``.
    * ``"libx264-fast"`` ... ``"libx264-ultrafast"``: the same CRF at a faster libx264 preset (larger files or a
      little lower quality; ``bench/encoders.py`` measures speed, size and PSNR against medium).
    * ``"nvenc"`` / ``"auto"``: ``h264_nvenc`` (``-preset p5 -rc vbr -cq 18``) when a one-frame test encode
      (:func:`nvenc_probe`) succeeds with imageio-ffmpeg's binary, else with the ``ffmpeg`` on PATH; otherwise
      libx264 medium, with a :class:`~nbhelpers.errors.FallbackWarning` that gives the test encode's error.

    Args:
        setting: One of :data:`nbhelpers.constants.ENCODERS`.
        ffmpegs: Binaries to try NVENC with, in order; None = imageio-ffmpeg's, then the one on PATH if different.
        probe: ``probe(ffmpeg_path) -> (ok, reason)``; None = :func:`nvenc_probe` (tests inject their own).
        warn: Emit the fallback warning (the reason is in the result either way).

    Returns:
        An :class:`EncoderChoice`.

    Raises:
        InputError: When ``setting`` is not a known encoder setting.
    """
    if setting not in ENCODER_SETTINGS:
        raise InputError(f"encoder must be one of {', '.join(map(repr, ENCODERS))}; got {setting!r}. "
                         "'libx264' (CRF 18, preset medium) is the official offline choice.")
    codec, preset = ENCODER_SETTINGS[setting]
    if codec == "libx264":
        return EncoderChoice(setting, codec, preset, None, f"libx264 CRF 18, preset {preset}")
    probe = probe or nvenc_probe
    if ffmpegs is None:
        ffmpegs = [ffmpeg_exe()]
        system = shutil.which("ffmpeg")
        if system and os.path.realpath(system) != os.path.realpath(ffmpegs[0]):
            ffmpegs.append(system)
    failures = []
    for exe in ffmpegs:
        ok, why = probe(exe)
        if ok:
            return EncoderChoice(setting, codec, preset, exe, f"h264_nvenc test encode succeeded with {exe}")
        failures.append(f"{exe}: {why}")
    reason = ("h264_nvenc is not usable here (" + "; ".join(failures or ["no ffmpeg to try"]) + "); encoding with "
              "libx264 CRF 18, preset medium instead")
    if warn:
        import warnings

        warnings.warn(f"encoder={setting!r}: {reason}.", FallbackWarning, stacklevel=2)
    return EncoderChoice(setting, "libx264", "medium", None, reason)


class VideoWriter:
    """Encode BGR frames through an ffmpeg pipe into an H.264 MP4, with the original audio muxed in.

    One ffmpeg process reads raw frames on its stdin (``-f rawvideo -pixel_format bgr24 -video_size WxH
    -framerate 25 -i pipe:0``) and the audio file as a second input, maps exactly ``0:v:0`` and the first audio
    stream of the audio file (``-map 1:<index>``), and writes:

    - video: libx264, ``-crf 18`` (the official value), ``-pix_fmt yuv420p``, colours converted with the BT.709
      matrix (limited range) and tagged as BT.709, ``-movflags +faststart`` (plays while downloading). Odd sizes
      get one black column/row added at the right/bottom (``pad=ceil(iw/2)*2:ceil(ih/2)*2``) because yuv420p
      needs even sizes; the frames you pass are never scaled.
    - audio: the stream copied when it is already AAC (into mp4/mov/m4v/mkv), otherwise encoded to AAC. The
      whole audio is kept and the file lasts as long as the longer stream, so when you write
      ``floor(audio_s * 25)`` frames (what the pipeline does) the output lasts the audio's duration (the video
      ends less than one frame earlier). ``shortest=True`` cuts at the shorter stream instead.
    - metadata: ``comment`` = :data:`SYNTHETIC_TAG` and the same text as the video track's handler name, marking
      the file as synthetic.

    The file is written as ``.<name>.partial-<random><suffix>`` in the output folder and renamed to ``path`` with
    ``os.replace`` only when ffmpeg succeeded; on any failure (or an exception inside the ``with`` block) ffmpeg
    is killed and the partial file removed, so no half-written output is ever left.

    No wait is unbounded: when ffmpeg takes no frame data for ``stall_timeout_s`` seconds in :meth:`write`, or
    shows no progress (CPU time, bytes written) for that long while :meth:`close` finishes the file, it has
    stalled (typically on an output folder on a network mount, such as Google Drive, that stopped answering): it
    is killed and :class:`~nbhelpers.errors.FFmpegError` (with ``stalled = True``) says so, instead of the cell
    hanging. A slow ffmpeg that keeps working is never stopped.

    NVENC: ``codec="h264_nvenc"`` encodes on an NVIDIA GPU (``-preset p5 -rc vbr -cq <crf> -b:v 0``). It needs an
    ffmpeg built with NVENC and a driver: imageio-ffmpeg's build has it, as has Colab's ``/usr/bin/ffmpeg``
    (``VideoWriter(..., codec="h264_nvenc", ffmpeg=ffmpeg_exe(prefer_system=True))``). The ``encoder`` setting
    does this choice safely: ``encoder="auto"`` uses NVENC only after a test encode worked (:func:`choose_encoder`).

    Args:
        path: Output file (.mp4, .mov, .m4v or .mkv); its folder is created when missing.
        width: Frame width in pixels (frames must be ``(height, width, 3)``).
        height: Frame height in pixels.
        fps: Frame rate in frames per second (25).
        audio: File whose first audio stream is muxed in (the original speech file, or a video with sound);
            None writes video only.
        crf: Constant rate factor 0-51 (lower = better; 18 is visually lossless and the official choice).
        codec: ``"libx264"`` (default), ``"h264_nvenc"``, or another ffmpeg H.264/H.265 encoder name.
        preset: Encoder preset; None uses ``"medium"`` for libx264 and ``"p5"`` for NVENC.
        audio_bitrate: AAC bitrate when the audio is re-encoded (ffmpeg notation, e.g. ``"192k"``).
        shortest: Stop at the shorter stream (``-shortest``) instead of keeping all the audio.
        ffmpeg: Path of the ffmpeg binary; None for :func:`ffmpeg_exe` (class default :attr:`ffmpeg`).
        extra_args: More output options placed before the file name, e.g. ``["-tune", "film"]``.
        synthetic: Tag the file as synthetic (comment and video handler name, :data:`SYNTHETIC_TAG`); True for
            everything the lip-sync writes, False for plain conversions such as :func:`convert_to_25fps`.
        stall_timeout_s: Seconds without progress after which ffmpeg counts as stalled (default
            :data:`WRITER_STALL_TIMEOUT_S`, 120); None waits for ever.
        encoder: An encoder setting (:data:`nbhelpers.constants.ENCODERS`, e.g. ``InferenceConfig.encoder``), or an
            :class:`EncoderChoice` already made by :func:`choose_encoder` (resolve once per job, write many clips);
            when given it sets ``codec`` and ``preset`` (an explicit ``preset`` still wins) and, for NVENC, the
            binary. A setting goes through :func:`choose_encoder`, which warns when NVENC falls back to libx264.

    Attributes:
        path: Final output path.
        encoder: The :class:`EncoderChoice` when ``encoder`` was given, else None.
        frames_written: Frames accepted so far.
        stall_timeout_s: The stall bound in seconds (None = none).

    Raises:
        InputError: Bad size, fps, crf, suffix, stall timeout or audio file (missing, or no audio stream) - before
            ffmpeg starts.
        FFmpegError: ffmpeg refused the options, died while frames were written (its stderr tail is in the
            message), failed when finishing, or stalled (``stalled`` attribute True).

    Source: scripts/inference.py:230-237 (libx264, ``format=yuv420p``, ``-crf 18``; then a re-encoding mux of the
    original audio with no ``-map``, reference §8 and §11 Q24). We encode once, map streams explicitly and write
    atomically (failure kinds F6, F14, F16).
    """

    ffmpeg: str | None = None  # class-level default binary; None means ffmpeg_exe()

    def __init__(self, path, width: int, height: int, fps=FPS, audio=None, crf: int = 18, codec: str = "libx264",
                 *, preset: str | None = None, audio_bitrate: str = "192k", shortest: bool = False,
                 ffmpeg: str | None = None, extra_args: Iterable[str] = (), synthetic: bool = True,
                 stall_timeout_s: float | None = WRITER_STALL_TIMEOUT_S, encoder: str | EncoderChoice | None = None):
        self.synthetic = bool(synthetic)
        if stall_timeout_s is not None and (isinstance(stall_timeout_s, bool) or not stall_timeout_s > 0):
            raise InputError(f"stall_timeout_s must be a number of seconds > 0, or None to wait for ever; got "
                             f"{stall_timeout_s!r}.")
        self.stall_timeout_s = None if stall_timeout_s is None else float(stall_timeout_s)
        self.encoder = encoder if isinstance(encoder, EncoderChoice) or encoder is None else choose_encoder(encoder)
        if self.encoder is not None:
            codec, preset = self.encoder.codec, preset or self.encoder.preset
            ffmpeg = ffmpeg or self.encoder.ffmpeg
        for name, value in (("width", width), ("height", height)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise InputError(f"{name} must be a positive integer number of pixels; got {value!r}.")
        self.width, self.height = int(width), int(height)
        self.fps = _check_fps(fps)
        if not isinstance(crf, (int, np.integer)) or isinstance(crf, bool) or not 0 <= crf <= 51:
            raise InputError(f"crf must be an integer 0-51 (18 = visually lossless, the official value); got {crf!r}.")
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            raise InputError(f"path must be a file path ending in .mp4; got {type(path).__name__} {path!r}.")
        out = Path(path).expanduser().absolute()
        if out.suffix.lower() not in _WRITER_SUFFIXES:
            raise InputError(f"path must end in one of {sorted(_WRITER_SUFFIXES)} (H.264 + AAC containers); got "
                             f"{str(out)!r}. Use e.g. 'result.mp4'.")
        if out.is_dir():
            raise InputError(f"path {str(out)!r} is a folder; give a file name such as {str(out / 'result.mp4')!r}.")
        self.path = out
        self.audio: Path | None = None
        audio_info = None
        if audio is not None:
            self.audio = _existing_file(audio, "audio")
            audio_info = probe(self.audio, count_frames=False)
            if not audio_info.has_audio:
                raise InputError(f"audio: {str(self.audio)!r} has no audio stream (container "
                                 f"{audio_info.container!r}); give the speech file, or audio=None for a silent "
                                 "video.")
        self.frames_written = 0
        self._exe = ffmpeg or type(self).ffmpeg or ffmpeg_exe()
        out.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = out.with_name(f".{out.stem}.partial-{uuid.uuid4().hex[:8]}{out.suffix}")
        self._result: Path | None = None
        self._closed = False
        self.args = self._build_args(codec, crf, preset, audio_info, audio_bitrate, shortest, list(extra_args))
        self._proc = _Process(self.args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        self._selector: selectors.BaseSelector | None = None
        if self.stall_timeout_s is not None and os.name == "posix":  # bounded writes: non-blocking pipe + select
            fd = self._proc.popen.stdin.fileno()
            os.set_blocking(fd, False)
            self._selector = selectors.DefaultSelector()
            self._selector.register(fd, selectors.EVENT_WRITE)

    def _build_args(self, codec, crf, preset, audio_info, audio_bitrate, shortest, extra) -> list[str]:
        w, h = self.width, self.height
        args = [self._exe, "-nostdin", "-hide_banner", "-nostats", "-loglevel", "error", "-y",
                "-f", "rawvideo", "-pixel_format", "bgr24", "-video_size", f"{w}x{h}",
                "-framerate", f"{self.fps.numerator}/{self.fps.denominator}", "-i", "pipe:0"]
        if self.audio is not None:
            args += ["-i", str(self.audio)]
        args += ["-map", "0:v:0"]
        if self.audio is not None:
            args += ["-map", f"1:{audio_info.audio_stream.index}"]
        chain = []
        if w % 2 or h % 2:
            chain.append("pad=ceil(iw/2)*2:ceil(ih/2)*2")  # one black column/row; yuv420p needs even sizes
        # BT.709 matrix, limited range, and the stream tagged so (setparams: the -color_* options alone are not
        # carried through the filtered frames by every ffmpeg version)
        chain += ["scale=out_color_matrix=bt709:out_range=tv", "format=yuv420p",
                  "setparams=range=tv:color_primaries=bt709:color_trc=bt709:colorspace=bt709"]
        args += ["-vf", ",".join(chain)]
        if codec == "libx264":
            args += ["-c:v", "libx264", "-preset", preset or "medium", "-crf", str(int(crf))]
        elif codec.endswith("_nvenc"):
            args += ["-c:v", codec, "-preset", preset or "p5", "-rc", "vbr", "-cq", str(int(crf)), "-b:v", "0"]
        else:
            args += ["-c:v", codec] + (["-preset", preset] if preset else [])
        args += ["-pix_fmt", "yuv420p", "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709",
                 "-color_range", "tv"]
        if self.audio is not None:
            if audio_info.audio_codec == "aac":
                args += ["-c:a", "copy"]
            else:
                args += ["-c:a", "aac", "-b:a", audio_bitrate]
            if shortest:
                args += ["-shortest"]
        if self.path.suffix.lower() in (".mp4", ".mov", ".m4v"):
            args += ["-movflags", "+faststart"]
        if self.synthetic:
            args += ["-metadata", f"comment={SYNTHETIC_TAG}", "-metadata:s:v:0", f"handler_name={SYNTHETIC_TAG}"]
        args += extra
        return args + [str(self._tmp)]

    def write(self, frames) -> None:
        """Append one frame ``(H, W, 3)`` or a batch ``(N, H, W, 3)`` of uint8 BGR frames.

        Args:
            frames: numpy array (or a torch tensor, copied to the host) of dtype uint8, BGR order, with
                H = ``height`` and W = ``width``. Non-contiguous arrays are copied.

        Raises:
            InputError: Wrong dtype or shape (the message shows what was received).
            FFmpegError: ffmpeg has died (broken pipe); the partial file has been removed.
            MediaError: The writer is already closed.
        """
        if self._closed:
            raise MediaError(f"This VideoWriter for {str(self.path)!r} is closed; open a new one to write again.")
        if hasattr(frames, "detach") and hasattr(frames, "cpu"):  # a torch tensor, possibly on the GPU
            frames = frames.detach().cpu().numpy()
        arr = np.asarray(frames)
        if arr.dtype != np.uint8:
            raise InputError(f"frames must be uint8 BGR (0-255); got dtype {arr.dtype}. Convert with "
                             "np.clip(x, 0, 255).astype(np.uint8) (and scale floats in [0, 1] by 255 first).")
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4 or arr.shape[1:] != (self.height, self.width, 3):
            raise InputError(f"frames must have shape (H, W, 3) or (N, H, W, 3) with H={self.height}, W={self.width} "
                             f"(BGR); got {tuple(np.shape(frames))}. Make the writer with the frame size, or resize "
                             "the frames.")
        if not len(arr):
            return
        arr = np.ascontiguousarray(arr)
        try:
            self._send(memoryview(arr).cast("B"))
        except _Stalled as exc:
            raise self._stalled(f"took no frame data for {exc.seconds:g} s") from None
        except (BrokenPipeError, ConnectionResetError, OSError, ValueError) as exc:
            if self._watchdog_fired:
                raise self._stalled(f"took no frame data for {self.stall_timeout_s:g} s") from None
            try:
                self._proc.popen.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass  # it closed its input but keeps running: abort() below kills it
            error = self._proc.error(f"ffmpeg stopped while frames were being written to {str(self.path)!r} "
                                     f"({self.frames_written} frames written; {type(exc).__name__}).")
            self.abort()
            raise error from exc
        self.frames_written += len(arr)

    def close(self) -> Path:
        """Finish the file: flush, wait for ffmpeg, rename the temporary file to :attr:`path`.

        Returns:
            The output path. Calling again returns it again.

        Raises:
            InputError: No frame was written (nothing is kept).
            FFmpegError: ffmpeg failed (the partial file is removed).
        """
        if self._result is not None:
            return self._result
        if self._closed:
            raise MediaError(f"The VideoWriter for {str(self.path)!r} was aborted; nothing was written.")
        if self.frames_written == 0:
            self.abort()
            raise InputError(f"No frames were written to {str(self.path)!r}; call write(frames) before close(). "
                             "Nothing was saved.")
        self._closed = True
        try:
            self._proc.popen.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        if self._selector is not None:
            self._selector.close()
        try:
            rc = self._finish_wait()
        except _Stalled as exc:
            raise self._stalled(f"showed no progress for {exc.seconds:g} s while finishing the file") from None
        if rc != 0 or not self._tmp.is_file():
            error = self._proc.error(f"ffmpeg failed to write {str(self.path)!r} (exit status {rc}) after "
                                     f"{self.frames_written} frames; nothing was saved.")
            self._remove_tmp()
            raise error
        os.replace(self._tmp, self.path)
        self._result = self.path
        return self.path

    _watchdog_fired = False  # set by the watchdog that bounds a blocking write where select cannot (Windows)

    def _send(self, data: memoryview) -> None:
        """Write all of ``data`` to ffmpeg's stdin; raise :class:`_Stalled` when it takes nothing for the timeout."""
        stdin = self._proc.popen.stdin
        if self._selector is None:
            if self.stall_timeout_s is None:
                stdin.write(data)
                return

            def fire() -> None:
                self._watchdog_fired = True
                self._proc.kill()  # the blocked write below then fails with a broken pipe
            watchdog = threading.Timer(self.stall_timeout_s, fire)
            watchdog.daemon = True
            watchdog.start()
            try:
                stdin.write(data)
            finally:
                watchdog.cancel()
            return
        fd = stdin.fileno()
        pos, size = 0, len(data)
        while pos < size:
            if not self._selector.select(self.stall_timeout_s):
                raise _Stalled(self.stall_timeout_s)
            try:
                pos += os.write(fd, data[pos:pos + _PIPE_CHUNK])
            except BlockingIOError:  # the reader took less than select promised; wait again
                continue

    def _finish_wait(self) -> int:
        """Wait for ffmpeg to exit after its stdin closed, as long as it shows progress (CPU time, bytes)."""
        if self.stall_timeout_s is None:
            return self._proc.wait()
        mark, since = self._proc.progress_mark(self._tmp), time.monotonic()
        while True:
            try:
                self._proc.popen.wait(timeout=min(1.0, self.stall_timeout_s))
                return self._proc.wait()
            except subprocess.TimeoutExpired:
                now_mark = self._proc.progress_mark(self._tmp)
                if now_mark != mark:
                    mark, since = now_mark, time.monotonic()
                elif time.monotonic() - since >= self.stall_timeout_s:
                    raise _Stalled(self.stall_timeout_s) from None

    def _stalled(self, what: str) -> FFmpegError:
        """Kill a stalled ffmpeg, drop the partial file, and return the error that says so."""
        self._closed = True
        self._proc.kill()
        error = FFmpegError(
            f"ffmpeg {what} while writing {str(self.path)!r} ({self.frames_written} frames written): it has "
            "stalled, most often because the output folder is on a network mount (Google Drive) that stopped "
            "answering, or the disk is full. ffmpeg was stopped and nothing was saved. Write the output to a local "
            "folder (for example /content/results) and copy it afterwards, or allow more time "
            "(VideoWriter(stall_timeout_s=...)).", args_list=self.args, returncode=self._proc.popen.returncode,
            stderr_tail=self._proc.tail())
        error.stalled = True  # type: ignore[attr-defined]
        remover = threading.Thread(target=self._remove_tmp, name="nbhelpers-remove-partial", daemon=True)
        remover.start()
        remover.join(timeout=5)  # unlinking on a dead mount can block too: never wait for it for ever
        return error

    def abort(self) -> None:
        """Stop ffmpeg and delete the partial file; the output path is left untouched. Safe to call twice."""
        self._closed = True
        proc = getattr(self, "_proc", None)
        if proc is not None:
            proc.kill()
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self):  # pragma: no cover - GC safety net: never leave ffmpeg running or a partial file behind
        try:
            if getattr(self, "_result", None) is None:
                self.abort()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "done" if self._result else ("closed" if self._closed else "open")
        return (f"VideoWriter({self.path.name!r}, {self.width}x{self.height} px, {_fps_text(self.fps)} fps, "
                f"frames_written={self.frames_written}, {state})")


class _Stalled(Exception):
    """ffmpeg made no progress for ``seconds`` (internal; turned into an FFmpegError)."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


def convert_to_25fps(src, dst, crf: int = 18) -> MediaInfo:
    """Write a constant-25-fps H.264 (yuv420p, CRF ``crf``) copy of a clip, with its first audio stream as AAC.

    The frames are exactly those :func:`load_video` yields (upright, alpha flattened, re-timed by timestamps) and
    the audio is copied when it is AAC, otherwise encoded to AAC. Written atomically (temporary name, then
    ``os.replace``).

    Args:
        src: Source video (or photo: gives a one-frame clip).
        dst: Output file (.mp4, .mov, .m4v or .mkv).
        crf: libx264 constant rate factor (0-51; 18 is the official value).

    Returns:
        :class:`MediaInfo` of the written file.

    Raises:
        InputError: Missing source, source without video, bad ``dst`` or ``crf``.
        FFmpegError: ffmpeg failed; no partial output is left.

    Source: what the Gradio upload hook does with imageio (app.py:432-472) and the README asks users to do
    (README.md:320); here with ffmpeg's timestamp-based ``fps`` filter and no quality loss beyond one CRF-18 encode.
    """
    with load_video(src) as reader:
        audio = reader.path if reader.info.has_audio else None
        with VideoWriter(dst, reader.width, reader.height, FPS, audio=audio, crf=crf, synthetic=False) as writer:
            for batch in reader.iter_batches(16):
                writer.write(batch)
        return probe(writer.path)


# ---------------------------------------------------------------------------------------------------------------
# demo inputs
# ---------------------------------------------------------------------------------------------------------------

def demo_inputs(directory) -> tuple[Path, Path]:
    """A demo face photo and speech clip, for a first run with nothing of your own.

    Writes scikit-image's public-domain ``astronaut`` photo (Eileen Collins, NASA; 512x512, loaded from
    ``skimage.data`` at run time) as ``astronaut.png`` into ``directory``, and returns the packaged
    ``demo-speech.wav`` (4.7 s of English speech made by this project with espeak-ng; see
    ``nbhelpers/data/README.md``).

    Args:
        directory: Folder to write the photo into (created when missing).

    Returns:
        ``(photo_path, audio_path)``: the PNG in ``directory`` and the packaged WAV (copied into ``directory``
        only when the package is not a plain folder on disk, e.g. a zip).

    Raises:
        MissingDependencyError: scikit-image or Pillow is not installed.

    Source: no official counterpart; both inputs are ours or public domain (nbhelpers/data/README.md).
    """
    from importlib import resources

    folder = Path(directory).expanduser().absolute()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        from skimage import data as skdata
    except ImportError as exc:
        raise MissingDependencyError("scikit-image provides the demo photo. Install it with:\n"
                                     "    pip install scikit-image") from exc
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError("Pillow writes the demo photo. Install it with:\n    pip install Pillow") from exc
    photo = folder / "astronaut.png"
    tmp = folder / f".astronaut.partial-{uuid.uuid4().hex[:8]}.png"
    try:
        Image.fromarray(skdata.astronaut()).save(tmp, format="PNG")  # RGB array -> PNG (colours kept)
        os.replace(tmp, photo)
    finally:
        if tmp.exists():
            tmp.unlink()
    wav = resources.files("nbhelpers") / "data" / "demo-speech.wav"
    if isinstance(wav, Path) and wav.is_file():
        return photo, wav
    audio = folder / "demo-speech.wav"  # package inside a zip: copy the bytes out
    tmp_audio = folder / f".demo-speech.partial-{uuid.uuid4().hex[:8]}.wav"
    tmp_audio.write_bytes(wav.read_bytes())
    os.replace(tmp_audio, audio)
    return photo, audio
