"""Run modes (``colab``, ``ci``, ``local``) and the constants of the workbook's media and packages."""

from __future__ import annotations

import os
import time
from typing import Any

from .. import progress
from ..errors import InputError, NbHelpersError
from ..weights.manifest import in_colab

MODES = ("colab", "ci", "local")
CI_CLIP_SECONDS = 0.6  # seconds of video and of audio cut from the test media for CI runs (15 frames)
SHARED_VIDEO = "face-sing-576x768-25fps.mp4"  # the project's test media (NBHELPERS_SHARED_DATA; test use only)
SHARED_AUDIO = "speech-en-short.wav"
SHARED_AUDIO_2 = "sing-44k1-mono.wav"
AUDIO_SUFFIXES = (".wav", ".mp3", ".m4a", ".aac", ".ogg", ".oga", ".opus", ".flac", ".wma")
WORKBOOK_VIDEO = "video-25fps.mp4"  # what 02_media leaves in media_dir() for the later notebooks
WORKBOOK_AUDIO = "audio"  # + the uploaded file's suffix
DRIVE_MOUNTPOINT = "/content/drive"

# Packages the notebooks never install, upgrade or downgrade (Colab's own builds; changing them breaks the runtime
# or needs a restart). torch is not installed even when missing: its build must match the machine's CUDA.
PROTECTED = ("torch", "torchvision", "torchaudio", "numpy", "transformers", "huggingface-hub", "ipywidgets",
             "opencv-python", "opencv-python-headless", "opencv-contrib-python", "jax", "jaxlib", "tensorflow")
NEVER_INSTALL = ("torch", "torchvision", "torchaudio")
# Distributions that provide the same import as another: an installed alternative satisfies the requirement (two
# of them in one environment overwrite each other's files).
ALTERNATIVES = {
    "onnxruntime-gpu": ("onnxruntime",), "onnxruntime": ("onnxruntime-gpu",),
    "dlib-bin": ("dlib",), "dlib": ("dlib-bin",),
    "opencv-python-headless": ("opencv-python", "opencv-contrib-python", "opencv-contrib-python-headless"),
    "opencv-python": ("opencv-python-headless", "opencv-contrib-python", "opencv-contrib-python-headless"),
}

# Import name -> distribution names, for the version table and the restart check.
_DISTS = {
    "torch": ("torch",), "diffusers": ("diffusers",), "transformers": ("transformers",),
    "huggingface_hub": ("huggingface-hub",), "numpy": ("numpy",), "ipywidgets": ("ipywidgets",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"), "dlib": ("dlib", "dlib-bin"),
    "cv2": ("opencv-python-headless", "opencv-python", "opencv-contrib-python", "opencv-contrib-python-headless"),
    "PIL": ("pillow",), "scipy": ("scipy",), "matplotlib": ("matplotlib",), "mmpose": ("mmpose",),
}
REPORTED = ("torch", "diffusers", "transformers", "huggingface_hub", "numpy", "ipywidgets", "onnxruntime", "dlib")

_SESSION_START = time.time()  # seconds since the epoch when this kernel first imported nbhelpers.env


class _ShownAsText:
    """A report that IPython's plain-text display shows as ``str(report)``."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


class ResultCheckError(NbHelpersError, AssertionError):
    """A notebook's final check found that this run did not produce its result (see the message)."""


def run_mode(mode: str | None = None) -> str:
    """Where this notebook runs: ``"colab"``, ``"ci"`` or ``"local"``; ``"ci"`` also turns progress bars off unless
    ``NBHELPERS_PROGRESS`` is set. ``mode`` None reads ``NBHELPERS_MODE``, else detects Colab. InputError when
    ``mode`` or ``NBHELPERS_MODE`` is not one of ``colab``, ``ci``, ``local``."""
    source = "mode"
    if mode is None or mode == "":
        mode, source = os.environ.get("NBHELPERS_MODE", ""), "NBHELPERS_MODE"
    mode = str(mode).strip().lower() or ("colab" if in_colab() else "local")
    if mode not in MODES:
        raise InputError(f"{source} must be one of {', '.join(MODES)}; got {mode!r}. Unset it for automatic "
                         "detection, or set NBHELPERS_MODE=ci to run the notebooks as the tests do.")
    if mode == "ci" and "NBHELPERS_PROGRESS" not in os.environ:
        progress.configure(disable=True)
    return mode
