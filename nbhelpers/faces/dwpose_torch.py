"""The ``dwpose`` landmark backend: DWPose (RTMPose-l whole-body 384x288) in plain torch from the official ``.pth``
with S3FD's face box (`preprocessing.py:15-23,84-111`); flip and SimCC decoding run on the model's device. Importing
it loads numpy only.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .. import models, weights
from ..errors import INSTALL_TORCH, CheckpointError, FallbackWarning, InputError, WeightsError, require
from ..gpu import batched, empty_cache, host_wait, to_device
from ..hashing import atomic_path
from . import dwpose_codec as codec
from .base import DWPOSE_PTH_FILE as CHECKPOINT_FILE
from .base import S3FD_FILE, PoseBackend, download_command, weights_root
from .s3fd import S3FD, resolve_dtype

# Frames per network call, at most (2 inputs each with the flip test); offline.fit_face_batches fits it on a GPU.
DEFAULT_BATCH = {"cuda": 64, "cpu": 8}
# Full frames per S3FD call on a GPU, at most (offline.fit_face_batches fits it; memory in bench/RESULTS.md).
S3FD_GPU_BATCH = 16


def _network():
    require("torch", INSTALL_TORCH)  # first, so that a missing torch is named as such
    return require("nbhelpers.faces.dwpose_net", INSTALL_TORCH)


def build_model(device: Any = "cpu"):
    """A random :class:`~nbhelpers.faces.dwpose_net.RTMPoseWholebody` in eval mode on ``device`` (``"meta"``: no
    memory)."""
    torch = require("torch", INSTALL_TORCH)
    with torch.device(device):
        model = _network().RTMPoseWholebody()
    return model.eval()


def state_dict_of(checkpoint: Any, path: str | os.PathLike = "checkpoint") -> dict:
    """The state dict in a loaded DWPose ``checkpoint`` (mmengine's ``{"meta", "state_dict"}`` or plain), a
    ``"module."`` prefix on every key removed; CheckpointError naming ``path`` when it is not a dict.
    Source: `[mmpose] apis/inference.py:104-111`."""
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a DWPose checkpoint (a dict with a "
                              "'state_dict'); use the official dw-ll_ucoco_384.pth.")
    state = checkpoint.get("state_dict", checkpoint)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: its 'state_dict' is a {type(state).__name__}, not a dict of tensors.")
    if state and all(str(k).startswith("module.") for k in state):
        state = {str(k)[len("module."):]: v for k, v in state.items()}
    return state


def read_checkpoint(path: str | os.PathLike, weights_dir: str | os.PathLike | None = None, *,
                    trusted_sha256: str | None = None) -> Any:
    """What the DWPose ``.pth`` ``path`` holds, read by :func:`nbhelpers.models.load_checkpoint`: unpickled in full
    (mmengine pickles metadata) only when it matches ``trusted_sha256`` (default: the sha256 and size of
    :func:`nbhelpers.weights.expected_facts` of :data:`CHECKPOINT_FILE` in ``weights_dir``, default ``path``'s
    grandparent). WeightsError: missing, damaged or an untrusted pickle.
    Source: `preprocessing.py:17-19`; `[mmpose] apis/inference.py:104-111`."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"DWPose checkpoint {str(path)!r} does not exist: download it with "
                           f"`{download_command(path, CHECKPOINT_FILE, 'faces')}` (or {weights.NOTEBOOK}), or "
                           "pass weights_dir= the folder that holds dwpose/.")
    expected_size = None
    if trusted_sha256 is None:
        with contextlib.suppress(Exception):  # no manifest facts (a foreign folder): the plain policy applies
            facts = weights.expected_facts(path.parent.parent if weights_dir is None else weights_dir, CHECKPOINT_FILE)
            trusted_sha256, expected_size = facts.sha256, facts.size
    return models.load_checkpoint(path, trusted_sha256=trusted_sha256, expected_size=expected_size)


