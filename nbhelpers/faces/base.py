"""The landmark-backend interface shared by every face backend (dlib, dwpose-onnx, mmpose, user boxes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class FaceResult:
    """What a backend finds in one frame.

    Attributes:
        face_box: (4,) float64 ``(x1, y1, x2, y2)``, full-frame pixels: the detector's box (S3FD, or dlib's).
        landmarks: (68, 2) float32 ``(x, y)``, full-frame pixels, iBUG 300-W order (DWPose whole-body points 23..90).
        score: Detector confidence in [0, 1], or NaN when the backend gives none.
    """

    face_box: np.ndarray
    landmarks: np.ndarray
    score: float = float("nan")


@runtime_checkable
class LandmarkBackend(Protocol):
    """A face backend; implementations register in ``faces.BACKENDS``.

    ``detect`` takes (N, H, W, 3) uint8 BGR frames and returns N entries, each a :class:`FaceResult` or None (no
    face); ``close`` releases the models. A backend with ``accepts_frames_device = True`` also takes
    ``frames_device=``, the same frames as a (N, H, W, 3) uint8 tensor on its GPU, with the same results.
    """

    name: str

    def detect(self, frames: np.ndarray) -> list[FaceResult | None]: ...

    def close(self) -> None: ...
