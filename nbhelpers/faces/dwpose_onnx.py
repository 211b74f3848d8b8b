"""The ``dwpose-onnx`` landmark backend (DWPose as ONNX on onnxruntime, S3FD's face box), and the pairing of a face
detector with a DWPose model that every DWPose backend shares (:class:`PoseBackend`, :func:`detect_with_pose`).

``dwpose/dw-ll_ucoco_384.onnx`` takes (N, 3, 384, 288) float32 normalised RGB and gives the SimCC vectors (N, 133,
576) and (N, 133, 768); names, batch axis and which output is x are read from the file.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import weights
from ..errors import FallbackWarning, InputError, WeightsError, require
from . import dwpose_codec as codec
from .base import FaceResult
from .s3fd import S3FD

ONNX_FILE = "dwpose/dw-ll_ucoco_384.onnx"  # relative to the weights dir (official models/ layout)
S3FD_FILE = "s3fd/s3fd-619a316812.pth"
ONNX_INSTALL = "pip install onnxruntime-gpu   (or: pip install onnxruntime  on a CPU-only machine)"  # see install_hint


def onnxruntime_requirement(cuda: str | None) -> str:
    """The onnxruntime requirement whose CUDA provider loads with ``torch.version.cuda`` ``cuda`` (None: the CPU
    build): onnxruntime-gpu up to 1.18 links CUDA 11.8, 1.19 to 1.26 CUDA 12, 1.27 on CUDA 13 (onnxruntime's CUDA
    execution provider requirements).
    """
    if not cuda:
        return "onnxruntime"
    try:
        major = int(str(cuda).split(".", 1)[0])
    except ValueError:
        return "onnxruntime-gpu"
    if major <= 11:
        return "onnxruntime-gpu>=1.16,<1.19"
    if major == 12:
        return "onnxruntime-gpu>=1.19,<1.27"
    return "onnxruntime-gpu>=1.27"


def install_hint(import_torch: bool = True) -> str:
    """The pip line for the onnxruntime matching torch's CUDA (torch read only when imported, unless ``import_torch``).
    """
    if not import_torch and "torch" not in sys.modules:
        return ONNX_INSTALL + " -- pick the onnxruntime-gpu build for torch's CUDA: <1.27 for CUDA 12, >=1.27 for 13"
    try:
        import torch

        cuda = torch.version.cuda
    except Exception:  # noqa: BLE001 - no torch or a broken one: the CPU build is the safe hint
        cuda = None
    req = onnxruntime_requirement(cuda)
    where = f"matches torch's CUDA {cuda}" if cuda else "torch has no CUDA here"
    return (f'pip install "{req}"   ({where}; the default landmark backend \'dwpose\' needs no onnxruntime)')


@dataclass(frozen=True)
class Availability:
    """Whether a backend can be built here (``ok``, also its truth value), and the ``reason`` with the fix when not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def weights_root(weights_dir: str | os.PathLike | None, needed: bool = True) -> Path | None:
    """``weights_dir`` as a Path; when None, the weights folder, or None when not ``needed``."""
    if weights_dir is not None:
        return Path(weights_dir)
    return Path(weights.default_dir()) if needed else None


def is_available(weights_dir: str | os.PathLike | None = None) -> Availability:
    """Whether :class:`DWPoseOnnxBackend` can be built with ``weights_dir`` (default: the weights folder), checked
    without heavy imports; ``reason`` says the fix."""
    if importlib.util.find_spec("onnxruntime") is None:
        return Availability(False, f"onnxruntime is not installed: {install_hint(import_torch=False)}")
    try:
        root = weights_root(weights_dir)
    except InputError as exc:
        return Availability(False, str(exc))
    for rel in (ONNX_FILE, S3FD_FILE):
        if not (root / rel).is_file():
            return Availability(False, f"{root / rel} is missing: run notebooks/00_setup.ipynb (weights.download)")
    return Availability(True)


