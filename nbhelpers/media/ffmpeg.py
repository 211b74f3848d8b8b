"""The ffmpeg binary and its processes: finding it, its version, and running it over pipes with bounded waits."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import subprocess
import threading
from pathlib import Path

from ..errors import FFmpegError, InputError, MissingDependencyError

SYNTHETIC_TAG = "Synthetic lip-sync video made with MuseTalk (nbhelpers)"
"""The ``comment`` tag and video handler name of every video :class:`VideoWriter` makes: the file is generated."""

SYNTHETIC_ARGS = ["-metadata", f"comment={SYNTHETIC_TAG}", "-metadata:s:v:0", f"handler_name={SYNTHETIC_TAG}"]
# BT.709 matrix, limited range, and the stream tagged so (setparams: the -color_* options alone are not carried
# through the filtered frames by every ffmpeg version)
BT709_FILTER = ("scale=out_color_matrix=bt709:out_range=tv,format=yuv420p,"
                "setparams=range=tv:color_primaries=bt709:color_trc=bt709:colorspace=bt709")
BT709_TAGS = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv"]
QUIET = ["-nostdin", "-hide_banner", "-nostats", "-loglevel", "error"]  # no prompt, banner, stats or chatter
_STDERR_TAIL_LINES = 40  # lines of ffmpeg's stderr kept in an FFmpegError
#: What each input of a job takes, in the words its errors use ("give ..." a file of this kind).
INPUT_TAKES = {"video": "a video or photo of a face", "audio": "an audio file, or a video with sound"}
WRITER_STALL_TIMEOUT_S = 120.0  # seconds a writing ffmpeg may take no frame data / show no progress: then stalled
_KILL_WAIT_S = 10.0  # seconds to wait for a killed ffmpeg to exit (one stuck on a dead mount may never exit)


@functools.cache
def ffmpeg_exe() -> str:
    """Absolute path of the ffmpeg binary nbhelpers runs: imageio-ffmpeg's (honouring ``IMAGEIO_FFMPEG_EXE``).
    Raises MissingDependencyError: imageio-ffmpeg is not installed or has no binary for this platform.
    Source: ``inference.py:23-39`` runs ``ffmpeg`` from PATH; nbhelpers never depends on PATH."""
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


@functools.cache
def ffmpeg_version(exe: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of an ffmpeg binary (None: :func:`ffmpeg_exe`); git builds give (99, 0), unreadable (0, 0)."""
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
    return (99, 0) if re.search(r"ffmpeg version (N-|git-)", text) else (0, 0)


def _video_filter(width: int, height: int) -> str:
    """BT.709 yuv420p, odd sizes padded by one black column/row at the right/bottom (yuv420p needs even sizes)."""
    return ("pad=ceil(iw/2)*2:ceil(ih/2)*2," if width % 2 or height % 2 else "") + BT709_FILTER


def _passthrough(exe: str) -> list[str]:
    """Output option that passes frames through unchanged (no duplicate/drop by the muxer's sync)."""
    return ["-fps_mode", "passthrough"] if ffmpeg_version(exe) >= (5, 1) else ["-vsync", "passthrough"]


class _Process:
    """A running ffmpeg whose standard error a daemon thread drains into a bounded tail."""

    def __init__(self, args: list[str], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                 pass_fds: tuple[int, ...] = ()):
        self.args = args
        try:
            self.popen = subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, pass_fds=pass_fds)
        except OSError as exc:
            raise FFmpegError(f"Could not start ffmpeg ({args[0]!r}): {exc}. Reinstall imageio-ffmpeg "
                              "(pip install --force-reinstall imageio-ffmpeg).", args_list=args) from exc
        self._lines: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._thread = threading.Thread(target=self._drain, name="ffmpeg-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        stream = self.popen.stderr
        try:
            for raw in iter(stream.readline, b""):
                self._lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
        except (OSError, ValueError):  # pragma: no cover - stream closed under us during a kill
            pass
        finally:  # ffmpeg has exited (or was killed): its stderr pipe is ours to close, not the garbage collector's
            with contextlib.suppress(OSError):  # pragma: no cover
                stream.close()

    def tail(self) -> str:
        self._thread.join(timeout=5)
        return "\n".join(list(self._lines))  # a copy: the drain thread may still append

    def wait(self) -> int:
        rc = self.popen.wait()
        self._thread.join(timeout=5)
        return rc

    def kill(self) -> None:
        with contextlib.suppress(OSError):  # pragma: no cover - gone meanwhile (kill() skips an exited one)
            self.popen.kill()
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            self.popen.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # stuck in the kernel (a dead network mount): leave it, never hang here
            return
        self._thread.join(timeout=5)

    def progress_mark(self, fallback: Path | None) -> tuple | None:
        """What changes while ffmpeg works: its CPU ticks and bytes written (``/proc``), else ``fallback``'s size and
        time; None when neither can be read."""
        pid = self.popen.pid
        with contextlib.suppress(OSError, IndexError):
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            mark: tuple = (fields[11], fields[12])  # utime, stime (fields 14 and 15 of proc(5))
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/io", "rb") as f:
                    mark += tuple(line for line in f.read().splitlines() if line.startswith((b"wchar", b"rchar")))
            return mark
        try:
            st = fallback.stat()
            return (st.st_size, st.st_mtime_ns)
        except (OSError, AttributeError):  # not there, or no file (a URL)
            return None

    def error(self, message: str) -> FFmpegError:
        return FFmpegError(message, args_list=self.args, returncode=self.popen.returncode, stderr_tail=self.tail())


def _run(args: list[str], what: str) -> tuple[int, bytes, str]:
    """Run ffmpeg to completion; return (returncode, stdout bytes, stderr text)."""
    try:
        done = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True)
    except OSError as exc:
        raise FFmpegError(f"Could not start ffmpeg to {what} ({args[0]!r}): {exc}. Reinstall imageio-ffmpeg "
                          "(pip install --force-reinstall imageio-ffmpeg).", args_list=args) from exc
    return done.returncode, done.stdout, done.stderr.decode("utf-8", "replace")


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-_STDERR_TAIL_LINES:])


def _existing_file(path, param: str) -> Path:
    """Absolute Path of an existing, non-empty regular file, or InputError that names the parameter (``"video"``,
    ``"audio"``, ``"media"``) and the file."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{param} must be a path (str or pathlib.Path); got {type(path).__name__} {path!r}.")
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{param} file not found: {str(p)!r}. Check the path (upload the file first on Colab, "
                         "or use nbhelpers.media.demo_inputs() for a demo photo and speech clip).")
    if not p.is_file():
        raise InputError(f"{param} path {str(p)!r} is {'a folder' if p.is_dir() else 'not a file'}. Give the path of "
                         f"{INPUT_TAKES.get(param, 'one video, photo or audio file')}.")
    if p.stat().st_size == 0:
        raise InputError(f"{param} file {str(p)!r} is empty (0 bytes): its upload, export or download did not finish. "
                         "Upload, export or download it again.")
    return p.resolve()
