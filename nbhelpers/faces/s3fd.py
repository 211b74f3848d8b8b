"""S3FD face detection with the official weights (``s3fd/s3fd-619a316812.pth``), downloading nothing.

The network (:class:`S3FDNet`, built on first use) and the loader :class:`S3FD` are kept apart from the numpy
decoding (:func:`decode_detections`, :func:`nms`, :func:`best_box`). Importing this module imports numpy only.
"""

from __future__ import annotations

import copy
import functools
import os
import warnings
from typing import Any, NamedTuple

import numpy as np

from .. import models
from ..errors import INSTALL_TORCH, FallbackWarning, InputError, require
from ..gpu import batched, device_constant, empty_cache, host_wait, to_device
from .base import S3FD_FILE

MEAN = (104.0, 117.0, 123.0)  # subtracted from the *RGB* channels in this order (BGR means on RGB data, Q18)
STRIDES = (4, 8, 16, 32, 64, 128)  # pixels, one per detection head
ANCHOR_SCALE = 4  # anchor side = 4 x stride pixels (square anchors)
VARIANCES = (0.1, 0.2)  # centre and size variances of the box encoding
CANDIDATE_SCORE = 0.05  # a cell is a candidate when its face probability is > this
NMS_THRESHOLD = 0.3  # IoU above which a lower-score box is suppressed
MIN_SCORE = 0.5  # boxes with score <= this are dropped after NMS
L2NORM_SCALES = {"conv3_3_norm": 10.0, "conv4_3_norm": 8.0, "conv5_3_norm": 5.0}
HEADS = ("conv3_3_norm", "conv4_3_norm", "conv5_3_norm", "fc7", "conv6_2", "conv7_2")  # strides 4..128

# S3FDNet is built on first access (module __getattr__), so importing needs no torch
__all__ = ["Detection", "S3FD", "S3FD_FILE", "S3FDNet", "best_box", "decode_detections", "nms", "softmax"]  # noqa: F822


class Detection(NamedTuple):
    """One S3FD face: the box as the official returns it (ints, clipped to >= 0, full-frame pixels) and its score."""

    x1: int
    y1: int
    x2: int
    y2: int
    score: float


