"""BiSeNet face parsing: ``79999_iter.pth`` loaded strictly, images turned into (N, 512, 512) label maps.

Source: ``musetalk/utils/face_parsing/__init__.py:59-90`` (docs/official-behaviour.md §7.3).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import PARSING_SIZE
from ..errors import INSTALL_TORCH, CheckpointError, FallbackWarning, InputError, WeightsError, require
from ..gpu import batched, device_constant
from ..models import LOAD_LOCK, check_state_dict
from ..resample import crop_resize_batch
from ..weights import MANIFEST
from .masks import N_CLASSES, check_parsing_args, face_mask

BISENET_FILE = "face-parse-bisent/79999_iter.pth"  # relative to a weights dir (face_parsing/__init__.py:61-67)
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # RGB, ToTensor scale [0, 1] (face_parsing/__init__.py:71-75)
IMAGENET_STD = (0.229, 0.224, 0.225)


def build_bisenet(n_classes: int = N_CLASSES):
    """A ``BiSeNet`` of ``n_classes`` outputs with PyTorch's random initialisation, eval mode, CPU, float32."""
    return require("nbhelpers.parsing.network", INSTALL_TORCH).BiSeNet(n_classes).eval()


def bisenet_path(weights: str | os.PathLike) -> Path:
    """The checkpoint ``weights`` (a ``.pth`` file) or ``weights/face-parse-bisent/79999_iter.pth``; WeightsError
    when neither exists."""
    path = Path(weights).expanduser()
    for found in (path, path / BISENET_FILE):
        if found.is_file():
            return found
    raise WeightsError(f"The face-parsing weights were not found: neither {str(path)!r} nor {str(found)!r} is a "
                       f"file. Run notebooks/01_weights.ipynb (or nbhelpers.weights.download) to fetch {BISENET_FILE} "
                       f"({MANIFEST.get('bisenet').expected_text()}), or pass the path of 79999_iter.pth.")


def load_bisenet(weights: str | os.PathLike, device: Any = "cpu", dtype: Any = None):
    """``BiSeNet`` in eval mode on ``device`` with ``dtype`` (None: float32) from the plain state dict
    ``79999_iter.pth`` (``weights``: a folder or the file, :func:`bisenet_path`), read with
    ``torch.load(weights_only=True)``: every key present with its shape, none extra. The official ImageNet ResNet-18
    load is not needed (this file overwrites all of it). WeightsError for a missing file; CheckpointError for not a
    state dict, or keys or shapes that differ from BiSeNet's (listed in the message).
    Source: ``face_parsing/__init__.py:59-67`` (docs/official-behaviour.md §1.1)."""
    import torch

    path, official = bisenet_path(weights), f"the official {BISENET_FILE} is {MANIFEST.get('bisenet').expected_text()}"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unusable file
        raise CheckpointError(f"Could not read the face-parsing checkpoint {str(path)!r} ({type(exc).__name__}: "
                              f"{exc}); it has {path.stat().st_size / 2**20:.1f} MiB and {official}: probably "
                              "incomplete. Delete it and run notebooks/01_weights.ipynb again to fetch it "
                              "anew.") from exc
    model = build_bisenet()
    check_state_dict(model, state, path, f"BiSeNet face parser (19 classes, ResNet-18; {official})")
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype or torch.float32).eval()


