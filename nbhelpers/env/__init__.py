"""The notebooks' environment: run mode, setup report, installs of what is missing, inputs, weights, result checks.

Every notebook's setup cell calls :func:`setup`, and its second cell :func:`run_mode`. The run mode decides where
inputs and weights come from:

=========  ==========================================================================================
mode       inputs and weights
=========  ==========================================================================================
``colab``  Google Colab: your uploads (``02_media``) or the packaged demo; weights from
           :func:`nbhelpers.weights.default_dir` (``NBHELPERS_WEIGHTS``, e.g. a shared Drive folder).
``local``  Jupyter elsewhere: the same as Colab without the Colab-only cells.
``ci``     Tests (``NBHELPERS_MODE=ci``): short clips cut from ``../shared/data`` (or the packaged demo),
           a tiny random-weights tree from :func:`nbhelpers.testing.make_tiny_weights`, the dlib backend,
           no progress bars, no installs (only the dry-run check).
=========  ==========================================================================================

Nothing here imports torch at module import; :func:`setup` asks :mod:`nbhelpers.gpu` for the device report.

Layout (made by ``tools/split_modules.py`` from the former ``nbhelpers/env.py``; each submodule's docstring says
what it owns):

- :mod:`nbhelpers.env.modes`: run modes and the session: where the notebooks run and what mode they run in.
- :mod:`nbhelpers.env.install`: the installer: what is installed, what is missing, and installing it without
  touching torch.
- :mod:`nbhelpers.env.drive`: google Drive on Colab: mounting it and saying whether it is mounted.
- :mod:`nbhelpers.env.folders`: the workbook's folders and inputs: work, media and weights folders, and the clips a
  notebook uses.
- :mod:`nbhelpers.env.session`: the setup report of a notebook: versions, device, restart advice, in one object that
  shows itself.
- :mod:`nbhelpers.env.checks`: assertions the notebooks make on themselves: a result is real, the setup works.

Every name of the former module is importable from here, private ones included. The package is one namespace with
its submodules: setting a name on it (``monkeypatch.setattr(env, name, value)``) sets it in every submodule that
holds it, so code that looks the name up at call time sees the new value.
"""

# ruff: noqa: F401 (re-exports)  Made by tools/split_modules.py; edit the submodules, not this list.
from __future__ import annotations

import functools
import hashlib
import html
import importlib
import importlib.metadata as metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _namespace
from ..constants import FPS
from ..errors import InputError, MediaError, NbHelpersError
from .checks import ONNX_ONLY, _check_file, check_result, check_setup
from .drive import DriveStatus, drive_mounted, mount_drive
from .folders import (
    _cut,
    _default_inputs,
    _demo,
    _ffmpeg,
    _source_fingerprint,
    _weights_path,
    default_config,
    keep_audio,
    media_dir,
    media_seconds,
    plan,
    sample_audios,
    shared_data_dir,
    upload,
    weights_dir,
    work_dir,
    workbook_inputs,
)
from .install import (
    COLAB_EXTRA,
    DIST_NAME,
    RESTART_MESSAGE,
    InstallReport,
    InstallRow,
    _checkout_extra,
    _normalise,
    _same_version,
    colab_requirements,
    install_missing,
    package_version,
    read_requirements,
    restart_reasons,
)
from .modes import (
    _DISTS,
    _SESSION_START,
    ALTERNATIVES,
    AUDIO_SUFFIXES,
    CI_CLIP_SECONDS,
    DRIVE_MOUNTPOINT,
    MEDIA_LICENCES,
    MODES,
    NEVER_INSTALL,
    PROTECTED,
    REPORTED,
    SHARED_AUDIO,
    SHARED_AUDIO_2,
    SHARED_VIDEO,
    WORKBOOK_AUDIO,
    WORKBOOK_VIDEO,
    ResultCheckError,
    _check_mode,
    _first_attr,
    _first_number,
    in_colab,
    run_mode,
)
from .session import EnvReport, _device_summary, setup

_SUBMODULES = ("modes", "install", "drive", "folders", "session", "checks")

_namespace.share(__name__, _SUBMODULES)
