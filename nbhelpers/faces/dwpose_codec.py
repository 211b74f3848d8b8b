"""DWPose (RTMPose-l whole-body, 384x288) pre- and post-processing maths, shared by the landmark backends.

The official top-down path with the whole frame as the person box (docs/official-behaviour.md §3.1), in NumPy and
OpenCV; the 68 face landmarks are whole-body keypoints 23..90.
"""

from __future__ import annotations

import functools

import numpy as np

# Model input size as (width, height) in pixels (SimCC codec ``input_size``).
# Source: rtmpose-l_8xb32-270e_coco-ubody-wholebody-384x288.py:44-50.
INPUT_SIZE: tuple[int, int] = (288, 384)
SIMCC_SPLIT_RATIO: float = 2.0  # SimCC bins per input pixel. Source: rtmpose-...py:44-50.
# The person box is enlarged by this factor (GetBBoxCenterScale default). Source: [mmpose]
# datasets/transforms/common_transforms.py:51.
BBOX_PADDING: float = 1.25
# Data-preprocessor normalisation, in RGB order (applied after BGR -> RGB). Source: rtmpose-...py:55-59.
MEAN_RGB: tuple[float, float, float] = (123.675, 116.28, 103.53)
STD_RGB: tuple[float, float, float] = (58.395, 57.12, 57.375)
# COCO-WholeBody keypoint count and the face block (iBUG-68 order). Source: preprocessing.py:99-101.
NUM_KEYPOINTS: int = 133
FACE_START: int = 23
FACE_STOP: int = 91  # exclusive: whole-body 23..90

SIMCC_X_BINS: int = int(INPUT_SIZE[0] * SIMCC_SPLIT_RATIO)  # length of the SimCC x vector: 576 bins
SIMCC_Y_BINS: int = int(INPUT_SIZE[1] * SIMCC_SPLIT_RATIO)  # y: 768 bins


@functools.lru_cache(maxsize=1)
def coco_wholebody_flip_indices() -> tuple[int, ...]:
    """Index of the mirror keypoint of each of the 133 COCO-WholeBody keypoints (an involution). Source: mmpose's
    ``coco_wholebody.py`` ``flip_indices``, used at ``[mmpose] rtmcc_head.py:193-208``."""
    pairs = [(left, left + 1) for left in range(1, 17, 2)]  # body: (1,2) eyes ... (15,16) ankles; 0 (nose) stays
    pairs += [(17 + k, 20 + k) for k in range(3)]            # feet: 17..19 left, 20..22 right
    face = [(k, 16 - k) for k in range(8)]                   # iBUG-68 jaw, 8 is the chin
    face += [(17 + k, 26 - k) for k in range(5)]             # brows
    face += [(31, 35), (32, 34)]                             # nose base
    face += [(36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)]  # eyes
    face += [(48, 54), (49, 53), (50, 52), (55, 59), (56, 58)]  # outer lips
    face += [(60, 64), (61, 63), (65, 67)]                   # inner lips
    pairs += [(FACE_START + a, FACE_START + b) for a, b in face]
    pairs += [(91 + k, 112 + k) for k in range(21)]          # hands: 91..111 left, 112..132 right
    flip = list(range(NUM_KEYPOINTS))
    for a, b in pairs:
        flip[a], flip[b] = b, a
    return tuple(flip)