def load_model(path: str | os.PathLike, weights_dir: str | os.PathLike | None = None):
    """:class:`~nbhelpers.faces.dwpose_net.RTMPoseWholebody` (eval, float32, CPU) with the ``.pth`` ``path``
    (:func:`read_checkpoint`) loaded strictly: CheckpointError when its names or shapes differ from RTMPose-l
    whole-body 384x288. Source: `preprocessing.py:17-19` (docs/official-behaviour.md §3.1)."""
    state = state_dict_of(read_checkpoint(path, weights_dir), path)
    model = build_model("cpu")
    models.check_state_dict(model, state, path, what="DWPose RTMPose-l whole-body 384x288 (dw-ll_ucoco_384.pth)")
    model.load_state_dict(state, strict=True)
    return model.eval()


def export_onnx(model, path: str | os.PathLike, *, dynamic_batch: bool = True) -> Path:
    """Export ``model`` (moved to the CPU in float32) to ``path``, atomically, with the published
    ``dw-ll_ucoco_384.onnx`` signature: ``input`` (N, 3, 384, 288) float32 normalised RGB, ``simcc_x`` (N, 133, 576),
    ``simcc_y`` (N, 133, 768); a dynamic batch axis unless ``dynamic_batch`` is False (batch 1, as published); ONNX
    opset 17. Returns ``path``; MissingDependencyError without the ``onnx`` package."""
    torch = require("torch", INSTALL_TORCH)
    require("onnx", "pip install onnx")
    net = model.to("cpu", torch.float32).eval()
    w, h = codec.INPUT_SIZE
    axes = {"input": {0: "batch"}, "simcc_x": {0: "batch"}, "simcc_y": {0: "batch"}} if dynamic_batch else None
    # dynamo=False: the TorchScript exporter, no onnxscript needed, the same graph on torch 2.1..2.1x
    kwargs = {"dynamo": False} if "dynamo" in torch.onnx.export.__code__.co_varnames else {}
    with torch.no_grad(), warnings.catch_warnings(), atomic_path(path, ".tmp.onnx") as tmp:
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(1, 3, h, w),), str(tmp), input_names=["input"],
                          output_names=["simcc_x", "simcc_y"], dynamic_axes=axes, opset_version=17, **kwargs)
    return Path(path)


def resolve_device(device: str | None) -> str:
    """``"cpu"`` or ``"cuda:N"`` for ``device`` (None: the GPU when torch sees one; CUDA without a GPU warns and
    falls back to the CPU); InputError for another string."""
    torch = require("torch", INSTALL_TORCH)
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device is None else str(device).lower()
    if not re.fullmatch(r"cpu|cuda(:\d+)?", dev):
        raise InputError(f"device={device!r}: expected 'cpu', 'cuda' or 'cuda:N' for the DWPose model")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"device={device!r} was asked for DWPose, but torch sees no CUDA GPU; running DWPose on the "
                      "CPU instead, which is much slower.", FallbackWarning, stacklevel=3)
        return "cpu"
    return "cuda:0" if dev == "cuda" else dev


def simcc_to_keypoints(simcc_x, simcc_y, flip_simcc: tuple | None = None):
    """:func:`dwpose_codec.merge_flip` (when ``flip_simcc``, the flipped input's pair, is given) and
    :func:`dwpose_codec.decode_simcc` in torch on the device of the (N, K, Wx), (N, K, Wy) float32 tensors:
    ``(keypoints (N, K, 2) float32 input pixels, scores (N, K) float32)``, numpy (`[mmpose] rtmcc_head.py:193-208`,
    `codecs/simcc_label.py:156,173`, `codecs/utils/post_processing.py:79-88`; docs/official-behaviour.md §3.1)."""
    torch = require("torch", INSTALL_TORCH)
    if flip_simcc is not None:
        idx = to_device(np.asarray(codec.coco_wholebody_flip_indices(), dtype=np.int64), simcc_x.device)
        fx, fy = flip_simcc
        simcc_x = (simcc_x + fx[:, idx].flip(-1)) * 0.5
        simcc_y = (simcc_y + fy[:, idx]) * 0.5
    max_x, max_y = simcc_x.amax(dim=-1), simcc_y.amax(dim=-1)
    # torch's max(dim) documents no tie rule: take the first bin that reaches the maximum, as numpy's argmax.
    arg_x = (simcc_x == max_x.unsqueeze(-1)).to(torch.uint8).argmax(dim=-1)
    arg_y = (simcc_y == max_y.unsqueeze(-1)).to(torch.uint8).argmax(dim=-1)
    scores = torch.minimum(max_x, max_y)
    locs = torch.stack([arg_x, arg_y], dim=-1).float()
    locs[scores <= 0] = -1.0
    locs = locs / float(codec.SIMCC_SPLIT_RATIO)
    host_wait(locs.device)  # sleep until the batch is done, then read it (no spinning core)
    return locs.cpu().numpy().astype(np.float32), scores.float().cpu().numpy().astype(np.float32)


