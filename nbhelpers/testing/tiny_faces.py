"""Tiny and random weights of the face models in their official files: S3FD, DWPose ``.pth`` and ONNX.

S3FD is the full network with random weights. DWPose in torch gets random full-size weights
(:func:`write_random_dwpose_checkpoint`) or template weights that draw a fixed cartoon face on any frame
(:func:`write_tiny_dwpose`); as ONNX, small graphs with the real signature and SimCC peaks at chosen bins
(:func:`simcc_peak_model`).
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np

from ..errors import InputError, NbHelpersWarning, require
from ..faces import dwpose_codec as codec
from ..faces import dwpose_onnx, dwpose_torch, s3fd
from ..hashing import atomic_path
from .tiny_models import _atomic_torch_save


def write_tiny_s3fd(directory: str | os.PathLike) -> Path:
    """Write ``<directory>/s3fd/s3fd-619a316812.pth``: the full S3FD with random weights (seed 0; detects nothing),
    stored in float16 (about 43 MiB). Returns the path."""
    import torch

    with torch.device("meta"):
        net = s3fd.S3FDNet()
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, meta in net.state_dict().items():
        name = key.rsplit(".", 1)[0]
        if name in s3fd.L2NORM_SCALES:
            t = torch.full(meta.shape, s3fd.L2NORM_SCALES[name])
        elif key.endswith(".bias"):
            t = torch.zeros(meta.shape)
        else:
            fan_in = int(np.prod(meta.shape[1:]))
            t = torch.randn(meta.shape, generator=gen) * (2.0 / fan_in) ** 0.5
        state[key] = t.half()
    out = Path(directory) / s3fd.S3FD_FILE
    _atomic_torch_save(state, out)
    return out


def random_dwpose_state_dict(seed: int = 0) -> dict:
    """A random ``{name: float32 CPU tensor}`` with the names and shapes of ``dw-ll_ucoco_384.pth`` (``seed``).

    He-normal weights, N(0, 0.02) biases; BatchNorm scales ``1 + N(0, 0.1)``, shifts and running means N(0, 0.1),
    running variances U(0.5, 1.5). Keypoints spread over the frame and follow the input."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    state = {}
    for key, meta in dwpose_torch.build_model("meta").state_dict().items():
        shape = tuple(meta.shape)
        leaf = key.rsplit(".", 1)[-1]
        is_bn = ".bn." in key
        if leaf == "num_batches_tracked":
            t = torch.zeros((), dtype=torch.int64)
        elif is_bn and leaf == "weight":
            t = 1 + 0.1 * torch.randn(shape, generator=gen)
        elif is_bn and leaf in ("bias", "running_mean"):
            t = 0.1 * torch.randn(shape, generator=gen)
        elif leaf == "running_var":
            t = 0.5 + torch.rand(shape, generator=gen)
        elif leaf == "gamma":
            t = torch.randn(shape, generator=gen)
        elif leaf == "beta":
            t = 0.1 * torch.randn(shape, generator=gen)
        elif leaf in ("g", "scale"):
            t = torch.ones(shape)
        elif leaf == "bias":
            t = 0.02 * torch.randn(shape, generator=gen)
        else:
            fan_in = int(np.prod(shape[1:]))
            t = torch.randn(shape, generator=gen) * math.sqrt(2.0 / fan_in)
        state[key] = t.float() if t.dtype.is_floating_point else t
    return state


def write_random_dwpose_checkpoint(directory: str | os.PathLike, seed: int = 0) -> Path:
    """Write ``<directory>/dwpose/dw-ll_ucoco_384.pth`` with :func:`random_dwpose_state_dict` (``seed``; 134 MB),
    wrapped as the official file (``{"meta", "state_dict"}``, plain values). Returns the path."""
    path = Path(directory) / dwpose_torch.CHECKPOINT_FILE
    _atomic_torch_save({"meta": {"note": "nbhelpers random weights", "seed": int(seed)},
                        "state_dict": random_dwpose_state_dict(seed)}, path)
    return path