class FaceParser:
    """BiSeNet face parsing of ``weights`` (:func:`bisenet_path`) with the official preprocessing, ``batch_size``
    512x512 images a pass (halved on CUDA out-of-memory), on ``device`` (officially always ``cuda:0``, quirk Q4).

    ``dtype`` None is float32; float16 on CUDA can change a few boundary labels; on the CPU a half dtype falls back
    to float32 with a FallbackWarning. Raises what :func:`load_bisenet` raises."""

    def __init__(self, weights: str | os.PathLike, device: Any = "cpu", dtype: Any = None, batch_size: int = 8):
        import torch

        if not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer; got {batch_size!r}.")
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        if self.device.type == "cpu" and self.dtype != torch.float32:
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
        """(N, 3, 512, 512) float32 inputs of (N, H, W, 3) uint8 RGB ``images_rgb`` (or a list of any sizes): PIL
        BILINEAR resize to 512, scale to [0, 1], ImageNet mean/std. InputError for a non-(H, W, 3) uint8 image.
        Source: ``face_parsing/__init__.py:71-75,83-88``."""
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
        """(N, 512, 512) uint8 labels 0..18 (:data:`LABELS`), the argmax of the main head, of each image of
        ``images_rgb``, an (N, H, W, 3) uint8 **RGB** array or a list of (H_i, W_i, 3) ones (MuseTalk passes each
        frame's expanded square flipped to RGB); ``batch_size`` None: the parser's.
        Raises InputError: an image is not (H, W, 3) uint8; OutOfMemoryError: one image does not fit on the GPU.
        Source: ``face_parsing/__init__.py:83-90``."""
        import torch

        images = _image_list(images_rgb)
        result = np.empty((len(images), PARSING_SIZE, PARSING_SIZE), np.uint8)

        def step(sl: slice) -> np.ndarray:
            x = torch.from_numpy(self.preprocess(images[sl])).to(self.device)
            with torch.inference_mode():
                return self.net.parse(x.to(self.dtype)).argmax(dim=1).to(torch.uint8).cpu().numpy()

        for sl, out in batched(len(images), batch_size or self.batch_size, step, stage="face parsing"):
            result[sl] = out
        return result

    def preprocess_torch(self, frames: Any, squares: Sequence[Sequence[int]]) -> Any:
        """:meth:`preprocess` of the squares of frames on their torch device: (B, 3, 512, 512) float32 RGB there.
        ``frames`` (B, H, W, 3) uint8 BGR; ``squares`` B ``(xs, ys, xe, ye)``, frame pixels.
        Crop (black outside) and resize are :func:`nbhelpers.resample.crop_resize_batch`, bit-exact with PIL.
        InputError when ``frames`` is not (B, H, W, 3) uint8 or the squares do not match it.
        Source: ``face_parsing/__init__.py:71-75,83-88``; ``blending.py:60`` (the crop)."""
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
        images = crop_resize_batch(frames.permute(0, 3, 1, 2), squares, PARSING_SIZE, "bilinear").flip(1)  # RGB
        mean = device_constant(IMAGENET_MEAN, frames.device, torch.float32).view(1, 3, 1, 1)
        std = device_constant(IMAGENET_STD, frames.device, torch.float32).view(1, 3, 1, 1)
        return (images.to(torch.float32) / 255.0 - mean) / std

    def labels_torch(self, frames: Any, squares: Sequence[Sequence[int]]) -> Any:
        """(B, 512, 512) uint8 labels 0..18 on the parser's device of the squares of ``frames`` (moved there), in
        one forward pass; arguments and errors as :meth:`preprocess_torch`. Source: ``face_parsing/__init__.py:83-90``.
        """
        import torch

        x = self.preprocess_torch(frames.to(self.device, non_blocking=True), squares)
        with torch.inference_mode():
            return self.net.parse(x.to(self.dtype)).argmax(dim=1).to(torch.uint8)

    def masks(self, images_rgb: np.ndarray | Sequence[np.ndarray], mode: str = "jaw", left_cheek_width: int = 90,
              right_cheek_width: int = 90) -> np.ndarray:
        """(N, 512, 512) uint8 0/255 masks: :meth:`labels` then :func:`face_mask` (same arguments and errors)."""
        check_parsing_args(mode, left_cheek_width, right_cheek_width)  # before the network runs
        out = np.zeros((len(images_rgb), PARSING_SIZE, PARSING_SIZE), np.uint8)
        for i, lab in enumerate(self.labels(images_rgb)):
            out[i] = face_mask(lab, mode, left_cheek_width, right_cheek_width)
        return out


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
