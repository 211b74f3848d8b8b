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
Submodules: :mod:`.modes` (run modes and the workbook's media), :mod:`.install` (what is installed, installing
what is missing without touching torch), :mod:`.drive` (Google Drive on Colab), :mod:`.folders` (work, media
and weights folders, the clips a notebook uses), :mod:`.session` (the setup report), :mod:`.checks` (the checks
the notebooks make on themselves).
"""

from __future__ import annotations

from .checks import check_result, check_setup
from .drive import DriveStatus, drive_mounted, mount_drive
from .folders import (
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
    InstallReport,
    InstallRow,
    colab_requirements,
    install_missing,
    package_version,
    read_requirements,
    restart_reasons,
)
from .modes import (
    CI_CLIP_SECONDS,
    MEDIA_LICENCES,
    MODES,
    REPORTED,
    SHARED_AUDIO,
    SHARED_AUDIO_2,
    SHARED_VIDEO,
    WORKBOOK_AUDIO,
    WORKBOOK_VIDEO,
    ResultCheckError,
    in_colab,
    run_mode,
)
from .session import EnvReport, setup

__all__ = [
    "CI_CLIP_SECONDS",
    "MEDIA_LICENCES",
    "MODES",
    "REPORTED",
    "SHARED_AUDIO",
    "SHARED_AUDIO_2",
    "SHARED_VIDEO",
    "WORKBOOK_AUDIO",
    "WORKBOOK_VIDEO",
    "DriveStatus",
    "EnvReport",
    "InstallReport",
    "InstallRow",
    "ResultCheckError",
    "check_result",
    "check_setup",
    "colab_requirements",
    "default_config",
    "drive_mounted",
    "in_colab",
    "install_missing",
    "keep_audio",
    "media_dir",
    "media_seconds",
    "mount_drive",
    "package_version",
    "plan",
    "read_requirements",
    "restart_reasons",
    "run_mode",
    "sample_audios",
    "setup",
    "shared_data_dir",
    "upload",
    "weights_dir",
    "work_dir",
    "workbook_inputs",
]
