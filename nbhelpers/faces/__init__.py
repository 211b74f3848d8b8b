"""Faces: a face box and the 68 landmarks per frame from a landmark backend, then the MuseTalk crop box.

Importing this package loads numpy only; a backend's libraries are imported when it is built. Backends
(:data:`BACKENDS`): ``"mmpose"`` (the official DWPose through OpenMMLab, plus S3FD; needs mmcv), ``"dwpose"``
(the same network in torch from the same ``.pth``, plus S3FD; the default wherever torch runs), ``"dwpose-onnx"``
(the same network in ONNX, plus S3FD; needs onnxruntime) and ``"dlib"`` (no weights to download).
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
from .track import FaceSizeWarning, FaceTrack, FaceTracker, find_tracks, track
from .tracks import FaceTracks, Track

__all__ = ["BACKENDS", "MIN_CROP_SIDE", "BBoxShiftRange", "BackendRegistry", "FaceResult", "FaceSizeWarning",
           "FaceTrack", "FaceTracker", "FaceTracks", "Track", "LandmarkBackend", "bbox_shift_range", "crop_box",
           "crop_box_with_source", "find_tracks", "get_backend", "smooth_boxes", "track", "user_boxes"]
