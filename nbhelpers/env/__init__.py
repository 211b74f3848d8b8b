"""The notebooks' environment: run mode, setup report, installs of what is missing, inputs, weights, result checks.

The run mode (:func:`run_mode`; every ``mode`` argument here, None detecting it) decides where inputs and
weights come from: ``colab`` and ``local`` use your uploads or the packaged demo and
:func:`nbhelpers.weights.default_dir`; ``ci`` (the tests) short clips of the project's test media, tiny random
weights, the dlib backend, no progress bars and no installs. The package imports the standard library alone.
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

__all__ = ["CI_CLIP_SECONDS", "MODES", "REPORTED", "SHARED_AUDIO", "SHARED_AUDIO_2", "SHARED_VIDEO", "WORKBOOK_AUDIO",
           "WORKBOOK_VIDEO", "DriveStatus", "EnvReport", "InstallReport", "InstallRow", "ResultCheckError",
           "check_result", "check_setup", "colab_requirements", "default_config", "drive_mounted", "in_colab",
           "install_missing", "keep_audio", "media_dir", "media_seconds", "mount_drive", "package_version", "plan",
           "read_requirements", "restart_reasons", "run_mode", "sample_audios", "setup", "shared_data_dir", "upload",
           "weights_dir", "work_dir", "workbook_inputs"]
