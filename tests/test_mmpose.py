"""The ``mmpose`` backend: the official model built from our config dict, run through mmpose on the CPU.

These tests need mmpose, which the main CI venv does not have (full mmcv cannot be built there). Build the overlay
with ``PYTHON=.venv/bin/python bash ci/mmpose-env.sh`` (mmcv-lite + our ``mmcv.ops`` stand-in) and run
``PYTHONPATH=/tmp/overlay-mmpose .venv/bin/python -m pytest tests/test_mmpose.py``; the environment checks
(tests/test_zz_environments.py) do both. Elsewhere they skip with that reason.

The key checks: the mmpose model with random weights, exported to ONNX, gives the same landmarks through the
``dwpose-onnx`` backend (our own pre/post-processing) as through mmpose's ``inference_topdown``, to 0.5 px; and the
``dwpose`` backend (our torch network) loads the same checkpoint file as mmpose and gives the same SimCC vectors and
landmarks, to 0.1 px in float32, with identical crop boxes.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
from helpers import REFERENCE, StubDetector, face_frames, max_landmark_difference

from nbhelpers import testing
from nbhelpers.errors import CheckpointError
from nbhelpers.faces import _mmcv_ops_stub
from nbhelpers.faces import dwpose_codec as codec

KEYS_JSON = REFERENCE / "checkpoints" / "dwpose-rtmpose-l-384x288.keys.json"
HAVE_MMPOSE = importlib.util.find_spec("mmpose") is not None and importlib.util.find_spec("mmcv") is not None
needs_mmpose = pytest.mark.skipif(
    not HAVE_MMPOSE, reason="mmpose/mmcv not importable here (the main CI venv has neither); build the mmpose "
                            "overlay with `PYTHON=.venv/bin/python bash ci/mmpose-env.sh` and run "
                            "`PYTHONPATH=/tmp/overlay-mmpose python -m "
                            "pytest tests/test_mmpose.py` (tests/test_zz_environments.py does both)")


FACE = (5, 6, 300, 400, 0.99)  # the stand-in detector's box


@pytest.mark.skipif(importlib.util.find_spec("mmcv") is not None, reason="mmcv is installed here")
def test_stub_does_nothing_without_mmcv():
    before = set(sys.modules)
    assert _mmcv_ops_stub.install() is False
    assert "mmcv.ops" not in sys.modules and not (set(sys.modules) - before) & {"mmcv", "mmcv.ops"}


# ------------------------------------------------------------------------------------------ with mmpose

@pytest.fixture(scope="module")
def mb():
    if not HAVE_MMPOSE:
        pytest.skip("mmpose is not importable")
    from nbhelpers.faces import mmpose_backend

    found = mmpose_backend.mmpose_available()
    assert found.ok, found.reason
    return mmpose_backend


@pytest.fixture(scope="module")
def model(mb):
    return mb.build_pose_model(None, "cpu", seed=0)


def _export_onnx(model, path, **kwargs):
    """The mmpose model's backbone and SimCC head (without its data preprocessor) exported as the published file."""
    import torch

    from nbhelpers.faces import dwpose_torch

    return dwpose_torch.export_onnx(torch.nn.Sequential(model.backbone, model.head), path, **kwargs)


@pytest.fixture(scope="module")
def onnx_file(mb, model, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return _export_onnx(model, tmp_path_factory.mktemp("onnx") / "dw-random.onnx")


@pytest.fixture(scope="module")
def frames(shared_data):
    return face_frames([0, 39])


@needs_mmpose
def test_config_builds_the_official_architecture(mb, model):
    state = model.state_dict()
    expected = json.loads(KEYS_JSON.read_text())
    assert set(state) == set(expected)
    assert {k: list(v.shape) for k, v in state.items()} == expected
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - 33.6) < 0.1
    # our flip list, written from the COCO-WholeBody definition, equals mmpose's own metainfo
    assert list(model.dataset_meta["flip_indices"]) == list(codec.coco_wholebody_flip_indices())
    assert model.cfg.model.test_cfg.flip_test is True
    assert type(model.backbone).__module__.startswith("mmpose.")  # mmpose's CSPNeXt, not mmdet's


