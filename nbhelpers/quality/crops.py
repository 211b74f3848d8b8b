"""The face crops SyncNet sees: face boxes per frame (S3FD, a landmark backend or given), smoothed, cut to 224x224.

Source: syncnet_python run_pipeline.py (``inference_video``, ``track_shot``, ``crop_video``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import weights
from ..errors import InputError, NoFaceError
from ..faces.boxes import single_box
from ..faces.registry import S3FD_FILE, get_backend
from ..faces.s3fd import S3FD
from .clip import frame_batches, frame_count

__all__ = ["detect_boxes", "given_boxes", "protocol_crops", "smooth_face_boxes"]

CROP_SIDE = 224  # pixels, side of the face crop SyncNet sees (run_pipeline.py crop_video, cv2.resize)
CROP_SCALE = 0.40  # margin of the crop around the face box (run_pipeline.py --crop_scale)
CROP_PAD_VALUE = 110  # grey level of the padding around the frame (run_pipeline.py np.pad constant 110)
SMOOTH_KERNEL = 13  # frames: median filter over box size and centre (run_pipeline.py signal.medfilt)
FACEDET_SCALE = 0.25  # S3FD runs on frames scaled by this (run_pipeline.py --facedet_scale)
FACEDET_MIN_SCORE = 0.9  # S3FD confidence kept (run_pipeline.py conf_th=0.9)
MAX_MISSED_FRAMES = 25  # frames without a face bridged by interpolation (run_pipeline.py --num_failed_det)


def smooth_face_boxes(boxes: np.ndarray) -> np.ndarray:
    """(N, 3) float64 crop squares ``(s, x, y)`` in pixels from (N, 4) float face ``boxes`` ``(x1, y1, x2, y2)``
    (NaN rows where no face was found), smoothed as the published pipeline does: NaN rows filled by linear
    interpolation, then half-size ``s = max(w, h) / 2`` and centre median-filtered over 13 frames (zero padding at
    the ends, as ``scipy.signal.medfilt``). InputError for a wrong shape or a gap of more than 25 frames without a
    face; NoFaceError for no face in any frame.
    Source: syncnet_python ``run_pipeline.py`` ``track_shot`` and ``crop_video``."""
    import scipy.ndimage

    b = np.asarray(boxes, dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != 4 or b.shape[0] == 0:
        raise InputError(f"boxes must be (N, 4) (x1, y1, x2, y2); got shape {b.shape}.")
    found = np.isfinite(b).all(axis=1)
    if not found.any():
        raise NoFaceError(f"no face found in any of the {b.shape[0]} frames; SyncNet needs the face in view. Pass "
                          "boxes= (x1, y1, x2, y2) to give the face box yourself.")
    idx = np.flatnonzero(found)
    gaps = np.diff(np.concatenate([[-1], idx, [b.shape[0]]])) - 1
    if gaps.max() > MAX_MISSED_FRAMES:
        raise InputError(f"the face is missing for {int(gaps.max())} frames in a row (more than "
                         f"{MAX_MISSED_FRAMES}); the published protocol scores one continuous face track. Trim the "
                         "clip to the part with the face, or pass boxes=.")
    t = np.arange(b.shape[0])
    filled = np.stack([np.interp(t, idx, b[idx, k]) for k in range(4)], axis=1)
    s = np.maximum(filled[:, 3] - filled[:, 1], filled[:, 2] - filled[:, 0]) / 2.0
    cx = (filled[:, 0] + filled[:, 2]) / 2.0
    cy = (filled[:, 1] + filled[:, 3]) / 2.0
    return np.stack([scipy.ndimage.median_filter(v, SMOOTH_KERNEL, mode="constant") for v in (s, cx, cy)], axis=1)


def protocol_crops(frames: np.ndarray, squares: np.ndarray) -> np.ndarray:
    """The (n, 224, 224, 3) uint8 BGR SyncNet crops of (n, H, W, 3) uint8 BGR ``frames`` for (n, 3) ``squares``
    ``(s, x, y)``: rows ``y - s`` to ``y + 1.8 s``, columns ``x - 1.4 s`` to ``x + 1.4 s`` of the frame padded with grey
    110 (indices truncated as published), resized bilinearly. InputError for mismatched shapes or an empty crop.
    Source: syncnet_python ``run_pipeline.py`` ``crop_video``."""
    import cv2

    frames = np.asarray(frames)
    squares = np.asarray(squares, dtype=np.float64)
    if frames.ndim != 4 or frames.shape[-1] != 3 or squares.shape != (frames.shape[0], 3):
        raise InputError(f"frames must be (n, H, W, 3) and squares (n, 3); got {frames.shape} and {squares.shape}.")
    out = np.empty((frames.shape[0], CROP_SIDE, CROP_SIDE, 3), np.uint8)
    cs = CROP_SCALE
    for k, (frame, (s, x, y)) in enumerate(zip(frames, squares, strict=True)):
        pad = int(s * (1 + 2 * cs))
        padded = cv2.copyMakeBorder(frame, pad, pad, pad, pad, cv2.BORDER_CONSTANT, value=(CROP_PAD_VALUE,) * 3)
        my, mx = y + pad, x + pad
        face = padded[int(my - s):int(my + s * (1 + 2 * cs)), int(mx - s * (1 + cs)):int(mx + s * (1 + cs))]
        if face.size == 0:
            raise InputError(f"frame {k}: the face box (half-size {s:.1f} px at ({x:.0f}, {y:.0f})) gives an empty "
                             "crop; check the boxes.")
        out[k] = cv2.resize(face, (CROP_SIDE, CROP_SIDE), interpolation=cv2.INTER_LINEAR)
    return out


def detect_boxes(video: Any, weights_dir: Any, device: Any) -> tuple[np.ndarray, str, list[str]]:
    """``(boxes, detector, notes)``: (N, 4) face boxes (NaN rows for none) from S3FD at scale 0.25 (score > 0.9)
    when its weights are in ``weights_dir``, else from dlib."""
    notes: list[str] = []
    rows: list[np.ndarray] = []
    root = weights.resolve_dir(weights_dir)
    s3fd = (root / S3FD_FILE).is_file()
    if not s3fd:
        notes.append(f"face boxes from dlib because {root / S3FD_FILE} is missing (the protocol uses S3FD; "
                     "LSE values can differ slightly): `python -m nbhelpers download --sets s3fd`")
    net = S3FD(root / S3FD_FILE, device=device) if s3fd else get_backend("dlib", weights_dir=weights_dir, device=device)
    name = "s3fd" if s3fd else str(getattr(net, "name", "dlib"))
    try:
        for batch in frame_batches(video, 16):
            if s3fd:
                side = max(1, round(max(batch.shape[1:3]) * FACEDET_SCALE))
                for dets in net.detections(batch, max_side=max(64, side)):
                    keep = dets[dets[:, 4] > FACEDET_MIN_SCORE]
                    rows.append(keep[0, :4] if len(keep) else np.full(4, np.nan))
            else:
                rows += [np.full(4, np.nan) if found is None else np.asarray(found.face_box, dtype=np.float64)
                         for found in net.detect(batch)]
    finally:
        net.close()
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4), name, notes


def given_boxes(boxes: Any, video: Any) -> np.ndarray:
    """(N, 4) float boxes from ``boxes=``: one box (bare, or a list or (1, 4) array holding just it, as for the
    lip-sync jobs) repeated over the frames of ``video``, or one row per frame (rows of -1 become NaN, no face)."""
    one = single_box(boxes)
    b = np.asarray(boxes if one is None else one, dtype=np.float64)
    if b.shape == (4,):
        return np.tile(b, (frame_count(video), 1))
    if b.ndim != 2 or b.shape[1] != 4:
        raise InputError(f"boxes must be one (x1, y1, x2, y2) or (N, 4) per frame; got shape {b.shape}.")
    b = b.copy()
    b[(b < 0).all(axis=1)] = np.nan  # rows of -1 mean "no face", as in FaceTrack
    return b