def softmax(logits: np.ndarray, axis: int = 1) -> np.ndarray:
    """Numerically stable float64 softmax of ``logits`` along ``axis`` (1 for the (B, 2, H, W) conf maps)
    (``detect.py:67-70``)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def nms(dets: np.ndarray, threshold: float = NMS_THRESHOLD) -> np.ndarray:
    """Greedy non-maximum suppression of (K, 5) ``dets`` ``(x1, y1, x2, y2, score)``: the (M,) int64 indices kept,
    highest score first; a kept box removes those whose IoU exceeds ``threshold``, sides counted as ``x2 - x1 + 1``
    (``bbox.py:44-64``)."""
    dets = np.asarray(dets, dtype=np.float64)
    if dets.size == 0:
        return np.zeros(0, dtype=np.int64)
    x1, y1, x2, y2, scores = (dets[:, k] for k in range(5))
    areas = (x2 - x1 + 1.0) * (y2 - y1 + 1.0)
    order = np.argsort(scores)[::-1]
    keep: list[int] = []
    while order.size:
        top, rest = order[0], order[1:]
        keep.append(int(top))
        iw = np.maximum(0.0, np.minimum(x2[top], x2[rest]) - np.maximum(x1[top], x1[rest]) + 1.0)
        ih = np.maximum(0.0, np.minimum(y2[top], y2[rest]) - np.maximum(y1[top], y1[rest]) + 1.0)
        inter = iw * ih
        overlap = inter / (areas[top] + areas[rest] - inter)
        order = rest[overlap <= threshold]
    return np.asarray(keep, dtype=np.int64)


def _decode_image(outputs: list[np.ndarray]) -> np.ndarray:
    """All candidate boxes of one image: (K, 5) ``(x1, y1, x2, y2, score)`` in input pixels."""
    found = []
    for level, stride in enumerate(STRIDES):
        prob, loc = outputs[2 * level], outputs[2 * level + 1]  # (2, h, w) face probability in [1]; (4, h, w)
        rows, cols = np.nonzero(prob[1] > CANDIDATE_SCORE)
        if rows.size == 0:
            continue
        size = float(ANCHOR_SCALE * stride)
        cx = stride / 2.0 + cols * float(stride)
        cy = stride / 2.0 + rows * float(stride)
        d = loc[:, rows, cols].astype(np.float64)  # (4, K)
        bx = cx + d[0] * VARIANCES[0] * size
        by = cy + d[1] * VARIANCES[0] * size
        bw = size * np.exp(d[2] * VARIANCES[1])
        bh = size * np.exp(d[3] * VARIANCES[1])
        x1, y1 = bx - bw / 2.0, by - bh / 2.0
        found.append(np.stack([x1, y1, x1 + bw, y1 + bh, prob[1, rows, cols].astype(np.float64)], axis=1))
    return np.concatenate(found, axis=0) if found else np.zeros((0, 5), dtype=np.float64)


def decode_detections(olist: list[Any], *, apply_softmax: bool = True) -> list[np.ndarray]:
    """The 12 S3FD head outputs as face boxes: B float64 arrays (K_b, 5) ``(x1, y1, x2, y2, score)`` in input pixels,
    highest score first. Head ``i`` (stride ``s = 4 * 2**i``): a cell ``(r, c)`` whose face probability exceeds
    :data:`CANDIDATE_SCORE` (0.05) decodes its anchor (side ``4s``, centre ``(s/2 + c s, s/2 + r s)``) with variances
    (0.1, 0.2); then :func:`nms` at :data:`NMS_THRESHOLD` (0.3), and scores <= :data:`MIN_SCORE` (0.5) go.
    ``olist`` is ``[conf_0, loc_0, ..., conf_5, loc_5]`` (numpy or torch): (B, 2, H_i, W_i) float (logits when
    ``apply_softmax``), channel 1 = face, and (B, 4, H_i, W_i) float; InputError for other shapes.
    Source: ``detect.py:59-91``, ``bbox.py:44-64,111-129``, ``sfd_detector.py:41-47``, ``net_s3fd.py:124-127``."""
    if len(olist) != 2 * len(STRIDES):
        raise InputError(f"olist must hold 12 arrays (conf and loc for 6 heads); got {len(olist)}.")
    arrays = []
    for k, o in enumerate(olist):
        if hasattr(o, "detach"):  # a torch tensor
            o = o.detach().float().cpu().numpy()
        a = np.asarray(o)
        if a.ndim != 4 or a.shape[1] != (2 if k % 2 == 0 else 4):
            raise InputError(f"olist[{k}] must be (B, {2 if k % 2 == 0 else 4}, H, W); got {a.shape}.")
        arrays.append(softmax(a, axis=1) if (k % 2 == 0 and apply_softmax) else a)
    results = []
    for b in range(arrays[0].shape[0]):
        dets = _decode_image([a[b] for a in arrays])
        dets = dets[nms(dets)]
        results.append(dets[dets[:, 4] > MIN_SCORE])
    return results


def best_box(dets: np.ndarray) -> tuple[int, int, int, int] | None:
    """The highest-score box of (K, 5) ``dets``, clipped to >= 0 and int-truncated, or None (``api.py:76-84``)."""
    dets = np.asarray(dets)
    if dets.shape[0] == 0:
        return None
    top = dets[int(np.argmax(dets[:, 4]))]
    x1, y1, x2, y2 = (int(max(0.0, float(v))) for v in top[:4])
    return x1, y1, x2, y2


# VGG16 stages: (prefix, input channels, output channels, convs); a 2x2 max-pool follows each stage.
_VGG = (("conv1", 3, 64, 2), ("conv2", 64, 128, 2), ("conv3", 128, 256, 3), ("conv4", 256, 512, 3),
        ("conv5", 512, 512, 3))


@functools.lru_cache(maxsize=1)
def _build_classes() -> dict[str, Any]:
    torch = require("torch", INSTALL_TORCH)
    from torch import nn
    from torch.nn import functional as F

    class L2Norm(nn.Module):
        """``y = x / (||x||_2 + 1e-10) * weight`` over channels, in float32 for any input (1e-10 underflows in fp16)."""

        def __init__(self, channels: int, scale: float):
            super().__init__()
            self.weight = nn.Parameter(torch.full((channels,), float(scale)))

        def forward(self, x):
            xf = x.float()
            norm = xf.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10
            return (xf / norm * self.weight.float().view(1, -1, 1, 1)).to(x.dtype)

    class S3FDNet(nn.Module):
        """The S3FD network (``net_s3fd.py``): VGG16, fc6/fc7 as convolutions, conv6/conv7, L2Norm on conv3_3/4_3/5_3
        (scales 10, 8, 5) and six conf/loc heads at strides 4..128.

        ``forward(x)`` takes (B, 3, H, W) float RGB minus :data:`MEAN` (0..255) and returns ``[conf_0, loc_0, ...]``:
        (B, 2, H_i, W_i) logits (head 0 max-outs 3 background channels) and (B, 4, H_i, W_i) offsets."""

        def __init__(self):
            super().__init__()
            for prefix, c_in, c_out, n_convs in _VGG:
                for k in range(1, n_convs + 1):
                    setattr(self, f"{prefix}_{k}", nn.Conv2d(c_in if k == 1 else c_out, c_out, 3, padding=1))
            self.fc6 = nn.Conv2d(512, 1024, 3, padding=3)
            self.fc7 = nn.Conv2d(1024, 1024, 1)
            self.conv6_1 = nn.Conv2d(1024, 256, 1)
            self.conv6_2 = nn.Conv2d(256, 512, 3, stride=2, padding=1)
            self.conv7_1 = nn.Conv2d(512, 128, 1)
            self.conv7_2 = nn.Conv2d(128, 256, 3, stride=2, padding=1)
            for name, scale in L2NORM_SCALES.items():
                setattr(self, name, L2Norm(512 if name != "conv3_3_norm" else 256, scale))
            head_channels = (256, 512, 512, 1024, 512, 256)
            for i, (head, channels) in enumerate(zip(HEADS, head_channels, strict=True)):
                setattr(self, f"{head}_mbox_conf", nn.Conv2d(channels, 4 if i == 0 else 2, 3, padding=1))
                setattr(self, f"{head}_mbox_loc", nn.Conv2d(channels, 4, 3, padding=1))

        def forward(self, x):
            taps = {}
            h = x
            for prefix, _, _, n_convs in _VGG:
                for k in range(1, n_convs + 1):
                    h = F.relu(getattr(self, f"{prefix}_{k}")(h))
                taps[prefix] = h
                h = F.max_pool2d(h, 2, 2)
            taps["fc7"] = F.relu(self.fc7(F.relu(self.fc6(h))))
            taps["conv6_2"] = F.relu(self.conv6_2(F.relu(self.conv6_1(taps["fc7"]))))
            taps["conv7_2"] = F.relu(self.conv7_2(F.relu(self.conv7_1(taps["conv6_2"]))))
            sources = [self.conv3_3_norm(taps["conv3"]), self.conv4_3_norm(taps["conv4"]),
                       self.conv5_3_norm(taps["conv5"]), taps["fc7"], taps["conv6_2"], taps["conv7_2"]]
            out = []
            for i, (head, feat) in enumerate(zip(HEADS, sources, strict=True)):
                conf = getattr(self, f"{head}_mbox_conf")(feat)
                if i == 0:  # channels 0-2: background, 3: face -> (max of background, face)
                    conf = torch.cat([conf[:, :3].amax(dim=1, keepdim=True), conf[:, 3:4]], dim=1)
                out += [conf, getattr(self, f"{head}_mbox_loc")(feat)]
            return out

    return {"S3FDNet": S3FDNet, "L2Norm": L2Norm}


def __getattr__(name: str) -> Any:
    if name in ("S3FDNet", "L2Norm"):
        return _build_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_dtype(torch: Any, dtype: Any, device: Any = None) -> Any:
    """The torch dtype of ``dtype``: a dtype, a name (``"float16"``, ``"fp16"``...), ``"auto"`` (float16 on a CUDA
    ``device``, else float32) or None (float32); InputError for another name."""
    if dtype is None:
        return torch.float32
    if dtype == "auto":  # fp16 where it is fast (CUDA), fp32 elsewhere
        return torch.float16 if device is not None and device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
                 "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
        if dtype not in table:
            raise InputError(f"dtype must be one of {sorted(table)} or a torch.dtype; got {dtype!r}.")
        return table[dtype]
    return dtype


class S3FD:
    """The S3FD face detector with the official weights ``weights_path`` (plain or wrapped in ``"state_dict"``, loaded
    strictly), on ``device`` (None: CUDA when available) in ``dtype`` (:func:`resolve_dtype`; half on the CPU falls back
    to float32, a half batch with non-finite outputs runs again in float32, both warn); ``batch_size`` frames per call
    (official 1), halved on CUDA out-of-memory. WeightsError or CheckpointError for a missing, damaged or foreign file.
    Source: ``api.py:46-84``, ``sfd_detector.py``, ``detect.py:59-91``; docs/official-behaviour.md §3.2."""

    name = "s3fd"

    def __init__(self, weights_path: str | os.PathLike, device: str | None = None, dtype: Any = None,
                 batch_size: int = 1):
        torch = require("torch", INSTALL_TORCH)
        if int(batch_size) < 1:
            raise InputError(f"batch_size must be >= 1; got {batch_size!r}.")
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(torch, dtype, self.device)
        if self.device.type == "cpu" and self.dtype != torch.float32:
            warnings.warn(f"S3FD: {self.dtype} on the CPU is slow or unsupported; using float32 instead.",
                          FallbackWarning, stacklevel=2)
            self.dtype = torch.float32
        self._net32 = None  # float32 copy, made only if a half-precision batch overflows
        self.batch_size = int(batch_size)
        state = models.load_checkpoint(weights_path)
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        net = _build_classes()["S3FDNet"]()
        models.check_state_dict(net, state, weights_path, what=f"S3FD face detector ({S3FD_FILE})")
        net.load_state_dict(state, strict=True)
        self.net = net.to(device=self.device, dtype=self.dtype).eval()
        # NHWC on a GPU in half precision, the layout of cuDNN's tensor-core convolutions (same results)
        self.channels_last = self.device.type == "cuda" and self.dtype != torch.float32
        if self.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)

    def detections(self, frames: np.ndarray, max_side: int | None = None) -> list[np.ndarray]:
        """All faces S3FD keeps in each frame of ``frames`` ((N, H, W, 3) or (H, W, 3) uint8 BGR, numpy or torch; on
        the detector's GPU they stay there) after NMS and the 0.5 score cut: N float64 arrays (K, 5) ``(x1, y1, x2,
        y2, score)`` in frame pixels, highest score first. ``max_side``: None (full resolution, official), or an int
        to downscale larger frames to (bilinear, antialiased). InputError for bad frames."""
        import torch

        frames = _as_batch(frames, torch)
        height, width = frames.shape[1:3]
        scale = int(max_side) / max(height, width) if max_side is not None and max(height, width) > max_side else 1.0
        out_h, out_w = max(1, round(height * scale)), max(1, round(width * scale))
        mean = device_constant(MEAN, self.device, torch.float32).view(1, 3, 1, 1)

        def step(sl: slice) -> list[np.ndarray]:
            if isinstance(frames, torch.Tensor):
                x = frames[sl].to(self.device, non_blocking=True)
            else:
                # contiguous and writable (frames from np.frombuffer are not; torch wants a writable array)
                x = to_device(np.require(frames[sl], requirements=["C", "W"]), self.device)
            x = x.flip(-1).permute(0, 3, 1, 2).float()  # BGR -> RGB, NCHW, 0..255
            if scale != 1.0:
                x = torch.nn.functional.interpolate(x, size=(out_h, out_w), mode="bilinear", align_corners=False,
                                                    antialias=True)
            x = x - mean  # RGB minus (104, 117, 123), as the official does (Q18)
            with torch.inference_mode():
                xin = x.to(self.dtype)
                if self.channels_last:
                    xin = xin.contiguous(memory_format=torch.channels_last)
                olist = [o.float() for o in self.net(xin)]
                finite = torch.stack([torch.isfinite(o).all() for o in olist]).all()
                host_wait(self.device)  # sleep, not spin, until the batch is done (one wait, not twelve)
                if self.dtype != torch.float32 and not bool(finite):
                    olist = self._rerun_fp32(x)
                # softmax of the conf maps on the device in float32, as the official (detect.py:67-70)
                olist = [torch.softmax(o, dim=1) if k % 2 == 0 else o for k, o in enumerate(olist)]
            dets = decode_detections(olist, apply_softmax=False)
            if scale != 1.0:
                for d in dets:
                    d[:, :4] *= (width / out_w, height / out_h, width / out_w, height / out_h)
            return dets

        return [d for _, dets in batched(frames.shape[0], self.batch_size, step, stage="s3fd") for d in dets]

    def _rerun_fp32(self, x: Any) -> list[Any]:
        """Run one batch again in float32 after a half-precision overflow (warns once per detector)."""
        if self._net32 is None:
            warnings.warn(f"S3FD: {self.dtype} outputs were not finite (an activation overflowed); running such "
                          "batches in float32. Use dtype='float32' to skip the half-precision attempt.",
                          FallbackWarning, stacklevel=3)
            forward = self.net.__dict__.pop("forward", None)  # a compile dispatcher (gpu/compile.py) is not copied
            try:
                self._net32 = copy.deepcopy(self.net).float()
            finally:
                if forward is not None:
                    self.net.forward = forward
        return [o.float() for o in self._net32(x.float())]

    def detect(self, frames: np.ndarray, max_side: int | None = None) -> list[Detection | None]:
        """The official face box per frame: a :class:`Detection` (highest score, clipped to >= 0, int-truncated,
        frame pixels) or None; arguments as :meth:`detections`. Source: ``api.py:72-84``."""
        found = [(best_box(dets), dets) for dets in self.detections(frames, max_side)]
        return [None if box is None else Detection(*box, float(dets[:, 4].max())) for box, dets in found]

    def close(self) -> None:
        """Release the network (and the CUDA cache)."""
        self.__dict__.pop("net", None)
        self._net32 = None
        empty_cache()


def _as_batch(frames: Any, torch: Any) -> Any:
    tensor = isinstance(frames, torch.Tensor)
    arr = frames if tensor else np.asarray(frames)
    arr = arr[None] if arr.ndim == 3 else arr
    uint8 = arr.dtype == (torch.uint8 if tensor else np.uint8)
    if arr.ndim != 4 or arr.shape[-1] != 3 or not uint8 or arr.shape[0] == 0:
        raise InputError(f"frames must be (N, H, W, 3) uint8 BGR with N >= 1; got shape {tuple(arr.shape)}, "
                         f"dtype {arr.dtype}.")
    return arr