@needs_mmpose
def test_ops_stand_in_is_used_only_because_real_ops_are_missing(mb):
    import mmcv

    if _mmcv_ops_stub.real_ops_available():
        pytest.skip("full mmcv with compiled ops is installed; the stand-in is not used")
    assert _mmcv_ops_stub.is_installed() and mmcv.ops is sys.modules["mmcv.ops"]
    from mmcv.ops import batched_nms
    from mmcv.ops.roi_align import roi_align

    with pytest.raises(NotImplementedError, match="compiled mmcv operator"):
        batched_nms(None, None, None, None)
    with pytest.raises(NotImplementedError, match="mmcv-lite"):
        roi_align()
    assert _mmcv_ops_stub.install() is True  # idempotent


@needs_mmpose
def test_mmpose_and_dwpose_onnx_agree_on_the_same_random_weights(mb, model, onnx_file, frames):
    from nbhelpers.faces.dwpose_onnx import DWPoseOnnx, DWPoseOnnxBackend

    mm = mb.MMPoseBackend(model=model, face_detector=StubDetector(FACE, none={1}), device="cpu")
    onnx_backend = DWPoseOnnxBackend.__new__(DWPoseOnnxBackend)  # same backend, our ONNX file, stub detector
    onnx_backend.weights_dir, onnx_backend.face_detector = onnx_file.parent, StubDetector(FACE, none={1})
    onnx_backend.pose = DWPoseOnnx(onnx_file, "cpu")
    onnx_backend.device = "cpu"
    wide = np.ascontiguousarray(np.repeat(np.linspace(0, 255, 640, dtype=np.uint8)[None, :, None], 360, 0)
                                .repeat(3, 2))  # a 640x360 frame: the other branch of the aspect fix
    batch = np.stack([frames[0], frames[1], frames[1]])
    a, b = mm.detect(batch), onnx_backend.detect(batch)
    assert a[1] is None and b[1] is None
    for r_mm, r_onnx in ((a[0], b[0]), (a[2], b[2])):
        assert np.abs(r_mm.landmarks - r_onnx.landmarks).max() <= 0.5
        np.testing.assert_array_equal(r_mm.face_box, r_onnx.face_box)
    kp_mm, _ = mm.keypoints(wide[None])
    kp_onnx, _ = onnx_backend.pose.keypoints(wide[None])
    assert np.abs(kp_mm - kp_onnx).max() <= 0.5
    # the random weights give landmarks that spread out and follow the input (the check is not vacuous)
    face = a[0].landmarks
    assert len(np.unique(face, axis=0)) > 20 and not np.allclose(face, a[2].landmarks)


@needs_mmpose
def test_flip_test_changes_the_result_in_both_backends_alike(mb, model, onnx_file, frames):
    import torch

    from nbhelpers.faces.dwpose_onnx import DWPoseOnnx

    plain = mb.build_pose_model(None, "cpu", flip_test=False, seed=0)  # one seed fixes every parameter
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in plain.state_dict().items())
    mm_noflip = mb.MMPoseBackend(model=plain, face_detector=StubDetector(FACE), device="cpu")
    kp_mm, _ = mm_noflip.keypoints(frames[:1])
    kp_onnx, _ = DWPoseOnnx(onnx_file, "cpu", flip_test=False).keypoints(frames[:1])
    assert np.abs(kp_mm - kp_onnx).max() <= 0.5
    kp_flip, _ = DWPoseOnnx(onnx_file, "cpu", flip_test=True).keypoints(frames[:1])
    assert np.abs(kp_flip - kp_onnx).max() > 5  # the flip test is doing something


