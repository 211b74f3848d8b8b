"""Live avatar sessions: speech pushed in chunks as it arrives, finished frames out in order at 25 fps.

This module owns the live loop around the engine: the session's audio timeline (chunks resampled to 16 kHz and
joined, silence added when the feed runs dry), the sliding whisper context and the schedule that says when each
frame is final, idle frames for silence, pacing to the wall clock, the live sinks (Python, a file, any ffmpeg
output URL with the audio muxed live) and the session's report. Frames are rendered by
:func:`nbhelpers.engine.render`; nothing here is a second generation loop.

What each frame's tokens depend on (reference §5.1, :mod:`nbhelpers.audio`). Frame ``k`` (audio
``[640k, 640k + 640)`` samples at 16 kHz) reads encoder frames ``2k-4 .. 2k+5``, i.e. audio up to sample
``640 (k + 3)``: 80 ms past its own end. But whisper-tiny's encoder runs on whole 30 s segments
(``[480000 s, 480000 (s + 1))``) with *global* self-attention in all 4 layers, and the log-mel is clamped at
``max - 8`` of the whole segment; so every token of frame ``k`` depends on all the audio of its 30 s segment
(and the segment before, when the window straddles a border). No finite look-ahead short of the segment's end
makes a frame exactly equal to one-clip generation; waiting for it would mean up to 30 s of latency.

The design, so that latency is bounded and frames never depend on how the audio was chunked:

- Frames are made in groups of ``hop`` (group ``g`` = frames ``g*hop .. g*hop + hop - 1``). A group is final as
  soon as the timeline holds ``E_g = 640 (g*hop + hop + 2) + lookahead`` samples: its windows are then inside the
  audio. Its tokens are computed by exactly the one-clip code path (same log-mel, same encoder, same trimming and
  zero padding) on the audio prefix ``[0, E_g)``, whatever more audio has arrived. A complete 30 s segment is
  encoded once and kept; only the open segment is re-encoded, once per group: the re-computation cost is one
  whisper-tiny forward (fixed 30 s input) per ``hop`` frames, whatever the session's length.
- Hence the exact law, tested: frame ``k`` of a live session equals frame ``k`` of ``avatar.generate`` on the
  audio prefix ``[0, min(E_g, L))``, where ``L`` is all the audio pushed before :meth:`LiveSession.close`. It
  does not depend on chunk sizes (1 ms or 2 s chunks give the same frames), so there is no seam at chunk borders.
  (Bit for bit under the batch condition below.)
- Latency: a frame is final ``80 ms + (hop - 1) x 40 ms + lookahead`` after its own audio ends, then takes one
  whisper pass (a 30 s log-mel, computed on the device when the whisper is on CUDA, and the encoder) and the
  render of its group. One-time costs (first forwards, kernel loading, pinned buffers) are paid by a warm-up when
  the session is made (``warm_up``), not by frame 0; ``stats`` splits frame 0's latency into its parts.
- One thread per avatar runs all the model work of its sessions (:class:`ModelThread`): the warm-up, every
  whisper pass and every render, in every session, threaded or not. PyTorch keeps some of its one-time set-up per
  thread: the cuDNN execution plans of the convolutions (UNet, VAE decoder, whisper's conv front-end) are cached in
  ``thread_local`` storage (``aten/src/ATen/native/cudnn/Conv_v8.cpp``), one plan per shape. A warm-up in the
  constructor's thread followed by the work in a new per-session thread rebuilt every plan inside frame 0.
- Batches: the session cuts its engine batches at multiples of the batch size, as one-clip generation does. In
  real time each group is rendered as soon as it is final; otherwise every group already final up to the end of
  the current aligned batch is rendered with it (audio pushed faster than real time gives whole batches), each
  group's tokens still from its own prefix.

Which frames equal one ``avatar.generate`` of the whole audio (``L`` samples, ``T = L // 640`` frames) and why:

- Equal: every frame whose group prefix reaches the end of its 30 s segment's audio, i.e. ``E_g >= min(L,
  480000 (s + 1))``: the groups whose last frame is at most ``2 + lookahead / 40 ms`` frames before the clip's
  end (always the last group, made at :meth:`LiveSession.close` with the whole audio; 1 to ``hop + 2`` frames)
  and likewise the groups ending at most that far before each 30 s border. "Equal" is bit for bit when the
  frame's engine batch holds the frames one-clip generation's does (batches are aligned alike, see above): always
  when ``hop`` is a multiple of the engine batch size, and for the batches whose groups were final at once;
  a batch cut short (by the group rule or the clip's end) runs the UNet and VAE on another batch shape, which
  changes results by float rounding only (seen on the CPU: 1 level in 1 of 27 648 values). For
  clips longer than 30 s, whole-clip generation encodes up to 8 segments per forward and live encodes one:
  float rounding again (about 1e-6 relative in fp32).
- Can differ: every other frame, because audio that arrived after its group was made (later in the same 30 s
  segment) changes its tokens through the encoder's attention and the segment's log-mel clamp. For such a frame
  the encoder saw the segment's future as silence; the effect is small for audio far from the frame, but it is
  not zero, and no bounded-latency design can make it zero.
- Always differ by design: idle frames (see below), and frames near silence the session added because the feed
  ran dry in real-time mode (``starved_frames`` in the report).
- ``context="segment"`` trades latency for exact equality: a group waits for its whole 30 s segment (or
  :meth:`LiveSession.close`), so every frame equals one-clip generation; the latency is then up to 30 s.

Silence. A frame whose 200 ms token window (``[640k - 1280, 640k + 1920)``) is below ``silence_db`` dBFS RMS
is an idle frame: the avatar's source frame as recorded (``silence="source"``) or a closed-mouth generation from
the tokens of digital silence (``silence="closed"``); ``silence=None`` renders every frame from its audio. In
real-time mode the session emits a frame every 40 ms from ``delay_s`` after the first push; when the audio for
the next frame has not arrived ``guard_s`` before its time, the timeline gets silence for it (and the sink gets
silent audio), so frames never stop. Output frame ``n`` always uses source frame ``cycle_index(n, N)`` (engine
rule), idle or not, so speech resumes without a jump in the source-frame cycle.
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .constants import FPS, SAMPLE_RATE, SEGMENT_SAMPLES, WHISPER_DIM, WHISPER_LAYERS
from .errors import FFmpegError, InputError, NbHelpersError

SAMPLES_PER_FRAME = SAMPLE_RATE // FPS  # 640 samples = 40 ms
SAMPLES_PER_ENCODER_FRAME = SAMPLE_RATE // 50  # 320 samples = 20 ms
RIGHT_CONTEXT = 2 * SAMPLES_PER_FRAME  # the window reads 2 video frames past the current one (PAD_RIGHT_STEPS)
LEFT_CONTEXT = 2 * SAMPLES_PER_FRAME
DEFAULT_HOP = 2  # frames per whisper pass
DEFAULT_DELAY_S = 0.24  # play-out delay of the real-time mode: >= chunk interval - 80 ms + compute, for 200 ms chunks
DEFAULT_GUARD_S = 0.06  # how long before a frame's time the session gives up waiting for its audio
LATE_TOLERANCE_S = 0.5 / FPS  # a frame emitted more than half a frame period after its time is late
DEFAULT_SILENCE_DB = -60.0
SILENCE_MODES = ("closed", "source", None)
CONTEXTS = ("sliding", "segment")


# ------------------------------------------------------------------------------------------------------------------
# Report


@dataclass
class LiveStats:
    """Counters of one live session (what :class:`~nbhelpers.result.ClipResult` ``.stats`` reports).

    Attributes:
        first_push_t: Clock time of the first push, seconds.
        first_frame_t: Clock time frame 0 was handed out, seconds.
        emit_t: Clock times of every emitted frame (kept for the rate).
        late: Frames handed out more than half a frame period after their time (real-time mode).
        max_late_s: Largest lateness, seconds.
        idle: Idle frames (silence).
        starved: Frames whose audio had not arrived in time (silence was added for them).
        whisper_passes: Encoder forwards run (the warm-up's not counted).
        first_ready_t: Clock time the session started on frame 0's group (its audio final, the worker awake).
        first_tokens_t: Clock time frame 0's whisper tokens were ready on the device (log-mel, encoder, gather).
        first_rendered_t: Clock time frame 0's group was rendered and on the host (UNet, VAE decode, blend, copy).
    """

    first_push_t: float | None = None
    first_frame_t: float | None = None
    emit_t: list[float] = field(default_factory=list)
    late: int = 0
    max_late_s: float = 0.0
    idle: int = 0
    starved: int = 0
    whisper_passes: int = 0
    first_ready_t: float | None = None
    first_tokens_t: float | None = None
    first_rendered_t: float | None = None

    def first_frame_breakdown(self) -> dict[str, float]:
        """Frame 0's latency in parts, seconds (NaN where not reached): ``wait`` (first push until the session
        started on its group: waiting for its audio and waking the worker), ``whisper`` (log-mel, encoder and
        token gather), ``render`` (UNet, VAE decode, blend and the copy to the host) and ``handout`` (until it was
        handed out: pacing in real time, the callback of frames before it).
        """
        marks = [self.first_push_t, self.first_ready_t, self.first_tokens_t, self.first_rendered_t,
                 self.first_frame_t]
        out = {}
        for name, t0, t1 in zip(("wait", "whisper", "render", "handout"), marks, marks[1:], strict=False):
            out[name] = float(t1 - t0) if t0 is not None and t1 is not None else float("nan")
        return out

    def as_dict(self) -> dict[str, float]:
        """Plain numbers: first_frame_latency_s, sustained_fps, late_frames, max_late_s, idle, starved, passes,
        and frame 0's latency in parts (``first_frame_<part>_s``, :meth:`first_frame_breakdown`)."""
        n = len(self.emit_t)
        span = self.emit_t[-1] - self.emit_t[0] if n > 1 else 0.0
        latency = (self.first_frame_t - self.first_push_t) if self.first_frame_t is not None \
            and self.first_push_t is not None else float("nan")
        return {"first_frame_latency_s": float(latency),
                "sustained_fps": float((n - 1) / span) if span > 0 else float("nan"),
                "late_frames": int(self.late), "max_late_s": float(self.max_late_s), "idle_frames": int(self.idle),
                "starved_frames": int(self.starved), "whisper_passes": int(self.whisper_passes),
                **{f"first_frame_{k}_s": v for k, v in self.first_frame_breakdown().items()}}


