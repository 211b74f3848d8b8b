"""Faces: a face box and the 68 landmarks per frame from a landmark backend, then the MuseTalk crop box.

Importing this package loads numpy only (no torch, cv2, dlib or onnxruntime); a backend's libraries are imported
when it is built.

>>> from nbhelpers import faces
>>> faces.crop_box(landmarks, face_box, frame.shape)           # doctest: +SKIP  (one frame, official rules)
>>> track = faces.track("clip.mp4", backend="dlib")             # doctest: +SKIP  (every frame, streamed)
>>> track = faces.track("clip.mp4", boxes=(180, 150, 380, 340)) # doctest: +SKIP  (your box, no detector)

Backends (``faces.BACKENDS``, name -> factory imported lazily):

- ``"mmpose"``: the official DWPose landmarks through OpenMMLab, plus S3FD (exact; needs mmcv).
- ``"dwpose"``: the same DWPose network written in torch, from the same ``.pth``, plus S3FD (the default wherever
  torch runs, Colab included: float16 on the GPU, batched; no mmcv, no onnxruntime).
- ``"dwpose-onnx"``: the same DWPose network exported to ONNX, plus S3FD (optional; needs onnxruntime).
- ``"dlib"``: dlib's detector and 68-point predictor (no weights to download; tests and CI use it).

``get_backend("auto")`` picks the first usable in that order and says why in the backend's ``reason``.
"""

from __future__ import annotations

from .base import FaceResult, LandmarkBackend
from .boxes import (
    MIN_CROP_SIDE,
    BBoxShiftRange,
    bbox_shift_range,
    crop_box,
    crop_box_with_source,
    smooth_boxes,
    user_boxes,
)
from .registry import BACKENDS, BackendRegistry, get_backend
from .track import FaceSizeWarning, FaceTrack, FaceTracker, track

__all__ = [
    "BACKENDS",
    "MIN_CROP_SIDE",
    "BBoxShiftRange",
    "BackendRegistry",
    "FaceResult",
    "FaceSizeWarning",
    "FaceTrack",
    "FaceTracker",
    "LandmarkBackend",
    "bbox_shift_range",
    "crop_box",
    "crop_box_with_source",
    "get_backend",
    "smooth_boxes",
    "track",
    "user_boxes",
]
