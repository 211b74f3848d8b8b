"""``python -m nbhelpers``: parse the flags, run the command, and turn the package's errors into one line each."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

from ..errors import NbHelpersError, Terminated, WeightsError
from ..weights.manifest import is_tiny, resolve_dir
from .avatar import avatar
from .batch import batch
from .flags import check_restore
from .lipsync import TRY_TINY, demo, lipsync
from .parser import build_parser
from .score import score
from .system import download, report, verify
from .terms import in_cli_terms

__all__ = ["COMMANDS", "main"]

#: Command name -> the function that runs it with the parsed arguments and returns the exit status.
COMMANDS: dict[str, Callable[[Any], int]] = {"lipsync": lipsync, "demo": demo, "download": download, "verify": verify,
                                             "report": report, "score": score, "batch": batch, "avatar": avatar}


def main(argv: list[str] | None = None) -> int:
    """Run one command line; returns the exit status.

    Exit status: the command's (0 done, 1 a check that failed: ``verify``, ``batch``), 2 for an error the package
    raises on purpose or a usage error (printed as one line, in command-line terms, without a traceback), 130 on
    Ctrl-C, 143 on SIGTERM."""
    args = build_parser().parse_args(argv)
    run = in_cli_terms(COMMANDS[args.command])  # messages in flag names, not Python names or notebooks
    previous = _terminate_like_interrupt()
    try:
        in_cli_terms(check_restore)(args)  # before any download, model or frame
        return int(run(args) or 0)
    except NbHelpersError as exc:
        message = str(exc)
        if isinstance(exc, WeightsError) and not _on_tiny_weights(args) and "demo --tiny" not in message:
            message += "\n" + TRY_TINY
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated), perhaps re-raised as Ctrl-C by a C wait
        if isinstance(exc, Terminated) or Terminated.pending:
            print("terminated", file=sys.stderr)
            return 143
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        Terminated.pending = False
        if previous is not None:  # main() called in-process (tests, notebooks): give the handler back
            signal.signal(signal.SIGTERM, previous)


def _on_tiny_weights(args: Any) -> bool:
    """True for ``demo --tiny`` and for a command whose weights folder holds the tiny test weights: the hint to try
    them would send the user where they are."""
    return bool(getattr(args, "tiny", False)) or is_tiny(resolve_dir(getattr(args, "weights", None)))


def _terminate_like_interrupt() -> Any:
    """Turn SIGTERM into an exception in the main thread, so that the jobs' ``with`` blocks remove their partial
    output and frame store as they do on Ctrl-C (the default SIGTERM action kills the process without cleanup);
    returns the handler it replaced (to restore), or None when none was installed."""

    def handler(signum, frame):
        Terminated.pending = True
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # not the main thread, or not allowed here (an embedding host): keep the default
        return None
