"""Google Drive on Colab: mounting it and saying whether it is mounted."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .modes import DRIVE_MOUNTPOINT, _ShownAsText, in_colab


def drive_mounted() -> bool:
    """True when Google Drive is mounted at :data:`DRIVE_MOUNTPOINT` (its ``MyDrive`` folder exists)."""
    return Path(DRIVE_MOUNTPOINT, "MyDrive").is_dir()


def mount_drive(weights_folder: str | os.PathLike | None = None, *, enabled: bool = True) -> DriveStatus:
    """Mount Google Drive at :data:`DRIVE_MOUNTPOINT` in Colab (outside Colab, do nothing) and optionally read the
    weights from ``weights_folder`` on it, set as ``NBHELPERS_WEIGHTS`` for this session (a teacher's shared folder,
    added to My Drive as a shortcut). ``enabled`` False only reports the state (the notebook's ``MOUNT_DRIVE``).
    InputError when ``weights_folder`` does not exist on the mounted Drive (the message says how to add a shortcut)."""
    if not in_colab():
        return DriveStatus(False, None, "not in Colab: nothing mounted (use a local folder with "
                                        "NBHELPERS_WEIGHTS instead)")
    if not enabled:
        state = "mounted" if drive_mounted() else "not mounted (set MOUNT_DRIVE = True to mount it)"
        return DriveStatus(drive_mounted(), None, state)
    if not drive_mounted():
        from google.colab import drive  # type: ignore[import-not-found]

        drive.mount(DRIVE_MOUNTPOINT)
    weights = None
    if weights_folder:
        weights = Path(weights_folder).expanduser()
        if not weights.is_dir():
            raise InputError(
                f"weights_folder {str(weights)!r} does not exist on the mounted Drive. For a folder someone shared "
                "with you: open drive.google.com, right-click it in 'Shared with me', choose Organize > Add "
                f"shortcut > My Drive, then pass '{DRIVE_MOUNTPOINT}/MyDrive/<folder name>'.")
        os.environ["NBHELPERS_WEIGHTS"] = str(weights)
    return DriveStatus(drive_mounted(), weights, "mounted" if drive_mounted() else "not mounted")


@dataclass(frozen=True)
class DriveStatus(_ShownAsText):
    """Result of :func:`mount_drive`; ``weights_dir`` is the folder now in ``NBHELPERS_WEIGHTS``, or None."""

    mounted: bool
    weights_dir: Path | None
    message: str

    def __str__(self) -> str:
        weights = f"; weights from {self.weights_dir}" if self.weights_dir else ""
        return f"Google Drive: {self.message}{weights}"
