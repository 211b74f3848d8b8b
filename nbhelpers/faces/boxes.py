"""Crop boxes from landmarks: the official MuseTalk rules, then the fixes for its known bugs (numpy only).

A box ``(x1, y1, x2, y2)`` in full-frame pixels (x right, y down) is ``frame[y1:y2, x1:x2]``. ``lm[k]`` is face
point k of the 68 in iBUG 300-W order (DWPose whole-body points 23..90); lm[28..30] lie on the nose bridge.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..constants import VERSIONS
from ..errors import InputError, NoFaceError, plural

MIN_CROP_SIDE = 16  # pixels: the smallest crop side we hand to the 256-px resize (a fix; the official has none)
N_LANDMARKS = 68  # face points in iBUG 300-W order

__all__ = ["MIN_CROP_SIDE", "BBoxShiftRange", "bbox_shift_range", "crop_box", "crop_box_with_source", "single_box",
           "smooth_boxes", "user_boxes"]


def _frame_hw(frame_shape: Any) -> tuple[int, int]:
    try:
        shape = tuple(int(v) for v in frame_shape)
    except (TypeError, ValueError):
        raise InputError(f"frame_shape must be (H, W) or (H, W, 3) in pixels; got {frame_shape!r}.") from None
    if len(shape) not in (2, 3) or shape[0] < 1 or shape[1] < 1:
        raise InputError(f"frame_shape must be (H, W) or (H, W, 3) with H, W >= 1 pixels; got {frame_shape!r}.")
    return shape[0], shape[1]


def _landmarks_int(landmarks: Any) -> np.ndarray:
    lm = np.asarray(landmarks, dtype=np.float64)
    if lm.shape != (N_LANDMARKS, 2):
        raise InputError(f"landmarks must have shape (68, 2) as (x, y) pixels in iBUG 300-W order; got shape "
                         f"{lm.shape}. Pass one frame's landmarks (e.g. FaceTrack.landmarks[i]).")
    if not np.isfinite(lm).all():
        raise InputError("landmarks contain NaN or inf (a frame with no face?); crop_box needs the 68 points of a "
                         "detected face. Skip frames whose has_face is False.")
    # The official casts the keypoints to int32, which truncates towards zero (preprocessing.py:99-101).
    return lm.astype(np.int32)


def _official_face_box(face_box: Any) -> tuple[int, int, int, int]:
    """The detector box as the official returns S3FD's: clipped to >= 0, then int-truncated (api.py:76-84)."""
    fb = np.asarray(face_box, dtype=np.float64).reshape(-1)
    if fb.shape != (4,) or not np.isfinite(fb).all():
        raise InputError(f"face_box must be 4 finite numbers (x1, y1, x2, y2) in pixels; got {face_box!r}.")
    x1, y1, x2, y2 = (int(max(0.0, float(v))) for v in fb)
    return x1, y1, x2, y2


def _grow_side(lo: int, hi: int, size: int, limit: int) -> tuple[int, int]:
    """Widen [lo, hi) about its centre to at least ``size`` pixels, then slide it back inside [0, limit)."""
    size = min(size, limit)
    if hi - lo >= size:
        return lo, hi
    deficit = size - (hi - lo)
    lo -= deficit // 2
    hi += deficit - deficit // 2
    if lo < 0:
        hi, lo = hi - lo, 0
    if hi > limit:
        lo, hi = lo - (hi - limit), limit
    return max(lo, 0), hi