def frame_center_scale(width: int, height: int,
                       input_size: tuple[int, int] = INPUT_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Centre ``(cx, cy)`` and size ``(w, h)``, (2,) float32 frame pixels, of the whole frame as person box, enlarged
    by :data:`BBOX_PADDING`, then one side enlarged so that w / h is the aspect of ``input_size``. Source:
    ``preprocessing.py:97``; ``[mmpose] apis/inference.py:162-166``, ``common_transforms.py:51``,
    ``topdown_transforms.py:56-70``."""
    center = np.array([width * 0.5, height * 0.5], dtype=np.float32)
    scale = np.array([width, height], dtype=np.float32) * np.float32(BBOX_PADDING)
    aspect = input_size[0] / input_size[1]
    w, h = scale[0:1], scale[1:2]
    return center, np.concatenate([w, w / aspect] if w > h * aspect else [h * aspect, h]).astype(np.float32)


def warp_matrix(center: np.ndarray, scale: np.ndarray, output_size: tuple[int, int]) -> np.ndarray:
    """(2, 3) float64 ``cv2.warpAffine`` matrix ``[[s, 0, tx], [0, s, ty]]`` mapping the box (``center``, ``scale``
    (w, h), not rotated: DWPose's rotation is 0) onto an ``output_size`` (w, h) input: ``s = out_w / w``,
    ``t = out_centre - s * centre`` (``[mmpose] topdown_transforms.py:89,113-118``, ``get_warp_matrix``, no UDP)."""
    out_w, out_h = float(output_size[0]), float(output_size[1])
    s = out_w / float(scale[0])
    t = np.array([out_w * 0.5, out_h * 0.5]) - s * np.array([float(center[0]), float(center[1])])
    return np.array([[s, 0.0, t[0]], [0.0, s, t[1]]], dtype=np.float64)


def warp_frames(frames_bgr, input_size: tuple[int, int] = INPUT_SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(warped, centers, scales)`` of N >= 1 (H, W, 3) uint8 BGR frames (any sizes), each its own person box
    (:func:`frame_center_scale`) warped (bilinear, black outside) to the input: (N, h, w, 3) uint8 BGR and (N, 2)
    float32 frame pixels. Source: ``[mmpose] topdown_transforms.py:113-118``."""
    import cv2

    boxes = [frame_center_scale(f.shape[1], f.shape[0], input_size) for f in frames_bgr]
    size = (int(input_size[0]), int(input_size[1]))
    warped = [cv2.warpAffine(f, warp_matrix(c, s, input_size), size, flags=cv2.INTER_LINEAR)
              for f, (c, s) in zip(frames_bgr, boxes, strict=True)]
    return np.stack(warped), np.stack([c for c, _ in boxes]), np.stack([s for _, s in boxes])


def normalize(inputs_bgr: np.ndarray) -> np.ndarray:
    """(N, h, w, 3) uint8 BGR -> (N, 3, h, w) float32 RGB ``(x - MEAN_RGB) / STD_RGB`` (``rtmpose-….py:55-59``)."""
    x = np.ascontiguousarray(inputs_bgr[..., ::-1], dtype=np.float32)
    x -= np.asarray(MEAN_RGB, dtype=np.float32)
    x /= np.asarray(STD_RGB, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def merge_flip(simcc: tuple[np.ndarray, np.ndarray], simcc_flipped: tuple[np.ndarray, np.ndarray],
               flip_indices: tuple[int, ...] | list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The plain (N, K, Wx), (N, K, Wy) ``(simcc_x, simcc_y)`` averaged with the flipped input's mapped back (keypoint
    k takes its mirror's per ``flip_indices``, default COCO-WholeBody; x reversed along its bins), ``(a + b) * 0.5``
    in float32 (``[mmpose] models/utils/tta.py``, ``rtmcc_head.py:193-208``)."""
    idx = np.asarray(coco_wholebody_flip_indices() if flip_indices is None else flip_indices)
    fx, fy = simcc_flipped[0][:, idx, ::-1], simcc_flipped[1][:, idx]
    return ((simcc[0] + fx) * 0.5).astype(np.float32), ((simcc[1] + fy) * 0.5).astype(np.float32)


def decode_simcc(simcc_x: np.ndarray, simcc_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SimCC vectors (N, K, Wx), (N, K, Wy) -> ``(keypoints, scores)``: (N, K, 2) float32 ``(x, y)`` input pixels, the
    first argmax bin / :data:`SIMCC_SPLIT_RATIO` (bin -1 where the score is <= 0), and (N, K) float32, the smaller peak
    (``[mmpose] codecs/simcc_label.py:156,173``, ``codecs/utils/post_processing.py:79-88``)."""
    simcc_x, simcc_y = np.asarray(simcc_x), np.asarray(simcc_y)
    locs = np.stack([np.argmax(simcc_x, axis=-1), np.argmax(simcc_y, axis=-1)], axis=-1).astype(np.float32)
    scores = np.minimum(np.max(simcc_x, axis=-1), np.max(simcc_y, axis=-1)).astype(np.float32)
    locs[scores <= 0] = -1.0
    return locs / np.float32(SIMCC_SPLIT_RATIO), scores


def to_frame(keypoints: np.ndarray, centers: np.ndarray, scales: np.ndarray,
             input_size: tuple[int, int] = INPUT_SIZE) -> np.ndarray:
    """(N, K, 2) keypoints from input to frame pixels, float32: ``kp / input_size * scale + center - scale / 2``
    (``[mmpose] models/pose_estimators/topdown.py:150-155``)."""
    size = np.asarray(input_size, dtype=np.float32)
    c = np.asarray(centers, dtype=np.float32)[:, None, :]
    s = np.asarray(scales, dtype=np.float32)[:, None, :]
    return (np.asarray(keypoints, dtype=np.float32) / size * s + c - 0.5 * s).astype(np.float32)


def face_landmarks(keypoints: np.ndarray) -> np.ndarray:
    """The (..., 68, 2) iBUG-order face landmarks (a view) of (..., 133, 2) whole-body keypoints, points 23..90
    (``preprocessing.py:99-101``)."""
    return keypoints[..., FACE_START:FACE_STOP, :]
