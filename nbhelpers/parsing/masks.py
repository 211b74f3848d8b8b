"""Face parsing's label vocabulary and the label map -> mask step of each parsing mode (``raw`` / ``jaw`` / ``neck``).

Source: ``musetalk/utils/face_parsing/__init__.py:15-57,92-110`` (docs/official-behaviour.md §7.3).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..constants import PARSING_SIZE
from ..errors import InputError
from ..gpu import device_constant

N_CLASSES = 19  # BiSeNet output classes: background + 18 CelebAMask-HQ parts (model.py:230-254)

# Class index -> name, the CelebAMask-HQ order face-parsing.PyTorch trained with.
LABELS = ("background", "skin", "l_brow", "r_brow", "l_eye", "r_eye", "eye_g", "l_ear", "r_ear", "ear_r",
          "nose", "mouth", "u_lip", "l_lip", "neck", "neck_l", "cloth", "hair", "hat")
SKIN, NOSE, MOUTH, UPPER_LIP, LOWER_LIP, NECK = 1, 10, 11, 12, 13, 14

PARSING_MODES = ("jaw", "raw", "neck")
_KEEP = {  # labels kept as 255 by the simple modes (face_parsing/__init__.py:93-95,106-108)
    "raw": (SKIN, MOUTH, UPPER_LIP, LOWER_LIP),
    "neck": (SKIN, MOUTH, UPPER_LIP, LOWER_LIP, NECK),
}


def jaw_dilation_kernel() -> np.ndarray:
    """The (33, 33) uint8 0/1 "cone + tail" kernel jaw mode dilates the skin with: rows 0-9 zero, row ``r`` in
    10..20 a run of ``2 (r - 10) + 1`` ones centred on column 16, rows 21-32 ones in columns 6-26. With OpenCV's
    centre anchor the skin grows mostly upwards. Source: ``face_parsing/__init__.py:15-42``."""
    kernel = np.zeros((33, 33), np.uint8)
    for half in range(11):  # rows 10-20
        kernel[10 + half, 16 - half:17 + half] = 1
    kernel[21:33, 6:27] = 1
    return kernel


def jaw_erosion_kernel() -> np.ndarray:
    """The (3, 35) uint8 ellipse jaw mode erodes twice with: ones on row 1 and at column 17 of rows 0 and 2.
    Source: ``face_parsing/__init__.py:45-46``."""
    import cv2

    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (35, 3))


def cheek_mask(left_cheek_width: int = 90, right_cheek_width: int = 90) -> np.ndarray:
    """The (512, 512) uint8 cheek bands of jaw mode: 255 on columns ``0 .. 256 - left_cheek_width`` and
    ``256 + right_cheek_width .. 511`` (inclusive; 90/90: 0-166 and 346-511), 0 between; widths are integers
    0..256 in parsing pixels (InputError otherwise).
    Source: ``face_parsing/__init__.py:49-57``."""
    left = _cheek_width("left_cheek_width", left_cheek_width)
    right = _cheek_width("right_cheek_width", right_cheek_width)
    import cv2

    mask = np.zeros((PARSING_SIZE, PARSING_SIZE), np.uint8)
    cv2.rectangle(mask, (0, 0), (PARSING_SIZE // 2 - left, PARSING_SIZE - 1), 255, -1)
    cv2.rectangle(mask, (PARSING_SIZE // 2 + right, 0), (PARSING_SIZE - 1, PARSING_SIZE - 1), 255, -1)
    return mask


def face_mask(labels: np.ndarray, mode: str = "jaw", left_cheek_width: int = 90,
              right_cheek_width: int = 90) -> np.ndarray:
    """The (512, 512) uint8 mask, 255 on the pixels the generated face may replace, of a BiSeNet label map.

    ``raw`` (v1): skin, mouth and lips (1, 11, 12, 13). ``neck``: ``raw`` plus the neck (14). ``jaw`` (v15 default):
    the skin dilated with :func:`jaw_dilation_kernel` (on the cheek bands of :func:`cheek_mask` then eroded twice
    with :func:`jaw_erosion_kernel`), minus the nose (10), plus mouth and lips. The cheek widths are parsing pixels
    0..256 (the scripts use 90, ``inference.py:272-273``; ``FaceParsing()`` defaults to 80). InputError when
    ``labels`` is not a (512, 512) integer label map (0..18), or the mode or a width is invalid.
    Source: ``face_parsing/__init__.py:92-110``."""
    check_parsing_args(mode, left_cheek_width, right_cheek_width)
    labels = np.asarray(labels)
    if labels.shape != (PARSING_SIZE, PARSING_SIZE) or labels.dtype.kind not in "ui":
        raise InputError(f"labels must be a ({PARSING_SIZE}, {PARSING_SIZE}) integer label map from "
                         f"FaceParser.labels; got shape {labels.shape} dtype {labels.dtype}.")
    if mode in _KEEP:
        return np.where(np.isin(labels, _KEEP[mode]), 255, 0).astype(np.uint8)

    cheeks = cheek_mask(left_cheek_width, right_cheek_width) == 255  # validates the widths
    import cv2

    skin = np.where(labels == SKIN, 255, 0).astype(np.uint8)                        # :96
    dilated = cv2.dilate(skin, jaw_dilation_kernel(), iterations=1)                # :97
    eroded = cv2.erode(dilated, jaw_erosion_kernel(), iterations=2)                # :98
    region = np.where(cheeks, eroded, dilated) == 255                              # :101-102
    keep = (region & (labels != NOSE)) | np.isin(labels, (MOUTH, UPPER_LIP, LOWER_LIP))  # :103-105
    return np.where(keep, 255, 0).astype(np.uint8)


def face_mask_torch(labels: Any, mode: str = "jaw", left_cheek_width: int = 90, right_cheek_width: int = 90) -> Any:
    """:func:`face_mask` of (B, 512, 512) integer ``labels`` on any torch device: a (B, 512, 512) uint8 0/255 tensor
    there, bit-exact. ``cv2.dilate``/``erode`` become max pools over each kernel row's run of ones (exact on 0/1).
    InputError as :func:`face_mask`."""
    import torch

    check_parsing_args(mode, left_cheek_width, right_cheek_width)
    if (not isinstance(labels, torch.Tensor) or labels.ndim != 3 or tuple(labels.shape[1:]) != (PARSING_SIZE,) * 2
            or labels.dtype.is_floating_point or labels.dtype == torch.bool):
        raise InputError(f"labels must be a (B, {PARSING_SIZE}, {PARSING_SIZE}) integer torch tensor of label maps; "
                         f"got {getattr(labels, 'shape', type(labels).__name__)} {getattr(labels, 'dtype', '')}.")
    device = labels.device
    if mode in _KEEP:
        keep = torch.isin(labels, device_constant(_KEEP[mode], device, labels.dtype))
        return keep.to(torch.uint8) * 255
    cheeks = device_constant(cheek_mask(left_cheek_width, right_cheek_width) == 255, device, torch.bool)
    work = torch.float16 if device.type == "cuda" else torch.float32  # 0/1 values: exact in either
    skin = (labels == SKIN).to(work)[:, None]                                              # :96
    dilated = _binary_dilate(skin, jaw_dilation_kernel())                                  # :97
    kernel = jaw_erosion_kernel()
    eroded = dilated
    for _ in range(2):                                                                     # :98, iterations=2
        eroded = 1 - _binary_dilate(1 - eroded, kernel)  # erosion: outside pixels count as 1 (never win)
    region = torch.where(cheeks, eroded[:, 0], dilated[:, 0]) > 0.5                        # :101-102
    lips = torch.isin(labels, device_constant((MOUTH, UPPER_LIP, LOWER_LIP), device, labels.dtype))
    keep = (region & (labels != NOSE)) | lips                                              # :103-105
    return keep.to(torch.uint8) * 255


def _binary_dilate(x: Any, kernel: np.ndarray) -> Any:
    """OpenCV ``dilate`` (centre anchor, no kernel flip, zero outside) of a (B, 1, H, W) 0/1 float tensor."""
    import torch
    import torch.nn.functional as F

    kh, kw = kernel.shape
    ay, ax = kh // 2, kw // 2
    height, width = x.shape[-2:]
    padded = F.pad(x, (ax, kw - 1 - ax, ay, kh - 1 - ay), value=0.0)  # padded[y + i, x + j] = in(y+i-ay, x+j-ax)
    runs: dict[tuple[int, int], Any] = {}
    out = None
    for i in range(kh):
        cols = np.flatnonzero(kernel[i])
        if cols.size == 0:
            continue
        for run in np.split(cols, np.flatnonzero(np.diff(cols) != 1) + 1):
            start, length = int(run[0]), int(run.size)
            if (start, length) not in runs:
                pooled = F.max_pool2d(padded, (1, length), stride=1) if length > 1 else padded
                runs[(start, length)] = pooled[..., start:start + width]
            piece = runs[(start, length)][..., i:i + height, :]
            out = piece if out is None else torch.maximum(out, piece)
    return out


def check_parsing_args(mode: str, left_cheek_width: int = 90, right_cheek_width: int = 90) -> None:
    """Raise InputError unless ``mode`` is in :data:`PARSING_MODES` and both widths are integers 0..256."""
    if mode not in PARSING_MODES:
        raise InputError(f"parsing_mode must be one of {PARSING_MODES}; got {mode!r}. Use 'jaw' for MuseTalk 1.5 "
                         "(the official default) or 'raw' for 1.0.")
    _cheek_width("left_cheek_width", left_cheek_width)
    _cheek_width("right_cheek_width", right_cheek_width)


def _cheek_width(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= 256:
        raise InputError(f"{name} must be an integer between 0 and 256 (pixels of the 512-px parsing space); got "
                         f"{value!r}. The official scripts use 90.")
    return int(value)

