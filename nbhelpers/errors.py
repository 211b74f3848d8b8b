"""Exception and warning classes. Every error the package raises on purpose derives from :class:`NbHelpersError`.

A message names the parameter or file, shows the value received, states the rule and gives the next step.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import signal
import warnings
from typing import Any


class NbHelpersError(Exception):
    """Base class of all errors raised on purpose by nbhelpers."""


class InputError(NbHelpersError, ValueError):
    """A user-supplied argument or file is unusable (bad value, missing file, wrong kind of media)."""


class SettingNameError(InputError, TypeError):
    """A keyword names no setting of a config class; a TypeError too, as Python's own error for an unknown keyword."""


class MediaError(NbHelpersError):
    """A media file could not be read or written (see the message for ffmpeg's own words)."""


class FFmpegError(MediaError):
    """ffmpeg exited with an error; the message ends with what it printed (``stderr_tail``, the last lines of its
    standard error). ``args_list`` is the argument list that was run, ``returncode`` its exit status."""

    def __init__(self, message: str, args_list: list[str] | None = None, returncode: int | None = None,
                 stderr_tail: str = ""):
        self.args_list = list(args_list or [])
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        stopped = _stop_signal_note(returncode)
        full = f"{message} {stopped}" if stopped else message
        if stderr_tail:
            full += "\n--- ffmpeg said ---\n" + stderr_tail.rstrip()
        super().__init__(full)


def _stop_signal_note(returncode: int | None) -> str:
    """What an ffmpeg exit status says about a signal: negative is the signal that ended it, 255 is ffmpeg's status
    after it caught SIGINT or SIGTERM (``fftools/ffmpeg.c``); its last lines may then blame an input file that is
    fine."""
    if returncode is None or not (returncode < 0 or returncode == 255):
        return ""
    if returncode < 0:
        try:
            how = f"by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"by signal {-returncode}"
    else:
        how = "by a signal (exit status 255)"
    return (f"ffmpeg was stopped {how}, not by a problem with the files: a Ctrl-C, kill or timeout sent to its "
            "process group (this process may ignore it, as a background job of a script does) interrupted it; run "
            "the job again.")


class WeightsError(NbHelpersError):
    """Weight files are missing, corrupt, or cannot be downloaded."""


class CheckpointError(WeightsError):
    """A checkpoint does not match the model it is loaded into (missing, unexpected or mis-shaped keys)."""


class MissingDependencyError(NbHelpersError, ImportError):
    """An optional package is not installed. The message gives the exact install line."""


class NoFaceError(InputError):
    """No face was found in any frame. Raised before any heavy model loads."""


class NoAudioError(InputError):
    """A file given for its speech has no audio stream: ``param`` and ``path`` name it, ``info`` is its
    :class:`nbhelpers.media.MediaInfo`; ``hint`` (the message's end) says how to give the speech."""

    def __init__(self, param: str, path: str, info: Any, hint: str | None = None):
        self.param, self.path, self.info = param, path, info
        what = ("a photo" if info.is_image else "a video without sound" if info.has_video
                else "a file with no audio or video streams (empty?)")
        super().__init__(f"{param}: {path!r} has no audio stream (it is {what}; container {info.container!r}). " + (
            hint or "Give a speech file (wav, mp3, m4a, ogg, flac) or a video that has sound."))


class CacheError(NbHelpersError):
    """An avatar cache is unreadable or does not match what was asked; it will be rebuilt."""


class DiskSpaceError(NbHelpersError, OSError):
    """Not enough free disk for what a job must write, before or while it runs; nothing half-written is left."""


class OutOfMemoryError(NbHelpersError):
    """The GPU ran out of memory even at batch size 1."""


def plural(n: float, noun: str, many: str = "", spec: str = "") -> str:
    """``n`` formatted with ``spec``, then ``noun``, or ``many`` (default ``noun + "s"``) unless ``n`` is 1 or -1."""
    return f"{n:{spec}} " + (noun if abs(n) == 1 else many or f"{noun}s")


# The install line for torch, an optional dependency of the package (Colab has it; reinstalling it breaks CUDA).
INSTALL_TORCH = "pip install torch  (on Colab it is preinstalled; never reinstall it there)"


def require(module: str, install: str):
    """Import an optional dependency, or raise :class:`MissingDependencyError` naming the pip line ``install``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - message content is tested through callers
        raise MissingDependencyError(
            f"The optional package {module!r} is not installed ({exc}). Install it with:\n    {install}"
        ) from exc


def package_version(*dists: str) -> str | None:
    """The installed version of the first installed of ``dists`` (from the metadata, no import); None if none is."""
    for name in dists:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


class Terminated(KeyboardInterrupt):
    """SIGTERM made an exception in the main thread by the command line, so ``with`` blocks clean up as on Ctrl-C.

    A KeyboardInterrupt, because code waiting in C (Ray's ``ray.wait``) takes only that from a signal handler;
    :attr:`pending` records that the stop was a SIGTERM even after such a wait re-raised it as Ctrl-C."""

    pending = False


class NbHelpersWarning(UserWarning):
    """Base class of nbhelpers' warnings, shown as ``Name: message`` without Python's file and source line; filter
    them with ``warnings.filterwarnings("ignore", category=NbHelpersWarning)``."""


class FallbackWarning(NbHelpersWarning, RuntimeWarning):
    """A slower or smaller way took over from what was asked, with nothing lost (a batch halved after out-of-memory,
    the CPU instead of a missing CUDA provider, the next landmark backend)."""


class SilentAudioWarning(NbHelpersWarning):
    """The speech of a job is silent (digital silence, or nearly): the job goes on, but the mouth will not speak."""


_default_formatwarning = warnings.formatwarning


def _formatwarning(message, category, filename, lineno, line=None):
    if isinstance(category, type) and issubclass(category, NbHelpersWarning):
        return f"{category.__name__}: {message}\n"
    return _default_formatwarning(message, category, filename, lineno, line)


if not getattr(warnings.formatwarning, "_nbhelpers", False):
    _formatwarning._nbhelpers = True  # type: ignore[attr-defined]
    warnings.formatwarning = _formatwarning
