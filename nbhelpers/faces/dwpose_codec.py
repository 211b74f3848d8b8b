"""DWPose (RTMPose-l whole-body, 384x288) pre- and post-processing maths, shared by the ONNX and mmpose backends.

The official pipeline runs mmpose's top-down path with no person box (reference §3.1). Per frame:

1. person box = the whole frame ``[0, 0, W, H]``; centre = its middle, scale = its size x 1.25 (padding);
2. the scale is widened or heightened so that w/h = 288/384 = 0.75 (nothing is cut);
3. an affine warp (rotation 0) maps that box onto the 288x384 model input (``cv2.warpAffine``, bilinear, black
   border);
4. BGR -> RGB, then ``(x - mean) / std`` per channel;
5. the network gives SimCC vectors: for each of the 133 keypoints a (576,) x vector and a (768,) y vector
   (two bins per input pixel);
6. flip test: the same on the horizontally flipped input; its vectors are mapped back (keypoint k takes the
   vectors of its mirror keypoint, and the x vector is reversed) and averaged with the plain ones;
7. decoding: argmax bin of each vector; a keypoint whose peak value is <= 0 gets bin -1; bins / 2 -> input pixels;
8. back-projection to the frame: ``kp / input_size * scale + centre - scale / 2``.

The 68 face landmarks are whole-body keypoints 23..90 (iBUG 300-W order).

Everything here is NumPy + OpenCV, so both backends share one description of the maths and tests can check it
against independent computations. Nothing here imports torch or onnxruntime.
"""

from __future__ import annotations

import functools
import math

import numpy as np

# Model input size as (width, height) in pixels (SimCC codec ``input_size``).
# Source: rtmpose-l_8xb32-270e_coco-ubody-wholebody-384x288.py:44-50 (reference §3.1).
INPUT_SIZE: tuple[int, int] = (288, 384)
# SimCC bins per input pixel. Source: rtmpose-...py:44-50.
SIMCC_SPLIT_RATIO: float = 2.0
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
NUM_FACE_LANDMARKS: int = FACE_STOP - FACE_START  # 68

# Length of the SimCC x and y vectors: 576 and 768 bins.
SIMCC_X_BINS: int = int(INPUT_SIZE[0] * SIMCC_SPLIT_RATIO)
SIMCC_Y_BINS: int = int(INPUT_SIZE[1] * SIMCC_SPLIT_RATIO)


# --------------------------------------------------------------------------------------------- flip indices

def _ibug68_mirror() -> list[int]:
    """Mirror partner of each iBUG-68 point (0-based), from the 300-W point definitions.

    Jaw 0..16 runs from the right of the image subject's face to the left, so point k pairs with 16-k.
    Brows 17..21 and 22..26 pair end to end (17<->26 ... 21<->22). Nose bridge 27..30 lies on the midline.
    Nose base 31..35 pairs 31<->35, 32<->34, 33 on the midline. Eyes: the right eye 36..41 (outer corner, two
    upper points, inner corner, two lower points) pairs with the left eye 42..47 read from its outer corner
    45: 36<->45, 37<->44, 38<->43, 39<->42, 40<->47, 41<->46. Outer lips 48..59: corners 48<->54, upper lip
    49<->53, 50<->52 with 51 on the midline, lower lip 55<->59, 56<->58 with 57 on the midline. Inner lips 60..67:
    corners 60<->64, upper 61<->63 with 62 on the midline, lower 65<->67 with 66 on the midline.
    """
    pairs = [(k, 16 - k) for k in range(8)]                       # jaw, 8 is the chin
    pairs += [(17 + k, 26 - k) for k in range(5)]                 # brows
    pairs += [(31, 35), (32, 34)]                                 # nose base
    pairs += [(36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)]  # eyes
    pairs += [(48, 54), (49, 53), (50, 52), (55, 59), (56, 58)]   # outer lips
    pairs += [(60, 64), (61, 63), (65, 67)]                       # inner lips
    mirror = list(range(68))
    for a, b in pairs:
        mirror[a], mirror[b] = b, a
    return mirror


