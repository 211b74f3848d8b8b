"""The workbook's places for notebook cells: its weights, the files a notebook writes, the planner, the final check.

Cells call the library's API and take from here only *where* things go, for the run mode
(:func:`nbhelpers.env.run_mode`) and the folders of :mod:`nbhelpers.env` (``NBHELPERS_WORKDIR``, else a default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import env
from .env import check_setup, install_missing, keep_audio, mount_drive
from .errors import InputError

__all__ = ["check", "check_setup", "install_missing", "keep_audio", "keep_video", "mount_drive", "path", "plan",
           "weights"]


def weights(*, download: bool = True) -> Path:
    """The weights folder of this run mode in the official ``models/`` layout (:func:`nbhelpers.env.weights_dir`)."""
    return env.weights_dir(None, download=download)


def path(*parts: str | os.PathLike) -> Path:
    """``work_dir / parts...`` (relative parts, e.g. ``path("avatars", "my-avatar")``) inside the workbook's folder,
    its parent folder created (not the path itself). InputError for no part, an absolute one or one with ``..``."""
    if not parts:
        raise InputError("workbook.path needs a name, e.g. workbook.path('lipsync.mp4').")
    relative = Path(*parts)
    if relative.is_absolute() or ".." in relative.parts:
        raise InputError(f"workbook.path takes a path inside the workbook folder; got {str(relative)!r}. Give a "
                         "relative name such as 'results/clip.mp4', or use your own absolute path directly.")
    target = env.work_dir(None) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def plan(kind: str = "lipsync", **changes: Any):
    """The GPU planner's choice for this run mode (:func:`nbhelpers.env.plan`) for ``kind`` (``"lipsync"``,
    ``"avatar"``, ``"realtime"``) from a config with ``changes`` (e.g. ``batch_size=4``), in ``plan.config``."""
    return env.plan(kind, None, **changes)


def keep_video(video: str | os.PathLike):
    """Convert ``video`` (or a photo) to 25 fps into the workbook's media folder; returns its ``MediaInfo``.
    InputError when ``video`` does not exist, MediaError or FFmpegError when it cannot be read or converted."""
    from .media import convert_to_25fps  # numpy: this module imports with the standard library alone

    return convert_to_25fps(video, env.media_dir(None) / env.WORKBOOK_VIDEO)


def check(result: Any, *, audio: str | os.PathLike | None = None, **expected: Any) -> str:
    """A notebook's final check that this run produced its ``result`` (a result with an ``output``, an avatar, a
    table, a path); returns a one-line summary. With ``audio``, the speech it was made from, the video must last as
    long within 1/25 s; ``expected`` as in :func:`nbhelpers.env.check_result`. ResultCheckError when a check fails,
    MediaError when ``audio`` cannot be probed."""
    if audio is not None:
        if "duration_s" in expected:
            raise InputError("give workbook.check either audio= or duration_s=, not both.")
        expected["duration_s"] = env.media_seconds(audio)
    return env.check_result(result, **expected)
