"""Writing video: the encoder choice and the writer that pipes frames and audio into an MP4."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ..constants import ENCODERS, FPS
from ..errors import FallbackWarning, FFmpegError, InputError, MediaError, NoAudioError, plural, require
from ..hashing import atomic_path
from .ffmpeg import (
    _KILL_WAIT_S,
    BT709_TAGS,
    QUIET,
    SYNTHETIC_ARGS,
    WRITER_STALL_TIMEOUT_S,
    _existing_file,
    _Process,
    _video_filter,
    ffmpeg_exe,
)
from .folders import check_writable
from .probing import MediaInfo, _fps_text, probe
from .video import _check_fps, load_video

ENCODER_SETTINGS = {  # setting -> (ffmpeg encoder, preset); "auto" picks nvenc when it works, else libx264
    "libx264": ("libx264", "medium"),
    **{name: ("libx264", name.removeprefix("libx264-")) for name in ENCODERS if name.startswith("libx264-")},
    "nvenc": ("h264_nvenc", "p5"),
    "auto": ("h264_nvenc", "p5"),
}

_WRITER_SUFFIXES = {".mp4", ".mov", ".m4v", ".mkv"}
_PIPE_CHUNK = 1 << 16  # bytes per write into ffmpeg's stdin (the size of a Linux pipe buffer)
_PROBE_SIZE = (256, 256)  # pixels of the test frame (NVENC's minimum is about 145x49)
_probe_cache: dict[str, tuple[bool, str]] = {}
_probe_lock = threading.Lock()


@dataclass(frozen=True)
class EncoderChoice:
    """What an ``encoder`` ``setting`` (one of :data:`nbhelpers.constants.ENCODERS`) resolved to: the ffmpeg
    ``codec`` (``"libx264"`` or ``"h264_nvenc"``), its ``preset``, the ``ffmpeg`` binary (None: :func:`ffmpeg_exe`)
    and the ``reason`` it was chosen."""

    setting: str
    codec: str
    preset: str
    ffmpeg: str | None = None
    reason: str = ""


def _check_size(width: int, height: int) -> tuple[int, int]:
    for name, value in (("width", width), ("height", height)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a positive integer number of pixels; got {value!r}.")
    return int(width), int(height)


def _partial(path: Path) -> Path:
    """``.<stem>.partial-<random><suffix>`` beside ``path``, once its folder is checked writable and made."""
    check_writable(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.stem}.partial-{uuid.uuid4().hex[:8]}{path.suffix}")


def padded_size_note(width: int, height: int) -> str | None:
    """The note a clip's summary gives when :class:`VideoWriter` pads odd frame sizes (H.264 in yuv420p needs even
    ones: one black column at the right and/or row at the bottom), or None for even ones."""
    if not (int(width) % 2 or int(height) % 2):
        return None
    padded = f"{int(width) + int(width) % 2}x{int(height) + int(height) % 2}"
    return (f"({width}x{height} frames written as {padded}: one black column/row added at the right/bottom, since "
            "H.264 in yuv420p needs even sizes; crop the source to an even size to avoid it)")


def nvenc_probe(ffmpeg: str | None = None, timeout: float = 30.0) -> tuple[bool, str]:
    """``(True, "")`` when ``h264_nvenc`` encodes one 256x256 black frame with this ``ffmpeg`` within ``timeout``
    seconds, else ``(False, reason)``; cached per binary (a listed encoder may still fail on the driver)."""
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


def choose_encoder(setting: str = "libx264", *, ffmpegs: Sequence[str] | None = None) -> EncoderChoice:
    """The :class:`EncoderChoice` of an ``encoder`` setting: ``"libx264"`` (official): CRF 18, preset ``medium``;
    ``"libx264-fast"`` ... ``"-ultrafast"``: faster presets (bench/RESULTS.md, "Encoder settings"); ``"nvenc"`` /
    ``"auto"``: ``h264_nvenc`` when :func:`nvenc_probe` succeeds with one of ``ffmpegs`` (None: imageio-ffmpeg's
    binary, then the one on PATH), else libx264 medium with a ``FallbackWarning`` (and the reason in the result).
    Raises InputError: ``setting`` is not a known encoder setting."""
    if setting not in ENCODER_SETTINGS:
        raise InputError(f"encoder must be one of {', '.join(map(repr, ENCODERS))}; got {setting!r}. "
                         "'libx264' (CRF 18, preset medium) is the official offline choice.")
    codec, preset = ENCODER_SETTINGS[setting]
    if codec == "libx264":
        return EncoderChoice(setting, codec, preset, None, f"libx264 CRF 18, preset {preset}")
    if ffmpegs is None:
        ffmpegs = [ffmpeg_exe()]
        system = shutil.which("ffmpeg")
        if system and os.path.realpath(system) != os.path.realpath(ffmpegs[0]):
            ffmpegs.append(system)
    failures = []
    for exe in ffmpegs:
        ok, why = nvenc_probe(exe)
        if ok:
            return EncoderChoice(setting, codec, preset, exe, f"h264_nvenc test encode succeeded with {exe}")
        failures.append(f"{exe}: {why}")
    reason = ("h264_nvenc is not usable here (" + "; ".join(failures or ["no ffmpeg to try"]) + "); encoding with "
              "libx264 CRF 18, preset medium instead")
    warnings.warn(f"encoder={setting!r}: {reason}.", FallbackWarning, stacklevel=2)
    return EncoderChoice(setting, "libx264", "medium", None, reason)


class VideoWriter(contextlib.AbstractContextManager):
    """Encode BGR frames through an ffmpeg pipe into an H.264 MP4, with the original audio muxed in.

    ``0:v:0`` and the first stream of ``audio`` (None: video only) are mapped; the video is libx264 CRF ``crf``
    (0-51) yuv420p, BT.709 limited range, ``+faststart``, odd sizes padded by one black column/row; the audio is
    copied when AAC, else AAC 192 kb/s; ``comment`` is :data:`SYNTHETIC_TAG` unless ``synthetic`` is False. ffmpeg
    writes ``.<name>.partial-<random><suffix>`` beside ``path`` (.mp4, .mov, .m4v or .mkv; its folder is made),
    renamed only on success; a failure or a stall (nothing taken, or no progress while finishing, for
    ``stall_timeout_s``; None waits for ever) kills ffmpeg and removes it. ``codec`` ``"h264_nvenc"`` runs ``-rc vbr
    -cq <crf>``; ``preset`` None is ``"medium"`` (libx264) or ``"p5"`` (NVENC); an ``encoder`` setting or
    :class:`EncoderChoice` (kept as :attr:`encoder`) sets both and the binary, else ``ffmpeg`` (None:
    :func:`ffmpeg_exe`). :attr:`frames_written` counts the frames accepted so far.
    Raises InputError: bad size, fps, crf, suffix, stall timeout or audio file, before ffmpeg starts; FFmpegError:
    ffmpeg refused the options, died, failed when finishing, or stalled (``stalled`` True).
    Source: ``inference.py:230-237`` encodes libx264 yuv420p CRF 18, then muxes with a second encode and no ``-map``
    (quirk Q24); here one encode with mapped streams."""

    def __init__(self, path, width: int, height: int, fps=FPS, audio=None, crf: int = 18, codec: str = "libx264",
                 *, preset: str | None = None, ffmpeg: str | None = None, synthetic: bool = True,
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
        self.width, self.height = _check_size(width, height)
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
                raise NoAudioError("audio", str(self.audio), audio_info, "Give the speech file, or audio=None for a "
                                   "silent video.")
        self.frames_written = 0
        self._exe = ffmpeg or ffmpeg_exe()
        self._tmp = _partial(out)
        self._result: Path | None = None
        self._closed = False
        self.args = self._build_args(codec, crf, preset, audio_info)
        self._start()

    def _start(self, pass_fds: tuple[int, ...] = ()) -> None:
        """Start ffmpeg on ``self.args`` with the frame pipe as stdin, made non-blocking under a stall bound."""
        self._proc = _Process(self.args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=pass_fds)
        self._selector: selectors.BaseSelector | None = None
        if self.stall_timeout_s is not None and os.name == "posix":  # bounded writes: non-blocking pipe + select
            fd = self._proc.popen.stdin.fileno()
            os.set_blocking(fd, False)
            self._selector = selectors.DefaultSelector()
            self._selector.register(fd, selectors.EVENT_WRITE)

    def _build_args(self, codec, crf, preset, audio_info) -> list[str]:
        w, h = self.width, self.height
        args = [self._exe, *QUIET, "-y", "-f", "rawvideo", "-pixel_format", "bgr24", "-video_size", f"{w}x{h}",
                "-framerate", f"{self.fps.numerator}/{self.fps.denominator}", "-i", "pipe:0"]
        if self.audio is not None:
            args += ["-i", str(self.audio), "-map", "0:v:0", "-map", f"1:{audio_info.audio_stream.index}"]
        else:
            args += ["-map", "0:v:0"]
        args += ["-vf", _video_filter(w, h)]
        if codec == "libx264":
            args += ["-c:v", "libx264", "-preset", preset or "medium", "-crf", str(int(crf))]
        elif codec.endswith("_nvenc"):
            args += ["-c:v", codec, "-preset", preset or "p5", "-rc", "vbr", "-cq", str(int(crf)), "-b:v", "0"]
        else:
            args += ["-c:v", codec] + (["-preset", preset] if preset else [])
        args += ["-pix_fmt", "yuv420p", *BT709_TAGS]
        if self.audio is not None:
            args += ["-c:a", "copy"] if audio_info.audio_codec == "aac" else ["-c:a", "aac", "-b:a", "192k"]
        if self.path.suffix.lower() in (".mp4", ".mov", ".m4v"):
            args += ["-movflags", "+faststart"]
        return args + (SYNTHETIC_ARGS if self.synthetic else []) + [str(self._tmp)]

    def write(self, frames) -> None:
        """Append one ``(H, W, 3)`` frame or ``(N, H, W, 3)`` batch of uint8 BGR ``frames`` (numpy or torch). Raises
        InputError for a wrong dtype or shape, FFmpegError when ffmpeg has died, MediaError when already closed."""
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
        except (_Stalled, OSError, ValueError) as exc:  # OSError: BrokenPipeError, ConnectionResetError, a closed pipe
            if isinstance(exc, _Stalled) or self._watchdog_fired:
                raise self._stalled(f"took no frame data for {self.stall_timeout_s:g} s") from None
            with contextlib.suppress(subprocess.TimeoutExpired):  # still running: abort() below kills it
                self._proc.popen.wait(timeout=_KILL_WAIT_S)
            ended = ""
            if self._proc.popen.returncode == 0:  # no error of its own: something outside stopped it
                ended = (" It ended with exit status 0 before it had every frame: it was stopped from outside (a "
                         "signal to its process group, such as a Ctrl-C this process ignores as a script's "
                         "background job), not by a problem with the files; run the job again.")
            error = self._proc.error(f"ffmpeg stopped while frames were being written to {str(self.path)!r} "
                                     f"({plural(self.frames_written, 'frame')} written; {type(exc).__name__}).{ended}")
            self.abort()
            raise error from exc
        self.frames_written += len(arr)

    def close(self) -> Path:
        """Finish the file (flush, wait for ffmpeg, rename the temporary file) and return :attr:`path`. Raises
        InputError when no frame was written, FFmpegError when ffmpeg failed, MediaError when the writer was aborted."""
        if self._result is not None:
            return self._result
        if self._closed:
            raise MediaError(f"The VideoWriter for {str(self.path)!r} was aborted; nothing was written.")
        if self.frames_written == 0:
            self.abort()
            raise InputError(f"No frames were written to {str(self.path)!r}; call write(frames) before close(). "
                             "Nothing was saved.")
        self._closed = True
        with contextlib.suppress(OSError):
            self._proc.popen.stdin.close()
        if self._selector is not None:
            self._selector.close()
        try:
            rc = self._finish_wait()
        except _Stalled:
            raise self._stalled(f"showed no progress for {self.stall_timeout_s:g} s while finishing the file") from None
        if rc != 0 or not self._tmp.is_file():
            error = self._proc.error(f"ffmpeg failed to write {str(self.path)!r} (exit status {rc}) after "
                                     f"{plural(self.frames_written, 'frame')}; nothing was saved.")
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
                raise _Stalled
            with contextlib.suppress(BlockingIOError):  # the reader took less than select promised; wait again
                pos += os.write(fd, data[pos:pos + _PIPE_CHUNK])

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
                    raise _Stalled from None

    def _stalled(self, what: str) -> FFmpegError:
        """Kill a stalled ffmpeg, drop the partial file, and return the error that says so."""
        self._closed = True
        self._proc.kill()
        error = FFmpegError(
            f"ffmpeg {what} while writing {str(self.path)!r} ({plural(self.frames_written, 'frame')} written): it has "
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
            tmp.unlink(missing_ok=True)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self):  # pragma: no cover - GC safety net: never leave ffmpeg running or a partial file behind
        with contextlib.suppress(Exception):
            if getattr(self, "_result", None) is None:
                self.abort()

    def __repr__(self) -> str:
        state = "done" if self._result else ("closed" if self._closed else "open")
        return (f"VideoWriter({self.path.name!r}, {self.width}x{self.height} px, {_fps_text(self.fps)} fps, "
                f"frames_written={self.frames_written}, {state})")


class _Stalled(Exception):
    """ffmpeg made no progress for the writer's ``stall_timeout_s`` (internal; turned into an FFmpegError)."""


