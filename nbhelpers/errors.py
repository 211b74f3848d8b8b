"""Exception classes. Every error the package raises on purpose derives from :class:`NbHelpersError`.

Messages follow one rule (STYLE.md §7): name the parameter or file, show the value received, state the rule,
and give the next step (which notebook to run, which file is missing, which install command).
"""

from __future__ import annotations

import warnings


class NbHelpersError(Exception):
    """Base class of all errors raised on purpose by nbhelpers."""


class InputError(NbHelpersError, ValueError):
    """A user-supplied argument or file is unusable (bad value, missing file, wrong kind of media)."""


class MediaError(NbHelpersError):
    """A media file could not be read or written (see the message for ffmpeg's own words)."""


class FFmpegError(MediaError):
    """ffmpeg exited with an error. ``stderr_tail`` holds the last lines it printed.

    Attributes:
        args_list: The argument list that was run (no shell involved).
        returncode: ffmpeg's exit status.
        stderr_tail: The last ~40 lines of ffmpeg's standard error.
    """

    def __init__(self, message: str, args_list: list[str] | None = None, returncode: int | None = None,
                 stderr_tail: str = ""):
        self.args_list = list(args_list or [])
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        full = message
        stopped = _stop_signal_note(returncode)
        if stopped:
            full += " " + stopped
        if stderr_tail:
            full += "\n--- ffmpeg said ---\n" + stderr_tail.rstrip()
        super().__init__(full)


def _stop_signal_note(returncode: int | None) -> str:
    """What an ffmpeg exit status says about a signal: a negative one is the signal that ended it (Python's
    ``Popen.returncode``), 255 is what ffmpeg returns after it caught SIGINT or SIGTERM and stopped
    (fftools/ffmpeg.c: ``received_nb_signals ? 255 : ...``). Its own last lines then often blame an input it was
    opening when the signal came, while the files are fine."""
    import signal

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
    """No face was found in any frame (F1 of the failure kinds). Raised before any heavy model loads."""


class CacheError(NbHelpersError):
    """An avatar cache is unreadable or does not match what was asked; it will be rebuilt."""


class DiskSpaceError(NbHelpersError, OSError):
    """Not enough free disk for what a job must write (checked before it starts), or the disk filled up while it ran.
    The message gives what is needed, what is free and where; nothing half-written is left behind."""


class OutOfMemoryError(NbHelpersError):
    """The GPU ran out of memory even at batch size 1."""


def require(module: str, install: str):
    """Import an optional dependency or raise :class:`MissingDependencyError` with the install line.

    Args:
        module: Dotted module name, e.g. ``"onnxruntime"``.
        install: The pip line that provides it, e.g. ``"pip install onnxruntime"``.

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: When the import fails; the message names ``install``.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - message content is tested through callers
        raise MissingDependencyError(
            f"The optional package {module!r} is not installed ({exc}). Install it with:\n    {install}"
        ) from exc


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (a timeout, ``docker stop``, systemd, a scheduler) and the command line turned it into an
    exception in the main thread, so that ``with`` blocks remove partial outputs as on Ctrl-C.

    It is a kind of KeyboardInterrupt because code that waits in C takes only that from a signal handler: Ray's
    ``ray.wait`` turns it into a plain KeyboardInterrupt of its own (any other exception raised by the handler
    there becomes a SystemError). :attr:`pending` is set by the handler, so that the stop is still known to be a
    SIGTERM after such a wait re-raised it as Ctrl-C.
    """

    pending = False


class NbHelpersWarning(UserWarning):
    """Base class of the warnings nbhelpers gives on purpose. They are shown as ``Name: message``, without the
    file name and source line Python adds by default (that line is ours, not the user's, and only adds noise in a
    notebook); filter them with ``warnings.filterwarnings("ignore", category=NbHelpersWarning)``."""


class FallbackWarning(NbHelpersWarning, RuntimeWarning):
    """What was asked could not be done as asked and a slower or smaller way took over, with nothing lost: a batch
    halved after CUDA out-of-memory, the CPU instead of a missing CUDA provider, the next landmark backend."""


_default_formatwarning = warnings.formatwarning


def _formatwarning(message, category, filename, lineno, line=None):
    if isinstance(category, type) and issubclass(category, NbHelpersWarning):
        return f"{category.__name__}: {message}\n"
    return _default_formatwarning(message, category, filename, lineno, line)


if not getattr(warnings.formatwarning, "_nbhelpers", False):
    _formatwarning._nbhelpers = True  # type: ignore[attr-defined]
    warnings.formatwarning = _formatwarning
