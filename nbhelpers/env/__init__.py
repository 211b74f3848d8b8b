"""The notebooks' environment: run mode, setup report, installs of what is missing, inputs, weights, result checks.

Every notebook calls :func:`setup` and :func:`run_mode`. The run mode decides where inputs and weights come from:
``colab`` and ``local`` use your uploads (``02_media``) or the packaged demo, and the weights of
:func:`nbhelpers.weights.default_dir`; ``ci`` (``NBHELPERS_MODE=ci``, the tests) uses short clips of the
project's test media (or the packaged demo), a tiny random-weights tree, the dlib backend, no progress bars and
no installs. The package imports the standard library alone (it installs the rest).
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