class DWPoseTorch:
    """DWPose whole-body keypoints of whole frames with the torch network (no face detector).

    The network is ``model`` (a built :class:`~nbhelpers.faces.dwpose_net.RTMPoseWholebody`) or the ``checkpoint``
    ``.pth`` (:func:`load_model`, facts from ``weights_dir``), on ``device`` (:func:`resolve_device`), in ``dtype``
    (None: float16 on a GPU, float32 on the CPU; float32, float16 or bfloat16), the head's token part (ScaleNorm, GAU,
    SimCC classifiers) in float32 (no attention overflow); ``fuse`` folds BatchNorm into the convs (on a copy),
    ``channels_last`` (default: on a GPU) runs NHWC convs. ``flip_test`` also runs the mirrored input and averages
    (official ``test_cfg.flip_test=True``); ``batch_size`` frames per call (default :data:`DEFAULT_BATCH`), halved on
    CUDA out-of-memory. WeightsError or CheckpointError for a bad checkpoint, InputError for bad arguments.

    Source: `preprocessing.py:17-19,97-101` (docs/official-behaviour.md §3.1)."""

    def __init__(self, checkpoint: str | os.PathLike | None = None, device: str | None = None, dtype: Any = None,
                 *, flip_test: bool = True, batch_size: int | None = None, model=None,
                 weights_dir: str | os.PathLike | None = None, fuse: bool = True, channels_last: bool | None = None):
        torch = require("torch", INSTALL_TORCH)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(torch, "auto" if dtype is None else dtype, torch.device(self.device))
        if self.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InputError(f"dtype must be float32, float16 or bfloat16; got {self.dtype!r}.")
        if self.device == "cpu" and self.dtype != torch.float32:
            raise InputError(f"dtype={self.dtype} on the CPU: half precision is for the GPU; use float32 "
                             "(the default).")
        if batch_size is None:
            batch_size = DEFAULT_BATCH["cuda" if self.device.startswith("cuda") else "cpu"]
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size={batch_size!r}: expected an int >= 1 (frames per DWPose call)")
        if model is None:
            if checkpoint is None:
                raise InputError("DWPoseTorch needs checkpoint= (dw-ll_ucoco_384.pth) or model=")
            model = load_model(checkpoint, weights_dir)
        if fuse:
            model = _network().fuse_batchnorm(model)
        self.channels_last = self.device.startswith("cuda") if channels_last is None else bool(channels_last)
        self.net = model.to(self.device, self.dtype).eval()
        if self.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        if self.dtype != torch.float32:  # the token part of the head stays float32 (see the class docstring)
            for part in (self.net.head.mlp, self.net.head.gau, self.net.head.cls_x, self.net.head.cls_y):
                part.float()
        self.flip_test = bool(flip_test)
        self.batch_size = batch_size
        self.input_size = codec.INPUT_SIZE
        self._mean = torch.tensor(codec.MEAN_RGB, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(codec.STD_RGB, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)

    def _inputs(self, frames_bgr) -> tuple[Any, np.ndarray, np.ndarray]:
        """(N, 3, 384, 288) inputs: warped on the CPU, normalised on the device as :func:`dwpose_codec.normalize`."""
        warped, centers, scales = codec.warp_frames(frames_bgr, self.input_size)
        x = to_device(warped, self.device).flip(-1).permute(0, 3, 1, 2).float()  # BGR -> RGB, NCHW
        return (x - self._mean) / self._std, centers, scales

    def simcc(self, inputs) -> tuple[Any, Any, tuple | None]:
        """``(simcc_x, simcc_y, flipped)`` float32 (N, K, 576), (N, K, 768) of an (N, 3, 384, 288) tensor of normalised
        inputs, and with the flip test the mirrored inputs' pair not yet mapped back (else None)."""
        torch = require("torch", INSTALL_TORCH)
        x = inputs.to(self.device, self.dtype)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        n = x.shape[0]
        with torch.inference_mode():
            if self.flip_test:
                sx, sy = self.net(torch.cat([x, x.flip(-1)]))
                return sx[:n], sy[:n], (sx[n:], sy[n:])
            sx, sy = self.net(x)
            return sx, sy, None

    def keypoints(self, frames_bgr) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`DWPoseOnnx.keypoints <nbhelpers.faces.dwpose_onnx.DWPoseOnnx.keypoints>`: (N, 133, 2) float32
        frame pixels and (N, 133) float32 peaks of whole frames (`[mmpose] apis/inference.py:162-166`)."""
        torch = require("torch", INSTALL_TORCH)
        n = len(frames_bgr)
        if n == 0:
            return np.zeros((0, codec.NUM_KEYPOINTS, 2), np.float32), np.zeros((0, codec.NUM_KEYPOINTS), np.float32)
        # CUDA: a short batch is padded to one shape (cuDNN plans built once), until an out-of-memory fallback.
        pad = {"to": self.batch_size if self.device.startswith("cuda") else None}

        def after_oom() -> None:
            pad["to"] = None
            empty_cache()

        def step(sl: slice):
            x, centers, scales = self._inputs(frames_bgr[sl])
            m = x.shape[0]
            if pad["to"] is not None and m < pad["to"]:
                x = torch.cat([x, x[-1:].expand(pad["to"] - m, *x.shape[1:])])
            sx, sy, flipped = self.simcc(x)
            if flipped is not None:
                flipped = (flipped[0][:m], flipped[1][:m])
            kp, sc = simcc_to_keypoints(sx[:m], sy[:m], flipped)
            return codec.to_frame(kp, centers, scales, self.input_size), sc

        parts = [out for _, out in batched(n, self.batch_size, step, stage="dwpose", on_oom=after_oom)]
        return np.concatenate([kp for kp, _ in parts]), np.concatenate([sc for _, sc in parts])

    def close(self) -> None:
        """Drop the network (and the CUDA cache)."""
        self.__dict__.pop("net", None)
        empty_cache()


class DWPoseBackend(PoseBackend):
    """Face box from S3FD + 68 landmarks from DWPose in torch: the default landmark backend wherever torch runs.

    ``weights_dir`` (default :func:`nbhelpers.weights.default_dir`) holds :data:`CHECKPOINT_FILE` and
    :data:`S3FD_FILE`; ``device`` serves both models; ``face_detector`` replaces S3FD (as in
    :func:`~nbhelpers.faces.base.detect_with_pose`); the other arguments are :class:`DWPoseTorch`'s.
    WeightsError or CheckpointError for a missing or foreign weight file; MissingDependencyError without torch.

    Source: `preprocessing.py:15-23,84-111` (docs/official-behaviour.md §3.1-3.3)."""

    name = "dwpose"
    accepts_frames_device = True  # S3FD reads the frames where they already are on the GPU

    def __init__(self, weights_dir: str | os.PathLike | None = None, device: str | None = None, *, dtype: Any = None,
                 face_detector=None, model=None, flip_test: bool = True, batch_size: int | None = None):
        self.weights_dir = root = weights_root(weights_dir, model is None or face_detector is None)
        self.pose = DWPoseTorch(None if model is not None else root / CHECKPOINT_FILE, device, dtype,
                                flip_test=flip_test, batch_size=batch_size, model=model, weights_dir=root)
        self.device = self.pose.device
        # S3FD: float16 and several frames per call on a GPU; float32, one frame per call on the CPU (official)
        self.face_detector = face_detector if face_detector is not None else S3FD(
            root / S3FD_FILE, self.device, "auto", batch_size=S3FD_GPU_BATCH if self.device.startswith("cuda") else 1)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, dtype={str(self.pose.dtype)!r})"