def crop_box_with_source(landmarks: Any, face_box: Any, frame_shape: Any, version: str = "v15",
                         bbox_shift: int = 0, extra_margin: int = 10) -> tuple[tuple[int, int, int, int], str]:
    """``(box, source)``: :func:`crop_box`, and ``"face_box"`` when the detector box was used (the official fallback,
    or a clamped landmark box under :data:`MIN_CROP_SIDE`), else ``"landmarks"``. InputError as :func:`crop_box`."""
    if version not in VERSIONS:
        raise InputError(f"version must be one of {', '.join(map(repr, VERSIONS))}; got {version!r}.")
    height, width = _frame_hw(frame_shape)
    lm = _landmarks_int(landmarks)

    # Official rules (preprocessing.py:113-132). The shift edits lm[29] in place, so the shifted value also takes
    # part in the max-y below (quirk Q16), as in the official code.
    if bbox_shift:
        lm[29, 1] += int(bbox_shift)
    nose_y = int(lm[29, 1])
    max_y = int(lm[:, 1].max())
    half_dist = max_y - nose_y
    y1 = int(max(0, nose_y - half_dist))
    box = (int(lm[:, 0].min()), y1, int(lm[:, 0].max()), max_y)
    source = "landmarks"
    if box[3] - box[1] <= 0 or box[2] - box[0] <= 0 or box[0] < 0:
        if face_box is None:
            raise InputError(f"the landmark box {box} is degenerate or starts left of the frame, and no face_box "
                             "was given to fall back on (the official uses the S3FD box). Pass the detector box.")
        box, source = _official_face_box(face_box), "face_box"

    def finish(b: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        x1_, y1_, x2_, y2_ = b
        if version == "v15":  # inference.py:170-172: y2 = min(y2 + extra_margin, H)
            y2_ = min(y2_ + int(extra_margin), height)
        # fix of Q17: all four sides inside the frame
        return min(max(x1_, 0), width), min(max(y1_, 0), height), min(max(x2_, 0), width), min(max(y2_, 0), height)

    out = finish(box)
    thin = out[2] - out[0] < MIN_CROP_SIDE or out[3] - out[1] < MIN_CROP_SIDE
    if source == "landmarks" and thin and face_box is not None:
        # Fix: a landmark box that lies mostly outside the frame falls back to the detector box.
        fallback = finish(_official_face_box(face_box))
        if fallback[2] - fallback[0] >= out[2] - out[0] and fallback[3] - fallback[1] >= out[3] - out[1]:
            out, source = fallback, "face_box"
    x1, y1, x2, y2 = out
    x1, x2 = _grow_side(x1, x2, MIN_CROP_SIDE, width)  # fix: a minimum crop size
    y1, y2 = _grow_side(y1, y2, MIN_CROP_SIDE, height)
    return (int(x1), int(y1), int(x2), int(y2)), source


def crop_box(landmarks: Any, face_box: Any, frame_shape: Any, version: str = "v15", bbox_shift: int = 0,
             extra_margin: int = 10) -> tuple[int, int, int, int]:
    """The crop box MuseTalk cuts from one frame: the official rules (docs/official-behaviour.md §3.3), the in-place
    shift of lm[29] included (quirk Q16), then fixes: the sides are clamped to the frame (quirk Q17), a clamped
    landmark box thinner than :data:`MIN_CROP_SIDE` falls back to a larger detector box, and each side is at least
    :data:`MIN_CROP_SIDE` pixels.

    ``landmarks`` are (68, 2) ``(x, y)`` full-frame pixels in iBUG 300-W order; ``face_box`` the (4,) detector box
    ``(x1, y1, x2, y2)`` (the fallback) or None; ``frame_shape`` ``(H, W)`` or ``(H, W, 3)``; ``version`` ``"v15"``
    or ``"v1"``; ``bbox_shift`` pixels are added to lm[29].y (positive moves the mask boundary down: more mouth);
    ``extra_margin`` pixels to the bottom edge for v15, clipped to the frame. Returns ``(x1, y1, x2, y2)`` Python
    ints, ``0 <= x1 < x2 <= W``, ``0 <= y1 < y2 <= H``. InputError for landmarks not (68, 2) or not finite, a bad
    frame_shape or version, or a fallback needed with ``face_box=None``.

    Source: ``preprocessing.py:84-137``, ``inference.py:170-172``."""
    box, _ = crop_box_with_source(landmarks, face_box, frame_shape, version, bbox_shift, extra_margin)
    return box


class BBoxShiftRange(NamedTuple):
    """The official "Manually adjust range" of ``bbox_shift``, printed as ``[ -minus~plus ]``, in pixels.

    ``minus`` is ``int(mean(lm[30].y - lm[29].y))`` and ``plus`` ``int(mean(lm[29].y - lm[28].y))`` over the frames
    with a face. The official labels are swapped (quirk Q15): the shifts that move the boundary to lm[28] and lm[30] are
    ``[-plus, +minus]`` (:attr:`geometric`)."""

    minus: int
    plus: int

    @property
    def geometric(self) -> tuple[int, int]:
        """``(-plus, minus)``: the shifts that move the boundary to lm[28] (up) and to lm[30] (down), pixels."""
        return -self.plus, self.minus

    def __str__(self) -> str:
        up, down = self.geometric
        return (f"[ -{self.minus}~{self.plus} ] (official label; the boundary reaches landmark 28 at "
                f"bbox_shift={up} and landmark 30 at bbox_shift=+{down})")


def bbox_shift_range(landmarks_per_frame: Any) -> BBoxShiftRange:
    """The official :class:`BBoxShiftRange` of unshifted landmarks, (N, 68, 2) pixels with all-NaN rows for no face
    (or (68, 2) arrays and None). InputError for a wrong shape; NoFaceError when no frame has a face (the official
    divides by zero). Source: ``preprocessing.py:114-117,134-136``."""
    frames: list[np.ndarray] = []
    items = list(landmarks_per_frame)
    for i, lm in enumerate(items):
        if lm is None:
            continue
        arr = np.asarray(lm, dtype=np.float64)
        if arr.shape != (N_LANDMARKS, 2):
            raise InputError(f"landmarks_per_frame[{i}] must have shape (68, 2); got {arr.shape}.")
        if np.isnan(arr).all():
            continue
        frames.append(_landmarks_int(arr))
    if not frames:
        raise NoFaceError(f"no face found in the {plural(len(items), 'frame')}, so there is no bbox_shift range to "
                          "compute.")
    lm = np.stack(frames)
    range_minus = lm[:, 30, 1] - lm[:, 29, 1]
    range_plus = lm[:, 29, 1] - lm[:, 28, 1]
    return BBoxShiftRange(int(float(np.mean(range_minus))), int(float(np.mean(range_plus))))


def smooth_boxes(boxes: Any, has_face: Any, window: int, frame_shape: Any) -> np.ndarray:
    """(N, 4) crop ``boxes`` smoothed over time: (N, 4) int32, -1 rows where ``has_face`` (N,) is False. Each
    coordinate of frame i becomes the mean over frames ``i - (window - 1) // 2 .. i + window // 2`` of its run of face
    frames, rounded and clamped to ``frame_shape`` (H, W); a ``window`` of 0 or 1 changes nothing. InputError for a
    negative window or mismatched shapes."""
    arr = np.asarray(boxes, dtype=np.float64)
    mask = np.asarray(has_face, dtype=bool)
    if arr.ndim != 2 or arr.shape[1] != 4 or mask.shape != (arr.shape[0],):
        raise InputError(f"boxes must be (N, 4) and has_face (N,); got {arr.shape} and {mask.shape}.")
    if int(window) < 0:
        raise InputError(f"smooth_boxes window must be >= 0 frames; got {window!r}.")
    out = np.full(arr.shape, -1, dtype=np.int32)
    if int(window) <= 1:
        out[mask] = arr[mask].astype(np.int32)
        return out
    height, width = _frame_hw(frame_shape)
    before, after = (int(window) - 1) // 2, int(window) // 2
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    for i, j in zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0], strict=True):
        run = arr[i:j]  # one run of consecutive frames with a face: [i, j)
        csum = np.vstack([np.zeros((1, 4)), np.cumsum(run, axis=0)])
        idx = np.arange(j - i)
        lo = np.maximum(idx - before, 0)
        hi = np.minimum(idx + after + 1, j - i)
        mean = (csum[hi] - csum[lo]) / (hi - lo)[:, None]
        rounded = np.floor(mean + 0.5).astype(np.int64)
        rounded[:, 0::2] = np.clip(rounded[:, 0::2], 0, width)
        rounded[:, 1::2] = np.clip(rounded[:, 1::2], 0, height)
        out[i:j] = rounded.astype(np.int32)
    return out