# ------------------------------------------------------------------------------------------------------------------
# Sinks


def video_codec_args(encoder: str | None = None) -> tuple[list[str], str | None]:
    """ffmpeg video encoder arguments for a live stream, and the ffmpeg binary to run them with.

    Args:
        encoder: None (libx264 ``ultrafast``, ``zerolatency``: a frame leaves the encoder as soon as it is in), or
            an ``encoder`` setting of :func:`nbhelpers.media.choose_encoder` (:data:`nbhelpers.constants.ENCODERS`):
            ``"nvenc"`` / ``"auto"`` use ``h264_nvenc`` with its low-latency tuning (``-preset p1 -tune ll``) when
            the one-frame NVENC test encode works (else libx264 as for None, with the chooser's warning); a
            ``libx264-<preset>`` setting uses that preset, ``libx264`` ultrafast, both with ``zerolatency``.

    Returns:
        ``(args, ffmpeg)``: the ``-c:v ...`` arguments and the binary (None = imageio-ffmpeg's).

    Raises:
        InputError: An unknown setting.
    """
    gop = ["-g", str(2 * FPS)]
    if encoder is None:
        return ["-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-pix_fmt", "yuv420p", *gop], None
    from .media import choose_encoder

    choice = choose_encoder(encoder)
    if choice.codec == "h264_nvenc":
        return ["-c:v", "h264_nvenc", "-preset", "p1", "-tune", "ll", "-pix_fmt", "yuv420p", *gop], choice.ffmpeg
    preset = choice.preset if encoder.startswith("libx264-") else "ultrafast"
    return ["-c:v", "libx264", "-preset", preset, "-tune", "zerolatency", "-pix_fmt", "yuv420p", *gop], choice.ffmpeg


