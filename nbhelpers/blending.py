"""Paste-back: put the generated 256x256 face into the original frame through a feathered face-parsing mask.

One description of the maths (official ``musetalk/utils/blending.py``, reference §7.1-7.4), two implementations:
:func:`blend_cpu` (numpy + OpenCV, bit-exact with the official PIL sequence) and :func:`blend_torch` (any torch
device, within 2 grey levels of the CPU path). The material (parsing + feathered masks) likewise has a CPU path,
:func:`prepare_materials`, and a batched torch path on the device, :func:`prepare_materials_torch`, whose resizes,
morphology and blur are integer-exact copies of PIL's and OpenCV's (:mod:`nbhelpers.resample`): given the same
labels its masks equal the CPU ones bit for bit.

The maths, for one frame with crop box ``box = (x1, y1, x2, y2)`` (w = x2 - x1, h = y2 - y1):

1. **Expanded square** (:func:`expanded_square`): ``xc = (x1+x2)//2``, ``yc = (y1+y2)//2``,
   ``s = int(max(w, h)//2 * 1.5)``, ``square = (xc-s, yc-s, xc+s, yc+s)``, side ``2s``.
2. **Material** (once per source frame, cacheable; :func:`prepare_material`): crop the square from the
   *original* frame (black outside the frame, :func:`crop_padded`), parse it with BiSeNet, turn the labels into
   a 0/255 mask (:func:`nbhelpers.parsing.face_mask`), then :func:`prepare_mask`: resize the 512 mask to
   ``(2s, 2s)`` with PIL's bicubic filter, keep it only inside the box and only on rows ``>= s`` (the lower half
   of the square, i.e. frame rows ``>= yc``), and feather it with ``cv2.GaussianBlur`` of odd size
   ``k = int(ratio * 2s // 2 * 2) + 1``: ratio 0.05 offline (``blending.py:81``), 0.1 realtime
   (``blending.py:134``; quirk Q10 - callers choose, see :data:`OFFLINE_BLUR_RATIO`, :data:`REALTIME_BLUR_RATIO`).
3. **Resize** the generated face to ``(w, h)`` bilinearly (``cv2.resize`` default, ``inference.py:218``).
4. **Blend**: in the official code the resized face is pasted at the box into the crop of the original
   (``face_large``), and ``face_large`` is pasted back into the frame at ``(xs, ys)`` with the mask as PIL 'L'
   alpha. Per channel PIL computes exactly ``out = round((orig * (255 - m) + new * m) / 255)`` (no ties occur,
   so ``(t + 127) // 255`` is the same integer). Outside the box ``face_large`` equals the original, and
   ``round(orig * 255 / 255) == orig``, so only ``box ∩ square ∩ frame`` changes. Both paths therefore work on that
   rectangle only (:func:`paste_region`); parts of the box or the square outside the frame are clipped, as PIL's
   paste clips negative offsets.

Frames here are BGR (OpenCV order). The blend is per channel and the parser input is flipped to RGB, so the
channel order is handled exactly where the official code converts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .constants import PARSING_SIZE
from .errors import InputError
from .gpu import batched, to_device
from .parsing import check_parsing_args, face_mask, face_mask_torch
from .progress import bar
from .resample import gaussian_blur_batch, resize_batch

__all__ = [
    "EXPAND", "UPPER_BOUNDARY_RATIO", "OFFLINE_BLUR_RATIO", "REALTIME_BLUR_RATIO", "BlendMaterial", "Region",
    "check_box", "expanded_square", "feather_kernel_size", "crop_padded", "box_mask", "feather", "prepare_mask",
    "prepare_material", "prepare_materials", "prepare_masks_torch", "prepare_materials_torch", "paste_region", "resize_face", "blend_pixels", "blend_cpu",
    "blend_torch",
]

EXPAND = 1.5  # expanded-square factor, get_crop_box default (blending.py:7-13, :35)
UPPER_BOUNDARY_RATIO = 0.5  # mask rows kept start at int(2s * 0.5) = s (blending.py:35, :74-77)
OFFLINE_BLUR_RATIO = 0.05  # feather kernel / square side in get_image (blending.py:81)
REALTIME_BLUR_RATIO = 0.1  # feather kernel / square side in get_image_prepare_material (blending.py:134)


@dataclass(frozen=True, eq=False)
class BlendMaterial:
    """What one source frame needs for paste-back, computed once (the avatar cache stores it).

    Attributes:
        mask: (2s, 2s) uint8 feathered mask in 0..255 over the expanded square (the official ``mask/%08d.png``):
            a numpy array from :func:`prepare_materials`, a torch tensor on the device from
            :func:`prepare_materials_torch`.
        square: ``(xs, ys, xe, ye)`` expanded square in frame pixels; may extend outside the frame (the official
            ``mask_coords.pkl`` entry).
        box: ``(x1, y1, x2, y2)`` crop box in frame pixels the material was made for (the ``coords.pkl`` entry).
    """

    mask: np.ndarray
    square: tuple[int, int, int, int]
    box: tuple[int, int, int, int]

    def __repr__(self) -> str:
        return f"BlendMaterial(box={self.box}, square={self.square}, mask={self.mask.shape} {self.mask.dtype})"


@dataclass(frozen=True)
class Region:
    """The rectangle a blend changes, as slices into the frame, the resized face and the mask.

    Attributes:
        frame: ``(rows, cols)`` slices into the frame: ``box ∩ square ∩ frame``.
        face: The same pixels as slices into the face resized to the box (h, w).
        mask: The same pixels as slices into the (2s, 2s) mask.
    """

    frame: tuple[slice, slice]
    face: tuple[slice, slice]
    mask: tuple[slice, slice]


# ---------------------------------------------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------------------------------------------

def check_box(box: Any, name: str = "box") -> tuple[int, int, int, int]:
    """Validate a crop box and return it as four Python ints.

    Args:
        box: ``(x1, y1, x2, y2)`` in frame pixels: 4 integers (Python/numpy ints, or floats with integral values)
            with ``x2 - x1 >= 2`` and ``y2 - y1 >= 2``.
        name: Parameter name used in the error message.

    Returns:
        ``(x1, y1, x2, y2)`` as ints.

    Raises:
        InputError: When ``box`` is not 4 integral numbers or is (nearly) empty, e.g. the official placeholder
            ``(0, 0, 0, 0)`` of a frame with no face (quirk Q7): such frames are passed through unchanged instead.
    """
    try:
        values = [float(v) for v in np.asarray(box, dtype=np.float64).reshape(-1)]
    except (TypeError, ValueError):
        values = []
    if len(values) != 4 or any(not np.isfinite(v) or v != int(v) for v in values):
        raise InputError(f"{name} must be 4 integers (x1, y1, x2, y2) in frame pixels; got {box!r}.")
    x1, y1, x2, y2 = (int(v) for v in values)
    if x2 - x1 < 2 or y2 - y1 < 2:
        raise InputError(f"{name} {(x1, y1, x2, y2)} is empty or smaller than 2x2 pixels (x2 > x1 + 1 and y2 > y1 + 1 "
                         "required). A frame with no face has no box: pass that frame through unchanged "
                         "(the official code writes no frame there, quirk Q7).")
    return x1, y1, x2, y2


def expanded_square(box: Any, expand: float = EXPAND) -> tuple[int, int, int, int]:
    """The square around the crop box that the mask and the parsing live in.

    ``xc = (x1 + x2) // 2``, ``yc = (y1 + y2) // 2``, ``s = int(max(x2 - x1, y2 - y1) // 2 * expand)``; the
    square is ``(xc - s, yc - s, xc + s, yc + s)`` (side ``2s``; it may extend outside the frame).

    Args:
        box: ``(x1, y1, x2, y2)`` crop box in frame pixels (see :func:`check_box`).
        expand: Half-side factor; 1.5 in the current code (legacy v1.0 used 1.2).

    Returns:
        ``(xs, ys, xe, ye)`` ints in frame pixels.

    Raises:
        InputError: When the box is invalid or ``expand`` is not a number >= 1.

    Source: ``musetalk/utils/blending.py:7-13`` (``get_crop_box``), reference §7.2 step 2.
    """
    x1, y1, x2, y2 = check_box(box)
    if not isinstance(expand, (int, float)) or isinstance(expand, bool) or not expand >= 1:
        raise InputError(f"expand must be a number >= 1; got {expand!r}. MuseTalk uses 1.5.")
    xc, yc = (x1 + x2) // 2, (y1 + y2) // 2
    s = int(max(x2 - x1, y2 - y1) // 2 * expand)
    return xc - s, yc - s, xc + s, yc + s


def feather_kernel_size(side: int, blur_ratio: float = OFFLINE_BLUR_RATIO) -> int:
    """Odd Gaussian kernel size of the feathering: ``int(blur_ratio * side // 2 * 2) + 1``.

    Evaluated in Python floats exactly as the official expression (so e.g. side 200 -> 11, 300 -> 15, 400 -> 21
    at ratio 0.05; side 300 -> 31 at 0.1).

    Args:
        side: Side of the expanded square, pixels (``2s``).
        blur_ratio: 0.05 offline (``blending.py:81``), 0.1 realtime (``blending.py:134``).

    Returns:
        Kernel size in pixels, odd, >= 1.

    Raises:
        InputError: When ``blur_ratio`` is negative.
    """
    if not isinstance(blur_ratio, (int, float)) or isinstance(blur_ratio, bool) or not blur_ratio >= 0:
        raise InputError(f"blur_ratio must be a number >= 0; got {blur_ratio!r}. MuseTalk uses 0.05 offline and 0.1 "
                         "in realtime mode.")
    return int(blur_ratio * side // 2 * 2) + 1


def _check_square(square: Any, name: str = "square") -> tuple[int, int, int, int]:
    try:
        values = [int(v) for v in square]
    except (TypeError, ValueError):
        values = []
    if len(values) != 4 or values[2] - values[0] != values[3] - values[1] or values[2] <= values[0]:
        raise InputError(f"{name} must be (xs, ys, xe, ye) of a non-empty square (from expanded_square); got "
                         f"{square!r}.")
    return values[0], values[1], values[2], values[3]


def _check_frame(frame: Any, name: str = "frame") -> np.ndarray:
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise InputError(f"{name} must be an (H, W, 3) uint8 BGR numpy array; got "
                         f"{getattr(frame, 'shape', type(frame).__name__)} {getattr(frame, 'dtype', '')}.")
    return frame


def crop_padded(frame: np.ndarray, square: Any) -> np.ndarray:
    """Crop a rectangle from a frame; parts outside the frame are black (as PIL ``Image.crop``).

    Args:
        frame: (H, W, C) uint8 image (any channel order; kept).
        square: ``(xs, ys, xe, ye)`` in frame pixels; may extend past any edge.

    Returns:
        (ye - ys, xe - xs, C) uint8 copy.

    Raises:
        InputError: When the rectangle is empty.

    Source: ``blending.py:60`` (``body.crop(crop_box)``), reference §7.2 step 3.
    """
    xs, ys, xe, ye = (int(v) for v in square)
    if xe <= xs or ye <= ys:
        raise InputError(f"square must have xe > xs and ye > ys; got {tuple(square)!r}.")
    height, width = frame.shape[:2]
    out = np.zeros((ye - ys, xe - xs) + frame.shape[2:], frame.dtype)
    fx1, fy1, fx2, fy2 = max(xs, 0), max(ys, 0), min(xe, width), min(ye, height)
    if fx2 > fx1 and fy2 > fy1:
        out[fy1 - ys:fy2 - ys, fx1 - xs:fx2 - xs] = frame[fy1:fy2, fx1:fx2]
    return out


def paste_region(box: Any, square: Any, frame_shape: Sequence[int]) -> Region | None:
    """Where a blend changes the frame: ``box ∩ square ∩ frame``, as slices (see the module docstring, step 4).

    Args:
        box: ``(x1, y1, x2, y2)`` crop box, frame pixels.
        square: ``(xs, ys, xe, ye)`` expanded square, frame pixels.
        frame_shape: ``(H, W, ...)`` of the frame.

    Returns:
        A :class:`Region`, or None when the intersection is empty (the frame stays unchanged).

    Raises:
        InputError: When ``box`` or ``square`` is invalid.
    """
    x1, y1, x2, y2 = check_box(box)
    xs, ys, xe, ye = _check_square(square)
    height, width = int(frame_shape[0]), int(frame_shape[1])
    left, top = max(x1, xs, 0), max(y1, ys, 0)
    right, bottom = min(x2, xe, width), min(y2, ye, height)
    if right <= left or bottom <= top:
        return None
    return Region(frame=(slice(top, bottom), slice(left, right)),
                  face=(slice(top - y1, bottom - y1), slice(left - x1, right - x1)),
                  mask=(slice(top - ys, bottom - ys), slice(left - xs, right - xs)))


# ---------------------------------------------------------------------------------------------------------------
# Mask preparation
# ---------------------------------------------------------------------------------------------------------------

def box_mask(mask_512: np.ndarray, box: Any, square: Any) -> np.ndarray:
    """The parsing mask brought to the expanded square, kept inside the box and on its lower half (no blur yet).

    1. Resize the 512x512 mask to (2s, 2s) with PIL **bicubic** (``Image.resize``'s default for mode 'L' in
       Pillow >= 7, named explicitly here), so its edges are no longer binary (``blending.py:26,31,65``).
    2. Zero everything outside the box (box minus square origin; parts outside the square are dropped)
       (``blending.py:67-70``).
    3. Zero rows ``< int(2s * 0.5) = s``: only the lower half of the square (frame rows ``>= yc``) is kept
       (``blending.py:74-77``; the official comment says "upper" but the code keeps the lower part).

    Args:
        mask_512: (512, 512) uint8 mask of 0/255 from :func:`nbhelpers.parsing.face_mask`.
        box: ``(x1, y1, x2, y2)`` crop box, frame pixels.
        square: ``(xs, ys, xe, ye)`` from :func:`expanded_square` of the same box.

    Returns:
        (2s, 2s) uint8 mask.

    Raises:
        InputError: When ``mask_512`` is not (512, 512) uint8, or ``box``/``square`` are invalid.

    Source: ``musetalk/utils/blending.py:65-77`` (reference §7.2 steps 4-6).
    """
    from PIL import Image

    mask_512 = np.asarray(mask_512)
    if mask_512.shape != (PARSING_SIZE, PARSING_SIZE) or mask_512.dtype != np.uint8:
        raise InputError(f"mask_512 must be a ({PARSING_SIZE}, {PARSING_SIZE}) uint8 mask from "
                         f"parsing.face_mask; got shape {mask_512.shape} dtype {mask_512.dtype}.")
    x1, y1, x2, y2 = check_box(box)
    xs, ys, xe, ye = _check_square(square)
    side = xe - xs
    bicubic = getattr(Image, "Resampling", Image).BICUBIC
    resized = np.asarray(Image.fromarray(mask_512).resize((side, side), bicubic))
    out = np.zeros((side, side), np.uint8)
    bx1, by1 = max(x1 - xs, 0), max(y1 - ys, 0)
    bx2, by2 = min(x2 - xs, side), min(y2 - ys, side)
    top = max(by1, int(side * UPPER_BOUNDARY_RATIO))
    if bx2 > bx1 and by2 > top:
        out[top:by2, bx1:bx2] = resized[top:by2, bx1:bx2]
    return out


def feather(mask: np.ndarray, blur_ratio: float = OFFLINE_BLUR_RATIO) -> np.ndarray:
    """Gaussian feathering: ``cv2.GaussianBlur(mask, (k, k), 0)``, ``k`` from :func:`feather_kernel_size`.

    Sigma follows from ``k`` (OpenCV: ``0.3 * ((k - 1) * 0.5 - 1) + 0.8``), border ``BORDER_REFLECT_101``
    (OpenCV's default).

    Args:
        mask: (2s, 2s) uint8 mask from :func:`box_mask`.
        blur_ratio: 0.05 offline, 0.1 realtime (quirk Q10).

    Returns:
        (2s, 2s) uint8 feathered mask.

    Raises:
        InputError: When ``blur_ratio`` is negative.

    Source: ``blending.py:81-82`` (offline), ``:134-135`` (realtime).
    """
    import cv2

    k = feather_kernel_size(mask.shape[0], blur_ratio)
    return cv2.GaussianBlur(mask, (k, k), 0)


def prepare_mask(mask_512: np.ndarray, box: Any, square: Any | None = None,
                 blur_ratio: float = OFFLINE_BLUR_RATIO) -> np.ndarray:
    """Parsing mask -> the feathered blend mask over the expanded square (:func:`box_mask` then :func:`feather`).

    Args:
        mask_512: (512, 512) uint8 0/255 mask from :func:`nbhelpers.parsing.face_mask` of the square's crop.
        box: ``(x1, y1, x2, y2)`` crop box, frame pixels.
        square: ``(xs, ys, xe, ye)``; None = :func:`expanded_square` of ``box``.
        blur_ratio: :data:`OFFLINE_BLUR_RATIO` (0.05, ``inference.py``) or :data:`REALTIME_BLUR_RATIO`
            (0.1, ``realtime_inference.py``).

    Returns:
        (2s, 2s) uint8 mask, 0..255.

    Raises:
        InputError: As :func:`box_mask` and :func:`feather`.

    Source: ``musetalk/utils/blending.py:65-82`` (offline ``get_image``), ``:112-136``
    (``get_image_prepare_material``), reference §7.2 steps 4-7 and §7.4.
    """
    feather_kernel_size(2, blur_ratio)  # validate before the resize
    square = expanded_square(box) if square is None else square
    return feather(box_mask(mask_512, box, square), blur_ratio)


def prepare_materials(frames: Sequence[np.ndarray], boxes: Sequence[Any], parser: Any, mode: str = "jaw",
                      left_cheek_width: int = 90, right_cheek_width: int = 90,
                      blur_ratio: float = OFFLINE_BLUR_RATIO, expand: float = EXPAND,
                      chunk: int = 64) -> list[BlendMaterial]:
    """Blend material of many frames: squares, crops, one batched parsing pass per chunk, masks.

    Args:
        frames: Sequence of (H, W, 3) uint8 **BGR** frames (or an (N, H, W, 3) array).
        boxes: N crop boxes ``(x1, y1, x2, y2)``, frame pixels (no placeholders: skip frames without a face).
        parser: A :class:`nbhelpers.parsing.FaceParser` (anything with ``labels(list of RGB images) ->
            (N, 512, 512) uint8``).
        mode: Parsing mode ``"jaw"`` (v15 default), ``"raw"`` (v1) or ``"neck"``.
        left_cheek_width: Jaw-mode cheek band, parsing pixels (default 90).
        right_cheek_width: Same on the right.
        blur_ratio: 0.05 (offline) or 0.1 (realtime); see :func:`prepare_mask`.
        expand: Expanded-square factor (1.5).
        chunk: Frames parsed per call of ``parser.labels`` (bounds the memory of the crops).

    Returns:
        N :class:`BlendMaterial`, in order.

    Raises:
        InputError: When a frame, a box or an option is invalid (checked for all frames before parsing).

    Source: ``blending.py:112-136`` (``get_image_prepare_material``), ``blending.py:51-82`` (``get_image``).
    """
    check_parsing_args(mode, left_cheek_width, right_cheek_width)
    feather_kernel_size(2, blur_ratio)
    if len(frames) != len(boxes):
        raise InputError(f"frames and boxes must have the same length; got {len(frames)} frames and "
                         f"{len(boxes)} boxes.")
    for i, frame in enumerate(frames):
        _check_frame(frame, f"frames[{i}]")
    checked = [check_box(b, f"boxes[{i}]") for i, b in enumerate(boxes)]
    squares = [expanded_square(b, expand) for b in checked]
    materials: list[BlendMaterial] = []
    with bar(len(checked), "face parsing") as progress:
        for start in range(0, len(checked), max(1, int(chunk))):
            idx = range(start, min(start + max(1, int(chunk)), len(checked)))
            crops_rgb = [np.ascontiguousarray(crop_padded(frames[i], squares[i])[:, :, ::-1]) for i in idx]
            labels = parser.labels(crops_rgb)
            for j, i in enumerate(idx):
                mask_512 = face_mask(labels[j], mode, left_cheek_width, right_cheek_width)
                materials.append(BlendMaterial(mask=prepare_mask(mask_512, checked[i], squares[i], blur_ratio),
                                               square=squares[i], box=checked[i]))
                progress.update(1)
    return materials


def prepare_masks_torch(masks_512: Any, boxes: Sequence[Any], squares: Sequence[Any] | None = None,
                        blur_ratio: float = OFFLINE_BLUR_RATIO) -> list[Any]:
    """:func:`prepare_mask` of a batch of parsing masks as torch ops on their device (equal bit for bit).

    PIL's bicubic resize to each frame's ``(2s, 2s)``, the box and lower-half cut, and ``cv2.GaussianBlur``
    with each frame's kernel size are integer-exact torch versions (:func:`nbhelpers.resample.resize_batch`,
    :func:`nbhelpers.resample.gaussian_blur_batch`), batched over frames of different sizes.

    Args:
        masks_512: (B, 512, 512) uint8 torch tensor of 0/255 (:func:`nbhelpers.parsing.face_mask_torch`).
        boxes: B crop boxes ``(x1, y1, x2, y2)``, frame pixels.
        squares: B squares ``(xs, ys, xe, ye)``; None = :func:`expanded_square` of each box.
        blur_ratio: 0.05 offline, 0.1 realtime (quirk Q10).

    Returns:
        B contiguous (2s_b, 2s_b) uint8 tensors on ``masks_512``' device.

    Raises:
        InputError: When the masks are not (B, 512, 512) uint8, or a box, square or the ratio is invalid.

    Source: ``musetalk/utils/blending.py:65-82`` and ``:112-136`` (reference §7.2 steps 4-7, §7.4).
    """
    import torch

    feather_kernel_size(2, blur_ratio)
    if (not isinstance(masks_512, torch.Tensor) or masks_512.ndim != 3 or masks_512.dtype != torch.uint8
            or tuple(masks_512.shape[1:]) != (PARSING_SIZE, PARSING_SIZE)):
        raise InputError(f"masks_512 must be a (B, {PARSING_SIZE}, {PARSING_SIZE}) uint8 torch tensor from "
                         f"parsing.face_mask_torch; got {getattr(masks_512, 'shape', type(masks_512).__name__)} "
                         f"{getattr(masks_512, 'dtype', '')}.")
    batch = masks_512.shape[0]
    if len(boxes) != batch or (squares is not None and len(squares) != batch):
        raise InputError(f"boxes (and squares) need one entry per mask ({batch}); got {len(boxes)} boxes"
                         + ("" if squares is None else f" and {len(squares)} squares") + ".")
    checked = [check_box(b, f"boxes[{i}]") for i, b in enumerate(boxes)]
    sq = [expanded_square(b) for b in checked] if squares is None else [
        _check_square(q, f"squares[{i}]") for i, q in enumerate(squares)]
    if batch == 0:
        return []
    sides = [q[2] - q[0] for q in sq]
    resized = resize_batch(masks_512, sides, "bicubic")                           # blending.py:65
    length = resized.shape[-1]
    bounds = np.zeros((batch, 4), np.int64)  # kept rows [top, bottom), columns [left, right) per frame
    for b, ((x1, y1, x2, y2), (xs, ys, _, _), side) in enumerate(zip(checked, sq, sides, strict=True)):
        bx1, by1, bx2, by2 = max(x1 - xs, 0), max(y1 - ys, 0), min(x2 - xs, side), min(y2 - ys, side)
        bounds[b] = (max(by1, int(side * UPPER_BOUNDARY_RATIO)), by2, bx1, bx2)   # :67-77

    lim = to_device(bounds, masks_512.device)[:, :, None]
    pos = torch.arange(length, device=masks_512.device)[None]
    rows = (pos >= lim[:, 0]) & (pos < lim[:, 1])
    cols = (pos >= lim[:, 2]) & (pos < lim[:, 3])
    cut = resized * (rows[:, :, None] & cols[:, None, :]).to(torch.uint8)
    blurred = gaussian_blur_batch(cut, sides, [feather_kernel_size(side, blur_ratio) for side in sides])  # :81-82
    return [blurred[b, :side, :side].contiguous() for b, side in enumerate(sides)]


def prepare_materials_torch(frames: Any, boxes: Sequence[Any], parser: Any, mode: str = "jaw",
                            left_cheek_width: int = 90, right_cheek_width: int = 90,
                            blur_ratio: float = OFFLINE_BLUR_RATIO, expand: float = EXPAND, bgr: bool = True,
                            batch_size: int | None = None) -> list[BlendMaterial]:
    """:func:`prepare_materials` on the parser's torch device, in batches: nothing goes back to the host.

    Per batch: the expanded squares are cropped and PIL-bilinear-resized to 512 on the device
    (:meth:`nbhelpers.parsing.FaceParser.preprocess_torch`), parsed by BiSeNet in one pass, turned into masks
    (:func:`nbhelpers.parsing.face_mask_torch`) and feathered (:func:`prepare_masks_torch`). Every image step is
    integer-exact with the CPU path; the only difference can come from BiSeNet itself (a GPU or fp16 forward pass
    may flip the argmax on a few boundary pixels). Run on the CPU device it equals :func:`prepare_materials`.

    Args:
        frames: (N, H, W, 3) uint8 torch tensor (BGR by default), on any device (best: already on the parser's);
            each batch is moved to the parser's device when it is elsewhere. A numpy array is accepted too.
        boxes: N crop boxes ``(x1, y1, x2, y2)``, frame pixels (no placeholders: skip frames without a face).
        parser: A :class:`nbhelpers.parsing.FaceParser` (its device and dtype are used).
        mode: ``"jaw"`` (v15 default), ``"raw"`` (v1) or ``"neck"``.
        left_cheek_width: Jaw-mode cheek band, parsing pixels (default 90).
        right_cheek_width: Same on the right.
        blur_ratio: 0.05 (offline) or 0.1 (realtime).
        expand: Expanded-square factor (1.5).
        bgr: Frames are BGR (default; flipped to RGB for the parser as the official code does) or RGB.
        batch_size: Frames per BiSeNet pass; None = ``parser.batch_size``. Halved on CUDA out-of-memory.

    Returns:
        N :class:`BlendMaterial`, in order, whose ``mask`` is a contiguous (2s, 2s) uint8 **tensor on the
        parser's device** (what :func:`blend_torch` takes; ``mask.cpu().numpy()`` gives the CPU path's array).

    Raises:
        InputError: When the frames, a box or an option is invalid (all checked before any parsing).
        OutOfMemoryError: When one frame still does not fit on the GPU.

    Source: ``blending.py:112-136`` (``get_image_prepare_material``), ``blending.py:51-82`` (``get_image``),
    ``face_parsing/__init__.py:77-111`` (reference §7.2-7.4).
    """
    import torch

    check_parsing_args(mode, left_cheek_width, right_cheek_width)
    feather_kernel_size(2, blur_ratio)
    if isinstance(frames, np.ndarray):
        frames = torch.from_numpy(frames)
    if (not isinstance(frames, torch.Tensor) or frames.ndim != 4 or frames.shape[3] != 3
            or frames.dtype != torch.uint8):
        raise InputError(f"frames must be an (N, H, W, 3) uint8 torch tensor (BGR); got "
                         f"{getattr(frames, 'shape', type(frames).__name__)} {getattr(frames, 'dtype', '')}.")
    if len(frames) != len(boxes):
        raise InputError(f"frames and boxes must have the same length; got {len(frames)} frames and "
                         f"{len(boxes)} boxes.")
    checked = [check_box(b, f"boxes[{i}]") for i, b in enumerate(boxes)]
    squares = [expanded_square(b, expand) for b in checked]
    size = batch_size or getattr(parser, "batch_size", 8)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"batch_size must be a positive integer or None; got {batch_size!r}.")

    def step(sl: slice) -> list[Any]:
        with torch.inference_mode():
            labels = parser.labels_torch(frames[sl], squares[sl], bgr)
            masks_512 = face_mask_torch(labels, mode, left_cheek_width, right_cheek_width)
            return prepare_masks_torch(masks_512, checked[sl], squares[sl], blur_ratio)

    materials: list[BlendMaterial] = []
    with bar(len(checked), "face parsing") as progress:  # counts queued frames: the device may still be busy
        for sl, masks in batched(len(checked), size, step, stage="face parsing"):
            materials += [BlendMaterial(mask=m, square=squares[i], box=checked[i])
                          for m, i in zip(masks, range(sl.start, sl.stop), strict=True)]
            progress.update(sl.stop - sl.start)
    return materials


def materials_for_frames(frames: Any, crop_boxes: Any, face_frames: Sequence[int], parser: Any, config: Any, *,
                         chunk: int = 32, progress: bool = True, frames_device: Any = None) -> list[BlendMaterial]:
    """Blend material of the source frames that have a face, in frame order, with the settings of a job.

    With a parser on CUDA the whole material is made on the GPU in batches (:func:`prepare_materials_torch`:
    every image step integer-exact with the CPU path) and the masks stay there; on the CPU the official PIL/OpenCV
    sequence runs (:func:`prepare_materials`).

    Args:
        frames: N source frames (N, H, W, 3) uint8 BGR with random access (``frames[i]``).
        crop_boxes: (N, 4) crop boxes, frame pixels.
        face_frames: M increasing indices of the frames with a face.
        parser: A :class:`nbhelpers.parsing.FaceParser`.
        config: An :class:`~nbhelpers.config.InferenceConfig` (parsing mode, cheek widths, ``blur_ratio``).
        chunk: Frames held at once (bounds the host memory of the crops).
        progress: Show a progress bar (``parsing``), counted in frames.
        frames_device: Optional (N, H, W, 3) uint8 tensor of the same frames on the parser's device.

    Returns:
        M :class:`BlendMaterial`, one per entry of ``face_frames`` (masks as device tensors on CUDA, numpy on the
        CPU).

    Raises:
        InputError: A frame, a box or an option is invalid.

    Source: ``scripts/inference.py:219-231`` / ``realtime_inference.py:164-181`` (reference §7).
    """
    import torch

    face_frames = [int(i) for i in face_frames]
    options = dict(mode=config.effective_parsing_mode, left_cheek_width=config.left_cheek_width,
                   right_cheek_width=config.right_cheek_width, blur_ratio=config.blur_ratio)
    on_gpu = torch.device(getattr(parser, "device", "cpu")).type == "cuda"
    out: list[BlendMaterial] = []
    with bar(total=len(face_frames), desc="parsing", unit="frame", **({} if progress else {"disable": True})) as pbar:
        step = max(1, int(chunk)) * (4 if on_gpu else 1)
        for start in range(0, len(face_frames), step):
            idx = face_frames[start:start + step]
            boxes = [crop_boxes[i] for i in idx]
            if on_gpu:
                if frames_device is not None and idx[-1] - idx[0] + 1 == len(idx):  # a run of frames: a view
                    batch = frames_device[idx[0]:idx[-1] + 1]
                elif frames_device is not None:  # the index through pinned memory (a pageable copy would wait)
                    batch = frames_device[to_device(np.asarray(idx, dtype=np.int64), frames_device.device)]
                else:
                    batch = to_device(np.stack([frames[i] for i in idx]), parser.device)
                out.extend(prepare_materials_torch(batch, boxes, parser, **options))
            else:
                out.extend(prepare_materials([frames[i] for i in idx], boxes, parser, **options))
            pbar.update(len(idx))
    return out


def prepare_material(frame_bgr: np.ndarray, box: Any, parser: Any, mode: str = "jaw", left_cheek_width: int = 90,
                     right_cheek_width: int = 90, blur_ratio: float = OFFLINE_BLUR_RATIO,
                     expand: float = EXPAND) -> BlendMaterial:
    """Blend material of one frame (see :func:`prepare_materials`, which batches the parsing).

    Args:
        frame_bgr: (H, W, 3) uint8 BGR original frame.
        box: ``(x1, y1, x2, y2)`` crop box, frame pixels.
        parser: A :class:`nbhelpers.parsing.FaceParser`.
        mode: ``"jaw"``, ``"raw"`` or ``"neck"``.
        left_cheek_width: Jaw-mode cheek band, parsing pixels (default 90).
        right_cheek_width: Same on the right.
        blur_ratio: 0.05 (offline) or 0.1 (realtime).
        expand: Expanded-square factor (1.5).

    Returns:
        :class:`BlendMaterial` with the (2s, 2s) uint8 mask, the square and the box.

    Raises:
        InputError: When the frame, box or an option is invalid.

    Source: ``blending.py:112-136`` (``get_image_prepare_material``).
    """
    return prepare_materials([frame_bgr], [box], parser, mode, left_cheek_width, right_cheek_width, blur_ratio,
                             expand)[0]


# ---------------------------------------------------------------------------------------------------------------
# Blend, CPU
# ---------------------------------------------------------------------------------------------------------------

def resize_face(face: np.ndarray, box: Any) -> np.ndarray:
    """Resize the generated face to the box size with OpenCV bilinear (``cv2.resize`` default).

    Args:
        face: (h0, w0, 3) uint8 face (256x256 from the VAE), any channel order.
        box: ``(x1, y1, x2, y2)`` crop box, frame pixels.

    Returns:
        (y2 - y1, x2 - x1, 3) uint8; ``face`` itself when it already has that size.

    Raises:
        InputError: When ``face`` is not (h, w, 3) uint8 or the box is invalid.

    Source: ``scripts/inference.py:218``; realtime ``realtime_inference.py:230-232`` (reference §7.1).
    """
    x1, y1, x2, y2 = check_box(box)
    _check_frame(face, "face")
    if face.shape[:2] == (y2 - y1, x2 - x1):
        return face
    import cv2

    return cv2.resize(face, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR)


def blend_pixels(orig: np.ndarray, new: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """PIL's masked paste per channel: ``round((orig * (255 - m) + new * m) / 255)`` in exact integers.

    Args:
        orig: (..., C) uint8 original pixels.
        new: (..., C) uint8 generated pixels, same shape.
        mask: (...) or (..., 1) uint8 alpha 0..255 (broadcast over channels).

    Returns:
        uint8 array of ``orig``'s shape. m = 0 gives ``orig``, m = 255 gives ``new``.

    Source: ``blending.py:89`` / ``:109`` (``body.paste(face_large, crop_box[:2], mask_image)``); PIL's
    ``ImagingPaste`` with an 'L' mask (verified bit-exact, tests/test_blending.py).
    """
    m = mask.astype(np.uint32)
    if m.ndim == orig.ndim - 1:
        m = m[..., None]
    t = orig.astype(np.uint32) * (255 - m) + new.astype(np.uint32) * m
    return ((t + 127) // 255).astype(np.uint8)


def blend_cpu(frame_bgr: np.ndarray, face_bgr: np.ndarray, box: Any, mask: np.ndarray, square: Any,
              inplace: bool = False) -> np.ndarray:
    """Paste a generated face back into one frame (numpy/OpenCV; bit-exact with the official PIL sequence).

    Args:
        frame_bgr: (H, W, 3) uint8 BGR original frame.
        face_bgr: (256, 256, 3) uint8 BGR generated face, or already resized to (y2 - y1, x2 - x1, 3).
        box: ``(x1, y1, x2, y2)`` crop box, frame pixels (may extend outside the frame; clipped).
        mask: (2s, 2s) uint8 feathered mask from :func:`prepare_mask` (``BlendMaterial.mask``).
        square: ``(xs, ys, xe, ye)`` expanded square of the mask (``BlendMaterial.square``).
        inplace: Write into ``frame_bgr`` instead of a copy.

    Returns:
        (H, W, 3) uint8 BGR blended frame (``frame_bgr`` itself when ``inplace``).

    Raises:
        InputError: When an array has the wrong shape or dtype, the box is invalid, or the mask does not match
            the square.

    Source: ``musetalk/utils/blending.py:35-93`` (``get_image``, steps 1-3 and 8-9) and ``:96-109``
    (``get_image_blending``); ``scripts/inference.py:218`` (resize), reference §7.1-7.2.
    """
    _check_frame(frame_bgr, "frame_bgr")
    square = _check_mask(mask, square)
    face = resize_face(face_bgr, box)
    out = frame_bgr if inplace else frame_bgr.copy()
    region = paste_region(box, square, out.shape)
    if region is not None:
        out[region.frame] = blend_pixels(out[region.frame], face[region.face], mask[region.mask])
    return out


def _check_mask(mask: Any, square: Any, name: str = "mask") -> tuple[int, int, int, int]:
    square = _check_square(square)
    side = square[2] - square[0]
    shape = tuple(getattr(mask, "shape", ()))
    dtype = str(getattr(mask, "dtype", ""))
    if shape != (side, side) or dtype not in ("uint8", "torch.uint8"):
        raise InputError(f"{name} must be a ({side}, {side}) uint8 mask matching square {square}; got shape "
                         f"{shape} dtype {dtype or type(mask).__name__}. Use BlendMaterial.mask with its square.")
    return square


# ---------------------------------------------------------------------------------------------------------------
# Blend, torch (GPU)
# ---------------------------------------------------------------------------------------------------------------

def blend_torch(frames: Any, faces: Any, boxes: Sequence[Any], masks: Sequence[Any], squares: Sequence[Any],
                inplace: bool = False) -> Any:
    """Paste generated faces back into a batch of frames on the frames' device (the GPU path).

    Same maths as :func:`blend_cpu`, per frame: bilinear resize of the face to its box with
    ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False, antialias=False)`` in float32 and
    rounded (OpenCV's ``INTER_LINEAR`` samples the same half-pixel-centred points without antialiasing, in
    11-bit fixed point; the two differ by at most 1 level), then the exact integer blend
    ``(orig * (255 - m) + new * m + 127) // 255`` on ``box ∩ square ∩ frame`` only. Result within 2 levels of
    :func:`blend_cpu` at every pixel. Boxes differ per frame, so this is a loop of a few small kernels per frame
    (cheap next to the VAE decode); masks given as numpy are uploaded cropped to the region.

    Args:
        frames: (B, H, W, 3) uint8 torch tensor (BGR), on any device (CUDA in the pipeline).
        faces: (B, h0, w0, 3) uint8 torch tensor (BGR), 256x256 from the VAE decode; moved to ``frames``' device.
        boxes: B crop boxes ``(x1, y1, x2, y2)`` (a sequence, an (B, 4) array or tensor).
        masks: B (2s_i, 2s_i) uint8 masks (numpy arrays or tensors; ``BlendMaterial.mask``). Keep them on the
            device (e.g. in the avatar) to skip the upload.
        squares: B squares ``(xs, ys, xe, ye)`` (``BlendMaterial.square``).
        inplace: Write into ``frames`` instead of a clone.

    Returns:
        (B, H, W, 3) uint8 tensor on ``frames``' device (``frames`` itself when ``inplace``).

    Raises:
        InputError: When shapes, dtypes or lengths disagree, or a box/mask/square is invalid.

    Source: as :func:`blend_cpu` (``blending.py:35-109``, ``inference.py:218``, ``realtime_inference.py:230-232``).
    """
    import torch
    import torch.nn.functional as F

    if not isinstance(frames, torch.Tensor) or frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != torch.uint8:
        raise InputError(f"frames must be a (B, H, W, 3) uint8 torch tensor; got "
                         f"{getattr(frames, 'shape', type(frames).__name__)} {getattr(frames, 'dtype', '')}.")
    batch = frames.shape[0]
    if (not isinstance(faces, torch.Tensor) or faces.ndim != 4 or faces.shape[0] != batch or faces.shape[3] != 3
            or faces.dtype != torch.uint8):
        raise InputError(f"faces must be a ({batch}, h, w, 3) uint8 torch tensor matching frames; got "
                         f"{getattr(faces, 'shape', type(faces).__name__)} {getattr(faces, 'dtype', '')}.")
    if not len(boxes) == len(masks) == len(squares) == batch:
        raise InputError(f"boxes, masks and squares must each have one entry per frame ({batch}); got "
                         f"{len(boxes)}, {len(masks)} and {len(squares)}.")
    device = frames.device
    plans = []
    for b in range(batch):  # validate everything before touching the device
        box = check_box(boxes[b], f"boxes[{b}]")
        square = _check_mask(masks[b], squares[b], f"masks[{b}]")
        plans.append((box, paste_region(box, square, frames.shape[1:3])))

    out = frames if inplace else frames.clone()
    faces = faces.to(device)
    for b, (box, region) in enumerate(plans):
        if region is None:
            continue
        x1, y1, x2, y2 = box
        face = faces[b]
        if tuple(face.shape[:2]) == (y2 - y1, x2 - x1):
            new = face[region.face].to(torch.int32)
        else:
            resized = F.interpolate(face.permute(2, 0, 1)[None].float(), size=(y2 - y1, x2 - x1), mode="bilinear",
                                    align_corners=False, antialias=False)[0]
            new = resized.permute(1, 2, 0)[region.face].round().clamp(0, 255).to(torch.int32)
        mask = masks[b]
        if isinstance(mask, torch.Tensor):
            m = mask[region.mask].to(device=device, dtype=torch.int32)
        else:
            m = torch.from_numpy(np.ascontiguousarray(mask[region.mask])).to(device=device, dtype=torch.int32)
        m = m[..., None]
        target = out[b][region.frame]
        target.copy_(((target.to(torch.int32) * (255 - m) + new * m + 127) // 255).to(torch.uint8))
    return out
