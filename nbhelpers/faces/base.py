"""The landmark-backend interface shared by every face backend (dlib, dwpose-onnx, mmpose, user boxes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class FaceResult:
    """What a backend finds in one frame.

    Attributes:
        face_box: (4,) float64 ``(x1, y1, x2, y2)`` in full-frame pixels: the detector's face box (S3FD for the
            official pipeline, dlib's rectangle for the dlib backend).
        landmarks: (68, 2) float32 ``(x, y)`` in full-frame pixels, iBUG 300-W order (DWPose whole-body points
            23..90 in the same order).
        score: Detector confidence in [0, 1], or NaN when the backend gives none.
    """

    face_box: np.ndarray
    landmarks: np.ndarray
    score: float = float("nan")


@runtime_checkable
class LandmarkBackend(Protocol):
    """A face backend. Implementations live in ``nbhelpers/faces/<name>.py`` and register in ``faces.BACKENDS``.

    ``detect`` takes a batch of frames (N, H, W, 3) uint8 BGR and returns a list of N entries, each a
    :class:`FaceResult` or None for a frame with no face. ``close`` releases models (GPU memory).

    A backend whose face detector runs on a GPU may set ``accepts_frames_device = True``: its ``detect`` then also
    takes ``frames_device=``, the same frames as a (N, H, W, 3) uint8 tensor already on that GPU (the offline job
    uploads each piece once), and must give the same results as without it.
    """

    name: str

    def detect(self, frames: np.ndarray) -> list[FaceResult | None]: ...

    def close(self) -> None: ...