@functools.lru_cache(maxsize=1)
def coco_wholebody_flip_indices() -> tuple[int, ...]:
    """Index of the mirror keypoint of each of the 133 COCO-WholeBody keypoints.

    Built from the public COCO-WholeBody definition: body 0..16 (COCO: nose, then left/right eye, ear, shoulder,
    elbow, wrist, hip, knee, ankle, each left at an odd index and right at the next even one), feet 17..22
    (left big toe, small toe, heel, then the same on the right), face 23..90 (iBUG-68, see ``_ibug68_mirror``),
    left hand 91..111 and right hand 112..132 (same 21-point order, so hand point i pairs with i +/- 21).

    Returns:
        A tuple of 133 ints, an involution (``f[f[k]] == k``). ``flip_indices[k]`` is the keypoint whose
        position, mirrored, is keypoint k's.

    Source: the COCO-WholeBody ``flip_indices`` that mmpose reads from ``configs/_base_/datasets/coco_wholebody.py``
    (reference §3.1, `[mmpose] models/heads/coord_cls_heads/rtmcc_head.py:193-208`).
    """
    flip = list(range(NUM_KEYPOINTS))

    def swap(a: int, b: int) -> None:
        flip[a], flip[b] = b, a

    for left in range(1, 17, 2):          # body: (1,2) eyes ... (15,16) ankles; 0 (nose) stays
        swap(left, left + 1)
    for k in range(3):                    # feet: 17..19 left, 20..22 right
        swap(17 + k, 20 + k)
    for k, m in enumerate(_ibug68_mirror()):
        flip[FACE_START + k] = FACE_START + m
    for k in range(21):                   # hands: 91..111 left, 112..132 right
        swap(91 + k, 112 + k)
    return tuple(flip)


# ------------------------------------------------------------------------------------------ affine geometry

def fix_aspect_ratio(scale: np.ndarray, aspect_ratio: float) -> np.ndarray:
    """Enlarge a box size so that width / height equals ``aspect_ratio`` (never shrinks a side).

    Args:
        scale: (..., 2) box sizes ``(w, h)`` in pixels.
        aspect_ratio: Wanted w / h (0.75 for a 288x384 input).

    Returns:
        (..., 2) sizes, same dtype: ``(w, w / a)`` where ``w > h * a``, else ``(h * a, h)``.

    Source: `[mmpose] datasets/transforms/topdown_transforms.py:56-70` (reference §3.1).
    """
    scale = np.asarray(scale)
    w, h = scale[..., 0:1], scale[..., 1:2]
    wide = np.concatenate([w, w / aspect_ratio], axis=-1)
    tall = np.concatenate([h * aspect_ratio, h], axis=-1)
    return np.where(w > h * aspect_ratio, wide, tall).astype(scale.dtype)