@needs_mmpose
def test_fixed_batch_export_like_the_published_file(mb, model, onnx_file, frames, tmp_path):
    from nbhelpers.faces.dwpose_onnx import DWPoseOnnx

    fixed = DWPoseOnnx(_export_onnx(model, tmp_path / "b1.onnx", dynamic_batch=False), "cpu")
    assert fixed.fixed_batch == 1 and (fixed.x_output, fixed.y_output) == ("simcc_x", "simcc_y")
    a, _ = fixed.keypoints(frames)
    b, _ = DWPoseOnnx(onnx_file, "cpu").keypoints(frames)
    assert np.abs(a - b).max() <= 0.5


@needs_mmpose
def test_checkpoint_in_the_official_layout_loads_strictly(mb, model, frames, tmp_path):
    import torch

    state = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "models" / "dwpose" / "dw-ll_ucoco_384.pth"
    path.parent.mkdir(parents=True)
    torch.save({"meta": {"epoch": 270}, "state_dict": {"module." + k: v for k, v in state.items()}}, path)
    backend = mb.MMPoseBackend(tmp_path / "models", "cpu", face_detector=StubDetector(FACE))
    loaded = backend.model.state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert backend.detect(frames[:1])[0].landmarks.shape == (68, 2)
    del state["head.cls_x.weight"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="1 missing"):
        mb.build_pose_model(path, "cpu")


@needs_mmpose
def test_self_check_reports_versions_and_times(mb):
    report = mb.self_check(device="cpu")
    assert report["ok"] and report["weights"] == "random" and report["landmarks_shape"] == [68, 2]
    assert report["versions"]["mmpose"] and report["pass_seconds"] > 0


@needs_mmpose
def test_dwpose_torch_equals_mmpose_on_one_checkpoint_file(mb, frames, tmp_path):
    """One random checkpoint in the official layout (BatchNorm statistics random too), loaded by mmpose's own
    builder and by the dwpose backend: the raw SimCC vectors agree to float32 rounding, the landmarks to 0.1 px
    (with and without the flip test), the crop boxes are identical, and a frame with no face gets none."""
    import torch

    from nbhelpers.faces import dwpose_torch as dt

    torch.set_num_threads(2)
    path = testing.write_random_dwpose_checkpoint(tmp_path / "models", seed=5)
    mm_model = mb.build_pose_model(path, "cpu")
    ours = dt.DWPoseBackend(tmp_path / "models", "cpu", face_detector=StubDetector(FACE, none={1}))
    x = torch.from_numpy(codec.normalize(codec.warp_frames(frames[:1])[0]))
    with torch.no_grad():
        want = mm_model.head(mm_model.backbone(x))
        got = ours.pose.net(x)
    for a, b in zip(got, want, strict=True):
        scale = float(b.abs().max())
        print(f"dwpose vs mmpose SimCC vectors: max difference {float((a - b).abs().max()):.3g} (peak {scale:.3g})")
        assert float((a - b).abs().max()) <= 1e-4 * scale, (float((a - b).abs().max()), scale)
    mm = mb.MMPoseBackend(model=mm_model, face_detector=StubDetector(FACE, none={1}), device="cpu")
    batch = np.stack([frames[0], frames[1], frames[1]])
    a, b = ours.detect(batch), mm.detect(batch)
    assert a[1] is None and b[1] is None
    worst = max_landmark_difference(a, b, batch.shape[1:])
    print(f"dwpose vs mmpose, fp32, shared video frames: max landmark difference {worst:.4f} px")
    assert worst <= 0.1
    assert len(np.unique(a[0].landmarks, axis=0)) > 20  # the random network's landmarks spread out
    wide = np.ascontiguousarray(np.repeat(np.linspace(0, 255, 640, dtype=np.uint8)[None, :, None], 360, 0)
                                .repeat(3, 2))
    assert np.abs(ours.pose.keypoints(wide[None])[0] - mm.keypoints(wide[None])[0]).max() <= 0.1
    plain = dt.DWPoseTorch(model=ours.pose.net, device="cpu", flip_test=False)
    mm_model.test_cfg = dict(flip_test=False)
    assert np.abs(plain.keypoints(frames[:1])[0] - mm.keypoints(frames[:1])[0]).max() <= 0.1
