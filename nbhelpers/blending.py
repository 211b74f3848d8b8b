"""Paste-back: put the generated 256x256 face into the original frame through a feathered face-parsing mask.

Once per source frame (:class:`BlendMaterial`): the expanded square around the crop box, cropped (black outside the
frame), parsed by BiSeNet, its mask resized onto the square, kept inside the box and on the square's lower half, and
feathered (quirk Q10). Per output frame: the face resized to the box and pasted through the mask; only
``box ∩ square ∩ frame`` changes (:func:`paste_region`).

CPU paths (numpy, OpenCV, PIL) are bit-exact with the official code; the torch paths run on the device, with masks
equal bit for bit (:mod:`nbhelpers.resample`) and blends within 2 grey levels. Frames are BGR; the parser gets RGB.

Source: ``musetalk/utils/blending.py:7-136``, ``scripts/inference.py:218``; docs/official-behaviour.md §7.
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
from .progress import bar, stage_bar
from .resample import gaussian_blur_batch, resize_batch

__all__ = ["EXPAND", "UPPER_BOUNDARY_RATIO", "OFFLINE_BLUR_RATIO", "REALTIME_BLUR_RATIO", "BlendMaterial", "Region",
           "check_box", "expanded_square", "feather_kernel_size", "crop_padded", "box_mask", "feather", "prepare_mask",
           "prepare_material", "prepare_materials", "prepare_masks_torch", "prepare_materials_torch", "paste_region",
           "resize_face", "blend_pixels", "blend_cpu", "blend_torch"]

EXPAND = 1.5  # expanded-square factor, get_crop_box default (blending.py:7-13, :35)
UPPER_BOUNDARY_RATIO = 0.5  # mask rows kept start at int(2s * 0.5) = s (blending.py:35, :74-77)
OFFLINE_BLUR_RATIO = 0.05  # feather kernel / square side in get_image (blending.py:81)
REALTIME_BLUR_RATIO = 0.1  # feather kernel / square side in get_image_prepare_material (blending.py:134)


@dataclass(frozen=True, eq=False)
class BlendMaterial:
    """What one source frame needs for paste-back, computed once (the avatar cache stores it): the (2s, 2s) uint8
    feathered ``mask`` (numpy, or a device tensor from :func:`prepare_materials_torch`; official ``mask/%08d.png``)
    over the expanded ``square`` (may extend past the frame) of crop ``box``, both in frame pixels."""

    mask: np.ndarray
    square: tuple[int, int, int, int]
    box: tuple[int, int, int, int]

    def __repr__(self) -> str:
        return f"BlendMaterial(box={self.box}, square={self.square}, mask={self.mask.shape} {self.mask.dtype})"


@dataclass(frozen=True)
class Region:
    """``box ∩ square ∩ frame`` as ``(rows, cols)`` slices into the frame, the face resized to the box, the mask."""

    frame: tuple[slice, slice]
    face: tuple[slice, slice]
    mask: tuple[slice, slice]


def check_box(box: Any, name: str = "box") -> tuple[int, int, int, int]:
    """The crop box ``box = (x1, y1, x2, y2)`` (frame pixels) as four ints; InputError naming it ``name`` when it is
    not 4 integral numbers or is under 2x2, as the official ``(0, 0, 0, 0)`` of a face-less frame (quirk Q7)."""
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


def expanded_square(box: Any) -> tuple[int, int, int, int]:
    """The square ``(xc - s, yc - s, xc + s, yc + s)`` around crop box ``box`` (ints, frame pixels), half side
    ``s = int(max(w, h) // 2 * EXPAND)``. Source: ``musetalk/utils/blending.py:7-13``."""
    x1, y1, x2, y2 = check_box(box)
    xc, yc = (x1 + x2) // 2, (y1 + y2) // 2
    s = int(max(x2 - x1, y2 - y1) // 2 * EXPAND)
    return xc - s, yc - s, xc + s, yc + s


def feather_kernel_size(side: int, blur_ratio: float = OFFLINE_BLUR_RATIO) -> int:
    """Odd feather kernel size in pixels for a square of side ``side`` = 2s, ``int(blur_ratio * side // 2 * 2) + 1``
    (side 300: 15); InputError for a negative ``blur_ratio``. Source: ``musetalk/utils/blending.py:81,134``."""
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


def _got(x: Any) -> str:
    return f"{getattr(x, 'shape', type(x).__name__)} {getattr(x, 'dtype', '')}"


def _check_frame(frame: Any, name: str) -> None:
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise InputError(f"{name} must be an (H, W, 3) uint8 BGR numpy array; got {_got(frame)}.")


def crop_padded(frame: np.ndarray, square: Any) -> np.ndarray:
    """Crop ``square = (xs, ys, xe, ye)`` from an (H, W, C) uint8 frame as a (ye - ys, xe - xs, C) copy, black
    outside the frame (PIL ``Image.crop``); InputError when empty. Source: ``musetalk/utils/blending.py:60``."""
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
    """Where a blend changes a frame of shape ``frame_shape = (H, W, ...)``: ``box ∩ square ∩ frame`` as a
    :class:`Region`, or None when empty. InputError when ``box`` or ``square`` is invalid."""
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


def box_mask(mask_512: np.ndarray, box: Any, square: Any) -> np.ndarray:
    """The (2s, 2s) uint8 mask, not feathered: a (512, 512) uint8 parsing mask ``mask_512`` PIL-bicubic-resized onto
    ``square``, kept inside ``box`` and on rows >= s (the official comment says "upper"; the code keeps the lower
    part). InputError for another mask shape or dtype, or a bad box or square. Source: ``blending.py:26,31,65-77``."""
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
    """``cv2.GaussianBlur(mask, (k, k), 0)`` of a (2s, 2s) uint8 mask, ``k`` from :func:`feather_kernel_size`.
    Source: ``musetalk/utils/blending.py:81-82,134-135``."""
    import cv2

    k = feather_kernel_size(mask.shape[0], blur_ratio)
    return cv2.GaussianBlur(mask, (k, k), 0)


def prepare_mask(mask_512: np.ndarray, box: Any, square: Any | None = None,
                 blur_ratio: float = OFFLINE_BLUR_RATIO) -> np.ndarray:
    """The feathered (2s, 2s) uint8 blend mask, :func:`box_mask` then :func:`feather` (InputError as they raise);
    ``square`` defaults to :func:`expanded_square` of ``box``. Source: ``musetalk/utils/blending.py:65-82,112-136``;
    docs/official-behaviour.md §7.2, §7.4."""
    feather_kernel_size(2, blur_ratio)  # validate before the resize
    square = expanded_square(box) if square is None else square
    return feather(box_mask(mask_512, box, square), blur_ratio)


def _checked_boxes(n_frames: int, boxes: Sequence[Any], mode: str, left_cheek_width: int, right_cheek_width: int,
                   blur_ratio: float) -> tuple[list, list]:
    """The parsing options checked, and one box per frame as ints with its expanded square (InputError otherwise)."""
    check_parsing_args(mode, left_cheek_width, right_cheek_width)
    feather_kernel_size(2, blur_ratio)
    if n_frames != len(boxes):
        raise InputError(f"frames and boxes must have the same length; got {n_frames} frames and {len(boxes)} boxes.")
    checked = [check_box(b, f"boxes[{i}]") for i, b in enumerate(boxes)]
    return checked, [expanded_square(b) for b in checked]


def prepare_materials(frames: Sequence[np.ndarray], boxes: Sequence[Any], parser: Any, mode: str = "jaw",
                      left_cheek_width: int = 90, right_cheek_width: int = 90,
                      blur_ratio: float = OFFLINE_BLUR_RATIO, chunk: int = 64,
                      progress: bool = True) -> list[BlendMaterial]:
    """N :class:`BlendMaterial` (numpy masks, in order) of N (H, W, 3) uint8 BGR ``frames`` and crop ``boxes`` on the
    CPU. ``parser`` is a :class:`nbhelpers.parsing.FaceParser` (``chunk`` frames a ``labels`` call); ``mode`` and the
    cheek widths (512-px parsing pixels) are :func:`nbhelpers.parsing.face_mask`'s. InputError for a bad frame, box
    or option, before parsing. Source: ``musetalk/utils/blending.py:51-82,112-136``."""
    checked, squares = _checked_boxes(len(frames), boxes, mode, left_cheek_width, right_cheek_width, blur_ratio)
    for i, frame in enumerate(frames):
        _check_frame(frame, f"frames[{i}]")
    materials: list[BlendMaterial] = []
    with bar(len(checked), "face parsing", **({} if progress else {"disable": True})) as pbar:
        for start in range(0, len(checked), max(1, int(chunk))):
            idx = range(start, min(start + max(1, int(chunk)), len(checked)))
            crops_rgb = [np.ascontiguousarray(crop_padded(frames[i], squares[i])[:, :, ::-1]) for i in idx]
            labels = parser.labels(crops_rgb)
            for j, i in enumerate(idx):
                mask_512 = face_mask(labels[j], mode, left_cheek_width, right_cheek_width)
                materials.append(BlendMaterial(mask=prepare_mask(mask_512, checked[i], squares[i], blur_ratio),
                                               square=squares[i], box=checked[i]))
                pbar.update(1)
    return materials


def prepare_masks_torch(masks_512: Any, boxes: Sequence[Any], squares: Sequence[Any],
                        blur_ratio: float = OFFLINE_BLUR_RATIO) -> list[Any]:
    """:func:`prepare_mask` of (B, 512, 512) uint8 ``masks_512`` with B ``boxes`` and ``squares`` in torch on their
    device, equal bit for bit: B contiguous (2s_b, 2s_b) uint8 tensors. InputError for a bad mask batch, box, square
    or ratio."""
    import torch

    feather_kernel_size(2, blur_ratio)
    if (not isinstance(masks_512, torch.Tensor) or masks_512.ndim != 3 or masks_512.dtype != torch.uint8
            or tuple(masks_512.shape[1:]) != (PARSING_SIZE, PARSING_SIZE)):
        raise InputError(f"masks_512 must be a (B, {PARSING_SIZE}, {PARSING_SIZE}) uint8 torch tensor from "
                         f"parsing.face_mask_torch; got {_got(masks_512)}.")
    batch = masks_512.shape[0]
    if len(boxes) != batch or len(squares) != batch:
        raise InputError(f"boxes and squares need one entry per mask ({batch}); got {len(boxes)} boxes and "
                         f"{len(squares)} squares.")
    checked = [check_box(b, f"boxes[{i}]") for i, b in enumerate(boxes)]
    sq = [_check_square(q, f"squares[{i}]") for i, q in enumerate(squares)]
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
                            blur_ratio: float = OFFLINE_BLUR_RATIO, progress: bool = True) -> list[BlendMaterial]:
    """:func:`prepare_materials` of an (N, H, W, 3) uint8 BGR tensor (or array) ``frames`` on the parser's torch
    device, ``parser.batch_size`` frames a BiSeNet pass (halved on CUDA out-of-memory), masks left there as tensors.
    Every image step is integer-exact with the CPU path; only BiSeNet's argmax may flip on boundary pixels on a GPU
    or in fp16. InputError for bad inputs (before parsing), OutOfMemoryError when one frame does not fit."""
    import torch

    if isinstance(frames, np.ndarray):
        frames = torch.from_numpy(frames)
    if (not isinstance(frames, torch.Tensor) or frames.ndim != 4 or frames.shape[3] != 3
            or frames.dtype != torch.uint8):
        raise InputError(f"frames must be an (N, H, W, 3) uint8 torch tensor (BGR); got {_got(frames)}.")
    checked, squares = _checked_boxes(len(frames), boxes, mode, left_cheek_width, right_cheek_width, blur_ratio)

    def step(sl: slice) -> list[Any]:
        with torch.inference_mode():
            labels = parser.labels_torch(frames[sl], squares[sl])
            masks_512 = face_mask_torch(labels, mode, left_cheek_width, right_cheek_width)
            return prepare_masks_torch(masks_512, checked[sl], squares[sl], blur_ratio)

    materials: list[BlendMaterial] = []
    with bar(len(checked), "face parsing", **({} if progress else {"disable": True})) as pbar:  # counts queued frames
        for sl, masks in batched(len(checked), getattr(parser, "batch_size", 8), step, stage="face parsing"):
            materials += [BlendMaterial(mask=m, square=squares[i], box=checked[i])
                          for m, i in zip(masks, range(sl.start, sl.stop), strict=True)]
            pbar.update(sl.stop - sl.start)
    return materials


def materials_for_frames(frames: Any, crop_boxes: Any, face_frames: Sequence[int], parser: Any, config: Any, *,
                         progress: Any = True, frames_device: Any = None) -> list[BlendMaterial]:
    """M :class:`BlendMaterial` of the frames ``face_frames`` (M increasing indices) of N source ``frames``
    ((H, W, 3) uint8 BGR, random access) with (N, 4) ``crop_boxes``, with ``config``'s parsing settings.

    A parser on CUDA makes them there (:func:`prepare_materials_torch`, from ``frames_device`` when given), else
    :func:`prepare_materials`, 32 frames held at once on the host. ``progress``: show a ``parsing`` bar, or a
    bar to advance."""
    import torch

    face_frames = [int(i) for i in face_frames]
    options = dict(mode=config.effective_parsing_mode, left_cheek_width=config.left_cheek_width,
                   right_cheek_width=config.right_cheek_width, blur_ratio=config.blur_ratio)
    on_gpu = torch.device(getattr(parser, "device", "cpu")).type == "cuda"
    out: list[BlendMaterial] = []
    with stage_bar(progress, len(face_frames), "parsing") as pbar:
        step = 128 if on_gpu else 32
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
                out.extend(prepare_materials_torch(batch, boxes, parser, progress=False, **options))
            else:
                out.extend(prepare_materials([frames[i] for i in idx], boxes, parser, progress=False, **options))
            pbar.update(len(idx))
    return out


def prepare_material(frame_bgr: np.ndarray, box: Any, parser: Any, mode: str = "jaw", left_cheek_width: int = 90,
                     right_cheek_width: int = 90, blur_ratio: float = OFFLINE_BLUR_RATIO) -> BlendMaterial:
    """Blend material of one (H, W, 3) uint8 BGR frame: :func:`prepare_materials` of one, same options."""
    return prepare_materials([frame_bgr], [box], parser, mode, left_cheek_width, right_cheek_width, blur_ratio)[0]


def resize_face(face: np.ndarray, box: Any) -> np.ndarray:
    """``face`` ((h0, w0, 3) uint8, any channel order) resized to ``box``, (y2 - y1, x2 - x1, 3), with
    ``cv2.resize`` bilinear; itself when it fits. InputError for a bad face or box.
    Source: ``scripts/inference.py:218``; docs/official-behaviour.md §7.1."""
    x1, y1, x2, y2 = check_box(box)
    _check_frame(face, "face")
    if face.shape[:2] == (y2 - y1, x2 - x1):
        return face
    import cv2

    return cv2.resize(face, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR)


def blend_pixels(orig: np.ndarray, new: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """PIL's masked paste per channel, ``round((orig * (255 - m) + new * m) / 255)`` in exact integers.

    ``orig`` and ``new`` are (..., C) uint8, ``mask`` (...) or (..., 1) uint8 alpha 0..255; the result is uint8 of
    ``orig``'s shape. Source: ``musetalk/utils/blending.py:89`` (PIL ``Image.paste`` with an 'L' mask)."""
    m = mask.astype(np.uint32)
    if m.ndim == orig.ndim - 1:
        m = m[..., None]
    t = orig.astype(np.uint32) * (255 - m) + new.astype(np.uint32) * m
    return ((t + 127) // 255).astype(np.uint8)


def blend_cpu(frame_bgr: np.ndarray, face_bgr: np.ndarray, box: Any, mask: np.ndarray, square: Any) -> np.ndarray:
    """Paste a generated (256, 256, 3) uint8 BGR face (or one already of the box's size) back into a copy of an
    (H, W, 3) uint8 BGR frame through a :class:`BlendMaterial`'s ``mask`` and ``square``, bit-exact with the official
    PIL code. InputError for a bad array, box, or a mask not matching the square.
    Source: ``musetalk/utils/blending.py:35-109``; docs/official-behaviour.md §7.1-§7.2."""
    _check_frame(frame_bgr, "frame_bgr")
    square = _check_mask(mask, square)
    face = resize_face(face_bgr, box)
    out = frame_bgr.copy()
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


def blend_torch(frames: Any, faces: Any, boxes: Sequence[Any], masks: Sequence[Any], squares: Sequence[Any],
                inplace: bool = False) -> Any:
    """:func:`blend_cpu` of (B, H, W, 3) uint8 BGR ``frames`` on their device (a clone, or themselves with
    ``inplace``) with (B, h0, w0, 3) uint8 BGR ``faces``, within 2 grey levels (``masks`` numpy or tensors): the face
    resized bilinearly in float32 and rounded, blended by :func:`blend_pixels`'s formula. InputError for shapes,
    dtypes or lengths that disagree, or a bad box, mask or square."""
    import torch
    import torch.nn.functional as F

    if not isinstance(frames, torch.Tensor) or frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != torch.uint8:
        raise InputError(f"frames must be a (B, H, W, 3) uint8 torch tensor; got {_got(frames)}.")
    batch = frames.shape[0]
    if (not isinstance(faces, torch.Tensor) or faces.ndim != 4 or faces.shape[0] != batch or faces.shape[3] != 3
            or faces.dtype != torch.uint8):
        raise InputError(f"faces must be a ({batch}, h, w, 3) uint8 torch tensor matching frames; got {_got(faces)}.")
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
        m = torch.as_tensor(masks[b][region.mask]).to(device=device, dtype=torch.int32)[..., None]
        target = out[b][region.frame]
        target.copy_(((target.to(torch.int32) * (255 - m) + new * m + 127) // 255).to(torch.uint8))
    return out
