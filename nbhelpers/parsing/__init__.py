"""Face parsing: BiSeNet label maps (``parser``, ``network``) and the ``raw`` / ``jaw`` / ``neck`` masks of the face
to repaint (``masks``). BiSeNet with a ResNet-18 context path, trained by face-parsing.PyTorch on CelebAMask-HQ
(``79999_iter.pth``). Importing this package loads numpy only.
Source: ``musetalk/utils/face_parsing/__init__.py``, ``model.py`` (docs/official-behaviour.md §7.3).
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

__all__ = ["BISENET_FILE", "N_CLASSES", "LABELS", "PARSING_MODES", "SKIN", "NOSE", "MOUTH", "UPPER_LIP", "LOWER_LIP",
           "NECK", "face_mask", "face_mask_torch", "check_parsing_args", "jaw_dilation_kernel", "jaw_erosion_kernel",
           "cheek_mask", "FaceParser", "build_bisenet", "load_bisenet", "bisenet_path"]