def _is_box(value: Any) -> bool:
    """Whether ``value`` looks like one ``(x1, y1, x2, y2)``: a (4,) array or a sequence of 4 numbers."""
    if isinstance(value, np.ndarray):
        return value.ndim == 1
    return isinstance(value, (list, tuple)) and len(value) == 4 and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in value)


def single_box(boxes: Any) -> Any:
    """The one crop box ``boxes`` gives for the whole clip (a bare ``(x1, y1, x2, y2)``, or a list, tuple or (1, 4)
    array of exactly one box), or None (per-frame entries, ``[None]``, or None); :func:`user_boxes` checks numbers."""
    if _is_box(boxes):
        return boxes
    if isinstance(boxes, np.ndarray):
        return boxes[0] if boxes.ndim == 2 and boxes.shape[0] == 1 else None
    return boxes[0] if isinstance(boxes, (list, tuple)) and len(boxes) == 1 and _is_box(boxes[0]) else None


def user_boxes(boxes: Any, n_frames: int, frame_shape: Any) -> tuple[np.ndarray, np.ndarray]:
    """The user's crop ``boxes`` checked and expanded to ``(crop_boxes, has_face)`` of ``n_frames`` frames of
    ``frame_shape``: (N, 4) int32 with -1 rows for no face, and (N,) bool. ``boxes`` is one ``(x1, y1, x2, y2)`` for
    the clip (:func:`single_box`), or per frame an (N, 4) array (-1 or NaN rows: no face) or N boxes and None;
    full-frame pixels, fractions truncated. InputError for a box outside the frame, inverted or under
    :data:`MIN_CROP_SIDE` pixels, or a per-frame list not of length N.

    Source: the nearest official feature, ``--use_saved_coord``, reuses pickled boxes unchecked
    (``inference.py:151-160``)."""
    height, width = _frame_hw(frame_shape)
    one = single_box(boxes)
    rows: list[Any] = [one] * n_frames if one is not None else list(boxes)
    if len(rows) != n_frames:
        raise InputError(boxes_count_message(len(rows), n_frames, "the clip"))
    out = np.full((n_frames, 4), -1, dtype=np.int32)
    has_face = np.zeros(n_frames, dtype=bool)
    for i, row in enumerate(rows):
        where = "boxes" if one is not None else f"boxes[{i}]"
        if row is None:
            continue
        try:
            vals = np.asarray(row, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise InputError(f"{where} must be (x1, y1, x2, y2) in pixels or None; got {row!r}.") from None
        if vals.shape != (4,):
            raise InputError(f"{where} must be 4 numbers (x1, y1, x2, y2) in pixels; got {row!r}.")
        if np.isnan(vals).all() or (vals == -1).all():
            continue  # "no face" row
        if not np.isfinite(vals).all():
            raise InputError(f"{where} must be finite numbers; got {row!r}.")
        x1, y1, x2, y2 = (int(v) for v in vals)
        if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
            raise InputError(f"{where} = {(x1, y1, x2, y2)} does not fit the frame: the rule is "
                             f"0 <= x1 < x2 <= {width} and 0 <= y1 < y2 <= {height} (frame {width}x{height} "
                             "pixels, x right, y down). Check the order (x1, y1, x2, y2) and the frame size.")
        if x2 - x1 < MIN_CROP_SIDE or y2 - y1 < MIN_CROP_SIDE:
            raise InputError(f"{where} = {(x1, y1, x2, y2)} is {x2 - x1}x{y2 - y1} pixels; each side must be at "
                             f"least {MIN_CROP_SIDE} pixels. Draw it as wide as the face, its bottom at the chin and "
                             "its middle at the nose (its lower half is repainted).")
        out[i] = (x1, y1, x2, y2)
        has_face[i] = True
    return out, has_face


def boxes_count_message(given: int, n_frames: int, where: str) -> str:
    """The refusal of ``given`` per-frame boxes where ``where`` (e.g. ``"the clip"``) has ``n_frames``."""
    return (f"boxes has {given} entries but {where} has {plural(n_frames, 'frame')} at 25 fps. Give one (x1, y1, x2, "
            f"y2) (or a list holding that one box) for every frame, or exactly {plural(n_frames, 'entry', 'entries')}, "
            "a box or None (no face) per frame.")