def frame_center_scale(width: int, height: int, padding: float = BBOX_PADDING,
                       input_size: tuple[int, int] = INPUT_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Centre and (aspect-fixed) scale of the whole-frame person box, as the official no-bbox call uses.

    Args:
        width: Frame width in pixels.
        height: Frame height in pixels.
        padding: Box enlargement factor (1.25 officially).
        input_size: Model input ``(w, h)`` in pixels, fixing the aspect ratio w/h.

    Returns:
        ``(center, scale)``: (2,) float32 ``(cx, cy)`` and (2,) float32 ``(w, h)`` in frame pixels. Float32 like
        mmpose, which builds the box as a float32 array.

    Source: `preprocessing.py:97`, `[mmpose] apis/inference.py:162-166`, `common_transforms.py:51`,
    `topdown_transforms.py:56-70` (reference §3.1).
    """
    box = np.array([0, 0, width, height], dtype=np.float32)
    center = np.array([(box[0] + box[2]) * 0.5, (box[1] + box[3]) * 0.5], dtype=np.float32)
    scale = np.array([box[2] - box[0], box[3] - box[1]], dtype=np.float32) * np.float32(padding)
    scale = fix_aspect_ratio(scale, input_size[0] / input_size[1])
    return center, scale


def warp_matrix(center: np.ndarray, scale: np.ndarray, output_size: tuple[int, int],
                rotation_deg: float = 0.0) -> np.ndarray:
    """Affine matrix that maps a box (centre, size, rotation) of the frame onto the model input.

    The box centre goes to the middle of the output, and the box width to the output width (a similarity:
    the same factor ``s = out_w / box_w`` on both axes, which is exact because the box aspect is already fixed).
    A box rotated by ``rotation_deg`` (counter-clockwise in x-right/y-down pixel axes, mmpose's convention) is
    turned upright: ``A = s * [[cos r, sin r], [-sin r, cos r]]``, ``t = out_centre - A @ centre``.

    Args:
        center: (2,) ``(cx, cy)`` in frame pixels.
        scale: (2,) box ``(w, h)`` in frame pixels (only w sets the factor).
        output_size: ``(w, h)`` of the model input in pixels (288, 384).
        rotation_deg: Box rotation in degrees (0 in the official pipeline).

    Returns:
        (2, 3) float64 matrix for ``cv2.warpAffine`` (frame -> input pixels).

    Source: `[mmpose] datasets/transforms/topdown_transforms.py:89,113-118` (``get_warp_matrix`` with
    ``fix_aspect_ratio``, no UDP) (reference §3.1). mmpose builds the same matrix from three float32 points with
    ``cv2.getAffineTransform``; the two agree to float32 rounding (< 1e-4 pixel).
    """
    cx, cy = float(center[0]), float(center[1])
    out_w, out_h = float(output_size[0]), float(output_size[1])
    s = out_w / float(scale[0])
    r = math.radians(rotation_deg)
    cos_r, sin_r = math.cos(r), math.sin(r)
    a = np.array([[s * cos_r, s * sin_r], [-s * sin_r, s * cos_r]], dtype=np.float64)
    t = np.array([out_w * 0.5, out_h * 0.5]) - a @ np.array([cx, cy])
    return np.concatenate([a, t[:, None]], axis=1)


def warp_frame(frame_bgr: np.ndarray, center: np.ndarray, scale: np.ndarray,
               input_size: tuple[int, int] = INPUT_SIZE) -> np.ndarray:
    """Cut the (centre, scale) box out of a frame and resize it to the model input, as mmpose's TopdownAffine.

    Args:
        frame_bgr: (H, W, 3) uint8 BGR frame.
        center: (2,) box centre in frame pixels.
        scale: (2,) aspect-fixed box size in frame pixels.
        input_size: Output ``(w, h)`` in pixels.

    Returns:
        (input_h, input_w, 3) uint8 BGR; outside the frame is black (0).

    Source: `[mmpose] datasets/transforms/topdown_transforms.py:113-118` (warpAffine, INTER_LINEAR).
    """
    import cv2

    mat = warp_matrix(center, scale, input_size)
    return cv2.warpAffine(frame_bgr, mat, (int(input_size[0]), int(input_size[1])), flags=cv2.INTER_LINEAR)


def normalize(inputs_bgr: np.ndarray) -> np.ndarray:
    """BGR uint8 images -> the network's input tensor (RGB, mean/std normalised, channels first).

    Args:
        inputs_bgr: (N, h, w, 3) uint8 BGR (already warped to the input size).

    Returns:
        (N, 3, h, w) float32, RGB channel order, ``(x - MEAN_RGB) / STD_RGB``.

    Source: rtmpose-...py:55-59 (``bgr_to_rgb=True``, mean, std) (reference §3.1).
    """
    x = np.ascontiguousarray(inputs_bgr[..., ::-1], dtype=np.float32)
    x -= np.asarray(MEAN_RGB, dtype=np.float32)
    x /= np.asarray(STD_RGB, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def prepare_inputs(frames_bgr: np.ndarray | list[np.ndarray], input_size: tuple[int, int] = INPUT_SIZE,
                   padding: float = BBOX_PADDING) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whole-frame person box, warp and normalisation for a batch of frames (steps 1-4 of the module doc).

    Args:
        frames_bgr: (N, H, W, 3) uint8 BGR frames, or a list of (H_i, W_i, 3) frames of any sizes.
        input_size: Model input ``(w, h)`` in pixels.
        padding: Person-box padding factor.

    Returns:
        ``(inputs, centers, scales)``: (N, 3, h, w) float32 normalised RGB, (N, 2) float32 box centres and
        (N, 2) float32 aspect-fixed box sizes in frame pixels (needed to map the keypoints back).

    Source: `preprocessing.py:97` with `[mmpose] apis/inference.py:162-166`, `common_transforms.py:51`,
    `topdown_transforms.py:56-70,113-118`, rtmpose-...py:55-59 (reference §3.1).
    """
    warped, centers, scales = [], [], []
    for frame in frames_bgr:
        h, w = frame.shape[:2]
        c, s = frame_center_scale(w, h, padding, input_size)
        warped.append(warp_frame(frame, c, s, input_size))
        centers.append(c)
        scales.append(s)
    if not warped:
        return (np.zeros((0, 3, input_size[1], input_size[0]), np.float32), np.zeros((0, 2), np.float32),
                np.zeros((0, 2), np.float32))
    return normalize(np.stack(warped)), np.stack(centers), np.stack(scales)


# ----------------------------------------------------------------------------------------- SimCC decoding

def flip_simcc_back(simcc_x: np.ndarray, simcc_y: np.ndarray,
                    flip_indices: tuple[int, ...] | list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Map SimCC vectors of the horizontally flipped input back to the unflipped keypoint order and x axis.

    Keypoint k takes the vectors of its mirror keypoint ``flip_indices[k]``; the x vector is then reversed along
    its bins (bin b <-> bin ``Wx - 1 - b``). No further shift is applied (mmpose does none for SimCC).

    Args:
        simcc_x: (N, K, Wx) float x vectors of the flipped input.
        simcc_y: (N, K, Wy) float y vectors of the flipped input.
        flip_indices: K ints; default COCO-WholeBody (K = 133).

    Returns:
        ``(simcc_x, simcc_y)`` in the unflipped frame of reference, same shapes and dtypes.

    Source: `[mmpose] models/utils/tta.py` ``flip_vectors``, used at `rtmcc_head.py:193-208` (reference §3.1).
    """
    idx = np.asarray(coco_wholebody_flip_indices() if flip_indices is None else flip_indices)
    return simcc_x[:, idx, ::-1], simcc_y[:, idx]


def merge_flip(simcc: tuple[np.ndarray, np.ndarray], simcc_flipped: tuple[np.ndarray, np.ndarray],
               flip_indices: tuple[int, ...] | list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Average the plain SimCC vectors with those of the flipped input mapped back: ``(a + b) * 0.5``.

    Args:
        simcc: ``(simcc_x (N, K, Wx), simcc_y (N, K, Wy))`` of the plain input.
        simcc_flipped: The same for the horizontally flipped input.
        flip_indices: K ints; default COCO-WholeBody.

    Returns:
        ``(simcc_x, simcc_y)`` averaged, float32.

    Source: `[mmpose] models/heads/coord_cls_heads/rtmcc_head.py:193-208` (reference §3.1).
    """
    fx, fy = flip_simcc_back(simcc_flipped[0], simcc_flipped[1], flip_indices)
    return ((simcc[0] + fx) * 0.5).astype(np.float32), ((simcc[1] + fy) * 0.5).astype(np.float32)


def decode_simcc(simcc_x: np.ndarray, simcc_y: np.ndarray,
                 split_ratio: float = SIMCC_SPLIT_RATIO) -> tuple[np.ndarray, np.ndarray]:
    """SimCC vectors -> keypoints in model-input pixels, and scores.

    The location is the argmax bin of each vector (the first one on ties). The score is the smaller of the two
    peak values. A keypoint whose score is <= 0 gets bin -1 on both axes. Bins are divided by ``split_ratio``.

    Args:
        simcc_x: (N, K, Wx) float x vectors (raw network output, no softmax).
        simcc_y: (N, K, Wy) float y vectors.
        split_ratio: Bins per input pixel (2.0).

    Returns:
        ``(keypoints, scores)``: (N, K, 2) float32 ``(x, y)`` in input pixels (288x384 space; -0.5 for a
        rejected keypoint) and (N, K) float32 scores.

    Source: `[mmpose] codecs/simcc_label.py:156,173`, `codecs/utils/post_processing.py:79-88` (reference §3.1).
    """
    simcc_x = np.asarray(simcc_x)
    simcc_y = np.asarray(simcc_y)
    locs = np.stack([np.argmax(simcc_x, axis=-1), np.argmax(simcc_y, axis=-1)], axis=-1).astype(np.float32)
    scores = np.minimum(np.max(simcc_x, axis=-1), np.max(simcc_y, axis=-1)).astype(np.float32)
    locs[scores <= 0] = -1.0
    return locs / np.float32(split_ratio), scores


def to_frame(keypoints: np.ndarray, centers: np.ndarray, scales: np.ndarray,
             input_size: tuple[int, int] = INPUT_SIZE) -> np.ndarray:
    """Map keypoints from model-input pixels back to frame pixels.

    ``kp_frame = kp_input / input_size * scale + center - 0.5 * scale`` (rotation 0).

    Args:
        keypoints: (N, K, 2) ``(x, y)`` in input pixels.
        centers: (N, 2) box centres in frame pixels.
        scales: (N, 2) aspect-fixed box sizes in frame pixels.
        input_size: ``(w, h)`` of the model input.

    Returns:
        (N, K, 2) float32 ``(x, y)`` in frame pixels (not rounded).

    Source: `[mmpose] models/pose_estimators/topdown.py:150-155` (reference §3.1).
    """
    size = np.asarray(input_size, dtype=np.float32)
    c = np.asarray(centers, dtype=np.float32)[:, None, :]
    s = np.asarray(scales, dtype=np.float32)[:, None, :]
    return (np.asarray(keypoints, dtype=np.float32) / size * s + c - 0.5 * s).astype(np.float32)


def face_landmarks(keypoints: np.ndarray) -> np.ndarray:
    """The 68 iBUG-order face landmarks of whole-body keypoints: points 23..90.

    Args:
        keypoints: (..., 133, 2) whole-body keypoints.

    Returns:
        (..., 68, 2) view of the face points, same dtype.

    Source: `preprocessing.py:99-101` (reference §3.1).
    """
    return keypoints[..., FACE_START:FACE_STOP, :]
