"""Checks the notebooks make on themselves: a result is real, the setup works."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from ..constants import FPS
from ..errors import plural
from .install import COLAB_EXTRA, InstallReport, install_missing
from .modes import _SESSION_START, ResultCheckError


def check_result(result: Any, *, frames: int | None = None, duration_s: float | None = None,
                 from_cache: bool | None = None, min_rows: int = 1, since: float | None = None) -> str:
    """The final cell's check that this run produced its ``result``; returns a one-line summary of what was checked.

    A path, an ``output`` path or a :class:`~nbhelpers.media.MediaInfo`: the file exists, was written after ``since``
    (default: this session), has ``frames`` (default: the result's ``n_frames``) and lasts ``duration_s`` within one
    frame. An avatar (``loaded_from_cache``): it equals ``from_cache`` when given and has frames. Anything with rows or
    a length: at least ``min_rows``. ResultCheckError when a check fails, naming it, the value and what to look at."""
    checked: list[str] = []
    output = result if isinstance(result, (str, os.PathLike)) else getattr(result, "output", None)
    if output is None and hasattr(result, "duration_s") and isinstance(getattr(result, "path", None), os.PathLike):
        output = result.path  # a MediaInfo of a file written by this run
    if output is not None:
        known = getattr(result, "n_frames", None) if frames is None else frames
        checked += _check_file(Path(output), known, duration_s, _SESSION_START if since is None else since)
    if hasattr(result, "loaded_from_cache"):
        cached = bool(result.loaded_from_cache)
        if from_cache is not None and cached != from_cache:
            raise ResultCheckError(
                f"loaded_from_cache is {cached}, expected {from_cache}: the avatar was "
                f"{'loaded from' if cached else 'rebuilt instead of loaded from'} its cache in "
                f"{getattr(result, 'directory', '?')}. Check that the settings match the prepared avatar.")
        n = int(getattr(result, "n_frames", 0) or 0)
        if n <= 0:
            raise ResultCheckError(f"the avatar has n_frames={n}; expected at least one prepared frame.")
        checked.append(f"avatar with {plural(n, 'frame')} ({'loaded from cache' if cached else 'prepared now'})")
    if output is None and not hasattr(result, "loaded_from_cache"):
        rows = next((getattr(result, n) for n in ("rows", "checks", "files") if hasattr(result, n)), result)
        try:
            count = len(rows() if callable(rows) else rows)
        except TypeError:
            raise ResultCheckError(f"cannot check a result of type {type(result).__name__}: it has no output "
                                   "file, no avatar cache flag and no rows.") from None
        if count < min_rows:
            raise ResultCheckError(f"the table has {count} rows; expected at least {min_rows}.")
        checked.append(f"table with {count} rows")
    return "OK: " + "; ".join(checked)


#: Distributions only the ``dwpose-onnx`` landmark backend needs (check_setup skips them for other backends).
ONNX_ONLY = frozenset({"onnxruntime", "onnxruntime-gpu"})


def check_setup(installs: InstallReport | None = None, backend: Any = None) -> str:
    """``00_setup``'s final check that this runtime is ready; returns a one-line summary of what was checked.

    In order: every requirement of ``installs`` (None: the ``[colab]`` extra, as a dry run) is satisfied now and none
    was refused (onnxruntime only for the ``dwpose-onnx`` backend); torch imports; the ffmpeg of
    :mod:`nbhelpers.media` reports a version; ``backend`` (a landmark backend or its name; None: skipped) has a name.
    ResultCheckError when a check fails, saying what is missing and what fixes it."""
    if installs is None:
        installs = install_missing(None, dry_run=True)
    if not getattr(installs, "rows", None):
        raise ResultCheckError("the install table is empty: install_missing read no requirement. Check that the "
                               f"package's [{COLAB_EXTRA}] extra lists what Colab lacks (env.colab_requirements()).")
    if isinstance(backend, str):
        from .. import faces  # numpy: env imports with the standard library alone (it installs the rest)

        backend = faces.get_backend(backend)
    backend_name = getattr(backend, "name", None)
    skip_onnx = bool(backend_name) and backend_name != "dwpose-onnx"
    optional = {row.requirement for row in installs.rows if skip_onnx and row.name in ONNX_ONLY}
    now = install_missing([row.requirement for row in installs.rows if row.requirement not in optional], dry_run=True)
    if now.missing:
        if installs.dry_run:
            fix = ("install " + ("it" if len(now.missing) == 1 else "them") + " with: "
                   + shlex.join([sys.executable, "-m", "pip", "install", *now.missing]))
        else:
            fix = ("the install above did not take effect: on Colab choose Runtime > Restart session and run this "
                   "notebook again")
        raise ResultCheckError(f"still missing: {', '.join(now.missing)}; {fix}.")
    if now.refused:
        row = now.refused[0]
        raise ResultCheckError(f"{row.name} {row.installed} is below {row.requirement}; it is a protected package "
                               "(the workbook never upgrades it, so as not to break the runtime's own stack): "
                               f"upgrade it yourself, or use a runtime that has {row.requirement}.")
    checked = [f"{plural(sum(row.action == 'ok' for row in now.rows), 'requirement')} satisfied"]
    if optional:
        checked.append(f"{', '.join(sorted(optional))} not needed by the {backend_name} backend")
    try:
        import torch
    except ImportError as exc:
        raise ResultCheckError(f"torch does not import ({exc}); install the torch build for your machine first "
                               "(https://pytorch.org/get-started/locally/), then run this notebook again.") from None
    checked.append(f"torch {torch.__version__}" + (" with CUDA" if torch.cuda.is_available() else " (CPU)"))
    from .. import media  # numpy

    exe = media.ffmpeg_exe()
    version = media.ffmpeg_version(exe)
    if version == (0, 0):
        raise ResultCheckError(f"the ffmpeg binary {exe!r} does not run or prints no version; reinstall "
                               "imageio-ffmpeg (pip install --force-reinstall imageio-ffmpeg).")
    checked.append(f"ffmpeg {version[0]}.{version[1]}")
    if backend is not None:
        if not backend_name:
            raise ResultCheckError(f"the landmark backend {backend!r} has no name: choose one with "
                                   "faces.get_backend('auto').")
        checked.append(f"landmarks: {backend_name}")
    return "OK: " + "; ".join(checked)


def _check_file(path: Path, frames: int | None, duration_s: float | None, since: float) -> list[str]:
    if not path.is_file() or path.stat().st_size == 0:
        raise ResultCheckError(f"the output file {str(path)!r} is missing or empty: the run did not write it.")
    mtime = path.stat().st_mtime
    if mtime + 1.0 < since:
        raise ResultCheckError(
            f"the output file {str(path)!r} was written at {time.ctime(mtime)}, before this session started "
            f"({time.ctime(since)}): it is a leftover of an earlier run, not this run's result.")
    found = [f"{path.name} written this session ({path.stat().st_size / 2**20:.2f} MiB)"]
    if frames is None and duration_s is None:
        return found
    from .. import media  # numpy

    info = media.probe(path)
    got_frames = info.frame_count
    # The video's own length (frames / 25) is what must match: the container also counts the audio's padding.
    got_seconds = got_frames / FPS if got_frames else info.duration_s
    if frames is not None and got_frames is not None and int(got_frames) != int(frames):
        raise ResultCheckError(f"{path.name} has {got_frames} frames; the result reports {frames}.")
    if duration_s is not None and got_seconds is not None and abs(got_seconds - duration_s) > 1.0 / FPS + 1e-6:
        raise ResultCheckError(f"{path.name} lasts {got_seconds:.3f} s; expected {duration_s:.3f} s within one "
                               f"frame ({1 / FPS:.2f} s).")
    if frames is not None:
        found.append(f"{frames} frames")
    if got_seconds is not None:
        found.append(f"{got_seconds:.2f} s")
    return found
