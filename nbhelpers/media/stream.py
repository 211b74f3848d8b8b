"""Live output: frames and their audio into one ffmpeg process (:class:`FFmpegSink`), a file or any output URL."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from fractions import Fraction
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from ..constants import FPS, SAMPLE_RATE
from ..errors import FFmpegError, InputError
from .ffmpeg import BT709_TAGS, SYNTHETIC_ARGS, WRITER_STALL_TIMEOUT_S, _video_filter, ffmpeg_exe
from .writer import VideoWriter, _check_size, _partial, choose_encoder

URL_CONTAINERS = {"rtmp://": "flv", "rtmps://": "flv", "srt://": "mpegts", "udp://": "mpegts", "rtp://": "mpegts",
                  "tcp://": "mpegts"}
FILE_CONTAINERS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska", ".ts": "mpegts", ".flv": "flv"}
UDP_PACKET_BYTES = 1316  # 7 MPEG-TS packets of 188 bytes: one UDP datagram under a 1500-byte MTU
GOP_FRAMES = 2 * FPS  # a keyframe every 2 s, so that a viewer joining a stream starts within 2 s
AUDIO_OUT_RATE = 48000  # Hz of the AAC track: the session's 16 kHz speech resampled, as players and editors expect


def container_of(target: str | os.PathLike) -> str:
    """The ffmpeg muxer (``-f``) of a live output ``target``: by URL scheme (``rtmp://`` -> ``flv``, ``srt://``,
    ``udp://``, ``rtp://``, ``tcp://`` -> ``mpegts``) or file suffix (``.mp4``, ``.mov``, ``.mkv``, ``.ts``,
    ``.flv``). Raises InputError for any other name, and for a URL without a host or port (``udp://``; an SRT
    listener needs no host, RTMP no port), which ffmpeg refuses only once the models have loaded and frames are sent."""
    target = os.fspath(target)
    low = target.lower()
    scheme = next((s for s in URL_CONTAINERS if low.startswith(s)), None)
    if scheme is not None:
        parts = urlsplit(target)
        try:
            port = parts.port
        except ValueError:  # not a number, or out of 0-65535
            port = -1
        listening = scheme == "srt://" and "mode=listener" in parts.query  # srt://:PORT?mode=listener waits here
        if not (parts.hostname or listening) or port in (-1, 0) or (port is None and "rtmp" not in scheme):
            needs = ("a host, as in {}127.0.0.1/live/KEY" if "rtmp" in scheme else
                     "a host and a port from 1 to 65535, as in {}127.0.0.1:9000").format(scheme)
            raise InputError(f"the live output {target!r} needs {needs}.")
        return URL_CONTAINERS[scheme]
    fmt = FILE_CONTAINERS.get(Path(low.split("?")[0]).suffix, "")
    if not fmt:
        raise InputError(f"cannot tell the container of {target!r}: give a .mp4/.mov/.mkv/.ts/.flv file or an "
                         "rtmp://, srt://, udp://, rtp:// or tcp:// URL.")
    return fmt


def video_codec_args(encoder: str | None = None, *, file: bool = False) -> tuple[list[str], str | None]:
    """``(args, ffmpeg)``: the ``-c:v ...`` arguments of a live stream and the binary (None: imageio-ffmpeg's).

    ``encoder`` None: libx264 ``ultrafast`` ``zerolatency`` (each frame leaves the encoder at once), or into a
    ``file`` ``veryfast`` CRF 18 (High profile, many times real time); ``"nvenc"`` / ``"auto"``: ``h264_nvenc
    -preset p1 -tune ll`` where :func:`nbhelpers.media.choose_encoder` finds it works (else libx264, with its
    warning); ``libx264-<preset>``: that preset with ``zerolatency``. Raises InputError: an unknown setting."""
    tail = ["-pix_fmt", "yuv420p", "-g", str(GOP_FRAMES)]
    if encoder is None:
        opts = ["-preset", "veryfast", "-crf", "18"] if file else ["-preset", "ultrafast", "-tune", "zerolatency"]
        return ["-c:v", "libx264", *opts, *tail], None
    choice = choose_encoder(encoder)
    if choice.codec == "h264_nvenc":
        return ["-c:v", "h264_nvenc", "-preset", "p1", "-tune", "ll", *tail], choice.ffmpeg
    preset = choice.preset if encoder.startswith("libx264-") else "ultrafast"
    return ["-c:v", "libx264", "-preset", preset, "-tune", "zerolatency", *tail], choice.ffmpeg


class FFmpegSink(VideoWriter):
    """Frames and their audio into one ffmpeg process: a file or any output URL, the audio muxed live.

    ffmpeg reads raw BGR video on stdin and raw 16 kHz mono s16le PCM on a second pipe (``pipe:FD``, POSIX), each
    fed by a thread so that neither blocks the other and :meth:`write` returns at once. ``target`` is a path
    (``.mp4``, ``.mov``, ``.mkv``, ``.ts``, ``.flv``) or URL (``rtmp://`` -> FLV, ``srt://``, ``udp://``,
    ``rtp://``, ``tcp://`` -> MPEG-TS); ``width`` and ``height`` are pixels; ``encoder`` as :func:`video_codec_args`.
    Raises InputError: the target's container cannot be told from its name or a URL names no host
    (:func:`container_of`), a size is not a positive whole number, or the platform has no pass_fds."""

    def __init__(self, target: str | os.PathLike, width: int, height: int, *, encoder: str | None = None):
        target = os.fspath(target)
        fmt = container_of(target)
        if os.name != "posix":
            raise InputError("the live ffmpeg sink needs a POSIX system (the audio goes through a second pipe).")
        # the writer's state (VideoWriter.write, close and abort use it)
        (self.width, self.height), self.fps = _check_size(width, height), Fraction(FPS)
        self.synthetic, self.encoder, self.audio = True, None, None
        self.stall_timeout_s = WRITER_STALL_TIMEOUT_S
        self.frames_written, self._result, self._closed = 0, None, False
        self.target, self.is_url = target, "://" in target
        self.path = self._tmp = None
        out = target
        if not self.is_url:
            self.path = Path(target).expanduser().absolute()
            self._tmp = _partial(self.path)
            out = str(self._tmp)
        elif target.lower().startswith("udp://") and "pkt_size" not in target:
            out = target + ("&" if "?" in target else "?") + f"pkt_size={UDP_PACKET_BYTES}"
        codec_args, exe = video_codec_args(encoder, file=not self.is_url)
        self._exe = exe or ffmpeg_exe()
        read_end, write_end = os.pipe()
        self.args = [self._exe, "-hide_banner", "-v", "error", "-nostdin", "-y",
                     "-thread_queue_size", "256", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{width}x{height}",
                     "-r", str(FPS), "-i", "pipe:0",
                     "-thread_queue_size", "256", "-f", "s16le", "-ar", str(SAMPLE_RATE), "-ac", "1",
                     "-i", f"pipe:{read_end}", "-map", "0:v", "-map", "1:a",
                     "-vf", _video_filter(self.width, self.height), *codec_args, *BT709_TAGS,
                     "-c:a", "aac", "-b:a", "96k", "-ar", str(AUDIO_OUT_RATE),
                     *(["-movflags", "+faststart"] if fmt in ("mp4", "mov") else []), *SYNTHETIC_ARGS, "-f", fmt,
                     *(["-flush_packets", "1"] if fmt == "mpegts" else []), out]
        try:
            self._start(pass_fds=(read_end,))
        finally:
            os.close(read_end)
        self._audio_pipe = os.fdopen(write_end, "wb", buffering=0)
        self.error: BaseException | None = None
        self._queues: tuple[queue.Queue, queue.Queue] = (queue.Queue(maxsize=64), queue.Queue(maxsize=256))
        self._threads = [threading.Thread(target=self._pump, args=(q, send), daemon=True, name=f"nbhelpers-live-{k}")
                         for k, (q, send) in enumerate(zip(self._queues, (self._send_frame, self._send_audio),
                                                           strict=True))]
        for t in self._threads:
            t.start()

    def _send_frame(self, frame: np.ndarray | None) -> None:
        if frame is not None:
            VideoWriter.write(self, frame)

    def _send_audio(self, pcm: bytes | None) -> None:
        if pcm is None:
            self._audio_pipe.close()  # end of the audio input
        else:
            self._audio_pipe.write(pcm)

    def _pump(self, q: queue.Queue, send) -> None:
        while True:
            item = q.get()
            if self.error is None or item is None:
                try:
                    send(item)
                except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                    self.error = self.error or exc
            if item is None:
                return

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:  # type: ignore[override]
        """Queue one (H, W, 3) uint8 BGR frame and its 640 float32 samples (blocks while ffmpeg is behind); FFmpegError
        when ffmpeg stopped taking input (its stderr is in the message)."""
        if self.error is not None:
            raise self._failed("ffmpeg stopped taking input")
        pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
        self._queues[1].put(pcm)
        self._queues[0].put(np.array(frame))  # a copy: the caller may reuse its buffer

    def _failed(self, what: str) -> FFmpegError:
        if isinstance(self.error, FFmpegError):  # the writer's own report (ffmpeg died, or stalled)
            return self.error
        cause = f" ({self.error})" if self.error is not None else ""
        return self._proc.error(f"the live output to {self.target} failed: {what}{cause}")

    def close(self, timeout_s: float = 120.0) -> Path | None:  # type: ignore[override]
        """Finish the stream; returns the file's path (None for a URL). FFmpegError when ffmpeg failed, stalled, or
        its input threads did not finish within ``timeout_s``."""
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join(timeout_s)
        if any(t.is_alive() for t in self._threads) or self.error is not None:
            error = self._failed("ffmpeg did not take the last frames" if self.error is None else "writing failed")
            self.abort()
            raise error
        if not self.is_url:
            return VideoWriter.close(self)
        self._closed = True
        self._proc.popen.stdin.close()
        rc = self._finish_wait()
        if rc != 0:
            raise self._failed(f"ffmpeg exited with code {rc}")
        return None

    def abort(self) -> None:
        """Stop ffmpeg and remove a partial file."""
        for q in self._queues:
            with contextlib.suppress(queue.Full):
                q.put_nowait(None)
        VideoWriter.abort(self)

    def __repr__(self) -> str:
        return f"FFmpegSink({self.target!r}, {self.width}x{self.height} px, frames_written={self.frames_written})"