def _container_for(target: str) -> str:
    low = target.lower()
    if low.startswith("rtmp://") or low.startswith("rtmps://"):
        return "flv"
    if low.startswith(("srt://", "udp://", "rtp://", "tcp://")):
        return "mpegts"
    suffix = Path(low.split("?")[0]).suffix
    return {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska", ".ts": "mpegts", ".flv": "flv"}.get(suffix, "")


class FFmpegSink:
    """Frames and their audio into one ffmpeg process: a file or any output URL, the audio muxed live.

    ffmpeg reads raw BGR video on its stdin and raw 16 kHz mono s16le PCM on a second pipe (``pipe:FD``, POSIX).
    Two writer threads feed the two pipes, so neither blocks the other (ffmpeg may read them in any order). A
    file target is written under a temporary name and renamed when ffmpeg has finished.

    Args:
        target: Output path (``.mp4``, ``.mkv``, ``.ts``, ``.flv``) or URL (``rtmp://`` -> FLV, ``srt://``,
            ``udp://``, ``rtp://``, ``tcp://`` -> MPEG-TS).
        width: Frame width, pixels.
        height: Frame height, pixels.
        encoder: See :func:`video_codec_args`.
        audio_bitrate: AAC bitrate.

    Raises:
        InputError: The target's container cannot be told from its name, or the platform has no pass_fds.
    """

    def __init__(self, target: str | os.PathLike, width: int, height: int, *, encoder: str | None = None,
                 audio_bitrate: str = "96k"):
        from . import media

        target = os.fspath(target)
        fmt = _container_for(target)
        if not fmt:
            raise InputError(f"cannot tell the container of {target!r}: give a .mp4/.mkv/.ts/.flv file or an "
                             "rtmp://, srt://, udp://, rtp:// or tcp:// URL.")
        if os.name != "posix":
            raise InputError("the live ffmpeg sink needs a POSIX system (the audio goes through a second pipe).")
        self.target = target
        self.is_url = "://" in target
        self.path = None if self.is_url else Path(target)
        self._tmp = None
        out = target
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = self.path.with_name(f".{self.path.stem}.partial{self.path.suffix}")
            out = str(self._tmp)
        elif target.lower().startswith("udp://") and "pkt_size" not in target:
            out = target + ("&" if "?" in target else "?") + "pkt_size=1316"
        codec_args, exe = video_codec_args(encoder)
        r, w = os.pipe()
        self.args = [exe or media.ffmpeg_exe(), "-hide_banner", "-v", "error", "-nostdin", "-y",
                     "-thread_queue_size", "256", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{width}x{height}",
                     "-r", str(FPS), "-i", "pipe:0",
                     "-thread_queue_size", "256", "-f", "s16le", "-ar", str(SAMPLE_RATE), "-ac", "1",
                     "-i", f"pipe:{r}", "-map", "0:v", "-map", "1:a", *codec_args,
                     "-c:a", "aac", "-b:a", audio_bitrate,
                     # marked as synthetic like every video the package writes (media.VideoWriter, README)
                     "-metadata", f"comment={media.SYNTHETIC_TAG}", "-metadata:s:v:0",
                     f"handler_name={media.SYNTHETIC_TAG}", "-f", fmt]
        if fmt == "mpegts":
            self.args += ["-flush_packets", "1"]
        self.args.append(out)
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, pass_fds=(r,))
        os.close(r)
        self._audio = os.fdopen(w, "wb", buffering=0)
        self._err: list[bytes] = []
        self._drain = threading.Thread(target=lambda: self._err.append(self.proc.stderr.read()), daemon=True)
        self._drain.start()
        self.error: BaseException | None = None
        self._queues = (queue.Queue(maxsize=64), queue.Queue(maxsize=256))
        self._threads = [threading.Thread(target=self._pump, args=(q, fh), daemon=True, name=f"nbhelpers-live-{k}")
                         for k, (q, fh) in enumerate(zip(self._queues, (self.proc.stdin, self._audio), strict=True))]
        for t in self._threads:
            t.start()
        self.frames = 0

    def _pump(self, q: queue.Queue, fh) -> None:
        while True:
            item = q.get()
            if item is None:
                break
            if self.error is not None:
                continue
            try:
                fh.write(item)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                self.error = exc
        try:
            fh.close()
        except OSError:
            pass

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """Queue one (H, W, 3) uint8 BGR frame and its 640 float32 samples (blocks while ffmpeg is behind)."""
        if self.error is not None:
            raise self._failed("ffmpeg stopped taking input")
        pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
        self._queues[1].put(pcm)
        self._queues[0].put(np.ascontiguousarray(frame).tobytes())
        self.frames += 1

    def _failed(self, what: str) -> FFmpegError:
        return FFmpegError(f"the live output to {self.target} failed: {what}", self.args, self.proc.poll() or -1,
                           b"".join(self._err).decode("utf-8", "replace")[-4000:])

    def close(self, timeout_s: float = 120.0) -> Path | None:
        """Finish the stream; returns the file's path (None for a URL).

        Raises:
            FFmpegError: ffmpeg failed or did not finish within ``timeout_s``.
        """
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join(timeout_s)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise self._failed(f"ffmpeg did not finish within {timeout_s:.0f} s") from None
        self._drain.join(5)
        if rc != 0 or self.error is not None:
            if self._tmp is not None:
                self._tmp.unlink(missing_ok=True)
            raise self._failed(f"ffmpeg exited with code {rc}" + (f" ({self.error})" if self.error else ""))
        if self._tmp is not None:
            os.replace(self._tmp, self.path)
            return self.path
        return None

    def abort(self) -> None:
        """Stop ffmpeg and remove a partial file."""
        for q in self._queues:
            try:
                q.put_nowait(None)
            except queue.Full:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------------------------
# The model thread


class ModelThread:
    """The one long-lived thread that runs an avatar's model work for all its live sessions (kept in its state).

    Why a thread of its own: PyTorch caches the cuDNN execution plan of each convolution shape per thread
    (``thread_local`` caches in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``), so work on a fresh thread re-plans
    every convolution of the UNet, the VAE decoder and whisper's front-end on its first call of each shape, which
    a warm-up done on another thread does not spare it. Here the warm-up and every session's whisper passes and
    renders run on the same thread, which outlives the sessions: each shape is planned once per avatar. The
    pinned host buffers of the rendered batches (:class:`~nbhelpers.engine.PinnedRing`) live here too, for the
    same reason: made once, not inside a session's first frame. The ring is only used on this thread and each
    batch is copied out before the next render call, so sessions can share it.

    Sessions of one avatar hand their work over one at a time (the device runs it in turn anyway); a call made
    from this thread itself runs inline. Waiting for a result blocks on the future (no polling).
    """

    def __init__(self):
        from .engine import PinnedRing

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nbhelpers-live-models",
                                        initializer=self._started)
        self.ident: int | None = None  # the thread's id once it runs
        self.ring = PinnedRing()
        self.warm: set = set()  # what the warm-ups have run on this thread: "whisper", ("render", frames)

    def _started(self) -> None:
        self.ident = threading.get_ident()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this thread; returns its result or raises its exception in the caller."""
        if threading.get_ident() == self.ident:
            return fn(*args)
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        """Let the thread end once its queued work is done (a later :meth:`call` raises RuntimeError)."""
        self._pool.shutdown(wait=False)


def model_thread(avatar: Any) -> ModelThread:
    """The avatar's :class:`ModelThread` (made on first use, kept in its device state until ``avatar.close()``)."""
    return avatar.keep("live_models_thread", ModelThread)


