"""Face parsing: our BiSeNet (19 CelebAMask-HQ classes) and the ``raw`` / ``jaw`` / ``neck`` masks.

MuseTalk decides which pixels of the generated face to show with a face-parsing network: BiSeNet with a
ResNet-18 context path, trained by face-parsing.PyTorch on CelebAMask-HQ (file ``79999_iter.pth``). This module
holds

* :func:`face_mask`: the label map -> 0/255 mask step of each parsing mode (numpy + OpenCV, no torch), and
  :func:`face_mask_torch`, the same on a batch of label maps on a torch device (equal bit for bit);
* :class:`FaceParser`: loads ``face-parse-bisent/79999_iter.pth`` strictly into our BiSeNet and turns RGB images
  into (N, 512, 512) label maps with the official preprocessing (:meth:`FaceParser.labels`, host images), or the
  squares of frames already on the device into label maps there (:meth:`FaceParser.labels_torch`, the PIL resize
  done integer-exactly by :mod:`nbhelpers.resample`);
* ``BiSeNet``: the network itself (a ``torch.nn.Module``), written from the parameter names and shapes of the
  official checkpoint (``shared/reference/checkpoints/bisenet-79999_iter.keys.json``). It is built on first access
  (``from nbhelpers.parsing import BiSeNet``) so that importing this module loads no torch.

The facts come from ``shared/reference/musetalk-pipeline.md`` §7.3 (``musetalk/utils/face_parsing/__init__.py``
and ``model.py`` of the official repository, commit 0a89dec).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .constants import PARSING_SIZE
from .errors import CheckpointError, FallbackWarning, InputError, WeightsError
from .gpu import batched, device_constant
from .models import LOAD_LOCK
from .resample import crop_resize_batch

# ``BiSeNet`` is public too (``from nbhelpers.parsing import BiSeNet``) but stays out of __all__ so that a star
# import does not load torch.
__all__ = [
    "BISENET_FILE", "N_CLASSES", "LABELS", "PARSING_MODES", "SKIN", "NOSE", "MOUTH", "UPPER_LIP", "LOWER_LIP",
    "NECK", "face_mask", "face_mask_torch", "check_parsing_args", "jaw_dilation_kernel", "jaw_erosion_kernel", "cheek_mask", "FaceParser",
    "build_bisenet", "load_bisenet", "bisenet_path",
]

BISENET_FILE = "face-parse-bisent/79999_iter.pth"  # relative to a weights dir (face_parsing/__init__.py:61-67)
N_CLASSES = 19  # BiSeNet output classes: background + 18 CelebAMask-HQ parts (model.py:230-254)

# Class index -> name, in the CelebAMask-HQ order that face-parsing.PyTorch trained with (reference §7.3).
LABELS = ("background", "skin", "l_brow", "r_brow", "l_eye", "r_eye", "eye_g", "l_ear", "r_ear", "ear_r",
          "nose", "mouth", "u_lip", "l_lip", "neck", "neck_l", "cloth", "hair", "hat")
SKIN, NOSE, MOUTH, UPPER_LIP, LOWER_LIP, NECK = 1, 10, 11, 12, 13, 14

PARSING_MODES = ("jaw", "raw", "neck")
_KEEP = {  # labels kept as 255 by the simple modes (face_parsing/__init__.py:93-95,106-108)
    "raw": (SKIN, MOUTH, UPPER_LIP, LOWER_LIP),
    "neck": (SKIN, MOUTH, UPPER_LIP, LOWER_LIP, NECK),
}

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # RGB, ToTensor scale [0, 1] (face_parsing/__init__.py:71-75)
IMAGENET_STD = (0.229, 0.224, 0.225)


# ---------------------------------------------------------------------------------------------------------------
# Label map -> mask (numpy / OpenCV only)
# ---------------------------------------------------------------------------------------------------------------

def jaw_dilation_kernel() -> np.ndarray:
    """The 33x33 "cone + tail" kernel that jaw mode dilates the skin with.

    Rows 0-9 are zero. Row ``r`` in 10..20 holds a centred run of ``2 (r - 10) + 1`` ones (1, 3, ..., 21 wide, around
    column 16). Rows 21-32 hold ones in columns 6-26 (21 wide). With OpenCV's centre anchor (16, 16) a single skin
    pixel at row ``y`` spreads to rows ``y-16 .. y-4`` at full width 21 and to rows ``y-3 .. y+6`` as a triangle
    narrowing from 19 to 1 pixels, i.e. the skin grows mostly upwards.

    Returns:
        (33, 33) uint8 array of 0/1.

    Source: ``musetalk/utils/face_parsing/__init__.py:15-42`` (reference §7.3, jaw step 2).
    """
    kernel = np.zeros((33, 33), np.uint8)
    for row in range(10, 21):
        half = row - 10
        kernel[row, 16 - half:16 + half + 1] = 1
    kernel[21:33, 6:27] = 1
    return kernel


def jaw_erosion_kernel() -> np.ndarray:
    """The elliptical (35 wide, 3 high) structuring element that jaw mode erodes twice with.

    Returns:
        (3, 35) uint8 array: row 0 and row 2 have a single one at column 17, row 1 is all ones.

    Source: ``cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (35, 3))``, ``face_parsing/__init__.py:45-46``.
    """
    import cv2

    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (35, 3))


def cheek_mask(left_cheek_width: int = 90, right_cheek_width: int = 90) -> np.ndarray:
    """The two cheek bands of jaw mode in the 512-px parsing space.

    255 on columns ``0 .. 256 - left_cheek_width`` and ``256 + right_cheek_width .. 511`` (both ends inclusive, as
    OpenCV draws filled rectangles), 0 in the central band. With 90/90: columns 0-166 and 346-511.

    Args:
        left_cheek_width: Width in parsing pixels (0-256) of the central band left of column 256.
        right_cheek_width: Width in parsing pixels (0-256) of the central band right of column 256.

    Returns:
        (512, 512) uint8 of 0/255.

    Raises:
        InputError: When a width is not an integer in 0..256.

    Source: ``face_parsing/__init__.py:49-57`` (reference §7.3, jaw step 4).
    """
    left = _cheek_width("left_cheek_width", left_cheek_width)
    right = _cheek_width("right_cheek_width", right_cheek_width)
    import cv2

    mask = np.zeros((PARSING_SIZE, PARSING_SIZE), np.uint8)
    cv2.rectangle(mask, (0, 0), (PARSING_SIZE // 2 - left, PARSING_SIZE - 1), 255, -1)
    cv2.rectangle(mask, (PARSING_SIZE // 2 + right, 0), (PARSING_SIZE - 1, PARSING_SIZE - 1), 255, -1)
    return mask


def face_mask(labels: np.ndarray, mode: str = "jaw", left_cheek_width: int = 90,
              right_cheek_width: int = 90) -> np.ndarray:
    """Turn a BiSeNet label map into the 0/255 mask of the pixels the generated face may replace.

    Modes:

    * ``raw`` (v1, or v15 with ``parsing_mode="raw"``): 255 on skin, mouth, upper and lower lip (1, 11, 12, 13).
    * ``neck``: ``raw`` plus the neck (14).
    * ``jaw`` (v15 default): the skin (1) is dilated with :func:`jaw_dilation_kernel` (grows upwards), the
      dilation is eroded twice with :func:`jaw_erosion_kernel`; the eroded version is used on the cheek bands of
      :func:`cheek_mask` and the dilated one in the central band. That region minus the nose (10), plus the lips
      and mouth (11, 12, 13), is the mask.

    Args:
        labels: (512, 512) integer label map (values 0..18) from :meth:`FaceParser.labels`.
        mode: ``"jaw"``, ``"raw"`` or ``"neck"``.
        left_cheek_width: Jaw mode only: central band width left of column 256, in parsing pixels (0-256).
            The scripts default to 90 (``inference.py:272``); the official ``FaceParsing()`` constructor (used by
            v1, where it does not matter) has 80.
        right_cheek_width: Jaw mode only: the same right of column 256 (``inference.py:273``).

    Returns:
        (512, 512) uint8 mask, 255 where kept and 0 elsewhere.

    Raises:
        InputError: When ``labels`` is not a (512, 512) integer array, ``mode`` is unknown, or a cheek width is
            outside 0..256.

    Source: ``musetalk/utils/face_parsing/__init__.py:92-110`` (reference §7.3).
    """
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


def face_mask_torch(labels: Any, mode: str = "jaw", left_cheek_width: int = 90,
                    right_cheek_width: int = 90) -> Any:
    """:func:`face_mask` of a batch of label maps as torch ops on their device (equal bit for bit).

    The jaw mode's ``cv2.dilate`` / ``cv2.erode`` are binary max / min filters over the kernels'
    ones with OpenCV's anchor (the centre) and default border (outside pixels never win); they are done as max
    pools over each kernel row's run of ones, shifted by the row's offset, which is exact for 0/1 images.

    Args:
        labels: (B, 512, 512) integer torch tensor (uint8 from :meth:`FaceParser.labels_torch`), any device.
        mode: ``"jaw"``, ``"raw"`` or ``"neck"``.
        left_cheek_width: Jaw mode only: central band width left of column 256, parsing pixels (0-256).
        right_cheek_width: Jaw mode only: the same right of column 256.

    Returns:
        (B, 512, 512) uint8 tensor of 0/255 on ``labels``' device.

    Raises:
        InputError: When ``labels`` is not a (B, 512, 512) integer tensor, or the mode or a width is invalid.

    Source: ``musetalk/utils/face_parsing/__init__.py:92-110`` (reference §7.3), as :func:`face_mask`.
    """
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
    """OpenCV ``dilate`` of a (B, 1, H, W) 0/1 float tensor with a 0/1 kernel, centre anchor, zero outside.

    ``out(y, x) = max over kernel ones (i, j) of in(y + i - ay, x + j - ax)``, no kernel flip (OpenCV's definition).
    """
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
    """Validate a parsing mode and the cheek widths (cheap; call before any model loads).

    Args:
        mode: ``"jaw"``, ``"raw"`` or ``"neck"``.
        left_cheek_width: Integer 0..256 (parsing pixels).
        right_cheek_width: Integer 0..256 (parsing pixels).

    Raises:
        InputError: When ``mode`` is unknown or a width is not an integer in 0..256.
    """
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


# ---------------------------------------------------------------------------------------------------------------
# The network (torch, built on first use)
# ---------------------------------------------------------------------------------------------------------------

def __getattr__(name: str) -> Any:  # PEP 562: `from nbhelpers.parsing import BiSeNet` builds the classes lazily
    if name == "BiSeNet":
        return _torch_classes()["BiSeNet"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _torch_classes() -> dict[str, type]:
    """Define the BiSeNet modules (needs torch; called on first use, once).

    Names and shapes follow the official state dict: ``cp.resnet.*`` (ResNet-18 without its classifier),
    ``cp.arm16`` / ``cp.arm32`` (attention refinement), ``cp.conv_head16/32`` and ``cp.conv_avg`` (context path),
    ``ffm`` (feature fusion) and the three heads ``conv_out`` (main, 19 classes from 256 channels), ``conv_out16``
    and ``conv_out32`` (auxiliary, from 128 channels). Every convolution has no bias and is followed by a
    BatchNorm (eps 1e-5) except the 1x1 attention and classifier convolutions.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ConvBNReLU(nn.Module):
        """conv (no bias) -> BatchNorm -> ReLU. Keys: ``conv.weight``, ``bn.*``."""

        def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, padding: int = 1):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x):
            return F.relu(self.bn(self.conv(x)))

    class BasicBlock(nn.Module):
        """ResNet basic block; ``downsample`` (1x1 conv + BN) when the stride or the width changes."""

        def __init__(self, cin: int, cout: int, stride: int = 1):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            branch = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            shortcut = x if self.downsample is None else self.downsample(x)
            return F.relu(shortcut + branch)

    class ResNet18(nn.Module):
        """ResNet-18 trunk returning the 1/8, 1/16 and 1/32 feature maps (128, 256, 512 channels)."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = nn.Sequential(BasicBlock(64, 64), BasicBlock(64, 64))
            self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128))
            self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256))
            self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512))

        def forward(self, x):
            x = self.layer1(self.maxpool(F.relu(self.bn1(self.conv1(x)))))
            feat8 = self.layer2(x)
            feat16 = self.layer3(feat8)
            feat32 = self.layer4(feat16)
            return feat8, feat16, feat32

    def global_pool(x):
        return x.mean(dim=(2, 3), keepdim=True)

    class AttentionRefinement(nn.Module):
        """Features times a channel attention (global pool -> 1x1 conv -> BN -> sigmoid)."""

        def __init__(self, cin: int, cout: int):
            super().__init__()
            self.conv = ConvBNReLU(cin, cout)
            self.conv_atten = nn.Conv2d(cout, cout, 1, bias=False)
            self.bn_atten = nn.BatchNorm2d(cout)

        def forward(self, x):
            feat = self.conv(x)
            return feat * torch.sigmoid(self.bn_atten(self.conv_atten(global_pool(feat))))

    class ContextPath(nn.Module):
        """ResNet-18 plus attention refinement of the 1/16 and 1/32 maps, merged top-down (nearest upsampling)."""

        def __init__(self):
            super().__init__()
            self.resnet = ResNet18()
            self.arm16 = AttentionRefinement(256, 128)
            self.arm32 = AttentionRefinement(512, 128)
            self.conv_head32 = ConvBNReLU(128, 128)
            self.conv_head16 = ConvBNReLU(128, 128)
            self.conv_avg = ConvBNReLU(512, 128, kernel=1, padding=0)

        def forward(self, x):
            feat8, feat16, feat32 = self.resnet(x)
            context = self.conv_avg(global_pool(feat32))  # (N, 128, 1, 1), broadcast over the 1/32 map
            up32 = F.interpolate(self.arm32(feat32) + context, size=feat16.shape[2:], mode="nearest")
            up32 = self.conv_head32(up32)
            up16 = F.interpolate(self.arm16(feat16) + up32, size=feat8.shape[2:], mode="nearest")
            up16 = self.conv_head16(up16)
            return feat8, up16, up32  # 1/8 (128 ch), 1/8 (128 ch), 1/16 (128 ch)

    class FeatureFusion(nn.Module):
        """Concatenate spatial and context features, 1x1 ConvBNReLU, then add a channel-attention copy."""

        def __init__(self, cin: int, cout: int):
            super().__init__()
            self.convblk = ConvBNReLU(cin, cout, kernel=1, padding=0)
            self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
            self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

        def forward(self, spatial, context):
            feat = self.convblk(torch.cat([spatial, context], dim=1))
            atten = torch.sigmoid(self.conv2(F.relu(self.conv1(global_pool(feat)))))
            return feat + feat * atten

    class Head(nn.Module):
        """ConvBNReLU (3x3) followed by a 1x1 classifier to ``n_classes`` logits."""

        def __init__(self, cin: int, mid: int, n_classes: int):
            super().__init__()
            self.conv = ConvBNReLU(cin, mid)
            self.conv_out = nn.Conv2d(mid, n_classes, 1, bias=False)

        def forward(self, x):
            return self.conv_out(self.conv(x))

    class BiSeNet(nn.Module):
        """BiSeNet face parser (face-parsing.PyTorch layout), 19 classes.

        Parameter names and shapes equal the official ``79999_iter.pth`` (191 entries, 13 313 119 values with
        the BatchNorm counters). ``forward`` returns the three heads like the original; :meth:`parse` returns only
        the main head (what MuseTalk uses) without computing the two auxiliary ones.

        Source: ``musetalk/utils/face_parsing/model.py:230-254``, ``resnet.py`` (reference §7.3).
        """

        def __init__(self, n_classes: int = N_CLASSES):
            super().__init__()
            self.cp = ContextPath()
            self.ffm = FeatureFusion(256, 256)
            self.conv_out = Head(256, 256, n_classes)
            self.conv_out16 = Head(128, 64, n_classes)
            self.conv_out32 = Head(128, 64, n_classes)

        def _upsample(self, logits, size):
            return F.interpolate(logits, size=size, mode="bilinear", align_corners=True)

        def parse(self, x):
            """Main-head logits (N, n_classes, H, W) for normalised images x (N, 3, H, W), H and W multiples of 32.

            Equal to ``forward(x)[0]``.
            """
            feat8, context8, _ = self.cp(x)
            return self._upsample(self.conv_out(self.ffm(feat8, context8)), x.shape[2:])

        def forward(self, x):
            """(main, aux16, aux32) logits, each (N, n_classes, H, W), upsampled bilinearly (align_corners=True)."""
            feat8, context8, context16 = self.cp(x)
            size = x.shape[2:]
            return (self._upsample(self.conv_out(self.ffm(feat8, context8)), size),
                    self._upsample(self.conv_out16(context8), size),
                    self._upsample(self.conv_out32(context16), size))

    for cls in (ConvBNReLU, BasicBlock, ResNet18, AttentionRefinement, ContextPath, FeatureFusion, Head, BiSeNet):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return {cls.__name__: cls for cls in (ConvBNReLU, BasicBlock, ResNet18, AttentionRefinement, ContextPath,
                                            FeatureFusion, Head, BiSeNet)}


def build_bisenet(n_classes: int = N_CLASSES):
    """A BiSeNet with PyTorch's default random initialisation (no file read).

    Args:
        n_classes: Output classes (19 for the official weights).

    Returns:
        ``BiSeNet`` module in eval mode on the CPU, float32.
    """
    return _torch_classes()["BiSeNet"](n_classes).eval()


def bisenet_path(weights: str | os.PathLike) -> Path:
    """The path of ``79999_iter.pth`` given a weights dir or the file itself.

    Args:
        weights: A weights directory in the official layout (holding ``face-parse-bisent/79999_iter.pth``), or the
            path of a BiSeNet ``.pth`` file.

    Returns:
        Path of the checkpoint file (which exists).

    Raises:
        WeightsError: When neither the file nor ``<weights>/face-parse-bisent/79999_iter.pth`` exists.
    """
    path = Path(weights).expanduser()
    if path.is_file():
        return path
    candidate = path / BISENET_FILE
    if candidate.is_file():
        return candidate
    raise WeightsError(f"The face-parsing weights were not found: neither {str(path)!r} nor {str(candidate)!r} is a "
                       f"file. Run notebooks/00_setup.ipynb (or nbhelpers.weights.download) to fetch "
                       f"{BISENET_FILE}, or pass the path of 79999_iter.pth.")


def load_bisenet(weights: str | os.PathLike, device: Any = "cpu", dtype: Any = None):
    """Load the official ``79999_iter.pth`` strictly into our BiSeNet.

    The file is a plain state dict. It is read with ``torch.load(weights_only=True)`` onto the CPU; every key
    must be present with its exact shape and no key may be extra. (The official code first loads the ImageNet
    ResNet-18 into the backbone; 79999_iter.pth overwrites all of it, so that file is not needed.)

    Args:
        weights: Weights directory or checkpoint path (see :func:`bisenet_path`).
        device: torch device for the model (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: torch dtype of the parameters; None = ``torch.float32``. fp16 is meant for CUDA.

    Returns:
        ``BiSeNet`` in eval mode on ``device`` with ``dtype``.

    Raises:
        WeightsError: When the file is missing.
        CheckpointError: When the file cannot be read as a state dict, or its keys or shapes differ from BiSeNet's
            (the message lists the missing, unexpected and mis-shaped keys).

    Source: ``face_parsing/__init__.py:59-67`` (reference §1.1, §7.3).
    """
    import torch

    path = bisenet_path(weights)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unusable file
        raise CheckpointError(f"Could not read the face-parsing checkpoint {str(path)!r} ({type(exc).__name__}: "
                              f"{exc}). The file is probably incomplete or not 79999_iter.pth; delete it and run "
                              "notebooks/00_setup.ipynb again to re-download it.") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{str(path)!r} is not a plain state dict of tensors (got {type(state).__name__}). "
                              "Use the official face-parse-bisent/79999_iter.pth.")
    model = build_bisenet()
    _check_state_dict(model.state_dict(), state, path)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype or torch.float32).eval()


def _check_state_dict(expected: dict, state: dict, path: Path) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(f"{k}: file {tuple(state[k].shape)} != model {tuple(expected[k].shape)}"
                    for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if not (missing or unexpected or shapes):
        return
    lines = [f"The face-parsing checkpoint {str(path)!r} does not match BiSeNet (19 classes, ResNet-18):"]
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", shapes)):
        if items:
            shown = ", ".join(items[:8]) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")
            lines.append(f"  {title}: {shown}")
    if unexpected and all(k.startswith("module.") for k in unexpected):
        lines.append("  The keys start with 'module.' (saved from DataParallel); the official file has no prefix.")
    lines.append("Use the official face-parse-bisent/79999_iter.pth (about 53 MB); re-download it with "
                 "notebooks/00_setup.ipynb if it was replaced.")
    raise CheckpointError("\n".join(lines))


# ---------------------------------------------------------------------------------------------------------------
# The parser: images -> label maps
# ---------------------------------------------------------------------------------------------------------------

class FaceParser:
    """BiSeNet face parsing with the official preprocessing, batched.

    Example:
        >>> parser = FaceParser("models", device="cuda", dtype=torch.float16)  # doctest: +SKIP
        >>> labels = parser.labels(crops_rgb)            # (N, 512, 512) uint8, values 0..18  # doctest: +SKIP
        >>> mask = face_mask(labels[0], "jaw")           # (512, 512) uint8 0/255  # doctest: +SKIP

    Args:
        weights: Weights directory (holding ``face-parse-bisent/79999_iter.pth``) or the checkpoint path.
        device: torch device (``"cpu"``, ``"cuda"``...). The official code always uses ``cuda:0`` (Q4).
        dtype: torch dtype of the network; None = float32. ``torch.float16`` works on CUDA (the labels can differ
            from fp32 on a few boundary pixels); on the CPU a half dtype falls back to float32 with a warning.
        batch_size: Images per forward pass (512x512 each); on CUDA out-of-memory the batch is halved.

    Raises:
        WeightsError: When the checkpoint is missing.
        CheckpointError: When it does not match BiSeNet.

    Source: ``musetalk/utils/face_parsing/__init__.py:59-90`` (reference §7.3).
    """

    def __init__(self, weights: str | os.PathLike, device: Any = "cpu", dtype: Any = None, batch_size: int = 8):
        import torch

        if not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer; got {batch_size!r}.")
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        if self.device.type == "cpu" and self.dtype != torch.float32:
            import warnings

            warnings.warn(f"FaceParser: {self.dtype} on the CPU is slow or unsupported; using float32 instead.",
                          FallbackWarning, stacklevel=2)
            self.dtype = torch.float32
        self.batch_size = batch_size
        self.path = bisenet_path(weights)

        with LOAD_LOCK:  # one model built at a time in the process (nbhelpers.models.LOAD_LOCK)
            self.net = load_bisenet(self.path, self.device, self.dtype)

    def __repr__(self) -> str:
        return f"FaceParser({str(self.path)!r}, device={str(self.device)!r}, dtype={self.dtype})"

    @staticmethod
    def preprocess(images_rgb: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
        """Official input preparation: PIL BILINEAR resize to 512x512, scale to [0, 1], ImageNet mean/std.

        Args:
            images_rgb: (N, H, W, 3) uint8 RGB array, or a sequence of (H_i, W_i, 3) uint8 RGB arrays (the
                expanded squares of different frames have different sizes).

        Returns:
            (N, 3, 512, 512) float32 normalised images.

        Raises:
            InputError: When an image is not (H, W, 3) uint8 with H, W >= 1.

        Source: ``face_parsing/__init__.py:71-75,83-88`` (transforms.ToTensor + Normalize; PIL resize BILINEAR).
        """
        from PIL import Image

        bilinear = getattr(Image, "Resampling", Image).BILINEAR
        images = _image_list(images_rgb)
        out = np.empty((len(images), 3, PARSING_SIZE, PARSING_SIZE), np.float32)
        mean = np.asarray(IMAGENET_MEAN, np.float32)[:, None, None]
        std = np.asarray(IMAGENET_STD, np.float32)[:, None, None]
        for i, image in enumerate(images):
            resized = np.asarray(Image.fromarray(image).resize((PARSING_SIZE, PARSING_SIZE), bilinear))
            out[i] = (resized.transpose(2, 0, 1).astype(np.float32) / 255.0 - mean) / std
        return out

    def labels(self, images_rgb: np.ndarray | Sequence[np.ndarray], batch_size: int | None = None) -> np.ndarray:
        """Per-pixel class labels of each image, in the 512x512 parsing space.

        Args:
            images_rgb: (N, H, W, 3) uint8 **RGB** array, or a sequence of (H_i, W_i, 3) uint8 RGB arrays. MuseTalk
                passes the expanded square of the original frame (``blending.crop_padded`` of the BGR frame,
                flipped to RGB).
            batch_size: Images per forward pass; None = the parser's ``batch_size``.

        Returns:
            (N, 512, 512) uint8 labels 0..18 (see :data:`LABELS`): argmax of the main head.

        Raises:
            InputError: When an image is not (H, W, 3) uint8.
            OutOfMemoryError: When one image still does not fit on the GPU.

        Source: ``face_parsing/__init__.py:83-90`` (``net(img)[0]``, argmax over classes).
        """
        import torch

        images = _image_list(images_rgb)
        result = np.empty((len(images), PARSING_SIZE, PARSING_SIZE), np.uint8)

        def step(sl: slice) -> np.ndarray:
            x = torch.from_numpy(self.preprocess(images[sl])).to(self.device)
            with torch.inference_mode():
                logits = self.net.parse(x.to(self.dtype))
                return logits.argmax(dim=1).to(torch.uint8).cpu().numpy()

        for sl, out in batched(len(images), batch_size or self.batch_size, step, stage="face parsing"):
            result[sl] = out
        return result

    def preprocess_torch(self, frames: Any, squares: Sequence[Sequence[int]], bgr: bool = True) -> Any:
        """:meth:`preprocess` of the squares of frames already on a torch device, without leaving it.

        The crop (black outside the frame) and the PIL BILINEAR resize to 512 are done by
        :func:`nbhelpers.resample.crop_resize_batch`, bit-exact with PIL; the scaling and mean/std are the same
        float32 operations as :meth:`preprocess`.

        Args:
            frames: (B, H, W, 3) uint8 torch tensor, any device.
            squares: B ``(xs, ys, xe, ye)`` expanded squares (``blending.expanded_square``), frame pixels; may
                extend past the frame.
            bgr: The frames are BGR (OpenCV order, the pipeline's); they are flipped to RGB as the official code
                does before parsing. False for RGB frames.

        Returns:
            (B, 3, 512, 512) float32 normalised RGB images on ``frames``' device.

        Raises:
            InputError: When ``frames`` is not (B, H, W, 3) uint8 or the squares do not match it.

        Source: ``face_parsing/__init__.py:71-75,83-88``; ``blending.py:60`` (the crop).
        """
        import torch

        _check_frames_torch(frames, squares)
        images = crop_resize_batch(frames.permute(0, 3, 1, 2), squares, PARSING_SIZE, "bilinear")
        if bgr:
            images = images.flip(1)
        mean = device_constant(IMAGENET_MEAN, frames.device, torch.float32).view(1, 3, 1, 1)
        std = device_constant(IMAGENET_STD, frames.device, torch.float32).view(1, 3, 1, 1)
        return (images.to(torch.float32) / 255.0 - mean) / std

    def labels_torch(self, frames: Any, squares: Sequence[Sequence[int]], bgr: bool = True) -> Any:
        """Label maps of the squares of a batch of frames on the parser's device (no host round trip).

        Args:
            frames: (B, H, W, 3) uint8 torch tensor; moved to the parser's device when elsewhere.
            squares: B expanded squares ``(xs, ys, xe, ye)`` (see :meth:`preprocess_torch`).
            bgr: Frames in BGR order (default) or RGB.

        Returns:
            (B, 512, 512) uint8 tensor of labels 0..18 on the parser's device. One forward pass: the caller
            chooses B (``blending.prepare_materials_torch`` uses the parser's ``batch_size``).

        Raises:
            InputError: As :meth:`preprocess_torch`.

        Source: ``face_parsing/__init__.py:83-90`` (``net(img)[0]``, argmax over classes).
        """
        import torch

        x = self.preprocess_torch(frames.to(self.device, non_blocking=True), squares, bgr)
        with torch.inference_mode():
            return self.net.parse(x.to(self.dtype)).argmax(dim=1).to(torch.uint8)

    def masks(self, images_rgb: np.ndarray | Sequence[np.ndarray], mode: str = "jaw", left_cheek_width: int = 90,
              right_cheek_width: int = 90) -> np.ndarray:
        """:meth:`labels` followed by :func:`face_mask` for each image.

        Args:
            images_rgb: See :meth:`labels`.
            mode: ``"jaw"``, ``"raw"`` or ``"neck"``.
            left_cheek_width: Jaw-mode cheek band, parsing pixels (default 90).
            right_cheek_width: Same on the right.

        Returns:
            (N, 512, 512) uint8 masks of 0/255.

        Raises:
            InputError: As :meth:`labels` and :func:`face_mask`.
        """
        check_parsing_args(mode, left_cheek_width, right_cheek_width)  # before the network runs
        out = np.zeros((len(images_rgb), PARSING_SIZE, PARSING_SIZE), np.uint8)
        for i, lab in enumerate(self.labels(images_rgb)):
            out[i] = face_mask(lab, mode, left_cheek_width, right_cheek_width)
        return out


def _check_frames_torch(frames: Any, squares: Sequence[Sequence[int]]) -> None:
    import torch

    if (not isinstance(frames, torch.Tensor) or frames.ndim != 4 or frames.shape[3] != 3
            or frames.dtype != torch.uint8):
        raise InputError(f"frames must be a (B, H, W, 3) uint8 torch tensor; got "
                         f"{getattr(frames, 'shape', type(frames).__name__)} {getattr(frames, 'dtype', '')}.")
    if len(squares) != frames.shape[0]:
        raise InputError(f"squares must have one entry per frame ({frames.shape[0]}); got {len(squares)}.")
    for i, sq in enumerate(squares):
        if len(sq) != 4 or int(sq[2]) - int(sq[0]) != int(sq[3]) - int(sq[1]) or int(sq[2]) <= int(sq[0]):
            raise InputError(f"squares[{i}] must be (xs, ys, xe, ye) of a non-empty square; got {tuple(sq)!r}.")


def _image_list(images_rgb: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    if isinstance(images_rgb, np.ndarray) and images_rgb.ndim == 3:
        raise InputError(f"images_rgb must be a batch (N, H, W, 3) or a list of (H, W, 3) images; got one image of "
                         f"shape {images_rgb.shape}. Wrap it: [image].")
    images = [np.ascontiguousarray(im) for im in images_rgb]
    for i, im in enumerate(images):
        if im.ndim != 3 or im.shape[2] != 3 or im.dtype != np.uint8 or im.shape[0] < 1 or im.shape[1] < 1:
            raise InputError(f"images_rgb[{i}] must be an (H, W, 3) uint8 RGB image; got shape {im.shape} dtype "
                             f"{im.dtype}.")
    return images
