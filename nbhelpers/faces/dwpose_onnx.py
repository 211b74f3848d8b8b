"""The ``dwpose-onnx`` landmark backend: DWPose as ONNX on onnxruntime, with S3FD's face box.

``dwpose/dw-ll_ucoco_384.onnx`` takes (N, 3, 384, 288) float32 normalised RGB and gives the SimCC vectors (N, 133,
576) and (N, 133, 768); names, batch axis and which output is x are read from the file.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np

from ..errors import FallbackWarning, InputError, WeightsError, require
from . import dwpose_codec as codec
from .base import DWPOSE_ONNX_FILE as ONNX_FILE
from .base import DWPOSE_PTH_FILE, S3FD_FILE, PoseBackend, download_command, weights_root
from .s3fd import S3FD


def onnxruntime_requirement(cuda: str | None) -> str:
    """The onnxruntime requirement whose CUDA provider loads with ``torch.version.cuda`` ``cuda`` (None: the CPU
    build): onnxruntime-gpu up to 1.18 links CUDA 11.8, 1.19 to 1.26 CUDA 12, 1.27 on CUDA 13 (onnxruntime's CUDA
    execution provider requirements)."""
    if not cuda:
        return "onnxruntime"
    try:
        major = int(str(cuda).split(".", 1)[0])
    except ValueError:
        return "onnxruntime-gpu"
    if major <= 11:
        return "onnxruntime-gpu>=1.16,<1.19"
    return "onnxruntime-gpu>=1.19,<1.27" if major == 12 else "onnxruntime-gpu>=1.27"


def install_hint() -> str:
    """The pip line for the onnxruntime matching torch's CUDA."""
    try:
        import torch

        cuda = torch.version.cuda
    except Exception:  # noqa: BLE001 - no torch or a broken one: the CPU build is the safe hint
        cuda = None
    req = onnxruntime_requirement(cuda)
    where = f"matches torch's CUDA {cuda}" if cuda else "torch has no CUDA here"
    return (f'pip install "{req}"   ({where}; the default landmark backend \'dwpose\' needs no onnxruntime)')


def _providers(device: str | None) -> tuple[list, str]:
    """onnxruntime providers for ``device``, and the device used (``"cuda:N"`` or ``"cpu"``)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    has_cuda = "CUDAExecutionProvider" in available
    dev = ("cuda" if has_cuda else "cpu") if device is None else str(device).lower()
    if not re.fullmatch(r"cpu|cuda(:\d+)?", dev):
        raise InputError(f"device={device!r}: expected 'cpu', 'cuda' or 'cuda:N' for the DWPose ONNX model")
    if dev == "cpu" or not has_cuda:
        if dev != "cpu":
            warnings.warn(f"device={device!r} was asked for DWPose, but this onnxruntime has no CUDA provider "
                          f"(providers: {available}); running DWPose on the CPU instead, which is much slower. "
                          f"Install the build that matches torch's CUDA: {install_hint()}.", FallbackWarning,
                          stacklevel=3)
        return ["CPUExecutionProvider"], "cpu"
    index = int(dev.partition(":")[2] or 0)
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"], f"cuda:{index}"


def _dim(value) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


class DWPoseOnnx:
    """DWPose whole-body keypoints of whole frames from the ONNX file ``onnx_path`` (input (N|1, 3, 384, 288) float32,
    two SimCC outputs; no face detector) on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``, None: CUDA when
    onnxruntime has it; ``device`` becomes ``"cpu"`` or ``"cuda:N"``). ``flip_test`` also runs the flipped input and
    averages (official); ``batch_size`` frames per onnxruntime call. Read from the file: ``input_name``,
    ``x_output``, ``y_output``, ``fixed_batch`` (1 for the published file, or None) and ``input_size`` ``(w, h)``.
    WeightsError for a missing, invalid or foreign file; MissingDependencyError without onnxruntime. Source:
    ``preprocessing.py:17-19,97-101``."""

    def __init__(self, onnx_path: str | os.PathLike, device: str | None = None, *, flip_test: bool = True,
                 batch_size: int = 8):
        ort = require("onnxruntime", install_hint())
        path = Path(onnx_path)
        if not path.is_file():
            raise WeightsError(f"DWPose ONNX file {str(path)!r} does not exist. It is an optional weight set: "
                               f"`{download_command(path, ONNX_FILE, 'faces-onnx')}` (or weights.download(sets="
                               "['faces-onnx'])), or pass weights_dir= the folder that holds it. The default "
                               f"'dwpose' backend needs no ONNX file (it reads {DWPOSE_PTH_FILE}).")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
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
        x_bins, y_bins = (int(round(side * codec.SIMCC_SPLIT_RATIO)) for side in self.input_size)
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
        chunk = self.fixed_batch or 2 * self.batch_size
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
        """``(simcc_x (N, K, 2w), simcc_y (N, K, 2h))`` float32 of (N, 3, h, w) normalised inputs, flip test included
        (``[mmpose] models/pose_estimators/topdown.py:102-104``, ``rtmcc_head.py:193-208``)."""
        if not self.flip_test:
            return self._run(inputs)
        n = len(inputs)
        both_x, both_y = self._run(np.concatenate([inputs, inputs[..., ::-1]]))
        return codec.merge_flip((both_x[:n], both_y[:n]), (both_x[n:], both_y[n:]))

    def keypoints(self, frames_bgr: np.ndarray | list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``(keypoints, scores)`` of (N, H, W, 3) uint8 BGR frames (or frames of any sizes), each its own person box:
        (N, 133, 2) float32 ``(x, y)`` frame pixels, not rounded, and (N, 133) float32 peaks (``preprocessing.py:97``;
        docs/official-behaviour.md §3.1)."""
        kps, scores = [], []
        for start in range(0, len(frames_bgr), self.batch_size):
            warped, centers, scales = codec.warp_frames(frames_bgr[start:start + self.batch_size], self.input_size)
            sx, sy = self.simcc(codec.normalize(warped))
            kp, sc = codec.decode_simcc(sx, sy)
            kps.append(codec.to_frame(kp, centers, scales, self.input_size))
            scores.append(sc)
        if not kps:
            return np.zeros((0, codec.NUM_KEYPOINTS, 2), np.float32), np.zeros((0, codec.NUM_KEYPOINTS), np.float32)
        return np.concatenate(kps), np.concatenate(scores)

    def close(self) -> None:
        """Drop the onnxruntime session (frees GPU memory when it ran on CUDA)."""
        self.session = None


class DWPoseOnnxBackend(PoseBackend):
    """Face box from S3FD and 68 landmarks from DWPose in ONNX on onnxruntime: the optional ``dwpose-onnx`` backend.
    Arguments as :class:`~nbhelpers.faces.dwpose_torch.DWPoseBackend` and :class:`DWPoseOnnx`; WeightsError for a
    missing or unreadable weight file, MissingDependencyError without onnxruntime (or torch, for S3FD)."""

    name = "dwpose-onnx"
    def __init__(self, weights_dir: str | os.PathLike | None = None, device: str | None = None, *,
                 face_detector=None, flip_test: bool = True, batch_size: int = 8):
        self.weights_dir = root = weights_root(weights_dir)
        self.pose = DWPoseOnnx(root / ONNX_FILE, device, flip_test=flip_test, batch_size=batch_size)
        self.device = self.pose.device
        self.face_detector = face_detector if face_detector is not None else S3FD(root / S3FD_FILE, device)