def _providers(device: str | None) -> tuple[list, str]:
    """onnxruntime providers for ``device``, and the device used (``"cuda:N"`` or ``"cpu"``)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    has_cuda = "CUDAExecutionProvider" in available
    if device is None:
        device = "cuda" if has_cuda else "cpu"
    dev = str(device).lower()
    if dev.startswith("cuda"):
        if not has_cuda:
            warnings.warn(f"device={device!r} was asked for DWPose, but this onnxruntime has no CUDA provider "
                          f"(providers: {available}); running DWPose on the CPU instead, which is much slower. "
                          f"Install the build that matches torch's CUDA: {install_hint()}.", FallbackWarning,
                          stacklevel=3)
            return ["CPUExecutionProvider"], "cpu"
        index = int(dev.split(":", 1)[1]) if ":" in dev else 0
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"], f"cuda:{index}"
    if dev != "cpu":
        raise InputError(f"device={device!r}: expected 'cpu', 'cuda' or 'cuda:N' for the DWPose ONNX model")
    return ["CPUExecutionProvider"], "cpu"


def _dim(value) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


class DWPoseOnnx:
    """DWPose whole-body keypoints of whole frames from an ONNX file (no face detector).

    Args:
        onnx_path: The ONNX file (input (N|1, 3, 384, 288) float32, two SimCC outputs).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None (CUDA when onnxruntime has it).
        flip_test, batch_size: Also run the flipped input and average (official); frames per onnxruntime call.

    Attributes:
        input_name, x_output, y_output, fixed_batch, input_size: Read from the file: names, the fixed batch size
            (1 for the published file) or None, and ``(w, h)`` pixels.
        device: ``"cpu"`` or ``"cuda:N"``.

    Raises:
        WeightsError: The file is missing, not a valid ONNX model, or does not look like DWPose's.
        MissingDependencyError: onnxruntime is not installed.

    Source: ``preprocessing.py:17-19,97-101``.
    """

    def __init__(self, onnx_path: str | os.PathLike, device: str | None = None, *, flip_test: bool = True,
                 batch_size: int = 8):
        ort = require("onnxruntime", install_hint())
        path = Path(onnx_path)
        if not path.is_file():
            raise WeightsError(f"DWPose ONNX file {str(path)!r} does not exist. It is an optional weight set: "
                               "`python -m nbhelpers download --sets faces-onnx` (or weights.download(sets="
                               "['faces-onnx'])), or pass the right weights_dir. The default 'dwpose' backend needs "
                               "no ONNX file (it reads dwpose/dw-ll_ucoco_384.pth)")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size={batch_size!r}: expected an int >= 1 (frames per DWPose call)")
        providers, self.device = _providers(device)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph classes
            raise WeightsError(f"DWPose ONNX file {str(path)!r} could not be loaded by onnxruntime ({exc}); "
                               f"it may be truncated: delete it and download it again") from exc
        if self.device.startswith("cuda") and "CUDAExecutionProvider" not in self.session.get_providers():
            warnings.warn("onnxruntime could not start its CUDA provider for DWPose (no GPU or CUDA libraries "
                          "missing); running on the CPU, which is much slower.", FallbackWarning, stacklevel=2)
            self.device = "cpu"
        self.path = path
        self.flip_test = bool(flip_test)
        self.batch_size = batch_size
        self._read_signature()

    def _read_signature(self) -> None:
        inputs = self.session.get_inputs()
        outputs = self.session.get_outputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 4 or _dim(inputs[0].shape[1]) not in (None, 3):
            raise WeightsError(f"{self.path}: expected one input of shape (N, 3, H, W), found "
                               f"{[(i.name, i.shape) for i in inputs]}; is this the DWPose whole-body model?")
        shape = inputs[0].shape
        self.input_name = inputs[0].name
        self.fixed_batch = _dim(shape[0])
        h, w = _dim(shape[2]), _dim(shape[3])
        self.input_size = (w or codec.INPUT_SIZE[0], h or codec.INPUT_SIZE[1])
        x_bins = int(round(self.input_size[0] * codec.SIMCC_SPLIT_RATIO))
        y_bins = int(round(self.input_size[1] * codec.SIMCC_SPLIT_RATIO))
        three_d = [o for o in outputs if len(o.shape) == 3]
        lasts = [_dim(o.shape[2]) for o in three_d]
        by_bins = {last: o.name for last, o in zip(lasts, three_d, strict=True)}
        if x_bins in by_bins and y_bins in by_bins:
            self.x_output, self.y_output = by_bins[x_bins], by_bins[y_bins]
        elif len(three_d) == 2 and None in lasts and all(v in (None, x_bins, y_bins) for v in lasts):
            self.x_output, self.y_output = None, None  # symbolic last dims: decided from the first real outputs
            self._candidates = [o.name for o in three_d]
        else:
            raise WeightsError(f"{self.path}: expected two outputs of shape (N, K, {x_bins}) and (N, K, {y_bins}) "
                               f"(SimCC x and y), found {[(o.name, o.shape) for o in outputs]}")
        self._x_bins, self._y_bins = x_bins, y_bins

    def _run(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(M, K, Wx), (M, K, Wy) float32 of (M, 3, h, w) float32 inputs, run in chunks."""
        chunk = self.fixed_batch or max(1, 2 * self.batch_size)
        xs, ys = [], []
        for start in range(0, len(inputs), chunk):
            part = inputs[start:start + chunk]
            n = len(part)
            if self.fixed_batch and n < self.fixed_batch:  # pad a fixed batch with zeros, then drop the padding
                part = np.concatenate([part, np.zeros((self.fixed_batch - n, *part.shape[1:]), part.dtype)])
            if self.x_output is None:
                names = self._candidates
                a, b = self.session.run(names, {self.input_name: part})
                bins = {a.shape[-1]: names[0], b.shape[-1]: names[1]}
                if self._x_bins not in bins or self._y_bins not in bins:
                    raise WeightsError(f"{self.path}: outputs have {a.shape} and {b.shape}; expected last dims "
                                       f"{self._x_bins} (x) and {self._y_bins} (y)")
                self.x_output, self.y_output = bins[self._x_bins], bins[self._y_bins]
            sx, sy = self.session.run([self.x_output, self.y_output], {self.input_name: part})
            xs.append(np.asarray(sx, dtype=np.float32)[:n])
            ys.append(np.asarray(sy, dtype=np.float32)[:n])
        return np.concatenate(xs), np.concatenate(ys)

    def simcc(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(simcc_x (N, K, 2w), simcc_y (N, K, 2h))`` float32 of (N, 3, h, w) normalised inputs, flip test included.

        Source: ``[mmpose] models/pose_estimators/topdown.py:102-104``, ``rtmcc_head.py:193-208``.
        """
        if not self.flip_test:
            return self._run(inputs)
        n = len(inputs)
        both_x, both_y = self._run(np.concatenate([inputs, inputs[..., ::-1]]))
        return codec.merge_flip((both_x[:n], both_y[:n]), (both_x[n:], both_y[n:]))

    def keypoints(self, frames_bgr: np.ndarray | list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``(keypoints, scores)`` of (N, H, W, 3) uint8 BGR frames (or frames of any sizes), each its own person box:
        (N, 133, 2) float32 ``(x, y)`` frame pixels, not rounded, and (N, 133) float32 peaks.

        Source: ``preprocessing.py:97``; docs/official-behaviour.md §3.1.
        """
        kps, scores = [], []
        for start in range(0, len(frames_bgr), self.batch_size):
            inputs, centers, scales = codec.prepare_inputs(frames_bgr[start:start + self.batch_size],
                                                           self.input_size)
            sx, sy = self.simcc(inputs)
            kp, sc = codec.decode_simcc(sx, sy)
            kps.append(codec.to_frame(kp, centers, scales, self.input_size))
            scores.append(sc)
        if not kps:
            return np.zeros((0, codec.NUM_KEYPOINTS, 2), np.float32), np.zeros((0, codec.NUM_KEYPOINTS), np.float32)
        return np.concatenate(kps), np.concatenate(scores)

    def close(self) -> None:
        """Drop the onnxruntime session (frees GPU memory when it ran on CUDA)."""
        self.session = None


def check_frames(frames) -> np.ndarray:
    """(N, H, W, 3) uint8 BGR frames (one (H, W, 3) frame gets N = 1); InputError for anything else."""
    arr = np.asarray(frames)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3 or min(arr.shape[1:3], default=0) < 1:
        raise InputError(f"frames: expected a uint8 array (N, H, W, 3) of BGR frames, got dtype {arr.dtype} shape "
                         f"{tuple(np.shape(frames))}; read frames with nbhelpers.media.load_video")
    return arr


def detect_with_pose(frames, face_detector, keypoints, frames_device=None, choose=None) -> list[FaceResult | None]:
    """The official pairing: N :class:`FaceResult` (None where the detector finds no face) of the face detector's box
    and DWPose's landmarks, run only on frames with a face.

    Args:
        frames: (N, H, W, 3) uint8 BGR frames (InputError otherwise).
        face_detector: S3FD, or any object whose ``detect(frames)`` gives N ``(x1, y1, x2, y2, score)`` or None.
        keypoints: ``keypoints(frames) -> ((M, 133, 2) whole-body keypoints, scores)``.
        frames_device: The same frames as a uint8 tensor on the detector's GPU, read there; or None.
        choose: None (the detector's best box), or ``choose(frame, dets)`` picking a row of all the detector's
            faces (K, 5), clipped and truncated as the official box, or None (no face kept).

    Source: ``preprocessing.py:84-111``.
    """
    frames = check_frames(frames)
    if frames_device is not None and tuple(frames_device.shape) != frames.shape:
        raise InputError(f"frames_device has shape {tuple(frames_device.shape)}; the frames have {frames.shape}.")
    seen = frames if frames_device is None else frames_device
    if choose is None:
        boxes = list(face_detector.detect(seen))
    else:
        boxes = [_chosen(frame, dets, choose) for frame, dets in zip(frames, face_detector.detections(seen),
                                                                      strict=True)]
    if len(boxes) != len(frames):
        raise RuntimeError(f"face detector returned {len(boxes)} results for {len(frames)} frames")
    with_face = [i for i, b in enumerate(boxes) if b is not None]
    results: list[FaceResult | None] = [None] * len(frames)
    if with_face:
        points, _ = keypoints(frames[with_face])
        for j, i in enumerate(with_face):
            results[i] = face_result(boxes[i], codec.face_landmarks(points[j]))
    return results


def _chosen(frame: np.ndarray, dets: np.ndarray, choose) -> np.ndarray | None:
    dets = np.asarray(dets, dtype=np.float64).reshape(-1, 5).copy()
    dets[:, :4] = np.trunc(np.maximum(dets[:, :4], 0.0))  # the official box: clipped to >= 0, truncated
    row = choose(frame, dets)
    return None if row is None else dets[row]


def face_result(box_with_score, landmarks: np.ndarray) -> FaceResult:
    """A :class:`FaceResult` of an S3FD ``(x1, y1, x2, y2[, score])``, clipped to >= 0 and truncated as officially
    (``api.py:76-84``), and (68, 2) landmarks."""
    box = np.trunc(np.maximum(np.asarray(box_with_score[:4], dtype=np.float64), 0.0))
    score = float(box_with_score[4]) if len(box_with_score) > 4 else float("nan")
    return FaceResult(face_box=box, landmarks=np.asarray(landmarks, dtype=np.float32).copy(), score=score)


def build_s3fd(weights_dir: Path, device: str | None, *, dtype: Any = None, batch_size: int = 1):
    """The :class:`~nbhelpers.faces.s3fd.S3FD` of ``weights_dir`` on ``device`` (None: the GPU when available), in
    ``dtype`` (None: float32 as officially), ``batch_size`` frames per call (``preprocessing.py:23``). WeightsError
    when the file is missing."""
    path = Path(weights_dir) / S3FD_FILE
    if not path.is_file():
        raise WeightsError(f"S3FD weights {str(path)!r} are missing: download the weights "
                           f"(notebooks/00_setup.ipynb) or pass the weights_dir that holds s3fd/")
    torch = require("torch", "pip install torch")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return S3FD(path, device, torch.float32 if dtype is None else dtype, batch_size=batch_size)


class PoseBackend:
    """S3FD's face box and DWPose's 68 face points per frame: what the ``dwpose``, ``dwpose-onnx`` and ``mmpose``
    backends share. A subclass sets ``pose`` (or overrides :meth:`keypoints`), ``face_detector``, ``weights_dir`` and
    ``device``.

    Source: ``preprocessing.py:15-23,84-111``.
    """

    accepts_frames_device = False

    def keypoints(self, frames_bgr) -> tuple[np.ndarray, np.ndarray]:
        """(N, 133, 2) float32 whole-body keypoints in frame pixels and (N, 133) float32 scores of whole frames."""
        return self.pose.keypoints(frames_bgr)

    def detect(self, frames: np.ndarray, frames_device: Any = None, choose: Any = None) -> list[FaceResult | None]:
        """Per frame of (N, H, W, 3) uint8 BGR ``frames``: None (no face) or a :class:`FaceResult` (the detector's box
        in whole pixels, its score, (68, 2) float32 landmarks in frame pixels); arguments as :func:`detect_with_pose`.

        Raises:
            InputError: ``frames`` is not a (N, H, W, 3) uint8 array.
        """
        return detect_with_pose(frames, self.face_detector, self.keypoints, frames_device, choose)

    def close(self) -> None:
        """Release both models (GPU memory)."""
        pose = self.__dict__.get("pose")
        if pose is not None:
            pose.close()
        closer = getattr(self.__dict__.get("face_detector"), "close", None)
        if callable(closer):
            closer()
        self.face_detector = None

    def __repr__(self) -> str:
        wd = None if self.weights_dir is None else str(self.weights_dir)
        return f"{type(self).__name__}(weights_dir={wd!r}, device={self.device!r})"


class DWPoseOnnxBackend(PoseBackend):
    """Face box from S3FD and 68 landmarks from DWPose in ONNX on onnxruntime: the optional ``dwpose-onnx`` backend.

    Args:
        weights_dir: The weights dir (default :func:`nbhelpers.weights.default_dir`).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None (GPU when available) for both models.
        face_detector: Instead of S3FD, an object whose ``detect(frames)`` gives N ``(x1, y1, x2, y2, score)`` or None.
        flip_test: DWPose flip test, as in the official config.
        batch_size: Frames per DWPose call.

    Raises:
        WeightsError: A weight file is missing or unreadable.
        MissingDependencyError: onnxruntime (or torch, for S3FD) is not installed.
    """

    name = "dwpose-onnx"
    def __init__(self, weights_dir: str | os.PathLike | None = None, device: str | None = None, *,
                 face_detector=None, flip_test: bool = True, batch_size: int = 8):
        self.weights_dir = root = weights_root(weights_dir)
        self.pose = DWPoseOnnx(root / ONNX_FILE, device, flip_test=flip_test, batch_size=batch_size)
        self.device = self.pose.device
        self.face_detector = face_detector if face_detector is not None else build_s3fd(root, device)
