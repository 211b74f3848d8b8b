"""One switch for every progress bar: ``tqdm.auto`` bars, one per stage, in domain units.

``NBHELPERS_PROGRESS=0`` in the environment, or :func:`configure`, turns them off.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

LOG_INTERVAL_S = 10.0  # seconds between two lines of one bar in a log or a pipe

_settings: dict[str, Any] = {"disable": os.environ.get("NBHELPERS_PROGRESS", "1") in ("0", "false", "no")}
_notes = {"on": not _settings["disable"]}


def configure(disable: bool | None = None, *, notes: bool | None = None, **tqdm_kwargs: Any) -> bool:
    """Change every later bar: ``disable`` (True hides them; None keeps the choice) and ``tqdm_kwargs`` for ``tqdm``;
    ``notes`` shows :func:`note` lines (None: where bars show). Returns whether bars were hidden before the call."""
    before = bool(_settings["disable"])
    if disable is not None:
        _settings["disable"] = bool(disable)
    _notes["on"] = not _settings["disable"] if notes is None else bool(notes)
    _settings.update(tqdm_kwargs)
    return before


def bar(total: int | float | None = None, desc: str = "", unit: str = "frame", **kwargs: Any):
    """A ``tqdm.auto`` bar of ``total`` ``unit`` (``"frame"``, ``"batch"``, ``"B"``) named ``desc``, as a context
    manager; ``kwargs`` go to ``tqdm`` over the global settings. Where its ``file`` (default: stderr) is neither a
    terminal nor a notebook's, each redraw is one plain line (no carriage return or cursor code), at most every
    :data:`LOG_INTERVAL_S` seconds (``mininterval``); the full bar's line is printed once, when the bar closes."""
    from tqdm.auto import tqdm

    options = {**_settings, **kwargs}
    file = options.get("file") or sys.stderr
    if not in_log(file):
        return tqdm(total=total, desc=desc, unit=unit, **options)
    lines = _Lines(file)
    lines.bar = tqdm(total=total, desc=desc, unit=unit, **{"mininterval": LOG_INTERVAL_S, **options, "file": lines})
    return lines.bar


def in_log(file: Any = None) -> bool:
    """Whether bars on ``file`` (default: stderr) land in a log or a pipe: neither a terminal nor a notebook's."""
    from tqdm.auto import tqdm

    file = file or sys.stderr
    widgets = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)  # tqdm.auto in Jupyter with ipywidgets
    return not (widgets or getattr(file, "isatty", lambda: False)() or type(file).__module__.startswith("ipykernel"))


class _Lines:
    """A bar's file in a log or a pipe: each tqdm redraw (``"\\r" + text``) is written as the line ``text``; bare
    carriage returns, newlines and cursor-up codes are dropped, and so are the redraws of ``bar`` at its total
    while it is open (tqdm disables a bar before its closing redraw)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.flush, self.bar = stream, stream.flush, None

    def write(self, text: str) -> None:
        full = self.bar is not None and not self.bar.disable and self.bar.n == self.bar.total
        if (line := text.replace("\x1b[A", "").strip()) and not full:
            self.stream.write(line + "\n")


def stage_bar(progress: Any, total: int, desc: str):
    """The frame bar of one call of a stage, as a context manager: ``progress`` True or False makes one (shown or
    not); a bar object, one bar a job keeps across several calls of the stage, is used as it is and left open."""
    if progress is None or isinstance(progress, bool):
        return bar(total=total, desc=desc, **({} if progress else {"disable": True}))
    return contextlib.nullcontext(progress)


def note(message: str) -> None:
    """Print a one-line notice of a long step that runs on its own (e.g. the background compile), unless notes are
    off (``NBHELPERS_PROGRESS=0``). Written through ``tqdm.write`` so it does not break a bar in progress."""
    if not _notes["on"]:
        return
    from tqdm.auto import tqdm

    tqdm.write(f"nbhelpers: {message}")