# ------------------------------------------------------------------------------------------------------------------
# The session


class _Ended:
    pass


_END = _Ended()


class LiveSession:
    """A live avatar: :meth:`push` audio chunks as they arrive, get frames in order at 25 fps, :meth:`close`.

    Made by :meth:`nbhelpers.avatar.Avatar.live`. See the module docstring for the context rule and exactly which
    frames equal one-clip generation.

    Args:
        avatar: A prepared :class:`~nbhelpers.avatar.Avatar`.
        realtime: Pace the output to the clock: frame ``n`` is handed out at ``delay_s + n / 25`` s after the
            first push, and silence fills in when the audio is late. False hands frames out as soon as they are
            final (as fast as the device allows), with no silence added.
        delay_s: Play-out delay of the real-time mode, seconds (a jitter buffer: at least the interval between
            chunks minus 80 ms, plus the compute time of a group).
        guard_s: Real-time mode: silence is added for a frame whose audio has not arrived this long before its
            time.
        hop: Frames per whisper pass, >= 1 (latency grows by 40 ms per frame, cost falls as 1 / hop).
        lookahead_ms: Audio past each window's end that a group waits for, >= 0 ms (the window itself already
            reads 80 ms past the frame).
        context: ``"sliding"`` (bounded latency) or ``"segment"`` (a group waits for its whole 30 s segment:
            every frame equals one-clip generation, latency up to 30 s).
        silence: What a silent frame shows: ``"closed"`` (generated from the tokens of digital silence),
            ``"source"`` (the source frame as recorded) or None (render every frame from its audio).
        silence_db: Speech threshold, dBFS RMS over a frame's 200 ms token window.
        on_frame: ``on_frame(n, frame)`` for each finished (H, W, 3) uint8 BGR frame, in order (in the session's
            thread when threaded).
        to: Also write the frames with their audio to this file or ffmpeg URL (:class:`FFmpegSink`).
        encoder: Video encoder of ``to`` (:func:`video_codec_args`).
        iterate: Keep frames for :meth:`frames` / iteration (default: when neither ``on_frame`` nor ``to`` is
            given). In threaded mode at most ``max_queue`` wait; the session waits for the reader beyond that.
        max_queue: Frames waiting for the reader (threaded mode).
        clock: Seconds, monotonic (``time.monotonic``); inject a fake one to test pacing without sleeping.
        threaded: Do the work on a background thread (default). False: the work happens inside :meth:`push`,
            :meth:`poll` and :meth:`close`, in the caller's thread (deterministic; for tests and notebooks).
        batch_size: Frames per engine batch (default the avatar's).
        ahead_s: Real-time mode: frames are not rendered more than this far ahead of their time (bounds memory).
        warm_up: Run one whisper pass and one render of each batch size the schedule uses (:meth:`warm_shapes`)
            now, at construction (once per avatar and size, on the avatar's :class:`ModelThread`, where all the
            session's model work runs), so that one-time costs (CUDA kernels loaded on first use, cuDNN plans and
            oneDNN set-up, the pinned buffers) are not paid inside the first frame's latency.

    Raises:
        InputError: An option is out of range.
    """

    def __init__(self, avatar: Any, *, realtime: bool = False, delay_s: float = DEFAULT_DELAY_S,
                 guard_s: float = DEFAULT_GUARD_S, hop: int = DEFAULT_HOP, lookahead_ms: float = 0.0,
                 context: str = "sliding", silence: str | None = "closed", silence_db: float = DEFAULT_SILENCE_DB,
                 on_frame: Callable[[int, np.ndarray], None] | None = None, to: str | os.PathLike | None = None,
                 encoder: str | None = None, iterate: bool | None = None, max_queue: int = 2 * FPS,
                 clock: Callable[[], float] = time.monotonic, threaded: bool = True, batch_size: int | None = None,
                 ahead_s: float = 1.0, warm_up: bool = True):
        if isinstance(hop, bool) or not isinstance(hop, int) or hop < 1:
            raise InputError(f"hop must be a whole number of frames >= 1; got {hop!r}.")
        if context not in CONTEXTS:
            raise InputError(f"context must be one of {CONTEXTS}; got {context!r}.")
        if silence not in SILENCE_MODES:
            raise InputError(f"silence must be 'closed', 'source' or None; got {silence!r}.")
        for name, v in (("delay_s", delay_s), ("guard_s", guard_s), ("lookahead_ms", lookahead_ms),
                        ("ahead_s", ahead_s)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 or math.isinf(v):
                raise InputError(f"{name} must be a finite number >= 0; got {v!r}.")
        from .engine import Timings, flush_denormals

        self.avatar = avatar
        self.realtime = bool(realtime)
        self.delay_s = float(delay_s)
        self.guard_s = float(guard_s)
        self.hop = hop
        self.lookahead = int(round(float(lookahead_ms) * SAMPLE_RATE / 1000.0))
        self.context = context
        self.silence = silence
        self.silence_rms = 10.0 ** (float(silence_db) / 20.0)
        self.on_frame = on_frame
        self.clock = clock
        self.threaded = bool(threaded)
        self.ahead_s = float(ahead_s)
        self.timings = Timings()
        self.stats = LiveStats()
        self._t_created = time.perf_counter()
        st = avatar.device_state()
        self._source = st["source"]
        self._models = st["models"]
        self._pipe = avatar.pipe
        self._flush = flush_denormals
        self._models_thread = model_thread(avatar)  # runs every whisper pass and render (see ModelThread)
        self._ring = self._models_thread.ring  # pinned host buffers the rendered batches are copied into (CUDA)
        self._on_cuda = getattr(self._models.device, "type", str(self._models.device)) == "cuda"
        self.batch_size = int(batch_size or avatar.config.batch_size or 8)
        h, w = avatar.frame_shape
        self.sink = FFmpegSink(to, w, h, encoder=encoder) if to is not None else None
        self.iterate = (on_frame is None and to is None) if iterate is None else bool(iterate)
        self._out: queue.Queue = queue.Queue(maxsize=max_queue if self.threaded else 0)
        # The timeline: 16 kHz float32 samples [base, base + len(buf)).
        self._buf = np.zeros(0, np.float32)
        self._base = 0
        self._inbox: list[np.ndarray] = []
        self._resampler = None
        self._rate: int | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._done = False
        self._next_compute = 0  # first frame not computed
        self._next_emit = 0  # first frame not handed out
        self._ready: deque = deque()  # (n, frame, idle, audio): finished, not handed out yet
        self._more = threading.Event()  # set when frames are added to _ready (wakes the pacer)
        self._segments: dict[int, Any] = {}  # complete 30 s segments' encoder output, (1500, 5, 384)
        self._silent_tokens = None
        self._t0: float | None = None  # clock time of the first push
        self._forced = -1  # real time: frames up to this one are made with the audio there is (starved feed)
        self._error: BaseException | None = None
        self._thread = None
        self._pacer = None  # threaded real time: hands frames out at their times, apart from the rendering
        self.result = None
        _ = self._pipe.whisper, self._pipe.feature_extractor  # loaded now, not inside the first frame's latency
        if silence == "closed":
            self._models_thread.call(self._silent)
        if warm_up:
            self._models_thread.call(self._warm_up)
        if self.threaded:
            self._thread = threading.Thread(target=self._worker, name="nbhelpers-live", daemon=True)
            if self.realtime:
                self._pacer = threading.Thread(target=self._pace, name="nbhelpers-live-pacer", daemon=True)
                self._pacer.start()
            self._thread.start()

    # -- input -----------------------------------------------------------------------------------------------------

    def push(self, samples: Any, sample_rate: int = SAMPLE_RATE) -> None:
        """Add a chunk of speech (any length, even 1 sample) to the session.

        Args:
            samples: (L,) or (L, C) PCM: float in about [-1, 1], or int16 (divided by 32768); channels are averaged
                to mono. A CPU torch tensor works too.
            sample_rate: Its rate in Hz; resampled to 16 kHz with soxr (``soxr_hq``, as
                :func:`nbhelpers.media.load_audio`), streaming, so chunk borders add nothing.

        Raises:
            InputError: Bad samples or rate, or the session is closed.
            NbHelpersError: Whatever stopped the session's thread (raised at the next push).
        """
        self._raise_error()
        if self._closing:
            raise InputError("the live session is closed; make a new one with avatar.live(...).")
        wave = _as_mono(samples)
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate < 1000:
            raise InputError(f"sample_rate must be a whole number of Hz >= 1000; got {sample_rate!r}.")
        wave = self._resample(wave, int(sample_rate))
        with self._lock:
            if self._t0 is None:
                self._t0 = self.clock()
                self.stats.first_push_t = self._t0
            if wave.size:
                self._inbox.append(wave)
            self._wake.notify_all()
        if not self.threaded:
            self.poll()

    def _resample(self, wave: np.ndarray, rate: int) -> np.ndarray:
        if rate != self._rate:
            tail = self._flush_resampler()
            self._rate = rate
            self._resampler = None
            if rate != SAMPLE_RATE:
                from .errors import require

                soxr = require("soxr", "pip install soxr")
                self._resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="soxr_hq")
            if tail.size:
                with self._lock:
                    self._inbox.append(tail)
        if self._resampler is None:
            return wave
        return np.asarray(self._resampler.resample_chunk(wave, last=False), dtype=np.float32).reshape(-1)

    def _flush_resampler(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros(0, np.float32)
        out = np.asarray(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True), np.float32)
        self._resampler = None
        return out.reshape(-1)

    # -- output ----------------------------------------------------------------------------------------------------

    def frames(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(n, frame)`` pairs in order: (H, W, 3) uint8 BGR, frame ``n`` is at ``n / 25`` s of the output.

        Threaded: blocks for the next frame until the session is closed and every frame is out. Not threaded:
        yields the frames finished so far (all of them after :meth:`close`).
        """
        if not self.iterate:
            raise InputError("this session hands its frames to on_frame / to=; pass iterate=True to also iterate.")
        while True:
            if self.threaded:
                item = self._out.get()
            else:
                try:
                    item = self._out.get_nowait()
                except queue.Empty:
                    return
            if item is _END:
                self._out.put(_END)
                return
            yield item

    __iter__ = frames

    def poll(self) -> None:
        """Not threaded: do the work due now (finish the frames whose audio is complete, hand out those due)."""
        if self.threaded:
            return
        self._step(self.clock())

    def close(self, timeout_s: float = 600.0):
        """Flush: finish every frame of the audio pushed (the tail with the zero padding of a clip's end), hand them
        out, close the sink, and return the session's :class:`~nbhelpers.result.ClipResult` (``kind="stream"``,
        ``stats`` with first_frame_latency_s, sustained_fps, late_frames...).

        Raises:
            NbHelpersError / FFmpegError: Whatever stopped the session or its sink.
        """
        if self.result is not None:
            return self.result
        tail = self._flush_resampler()
        with self._lock:
            if tail.size:
                self._inbox.append(tail)
            self._closing = True
            self._wake.notify_all()
        try:
            if self.threaded:
                self._thread.join(timeout_s)
                if self._pacer is not None:
                    self._pacer.join(timeout_s)
                if self._thread.is_alive() or (self._pacer is not None and self._pacer.is_alive()):
                    raise NbHelpersError(f"the live session did not finish within {timeout_s:.0f} s")
            else:
                self._step(self.clock(), final=True)
            self._raise_error()
        except BaseException:
            if self.sink is not None:
                self.sink.abort()
            raise
        output = self.sink.close() if self.sink is not None else None
        if self.iterate and not self.threaded:
            self._out.put(_END)  # the worker thread puts it in threaded mode
        self.result = self._result(output)
        return self.result

    def __enter__(self) -> LiveSession:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            with self._lock:
                self._closing = True
                self._done = True
                self._error = self._error or exc
                self._wake.notify_all()
            if self.sink is not None:
                self.sink.abort()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    # -- the loop ----------------------------------------------------------------------------------------------------

    def _deadline(self, n: int) -> float:
        return self._t0 + self.delay_s + n / FPS

    def _worker(self) -> None:
        try:
            while True:
                self._step(self.clock())
                with self._lock:
                    if self._done:
                        break
                    if self._inbox or (self._closing and not self.realtime):
                        continue
                    self._wake.wait(self._next_wake(self.clock()))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc
            self._done = True
        finally:
            self._more.set()
            if self.iterate and self._pacer is None:
                self._out.put(_END)

    def _pace(self) -> None:
        """Threaded real time: hand each finished frame out at its time (rendering goes on meanwhile)."""
        try:
            while True:
                if self._ready:
                    wait = self._deadline(self._ready[0][0]) - self.clock()
                    if wait > 0:
                        time.sleep(wait)
                        continue
                    self._emit(*self._ready.popleft(), self.clock())
                elif self._done:
                    break
                else:
                    self._more.wait(0.05)
                    self._more.clear()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc
            self._done = True
        finally:
            if self.iterate:
                self._out.put(_END)

    def _next_wake(self, now: float) -> float:
        """Seconds until the worker has something to do without new audio (real time: the next hand-out, the
        next starvation check, the next frame allowed to render)."""
        if not self.realtime or self._t0 is None:
            return 0.5
        times = [self._deadline(self._next_compute) - self.guard_s, self._deadline(self._next_compute) - self.ahead_s]
        if self._ready and self._pacer is None:
            times.append(self._deadline(self._ready[0][0]))
        future = [t - now for t in times if t > now]
        return max(0.0005, min(future)) if future else 0.5

    def _step(self, now: float, final: bool = False) -> None:
        with self._lock:
            closing = self._closing
            if self._inbox:
                self._buf = np.concatenate([self._buf, *self._inbox])
                self._inbox.clear()
            started = self._t0 is not None
        if not started:
            if closing:
                self._done = True
            return
        end = self._base + len(self._buf)
        total = end // SAMPLES_PER_FRAME if closing else None
        if self.realtime and not closing:
            end = self._fill_starved(now, end)
        while total is None or self._next_compute < total:
            spans = self._final_groups(now, end, total, closing)
            if not spans:
                break
            self._models_thread.call(self._compute, spans)
            self._next_compute = spans[-1][1]
            self._emit_due(self.clock(), final or not self.realtime)
        self._emit_due(self.clock(), final or not self.realtime)
        if closing and self._next_compute >= total and (self._pacer is not None or not self._ready):
            self._done = True
        self._trim()

    def _final_groups(self, now: float, end: int, total: int | None, closing: bool) -> list[tuple[int, int, int]]:
        """The groups to make now, ``[(a, b, E), ...]`` from ``_next_compute`` on: one group in real time (each is
        handed out as soon as it is made); otherwise every final group up to the end of the engine batch (aligned
        at multiples of the batch size, as in one-clip generation) that the first one starts in, so that audio
        that arrived at once is rendered in whole batches."""
        spans: list[tuple[int, int, int]] = []
        a = self._next_compute
        limit = (a // self.batch_size + 1) * self.batch_size
        while total is None or a < total:
            if self.realtime and not closing and self._deadline(a) > now + self.ahead_s:
                break
            span = self._group(a, end, total)
            if span is None or (spans and span[0] > limit):
                break
            spans.append((a, *span))
            a = span[0]
            if self.realtime or a >= limit:
                break
        return spans

    def _group(self, a: int, end: int, total: int | None) -> tuple[int, int] | None:
        """(b, E): frames a..b-1 are final with the audio prefix [0, E), or None when they are not yet."""
        g_end = (a // self.hop + 1) * self.hop
        need = SAMPLES_PER_FRAME * g_end + RIGHT_CONTEXT + self.lookahead
        if self.context == "segment":
            seg_end = (((SAMPLES_PER_FRAME * g_end + RIGHT_CONTEXT) - 1) // SEGMENT_SAMPLES + 1) * SEGMENT_SAMPLES
            need = max(need, seg_end)
        if total is not None:
            return min(g_end, total), min(need, end)
        if end >= need:
            return g_end, need
        if self._forced >= a:  # real time, the feed ran dry: finish up to the starved frame with what there is
            return min(g_end, self._forced + 1), end
        return None

    def _fill_starved(self, now: float, end: int) -> int:
        """Real time: add silence for frames whose audio has not arrived ``guard_s`` before their time; returns the
        new timeline end."""
        n = self._next_compute
        while self._deadline(n) - self.guard_s <= now:
            g_end = (n // self.hop + 1) * self.hop
            if end >= SAMPLES_PER_FRAME * g_end + RIGHT_CONTEXT + self.lookahead and self.context == "sliding":
                break  # final already: rendered normally
            if end < SAMPLES_PER_FRAME * (n + 1):
                missing = SAMPLES_PER_FRAME * (n + 1) - end
                self._buf = np.concatenate([self._buf, np.zeros(missing, np.float32)])
                end += missing
                self.stats.starved += 1
            self._forced = n
            n += 1
        return end

    def _audio(self, start: int, stop: int) -> np.ndarray:
        lo, hi = max(start, self._base), max(min(stop, self._base + len(self._buf)), self._base)
        return self._buf[lo - self._base:hi - self._base] if hi > lo else np.zeros(0, np.float32)

    def _is_silent(self, n: int, e: int) -> bool:
        if self.silence is None:
            return False
        w = self._audio(SAMPLES_PER_FRAME * n - LEFT_CONTEXT, min(e, SAMPLES_PER_FRAME * n + 3 * SAMPLES_PER_FRAME))
        if w.size == 0:
            return True
        return float(np.sqrt(np.mean(np.square(w, dtype=np.float64)))) < self.silence_rms

    def _compute(self, spans: list[tuple[int, int, int]]) -> None:
        """Render the groups ``spans`` (frames a..b-1 of each from the audio prefix [0, E)) and queue them for
        hand-out; frames are rendered in engine batches aligned at multiples of the batch size. Runs on the
        avatar's :class:`ModelThread`."""
        with self._flush(self._models.device):  # per thread (the CPU's FP control), so here on the model thread
            self._compute_flushed(spans)

    def _compute_flushed(self, spans: list[tuple[int, int, int]]) -> None:
        from .engine import render

        a, b = spans[0][0], spans[-1][1]
        first = a == 0 and self.stats.first_ready_t is None
        if first:
            self.stats.first_ready_t = self.clock()
        idle = np.array([self._is_silent(n, e) for ga, gb, e in spans for n in range(ga, gb)], dtype=bool)
        parts = []
        with self.timings.stage("audio"):
            for ga, gb, e in spans:
                parts.append(self._tokens(ga, gb, e) if not idle[ga - a:gb - a].all() else None)
        if first:
            if self._on_cuda:
                from .gpu import host_wait

                host_wait(self._models.device)  # frame 0 only: times the whisper part apart from the render
            self.stats.first_tokens_t = self.clock()
        frames: dict[int, np.ndarray] = {}
        need_render = [n for n in range(a, b) if not idle[n - a] or self.silence == "closed"]
        if need_render:
            feats = self._features(parts, spans, idle)
            for r0, r1 in _runs(need_render):
                cuts = [r0, *range((r0 // self.batch_size + 1) * self.batch_size, r1, self.batch_size), r1]
                for c0, c1 in zip(cuts, cuts[1:], strict=False):  # aligned like one-clip generation's batches
                    for t0, batch in render(self._source, feats, self._models, self.batch_size, c1 - c0,
                                            timings=self.timings, first_frame=c0, feature_offset=a,
                                            pinned=self._ring if self._on_cuda else False):
                        for k in range(len(batch)):
                            frames[t0 + k] = np.array(batch[k])  # the pinned buffer is reused: copy
        if self.silence == "source":
            from .framestore import cycle_index

            for n in range(a, b):
                if idle[n - a]:
                    frames[n] = np.array(self._source.frames[int(cycle_index(n, self._source.n_frames))])
        if first:
            self.stats.first_rendered_t = self.clock()
        for n in range(a, b):
            audio = self._audio(SAMPLES_PER_FRAME * n, SAMPLES_PER_FRAME * (n + 1)).copy()
            self._ready.append((n, frames[n], bool(idle[n - a]), audio))
        self._more.set()

    def _features(self, parts: list, spans: list[tuple[int, int, int]], idle: np.ndarray):
        """(b - a, 50, 384) tokens of the frames of ``spans``: each group's own tokens (``parts``, None for a group
        of idle frames only), the closed-mouth tokens for idle frames when ``silence="closed"``."""
        import torch

        if len(parts) == 1 and parts[0] is not None and not (self.silence == "closed" and idle.any()):
            return parts[0]
        silent = self._silent() if self.silence == "closed" else None
        ref = next((p for p in parts if p is not None), silent)
        rows = []
        for (ga, gb, _), part in zip(spans, parts, strict=True):
            rows.append(part if part is not None else ref.new_zeros((gb - ga, *ref.shape[-2:])))
        feats = torch.cat(rows) if len(rows) > 1 else rows[0]
        if silent is not None and idle.any():
            feats = feats.clone() if feats is parts[0] else feats
            feats[torch.from_numpy(np.flatnonzero(idle)).to(feats.device)] = silent.to(feats.dtype)
        return feats

    def _tokens(self, a: int, b: int, e: int):
        """(b - a, 50, 384) tokens of frames a..b-1 exactly as whisper_features(audio[:e]) gives them."""
        import torch

        from .gpu import to_device

        n_enc = e // SAMPLES_PER_ENCODER_FRAME
        idx = (np.arange(a, b, dtype=np.int64) * 2 - 4)[:, None] + np.arange(10, dtype=np.int64)[None, :]
        valid = (idx >= 0) & (idx < n_enc)
        segs = sorted({int(s) for s in np.unique(idx[valid] // 1500)})
        first = next(self._pipe.whisper.parameters())
        parts, base, pos = [], {}, 0
        for s in segs:  # the segments' encoder frames end to end, then one zero row for the padding
            part = self._segment(s, e)
            base[s], pos = pos, pos + int(part.shape[0])
            parts.append(part)
        parts.append(torch.zeros((1, WHISPER_LAYERS, WHISPER_DIM), dtype=first.dtype, device=first.device))
        table = torch.cat(parts) if len(parts) > 1 else parts[0]
        rows = np.full(idx.shape, pos, dtype=np.int64)
        for s in segs:
            m = valid & (idx // 1500 == s)
            rows[m] = idx[m] - 1500 * s + base[s]
        tokens = table[to_device(rows, table.device)]  # (b - a, 10, 5, 384); pinned copy: no wait for the GPU
        return tokens.reshape(b - a, 10 * WHISPER_LAYERS, WHISPER_DIM)

    def _segment(self, s: int, e: int):
        """Encoder output (kept frames, 5, 384) of 30 s segment s as whisper_features(audio[:e]) computes it."""
        start = s * SEGMENT_SAMPLES
        complete = e >= start + SEGMENT_SAMPLES
        if complete and s in self._segments:
            return self._segments[s]
        stop = min(e, start + SEGMENT_SAMPLES)
        wave = self._audio(start, stop)
        if wave.size != stop - start:
            raise NbHelpersError(f"internal: audio {start}..{stop} is no longer held")
        stacked = self._encode(wave)
        self.stats.whisper_passes += 1
        kept = min(1500, e // SAMPLES_PER_ENCODER_FRAME - 1500 * s)
        out = stacked[:kept]
        if complete:
            self._segments[s] = out
            for old in [k for k in self._segments if k < s - 1]:
                del self._segments[old]
        return out

    def _encode(self, wave: np.ndarray):
        """(1500, 5, 384) encoder hidden states of one <= 30 s segment, as :func:`nbhelpers.audio.whisper_features`
        computes them (the same log-mel, on the device with the whisper on CUDA, and the same encoder call)."""
        import torch

        from .audio import _encoder_of, _log_mel

        encoder = _encoder_of(self._pipe.whisper)
        first = next(encoder.parameters())
        with torch.no_grad():
            mel = _log_mel(self._pipe.feature_extractor, wave, first.device).to(device=first.device,
                                                                                dtype=first.dtype)
            hidden = encoder(mel, output_hidden_states=True).hidden_states
            return torch.stack(tuple(hidden), dim=2).reshape(-1, WHISPER_LAYERS, WHISPER_DIM)

    def warm_shapes(self) -> list[int]:
        """Engine batch sizes (frames) this session's schedule renders, so the warm-up can run each of them.

        A group rendered alone is cut at multiples of the batch size (as :meth:`_compute` does), which over one
        period of ``lcm(hop, batch_size)`` frames gives every piece size of the real-time schedule; audio pushed
        faster than real time (``realtime=False``) is also rendered in whole batches. The first group's size comes
        first. The tail at :meth:`close` and batches merged short of a whole one can still meet a new size.
        """
        sizes: list[int] = []
        b = self.batch_size
        for g0 in range(0, math.lcm(self.hop, b), self.hop):
            cuts = [g0, *range((g0 // b + 1) * b, g0 + self.hop, b), g0 + self.hop]
            sizes += [c1 - c0 for c0, c1 in zip(cuts, cuts[1:], strict=False) if c1 - c0 not in sizes]
        if not self.realtime and b not in sizes:
            sizes.append(b)
        return sizes

    def _warm_up(self) -> None:
        """One whisper pass and one render of each batch size of :meth:`warm_shapes` (results dropped), once per
        avatar and size, on the avatar's :class:`ModelThread`: the one-time costs of the first forwards (and the
        per-thread cuDNN plans) are paid here, not by the first frame."""
        import torch

        from .engine import render

        done = self._models_thread.warm
        with self._flush(self._models.device):
            if "whisper" not in done:
                self._encode(np.zeros(SAMPLES_PER_FRAME, np.float32))
                done.add("whisper")
            for size in self.warm_shapes():
                if ("render", size) in done:
                    continue
                first = next(self._pipe.whisper.parameters())
                feats = torch.zeros((size, 10 * WHISPER_LAYERS, WHISPER_DIM), dtype=first.dtype, device=first.device)
                for _ in render(self._source, feats, self._models, size, size,
                                pinned=self._ring if self._on_cuda else False):
                    pass
                done.add(("render", size))
            if self._on_cuda:
                from .gpu import host_wait

                host_wait(self._models.device)

    def _silent(self):
        """(50, 384) tokens of a frame inside digital silence (the closed-mouth idle frame), kept with the avatar's
        device state for its later sessions."""
        if self._silent_tokens is None:
            def make():
                self.stats.whisper_passes += 1
                return self._pipe.features(np.zeros(SAMPLE_RATE, np.float32))[FPS // 2].clone()

            self._silent_tokens = self.avatar.keep("live_silent_tokens", make)
        return self._silent_tokens

    def _emit_due(self, now: float, flush: bool) -> None:
        if self._pacer is not None:
            return
        while self._ready:
            n = self._ready[0][0]
            if self.realtime and not flush:
                due = self._deadline(n)
                if now < due:
                    return
            self._emit(*self._ready.popleft(), now)
            now = self.clock()

    def _emit(self, n: int, frame: np.ndarray, idle: bool, audio: np.ndarray, now: float) -> None:
        if n != self._next_emit:
            raise NbHelpersError(f"internal: frame {n} handed out when {self._next_emit} was next")
        if self.realtime:
            late = now - self._deadline(n)
            if late > LATE_TOLERANCE_S:
                self.stats.late += 1
            self.stats.max_late_s = max(self.stats.max_late_s, max(0.0, late))
        if n == 0:
            self.stats.first_frame_t = now
        self.stats.emit_t.append(now)
        self.stats.idle += int(idle)
        if self.on_frame is not None:
            self.on_frame(n, frame)
        if self.sink is not None:
            with self.timings.stage("encode_wait"):
                self.sink.write(frame, audio)
        if self.iterate:
            self._out.put((n, frame))
        self._next_emit = n + 1

    def _trim(self) -> None:
        """Drop audio no frame will read again (before the open segment and the next frame to hand out)."""
        first_window = max(0, SAMPLES_PER_FRAME * self._next_compute - LEFT_CONTEXT)
        keep = min((first_window // SEGMENT_SAMPLES) * SEGMENT_SAMPLES, SAMPLES_PER_FRAME * self._next_emit)
        if keep - self._base > SEGMENT_SAMPLES // 4:
            self._buf = self._buf[keep - self._base:].copy()
            self._base = keep

    def _result(self, output: Path | None):
        from .result import ClipResult

        a = self.avatar
        n = self._next_emit
        stats = self.stats.as_dict()
        notes = tuple(a.pipe.clip_notes())
        return ClipResult(output=output, n_frames=n, source_frames=a.n_frames, no_face_frames=a.n_frames - a.n_faces,
                          fps=FPS, duration_s=n * SAMPLES_PER_FRAME / SAMPLE_RATE, config=a.config,
                          backend=a.backend or "cache", timings=dict(self.timings.seconds),
                          wall_s=time.perf_counter() - self._t_created, kind="stream", notes=notes, stats=stats)


def _runs(ns: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive integers as (start, stop)."""
    out: list[tuple[int, int]] = []
    for n in ns:
        if out and out[-1][1] == n:
            out[-1] = (out[-1][0], n + 1)
        else:
            out.append((n, n + 1))
    return out


def _as_mono(samples: Any) -> np.ndarray:
    if hasattr(samples, "detach"):
        samples = samples.detach().cpu().numpy()
    arr = np.asarray(samples)
    if arr.dtype == np.int16:
        arr = arr.astype(np.float32) / 32768.0
    elif not np.issubdtype(arr.dtype, np.floating):
        raise InputError(f"samples must be float in about [-1, 1] or int16; got dtype {arr.dtype}.")
    if arr.ndim == 2:
        arr = arr.mean(axis=1)
    if arr.ndim != 1:
        raise InputError(f"samples must be (L,) or (L, channels) PCM; got shape {arr.shape}.")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise InputError("samples hold NaN or inf; the audio source is broken.")
    return arr


def play(session: LiveSession, waveform: np.ndarray, *, chunk_ms: float = 200.0, realtime: bool = True,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
    """Push a 16 kHz waveform into ``session`` in chunks, as if it arrived in real time; returns ``close()``'s result.

    Chunk ``i`` is pushed at ``i * chunk_ms`` after the first (all at once when ``realtime`` is False).
    """
    step = max(1, int(round(chunk_ms * SAMPLE_RATE / 1000.0)))
    t0 = clock()
    for i, start in enumerate(range(0, len(waveform), step)):
        if realtime:
            wait = t0 + i * step / SAMPLE_RATE - clock()
            if wait > 0:
                sleep(wait)
        session.push(waveform[start:start + step], SAMPLE_RATE)
    return session.close()


__all__ = ["FFmpegSink", "LiveSession", "LiveStats", "ModelThread", "model_thread", "play", "video_codec_args"]