def template_dwpose_state_dict() -> dict:
    """A state dict in the official layout whose network draws :func:`face_template_input_px` whatever the input.

    Every backbone conv is zero, so the backbone gives the constant ``silu(2)``; six taps of the head's 7x7 conv carry
    six numbers per keypoint, read back exactly by the ``mlp`` layer (a pseudo-inverse); the GAU adds nothing; and
    ``cls_x``/``cls_y`` make a parabola ``1 - 100 (z - z_k)^2`` over the bins, peaking at the wanted bin. Constant
    tensors are broadcast views, so the file is about 1.5 MB."""
    import torch
    from torch.nn import functional as F

    net = require("nbhelpers.faces.dwpose_net", dwpose_torch.INSTALL_TORCH)  # the architecture facts (torch)
    kp = face_template_input_px().astype(np.float64)
    k = codec.NUM_KEYPOINTS
    taps = ((0, 0), (0, 6), (6, 0), (6, 6), (3, 0), (0, 3))  # six taps of the 7x7 kernel, x: 0-2, y: 3-5
    fw, fh = net.FEATURE_MAP
    ones = torch.ones(1, 1, fh, fw, dtype=torch.float64)
    cols = []
    for i, j in taps:
        unit = torch.zeros(1, 1, net.FINAL_KERNEL, net.FINAL_KERNEL, dtype=torch.float64)
        unit[0, 0, i, j] = 1.0
        cols.append(F.conv2d(ones, unit, padding=net.FINAL_KERNEL // 2).flatten())
    m_taps = torch.stack(cols, dim=1)  # (108, 6): each tap's footprint on the map
    read_back = torch.linalg.pinv(m_taps)  # (6, 108), read_back @ m_taps = I
    kappa = 2.0 / (1.0 + math.exp(-2.0))  # silu(2): the constant backbone output
    curvature = 100.0
    coeffs = np.zeros((k, 6))
    for axis, bins in ((0, codec.SIMCC_X_BINS), (1, codec.SIMCC_Y_BINS)):
        half = (bins - 1) / 2.0
        z = (kp[:, axis] * codec.SIMCC_SPLIT_RATIO - half) / half
        coeffs[:, 3 * axis:3 * axis + 3] = np.stack([1.0 - curvature * z**2, 2 * curvature * z,
                                                      -curvature * np.ones(k)], axis=1)
    kernel = torch.zeros(k, 1, net.FINAL_KERNEL, net.FINAL_KERNEL, dtype=torch.float64)
    for t, (i, j) in enumerate(taps):
        kernel[:, 0, i, j] = torch.from_numpy(coeffs[:, t]) / (net.HEAD_IN_CHANNELS * kappa)

    def const(shape, value):  # a broadcast view of one float32 value
        return torch.full((1,) * len(shape), value, dtype=torch.float32).expand(shape)

    last_bn = "backbone.stage4.2.final_conv.bn."
    state = {}
    for key, meta in dwpose_torch.build_model("meta").state_dict().items():
        shape, leaf = tuple(meta.shape), key.rsplit(".", 1)[-1]
        if leaf == "num_batches_tracked":
            state[key] = torch.zeros((), dtype=torch.int64)
        elif leaf in ("running_var", "g", "scale") or (".bn." in key and leaf == "weight"):
            state[key] = const(shape, 1.0)
        else:
            state[key] = const(shape, 2.0 if key == last_bn + "bias" else 0.0)
    state["head.final_layer.weight"] = kernel.float().expand(k, net.HEAD_IN_CHANNELS, *kernel.shape[2:])
    mlp = torch.zeros(net.GAU_HIDDEN, net.FEATURE_MAP[0] * net.FEATURE_MAP[1])
    mlp[:6] = read_back.float()
    state["head.mlp.1.weight"] = mlp
    for name, bins, first in (("cls_x", codec.SIMCC_X_BINS, 0), ("cls_y", codec.SIMCC_Y_BINS, 3)):
        half = (bins - 1) / 2.0
        z = (torch.arange(bins, dtype=torch.float64) - half) / half
        w = torch.zeros(bins, net.GAU_HIDDEN, dtype=torch.float64)
        w[:, first], w[:, first + 1], w[:, first + 2] = 1.0, z, z * z
        state[f"head.{name}.weight"] = w.float()
    return state


def write_tiny_dwpose(directory: str | os.PathLike) -> Path:
    """Write ``dwpose/dw-ll_ucoco_384.pth`` with :func:`template_dwpose_state_dict`: the tiny ONNX model's cartoon
    face on any frame, so the ``dwpose`` backend gives a plausible crop box in the tiny tree."""
    path = Path(directory) / dwpose_torch.CHECKPOINT_FILE
    _atomic_torch_save({"meta": {"note": "nbhelpers tiny template weights (draws a fixed cartoon face)"},
                        "state_dict": template_dwpose_state_dict()}, path)
    return path


def simcc_peak_model(centers_x, centers_y, *, heights=1.0, switch_shift_x: float = 0.0, switch_shift_y: float = 0.0,
                     input_size: tuple[int, int] = codec.INPUT_SIZE, batch: int | str = "batch",
                     input_name: str = "input", x_name: str = "simcc_x", y_name: str = "simcc_y",
                     y_first: bool = False):
    """A small ONNX graph with DWPose's signature and SimCC peaks at chosen places.

    ``simcc_x[n, k, b] = heights[k] - (b - (centers_x[k] + s[n] * switch_shift_x))**2 / 64`` (likewise y), with
    ``s[n] = clip(1000 * (mean(left half of input n) - mean(right half)), -1, 1)``: a frame brighter on the left
    moves the peaks by +shift, its mirror by -shift, so the flip test changes the answer in a known way.

    Centres are (K,) bins (2 per input pixel); ``heights`` scalar or (K,) (<= 0 is rejected by the decoder);
    ``input_size`` ``(w, h)`` pixels; ``batch`` a dimension name (dynamic) or an int; ``y_first`` lists the y output
    first. Returns an ``onnx.ModelProto`` (opset 17, IR version 8)."""
    onnx = require("onnx", "pip install onnx")
    from onnx import TensorProto, helper, numpy_helper

    cx = np.asarray(centers_x, dtype=np.float32).reshape(1, -1, 1)
    cy = np.asarray(centers_y, dtype=np.float32).reshape(1, -1, 1)
    k = cx.shape[1]
    if cy.shape[1] != k:
        raise InputError(f"centers_y has {cy.shape[1]} keypoints but centers_x has {k}")
    heights_arr = np.broadcast_to(np.asarray(heights, dtype=np.float32), (k,)).reshape(1, k, 1)
    w, h = int(input_size[0]), int(input_size[1])
    wx, wy = int(w * codec.SIMCC_SPLIT_RATIO), int(h * codec.SIMCC_SPLIT_RATIO)

    constants = {
        "half": np.array([w // 2], np.int64), "zero": np.array([0], np.int64), "width": np.array([w], np.int64),
        "axis3": np.array([3], np.int64), "shape_n11": np.array([-1, 1, 1], np.int64),
        "gain": np.float32(1000.0), "lo": np.float32(-1.0), "hi": np.float32(1.0),
        "shift_x": np.float32(switch_shift_x), "shift_y": np.float32(switch_shift_y),
        "cx": cx, "cy": cy, "heights": heights_arr, "sharp": np.float32(1.0 / 64.0),
        "bins_x": np.arange(wx, dtype=np.float32).reshape(1, 1, wx),
        "bins_y": np.arange(wy, dtype=np.float32).reshape(1, 1, wy),
    }
    inits = [numpy_helper.from_array(np.asarray(value), name) for name, value in constants.items()]
    nodes = [
        helper.make_node("Slice", [input_name, "zero", "half", "axis3"], ["left"]),
        helper.make_node("Slice", [input_name, "half", "width", "axis3"], ["right"]),
        helper.make_node("ReduceMean", ["left"], ["left_mean"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("ReduceMean", ["right"], ["right_mean"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Sub", ["left_mean", "right_mean"], ["diff4"]),
        helper.make_node("Reshape", ["diff4", "shape_n11"], ["diff"]),
        helper.make_node("Mul", ["diff", "gain"], ["diff_gain"]),
        helper.make_node("Clip", ["diff_gain", "lo", "hi"], ["switch"]),
    ]
    for axis, out in (("x", x_name), ("y", y_name)):
        nodes += [
            helper.make_node("Mul", ["switch", f"shift_{axis}"], [f"move_{axis}"]),
            helper.make_node("Add", [f"c{axis}", f"move_{axis}"], [f"vertex_{axis}"]),     # (N, K, 1)
            helper.make_node("Sub", [f"bins_{axis}", f"vertex_{axis}"], [f"d_{axis}"]),    # (N, K, W)
            helper.make_node("Mul", [f"d_{axis}", f"d_{axis}"], [f"sq_{axis}"]),
            helper.make_node("Mul", [f"sq_{axis}", "sharp"], [f"curve_{axis}"]),
            helper.make_node("Sub", ["heights", f"curve_{axis}"], [out]),
        ]
    x_info = helper.make_tensor_value_info(x_name, TensorProto.FLOAT, [batch, k, wx])
    y_info = helper.make_tensor_value_info(y_name, TensorProto.FLOAT, [batch, k, wy])
    graph = helper.make_graph(
        nodes, "dwpose_simcc_peaks",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, 3, h, w])],
        [y_info, x_info] if y_first else [x_info, y_info], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="nbhelpers.testing")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def face_template_input_px() -> np.ndarray:
    """A mirror-symmetric cartoon face in DWPose input pixels: (133, 2) float32 whole-body keypoints, the 68
    face points (iBUG order) around the middle of the 288x384 input, the others below in mirror pairs."""
    axis = codec.INPUT_SIZE[0] * 0.5 - 0.25  # x -> 287.5/2 - x in bins is the flip mirror: axis 143.75
    flip = codec.coco_wholebody_flip_indices()
    offsets = np.zeros((codec.NUM_KEYPOINTS, 2), np.float64)  # (dx from the axis, y)
    # the jaw (image-left temple, round the chin, image-right temple), the image-left brow, the nose bridge
    face = {k: (-44 * math.cos(math.pi * k / 16), 180 + 60 * math.sin(math.pi * k / 16)) for k in range(17)}
    face.update({17 + i: (-38 + 7.5 * i, 168 - 4 * math.sin(math.pi * i / 4)) for i in range(5)})
    face.update({27 + i: (0.0, 178 + 10 * i) for i in range(4)})
    face.update({31: (-10, 214), 32: (-5, 216), 33: (0, 218)})
    face.update({36: (-30, 186), 37: (-24, 182), 38: (-16, 182), 39: (-10, 186), 40: (-16, 190), 41: (-24, 190)})
    face.update({48: (-20, 228), 49: (-12, 224), 50: (-5, 222), 51: (0, 223), 55: (12, 234), 56: (5, 237),
                 57: (0, 238)})
    face.update({60: (-16, 228), 61: (-6, 227), 62: (0, 227), 65: (6, 230), 66: (0, 230)})
    for k, (dx, y) in face.items():
        wb = codec.FACE_START + k
        offsets[wb] = (dx, y)
        offsets[flip[wb]] = (-dx, y)
    for k in range(codec.NUM_KEYPOINTS):
        if codec.FACE_START <= k < codec.FACE_STOP or k > flip[k]:
            continue
        dx = 0.0 if flip[k] == k else -(50.0 + (k % 40))
        offsets[k] = (dx, 300.0 + (k % 60))
        offsets[flip[k]] = (-dx, 300.0 + (k % 60))
    return np.stack([axis + offsets[:, 0], offsets[:, 1]], axis=1).astype(np.float32)


def write_tiny_dwpose_onnx(directory: str | os.PathLike) -> Path | None:
    """Write ``dwpose/dw-ll_ucoco_384.onnx`` under ``directory``: a few-kB graph drawing
    :func:`face_template_input_px`, input ``input`` (N, 3, 384, 288) float32, outputs ``simcc_x`` (N, 133, 576) and
    ``simcc_y`` (N, 133, 768). Returns the path, or None (with a warning) without ``onnx``."""
    try:
        import onnx
    except ImportError:
        warnings.warn("the onnx package is not installed, so the tiny weights tree gets no "
                      f"{dwpose_onnx.ONNX_FILE} (pip install onnx)", NbHelpersWarning, stacklevel=2)
        return None

    path = Path(directory) / dwpose_onnx.ONNX_FILE
    bins = face_template_input_px() * codec.SIMCC_SPLIT_RATIO
    model = simcc_peak_model(bins[:, 0], bins[:, 1])
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))
    return path
