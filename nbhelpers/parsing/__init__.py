"""Face parsing: BiSeNet label maps and the ``raw`` / ``jaw`` / ``neck`` masks of the face to repaint.

MuseTalk decides which pixels of the generated face to show with a face-parsing network: BiSeNet with a ResNet-18
context path, trained by face-parsing.PyTorch on CelebAMask-HQ (file ``79999_iter.pth``).

- ``masks``: the label vocabulary (:data:`LABELS`) and :func:`face_mask`, the label map -> 0/255 mask step of each
  parsing mode (numpy + OpenCV), with :func:`face_mask_torch`, the same on a batch on a torch device (equal bit for
  bit).
- ``parser``: :class:`FaceParser` loads ``face-parse-bisent/79999_iter.pth`` strictly and turns RGB images, or the
  squares of frames already on the device, into (N, 512, 512) label maps with the official preprocessing.
- ``network``: :class:`nbhelpers.parsing.network.BiSeNet`, the ``torch.nn.Module`` whose parameter names and shapes
  equal the official checkpoint's. It imports torch, so it is loaded when a parser is first built; importing this
  package loads numpy only.

Source: ``musetalk/utils/face_parsing/__init__.py`` and ``model.py`` of the official repository
(docs/official-behaviour.md §7.3).
"""

from __future__ import annotations

from .masks import (
    LABELS,
    LOWER_LIP,
    MOUTH,
    N_CLASSES,
    NECK,
    NOSE,
    PARSING_MODES,
    SKIN,
    UPPER_LIP,
    check_parsing_args,
    cheek_mask,
    face_mask,
    face_mask_torch,
    jaw_dilation_kernel,
    jaw_erosion_kernel,
)
from .parser import BISENET_FILE, FaceParser, bisenet_path, build_bisenet, load_bisenet

__all__ = [
    "BISENET_FILE", "N_CLASSES", "LABELS", "PARSING_MODES", "SKIN", "NOSE", "MOUTH", "UPPER_LIP", "LOWER_LIP",
    "NECK", "face_mask", "face_mask_torch", "check_parsing_args", "jaw_dilation_kernel", "jaw_erosion_kernel",
    "cheek_mask", "FaceParser", "build_bisenet", "load_bisenet", "bisenet_path",
]
