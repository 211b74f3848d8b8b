"""The workbook's places for notebook cells: its weights, the files a notebook writes, the planner, the final check.

A notebook cell shows the library's API (``MuseTalkPipeline.from_pretrained``, ``pipe.lipsync``,
``pipe.prepare_avatar``) and takes from here only *where* things go. Every function reads the run mode itself
(:func:`nbhelpers.env.run_mode`: ``NBHELPERS_MODE``, else Colab or local), so a cell never passes it:

>>> import nbhelpers as nbh
>>> pipe = nbh.MuseTalkPipeline.from_pretrained(nbh.workbook.weights())  # doctest: +SKIP
>>> result = pipe.lipsync(video, audio, nbh.workbook.path("lipsync.mp4"))  # doctest: +SKIP
>>> nbh.workbook.check(result, audio=audio)  # doctest: +SKIP

The folders are those of :mod:`nbhelpers.env` (``NBHELPERS_WORKDIR``, ``/content/musetalk-workbook`` on Colab,
``~/musetalk-workbook`` locally, a temporary folder in CI mode); the setup notebook's own steps
(:func:`install_missing`, :func:`mount_drive`, :func:`check_setup`) are the same functions as there.
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
    """The weights folder of this run mode, with its files.

    CI mode: the tiny random-weights tree (made once). Otherwise :func:`nbhelpers.weights.default_dir`
    (``NBHELPERS_WEIGHTS``, a Drive folder or the cache folder), downloading the default set's missing files
    first when ``download`` is true (present files are only checked).

    Args:
        download: False only names the folder (``01_weights`` shows the download itself).

    Returns:
        The folder, in the official ``models/`` layout.

    Raises:
        WeightsError: A download failed (the message names the files and the fix).
    """
    return env.weights_dir(None, download=download)


def path(*parts: str | os.PathLike) -> Path:
    """A path inside the workbook's folder, its parent folder created: ``path("avatars", "my-avatar")``.

    Args:
        *parts: Relative path parts (a file name, or folders then a name).

    Returns:
        ``work_dir / parts...`` (the file or folder itself is not created).

    Raises:
        InputError: No part, or a part that is absolute or climbs out with ``..``.
    """
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
    """The GPU planner's choice for this run mode (:func:`nbhelpers.env.plan`): device, precision, batch size.

    Args:
        kind: ``"lipsync"``, ``"avatar"`` or ``"realtime"``.
        **changes: Fields of the starting config, e.g. ``batch_size=4``.

    Returns:
        The plan (it shows its reasons); ``plan.config`` is the :class:`~nbhelpers.config.InferenceConfig`.
    """
    return env.plan(kind, None, **changes)


def keep_video(video: str | os.PathLike):
    """Convert your video (or photo) to 25 fps into the workbook's media folder, where later notebooks find it.

    Args:
        video: Your video or photo.

    Returns:
        The :class:`~nbhelpers.media.MediaInfo` of the converted file (``media_dir / video-25fps.mp4``).

    Raises:
        InputError: ``video`` does not exist.
        MediaError, FFmpegError: It cannot be read or converted.
    """
    from .media import convert_to_25fps  # numpy: this module imports with the standard library alone

    return convert_to_25fps(video, env.media_dir(None) / env.WORKBOOK_VIDEO)


def check(result: Any, *, audio: str | os.PathLike | None = None, **expected: Any) -> str:
    """A notebook's final check: this run produced its result (:func:`nbhelpers.env.check_result`).

    Args:
        result: What the notebook made (a result with an ``output``, an avatar, a table, a path).
        audio: The speech the result was made from: its duration (probed) is the one the video must have, within
            one frame (1/25 s).
        **expected: ``frames``, ``duration_s``, ``from_cache``, ``min_rows``, ``since`` as in
            :func:`~nbhelpers.env.check_result`.

    Returns:
        A one-line summary of what was checked.

    Raises:
        ResultCheckError: A check failed (the message names it and what to look at).
        MediaError: ``audio`` cannot be probed.
    """
    if audio is not None:
        if "duration_s" in expected:
            raise InputError("give workbook.check either audio= or duration_s=, not both.")
        expected["duration_s"] = env.media_seconds(audio)
    return env.check_result(result, **expected)
