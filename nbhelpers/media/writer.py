"""Writing video: the encoder choice and the writer that pipes frames and audio into an MP4.

Owns :data:`ENCODER_SETTINGS`, :class:`EncoderChoice` / :func:`choose_encoder` / :func:`nvenc_probe`
(NVENC probed once per process, libx264 fallback), :class:`VideoWriter` (temporary name, rename on
success, bounded waits on a stalled ffmpeg), :func:`convert_to_25fps` (a file re-encoded at 25 fps) and
:func:`demo_inputs` (the packaged demo photo and speech, written out).
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import ENCODERS, FPS
from ..errors import FallbackWarning, FFmpegError, InputError, MediaError, MissingDependencyError
from .ffmpeg import (
    _KILL_WAIT_S,
    _PIPE_CHUNK,
    _WRITER_SUFFIXES,
    SYNTHETIC_TAG,
    WRITER_STALL_TIMEOUT_S,
    _existing_file,
    _Process,
    ffmpeg_exe,
)
from .probing import MediaInfo, _fps_text, probe
from .video import _check_fps, load_video

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


def padded_size_note(width: int, height: int) -> str | None:
    """The note a clip's summary gives when :class:`VideoWriter` pads its frames: ``None`` for an even
    ``width`` x ``height`` (pixels), else what the file's size is and why (``"(577x769 frames written as 578x770:
    ..."``). H.264 in yuv420p stores colour at half resolution, so both sizes must be even; the writer adds one
    black column at the right and/or one row at the bottom and never scales the frames."""
    if not (int(width) % 2 or int(height) % 2):
        return None
    padded = f"{int(width) + int(width) % 2}x{int(height) + int(height) % 2}"
    return (f"({width}x{height} frames written as {padded}: one black column/row added at the right/bottom, since "
            "H.264 in yuv420p needs even sizes; crop the source to an even size to avoid it)")


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
            ended = ""
            if self._proc.popen.returncode == 0:  # no error of its own: something outside stopped it
                ended = (" It ended with exit status 0 before it had every frame: it was stopped from outside (a "
                         "signal to its process group, such as a Ctrl-C this process ignores as a script's "
                         "background job), not by a problem with the files; run the job again.")
            error = self._proc.error(f"ffmpeg stopped while frames were being written to {str(self.path)!r} "
                                     f"({self.frames_written} frames written; {type(exc).__name__}).{ended}")
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