def convert_to_25fps(src, dst) -> MediaInfo:
    """Write ``dst``, a constant-25-fps H.264 (yuv420p, CRF 18) copy of ``src`` with its audio as AAC, atomically,
    and return its :class:`MediaInfo`; the frames are those :func:`load_video` yields. Raises InputError for a
    missing source, a source without video or a bad ``dst``; FFmpegError when ffmpeg failed (no partial output left).
    Source: ``app.py:432-472`` re-times uploads to 25 fps; ``README.md:320`` asks for 25 fps input."""
    with load_video(src) as reader:
        audio = reader.path if reader.info.has_audio else None
        with VideoWriter(dst, reader.width, reader.height, FPS, audio=audio, synthetic=False) as writer:
            for batch in reader.iter_batches(16):
                writer.write(batch)
        return probe(writer.path)


def demo_inputs(directory) -> tuple[Path, Path]:
    """``(photo_path, audio_path)`` for a first run: scikit-image's public-domain ``astronaut`` photo (512x512),
    written into ``directory``, and the packaged ``demo-speech.wav`` (4.7 s, espeak-ng; ``nbhelpers/data/README.md``).
    MissingDependencyError when scikit-image or Pillow is not installed."""
    folder = Path(directory).expanduser().absolute()
    folder.mkdir(parents=True, exist_ok=True)
    skdata = require("skimage.data", "pip install scikit-image")
    image = require("PIL.Image", "pip install Pillow")
    photo = folder / "astronaut.png"
    with atomic_path(photo, ".png") as tmp:
        image.fromarray(skdata.astronaut()).save(tmp, format="PNG")  # RGB array -> PNG (colours kept)
    wav = resources.files("nbhelpers") / "data" / "demo-speech.wav"
    if isinstance(wav, Path) and wav.is_file():
        return photo, wav
    audio = folder / "demo-speech.wav"  # package inside a zip: copy the bytes out
    with atomic_path(audio, ".wav") as tmp:
        tmp.write_bytes(wav.read_bytes())
    return photo, audio
