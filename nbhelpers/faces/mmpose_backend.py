"""The ``mmpose`` landmark backend: the official DWPose path through OpenMMLab, for exact official landmarks.

The model of the official ``inference_topdown(model, frame)`` call is described as a dict
(:data:`RTMPOSE_L_WHOLEBODY_384X288`), built with mmpose and loaded from ``dwpose/dw-ll_ucoco_384.pth``; S3FD gives
the face box. ``mmcv-lite`` with the ``mmcv.ops`` stand-in (:mod:`nbhelpers.faces._mmcv_ops_stub`) suffices.
``python -m nbhelpers.faces.mmpose_backend --self-check`` prints a JSON report of one pass.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from .. import models
from ..errors import MissingDependencyError, package_version
from ..gpu import empty_cache
from . import _mmcv_ops_stub, dwpose_torch
from . import dwpose_codec as codec
from .base import DWPOSE_PTH_FILE as CHECKPOINT_FILE
from .base import S3FD_FILE, Availability, PoseBackend, weights_root
from .s3fd import S3FD

INSTALL_HINT = ("mmpose is not importable. Install it with nbhelpers.faces.mim.install_mmpose() (see "
                "notebooks/00_setup.ipynb), or use the 'dwpose' backend, which gives the same landmarks without mmcv")

# The SimCC codec. Source: rtmpose-l_8xb32-270e_coco-ubody-wholebody-384x288.py:44-50.
_CODEC = dict(type="SimCCLabel", input_size=codec.INPUT_SIZE, sigma=(6.0, 6.93),
              simcc_split_ratio=codec.SIMCC_SPLIT_RATIO, normalize=False, use_dark=False)

# The test pipeline: the whole image is the person box (no bbox given), padded 1.25, warped to 288x384.
# Source: rtmpose-...py:164-169, [mmpose] common_transforms.py:51, topdown_transforms.py.
_TEST_PIPELINE = [
    dict(type="LoadImage"),
    dict(type="GetBBoxCenterScale", padding=codec.BBOX_PADDING),
    dict(type="TopdownAffine", input_size=codec.INPUT_SIZE),
    dict(type="PackPoseInputs"),
]

#: RTMPose-l whole-body 384x288 (the DWPose student) as an mmengine config dict. The backbone has no
#: ``_scope_="mmdet"``: mmpose's own CSPNeXt (the same layers and names) is used, no mmdet model code. The train
#: dataloader entry only carries the COCO-WholeBody metainfo (keypoint names, flip indices) that mmpose reads when
#: the checkpoint has none. Source: rtmpose-...py:44-100,164-169,210.
RTMPOSE_L_WHOLEBODY_384X288 = dict(
    default_scope="mmpose",
    model=dict(
        type="TopdownPoseEstimator",
        data_preprocessor=dict(type="PoseDataPreprocessor", mean=list(codec.MEAN_RGB), std=list(codec.STD_RGB),
                               bgr_to_rgb=True),
        # CSPNeXt-P5 "l" (deepen = widen = 1.0), channel attention, the last stage (1024 channels) out
        backbone=dict(type="CSPNeXt", arch="P5", expand_ratio=0.5, deepen_factor=1.0, widen_factor=1.0,
                      out_indices=(4,), channel_attention=True, norm_cfg=dict(type="SyncBN"),
                      act_cfg=dict(type="SiLU")),
        head=dict(
            type="RTMCCHead", in_channels=1024, out_channels=codec.NUM_KEYPOINTS, input_size=codec.INPUT_SIZE,
            in_featuremap_size=(9, 12),  # input / 32: 288/32 x 384/32
            simcc_split_ratio=codec.SIMCC_SPLIT_RATIO, final_layer_kernel_size=7,
            gau_cfg=dict(hidden_dims=256, s=128, expansion_factor=2, dropout_rate=0.0, drop_path=0.0,
                         act_fn="SiLU", use_rel_bias=False, pos_enc=False),
            loss=dict(type="KLDiscretLoss", use_target_weight=True, beta=10.0, label_softmax=True),
            decoder=_CODEC,
        ),
        test_cfg=dict(flip_test=True),
    ),
    test_dataloader=dict(dataset=dict(type="CocoWholeBodyDataset", pipeline=_TEST_PIPELINE)),
    train_dataloader=dict(dataset=dict(type="CocoWholeBodyDataset",
                                       metainfo=dict(from_file="configs/_base_/datasets/coco_wholebody.py"))),
)


def mmpose_available() -> Availability:
    """Whether mmpose imports here (with the ``mmcv.ops`` stand-in when only mmcv-lite is there); ``reason`` says
    what is missing, or which mmcv is used."""
    if importlib.util.find_spec("mmpose") is None:
        return Availability(False, "mmpose is not installed: " + INSTALL_HINT)
    try:
        import_mmpose()
    except MissingDependencyError as exc:
        return Availability(False, str(exc))
    mmcv = (f"mmcv-lite {package_version('mmcv-lite')} + nbhelpers mmcv.ops stand-in" if _mmcv_ops_stub.is_installed()
            else f"mmcv {package_version('mmcv')}")
    return Availability(True, f"mmpose {package_version('mmpose')}, {mmcv}")


def import_mmpose():
    """``mmpose.apis``, imported with the ``mmcv.ops`` stand-in when only mmcv-lite is present;
    MissingDependencyError when mmpose, mmcv(-lite) or mmengine is missing or does not import."""
    if importlib.util.find_spec("mmcv") is None:
        raise MissingDependencyError("mmcv (or mmcv-lite) is not installed. " + INSTALL_HINT)
    _mmcv_ops_stub.install()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pkg_resources.*")
        warnings.filterwarnings("ignore", message=".*MultiScaleDeformableAttention.*")
        try:
            return importlib.import_module("mmpose.apis")
        except Exception as exc:  # ImportError, or an AssertionError on an mmcv version mismatch
            raise MissingDependencyError(f"mmpose does not import ({type(exc).__name__}: {exc}). "
                                         + INSTALL_HINT) from exc


def load_checkpoint_state(path: str | os.PathLike, trusted_sha256: str | None = None) -> tuple[dict, dict]:
    """``(state_dict, meta)`` of an mmpose checkpoint read by :func:`~nbhelpers.faces.dwpose_torch.read_checkpoint`
    (arguments and WeightsError as there), a leading ``"module."`` removed, ``meta`` empty when absent."""
    ckpt = dwpose_torch.read_checkpoint(path, trusted_sha256=trusted_sha256)
    state = dwpose_torch.state_dict_of(ckpt, path)  # a CheckpointError (a WeightsError) when not a dict
    meta = ckpt.get("meta")
    return state, meta if isinstance(meta, dict) else {}


def build_pose_model(checkpoint: str | os.PathLike | None = None, device: str | None = "cpu", *,
                     flip_test: bool = True, seed: int | None = None):
    """The official mmpose RTMPose-l whole-body model in eval mode on ``device`` (None: GPU when available), with the
    weights of ``checkpoint`` or, for None, random ones from ``seed``; ``flip_test`` sets ``test_cfg.flip_test``.
    MissingDependencyError when mmpose does not import; WeightsError or CheckpointError for a bad checkpoint.

    Source: ``preprocessing.py:17-19``; ``[mmpose] apis/inference.py:95,104,113-123``."""
    apis = import_mmpose()
    from mmengine.config import Config

    dev = dwpose_torch.resolve_device(device)
    cfg = copy.deepcopy(RTMPOSE_L_WHOLEBODY_384X288)
    cfg["model"]["test_cfg"]["flip_test"] = bool(flip_test)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pkg_resources.*")
        warnings.filterwarnings("ignore", message=".*metainfo config file.*")  # found in mmpose's .mim folder
        model = apis.init_model(Config(cfg), checkpoint=None, device="cpu")
    if checkpoint is not None:
        state, meta = load_checkpoint_state(checkpoint)
        models.check_state_dict(model, state, checkpoint, what="DWPose RTMPose-l whole-body 384x288 (mmpose)")
        model.load_state_dict(state, strict=True)
        if isinstance(meta.get("dataset_meta"), dict):
            model.dataset_meta = meta["dataset_meta"]
    else:
        randomize_weights(model, seed)
    return model.to(dev).eval()


def randomize_weights(model, seed: int | None = None) -> None:
    """Give ``model``'s weight matrices and kernels He-normal values (std sqrt(2 / fan_in)) and biases N(0, 0.02), in
    place, from ``seed`` (None: torch's global generator): with torch's default initialisation the signal fades
    through the 50-odd layers and every keypoint lands on the same bins."""
    import torch

    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2:
                values = torch.randn(param.shape, generator=generator) * math.sqrt(2.0 / param[0].numel())
            elif name.endswith(".bias"):
                values = torch.randn(param.shape, generator=generator) * 0.02
            else:
                continue
            param.copy_(values.to(param.dtype))


class MMPoseBackend(PoseBackend):
    """Face box from S3FD and 68 landmarks from the official mmpose DWPose model (``inference_topdown``): ``model``
    from :func:`build_pose_model` or the checkpoint, with the official ``test_cfg.flip_test``; the other arguments as
    :class:`~nbhelpers.faces.dwpose_torch.DWPoseBackend`. MissingDependencyError when mmpose (or torch) does not
    import; WeightsError or CheckpointError for a missing, unreadable or foreign weight file."""

    name = "mmpose"

    def __init__(self, weights_dir: str | os.PathLike | None = None, device: str | None = None, *,
                 face_detector=None, model=None, flip_test: bool = True):
        self.apis = import_mmpose()
        self.weights_dir = root = weights_root(weights_dir, model is None or face_detector is None)
        self.device = dwpose_torch.resolve_device(device)
        self.model = model if model is not None else build_pose_model(root / CHECKPOINT_FILE, self.device,
                                                                      flip_test=flip_test)
        self.face_detector = face_detector if face_detector is not None else S3FD(root / S3FD_FILE, device)

    def keypoints(self, frames_bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`PoseBackend.keypoints`, by ``inference_topdown`` with no bbox (``preprocessing.py:97-101``)."""
        kps = np.zeros((len(frames_bgr), codec.NUM_KEYPOINTS, 2), np.float32)
        scores = np.zeros((len(frames_bgr), codec.NUM_KEYPOINTS), np.float32)
        for i, frame in enumerate(frames_bgr):
            result = self.apis.inference_topdown(self.model, np.ascontiguousarray(frame))
            inst = result[0].pred_instances
            kps[i] = np.asarray(inst.keypoints)[0]
            scores[i] = np.asarray(inst.keypoint_scores)[0]
        return kps, scores

    def close(self) -> None:
        """Release the models (GPU memory)."""
        self.model = None
        super().close()
        empty_cache()


def self_check(weights_dir: str | os.PathLike | None = None, device: str | None = None) -> dict:
    """One pass of the mmpose model on ``device`` (``weights_dir``'s checkpoint when there, else random weights) on a
    synthetic frame, as a JSON-able dict: ok, reason, versions, weights, build_seconds, pass_seconds, landmarks_shape.
    """
    dists = ("mmpose", "mmcv", "mmcv-lite", "mmengine", "mmdet", "torch", "numpy")
    report: dict = {"ok": False, "versions": {d: package_version(d) for d in dists}}
    found = mmpose_available()
    report["reason"] = found.reason
    if not found:
        return report
    ckpt = Path(weights_dir) / CHECKPOINT_FILE if weights_dir is not None else None
    use_ckpt = ckpt is not None and ckpt.is_file()
    report["weights"] = "checkpoint" if use_ckpt else "random"
    t0 = time.perf_counter()
    model = build_pose_model(ckpt if use_ckpt else None, device, seed=0)
    report["build_seconds"] = round(time.perf_counter() - t0, 3)
    frame = np.zeros((512, 512, 3), np.uint8)
    frame[128:384, 160:352] = (90, 140, 200)
    t0 = time.perf_counter()
    result = import_mmpose().inference_topdown(model, frame)
    report["pass_seconds"] = round(time.perf_counter() - t0, 3)
    keypoints = np.asarray(result[0].pred_instances.keypoints)
    report["landmarks_shape"] = list(codec.face_landmarks(keypoints[0]).shape)
    report["ok"] = keypoints.shape == (1, codec.NUM_KEYPOINTS, 2) and bool(np.isfinite(keypoints).all())
    return report


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbhelpers.faces.mmpose_backend")
    parser.add_argument("--self-check", action="store_true", help="build the model, run one pass, print JSON")
    parser.add_argument("--weights-dir", default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if not args.self_check:
        parser.print_help()
        return 2
    report = self_check(args.weights_dir, args.device)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
