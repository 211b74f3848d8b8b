"""S3FD: the network's parameter names and shapes equal the official checkpoint's, and the decoding (anchors,
variances, NMS with the +1 convention, score thresholds) gives known boxes on head outputs built by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import REFERENCE

from nbhelpers import testing
from nbhelpers.errors import CheckpointError, InputError, WeightsError
from nbhelpers.faces import s3fd

KEYS = REFERENCE / "checkpoints" / "s3fd.keys.json"

# Map sizes (H_i, W_i) of the six heads for a 64x96 input: H/4, H/8, H/16, H/32 + 4, then two stride-2 steps.
MAPS_64x96 = [(16, 24), (8, 12), (4, 6), (6, 7), (3, 4), (2, 2)]


def built_outputs(maps=MAPS_64x96, batch=1, fill=0.0):
    """12 arrays of zeros shaped like S3FDNet outputs; conf holds face *probabilities* (channel 1)."""
    olist = []
    for h, w in maps:
        conf = np.zeros((batch, 2, h, w), np.float32)
        conf[:, 0] = 1.0 - fill
        conf[:, 1] = fill
        olist += [conf, np.zeros((batch, 4, h, w), np.float32)]
    return olist


def put_face(olist, level, row, col, score, loc=(0.0, 0.0, 0.0, 0.0), image=0):
    olist[2 * level][image, 1, row, col] = score
    olist[2 * level][image, 0, row, col] = 1.0 - score
    olist[2 * level + 1][image, :, row, col] = loc


# --------------------------------------------------------------------------------------------------------------
# Decoding, numpy only
# --------------------------------------------------------------------------------------------------------------

def test_one_anchor_with_zero_regression_is_the_anchor_square():
    # Stride 4 (head 0), cell row 5, col 7: anchor centre (4/2 + 7*4, 4/2 + 5*4) = (30, 22), side 4*4 = 16.
    # Box = centre -/+ 8 -> (22, 14, 38, 30).
    olist = built_outputs()
    put_face(olist, 0, 5, 7, 0.9)
    (dets,) = s3fd.decode_detections(olist, apply_softmax=False)
    np.testing.assert_allclose(dets, [[22, 14, 38, 30, 0.9]], rtol=0, atol=1e-6)
    assert s3fd.best_box(dets) == (22, 14, 38, 30)


def test_regression_decodes_with_variances_0_1_and_0_2():
    # Same anchor (centre (30, 22), side 16). loc = (1, -1, ln2/0.2, 0):
    # centre x = 30 + 1 * 0.1 * 16 = 31.6; centre y = 22 - 1.6 = 20.4;
    # width = 16 * exp(0.2 * ln2 / 0.2) = 32; height = 16 * exp(0) = 16.
    # Box = (31.6 - 16, 20.4 - 8, 31.6 + 16, 20.4 + 8) = (15.6, 12.4, 47.6, 28.4).
    olist = built_outputs()
    put_face(olist, 0, 5, 7, 0.8, loc=(1.0, -1.0, math.log(2) / 0.2, 0.0))
    (dets,) = s3fd.decode_detections(olist, apply_softmax=False)
    np.testing.assert_allclose(dets, [[15.6, 12.4, 47.6, 28.4, 0.8]], rtol=0, atol=1e-5)
    # The official result truncates after clipping at 0: (15, 12, 47, 28).
    assert s3fd.best_box(dets) == (15, 12, 47, 28)


@pytest.mark.parametrize("level,stride", list(enumerate(s3fd.STRIDES)))
def test_every_head_uses_stride_4_to_128_and_anchor_4x_stride(level, stride):
    # Cell (1, 1) of head `level`: centre 1.5 * stride, side 4 * stride -> (-0.5 s, -0.5 s, 3.5 s, 3.5 s).
    olist = built_outputs()
    put_face(olist, level, 1, 1, 0.7)
    (dets,) = s3fd.decode_detections(olist, apply_softmax=False)
    np.testing.assert_allclose(dets[0, :4], [-0.5 * stride, -0.5 * stride, 3.5 * stride, 3.5 * stride])
    # Negative corners are clipped to 0 in the final box.
    assert s3fd.best_box(dets) == (0, 0, int(3.5 * stride), int(3.5 * stride))


def test_nms_keeps_the_best_of_overlapping_boxes_and_a_distant_one():
    # Head 0 cells (5, 7) = (22, 14, 38, 30) score 0.9 and (5, 8) = (26, 14, 42, 30) score 0.8:
    # +1 convention: inter = (38 - 26 + 1) * (30 - 14 + 1) = 13 * 17 = 221; areas 17 * 17 = 289 each;
    # IoU = 221 / (578 - 221) = 0.619 > 0.3 -> the 0.8 box goes.
    # Cell (5, 12) = (42, 14, 58, 30) score 0.7: inter width 38 - 42 + 1 < 0 -> 0 -> kept.
    olist = built_outputs()
    put_face(olist, 0, 5, 7, 0.9)
    put_face(olist, 0, 5, 8, 0.8)
    put_face(olist, 0, 5, 12, 0.7)
    (dets,) = s3fd.decode_detections(olist, apply_softmax=False)
    np.testing.assert_allclose(dets, [[22, 14, 38, 30, 0.9], [42, 14, 58, 30, 0.7]], atol=1e-6)


def test_nms_plus_one_convention_and_threshold_is_inclusive():
    # A = (0, 0, 9, 9): 10 x 10 = 100 with +1. B = (0, 0, 9, 2): 10 x 3 = 30, inside A.
    # IoU = 30 / (100 + 30 - 30) = 0.3 exactly -> kept (suppressed only when > 0.3).
    a = [0, 0, 9, 9, 0.9]
    keep = s3fd.nms(np.array([a, [0, 0, 9, 2, 0.8]]), 0.3)
    assert keep.tolist() == [0, 1]
    # A = (0, 0, 10, 10): 11 x 11 = 121. B = (0, 0, 10, 3): 11 x 4 = 44 -> IoU 44/121 = 0.36 -> suppressed.
    # (Without the +1 it would be 30/100 = 0.3 and kept: this pins the convention.)
    keep = s3fd.nms(np.array([[0, 0, 10, 10, 0.9], [0, 0, 10, 3, 0.8]]), 0.3)
    assert keep.tolist() == [0]
    # Order: highest score first whatever the input order.
    keep = s3fd.nms(np.array([[100, 100, 120, 120, 0.6], [0, 0, 10, 10, 0.95]]), 0.3)
    assert keep.tolist() == [1, 0]


def test_score_thresholds_candidate_0_05_and_final_0_5():
    olist = built_outputs()
    put_face(olist, 0, 1, 1, 0.05)   # not a candidate (needs > 0.05)
    put_face(olist, 0, 1, 9, 0.06)   # candidate, dropped at the end (<= 0.5)
    put_face(olist, 0, 9, 1, 0.5)    # candidate, dropped at the end (score must be > 0.5)
    put_face(olist, 0, 9, 9, 0.51)   # kept
    all_candidates = s3fd._decode_image([o[0] for o in olist])  # before NMS and the final cut
    assert sorted(np.round(all_candidates[:, 4], 2).tolist()) == [0.06, 0.5, 0.51]
    (dets,) = s3fd.decode_detections(olist, apply_softmax=False)
    assert dets.shape == (1, 5) and dets[0, 4] == pytest.approx(0.51)


def test_softmax_of_logits_gives_the_same_boxes_as_probabilities():
    # Logits (0, ln 9) -> softmax (0.1, 0.9).
    probs = built_outputs()
    put_face(probs, 2, 1, 2, 0.9)
    logits = built_outputs()
    for conf in logits[0::2]:
        conf[:, 0], conf[:, 1] = 0.0, -20.0
    logits[4][0, 1, 1, 2] = math.log(9)
    logits[4][0, 0, 1, 2] = 0.0
    np.testing.assert_allclose(s3fd.decode_detections(logits)[0], s3fd.decode_detections(probs,
                                                                                          apply_softmax=False)[0])


def test_batch_images_are_decoded_separately_and_empty_gives_none():
    olist = built_outputs(batch=2)
    put_face(olist, 1, 2, 3, 0.95, image=1)  # stride 8: centre (28, 20), side 32 -> (12, 4, 44, 36)
    first, second = s3fd.decode_detections(olist, apply_softmax=False)
    assert first.shape == (0, 5) and s3fd.best_box(first) is None
    assert s3fd.best_box(second) == (12, 4, 44, 36)


def test_decode_rejects_wrong_outputs():
    with pytest.raises(InputError, match="12 arrays"):
        s3fd.decode_detections(built_outputs()[:10])
    bad = built_outputs()
    bad[1] = np.zeros((1, 3, 16, 24), np.float32)
    with pytest.raises(InputError, match=r"olist\[1\]"):
        s3fd.decode_detections(bad)


# --------------------------------------------------------------------------------------------------------------
# Network and loader (torch)
# --------------------------------------------------------------------------------------------------------------

def test_parameter_names_and_shapes_equal_the_official_checkpoint():
    torch = pytest.importorskip("torch")
    if not KEYS.is_file():
        pytest.skip(f"reference key list not found at {KEYS}")
    expected = json.loads(KEYS.read_text())
    with torch.device("meta"):
        net = s3fd.S3FDNet()
    got = {k: list(v.shape) for k, v in net.state_dict().items()}
    assert got == expected
    assert net.conv3_3_norm_mbox_conf.out_channels == 4  # 3 background (max-out) + 1 face


def test_forward_shapes_l2norm_scales_and_background_max_out():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = s3fd.S3FDNet().eval()
    norms = ("conv3_3_norm", "conv4_3_norm", "conv5_3_norm")
    assert [float(getattr(net, n).weight.detach()[0]) for n in norms] == [10, 8, 5]
    raw = {}
    net.conv3_3_norm_mbox_conf.register_forward_hook(lambda m, i, o: raw.setdefault("conf", o))
    with torch.no_grad():
        out = net(torch.randn(1, 3, 64, 96) * 50)
    shapes = [tuple(o.shape[2:]) for o in out]
    assert shapes[0::2] == MAPS_64x96 and shapes[1::2] == MAPS_64x96
    assert [o.shape[1] for o in out] == [2, 4] * 6
    # Head 0: channel 0 = max of the 3 background logits, channel 1 = the face logit.
    torch.testing.assert_close(out[0][:, 0], raw["conf"][:, :3].max(dim=1).values)
    torch.testing.assert_close(out[0][:, 1], raw["conf"][:, 3])


def test_l2norm_known_answer_and_zero_vector_in_fp16():
    torch = pytest.importorskip("torch")
    layer = s3fd.L2Norm(2, 10.0)
    x = torch.tensor([3.0, 4.0]).view(1, 2, 1, 1)  # norm 5 -> (0.6, 0.8) * 10
    torch.testing.assert_close(layer(x).view(2), torch.tensor([6.0, 8.0]))
    zeros = torch.zeros(1, 2, 2, 2, dtype=torch.float16)  # a dead ReLU output: must stay 0, not NaN
    assert torch.equal(layer.half()(zeros), zeros)


@pytest.fixture(scope="module")
def tiny_s3fd_file(tmp_path_factory):
    pytest.importorskip("torch")
    return testing.write_tiny_s3fd(tmp_path_factory.mktemp("w"))


def test_tiny_writer_file_loads_strictly_through_the_loader(tiny_s3fd_file):
    assert tiny_s3fd_file.as_posix().endswith("s3fd/s3fd-619a316812.pth")
    det = s3fd.S3FD(tiny_s3fd_file, device="cpu")
    assert det.net.conv1_1.weight.dtype.is_floating_point
    frames = np.random.default_rng(0).integers(0, 256, (2, 64, 96, 3), dtype=np.uint8)
    boxes = det.detect(frames)
    assert len(boxes) == 2
    for b in boxes:
        assert b is None or (all(isinstance(v, int) and v >= 0 for v in b[:4]) and 0.5 < b.score <= 1.0)
    det.close()
    assert not hasattr(det, "net")


def test_loader_errors_name_the_problem(tmp_path, tiny_s3fd_file):
    torch = pytest.importorskip("torch")
    with pytest.raises(WeightsError, match="does not exist"):
        s3fd.S3FD(tmp_path / "nope.pth", device="cpu")
    html = tmp_path / "html.pth"
    html.write_text("<html>Sign in</html>")
    with pytest.raises(WeightsError, match="HTML page"):
        s3fd.S3FD(html, device="cpu")
    state = torch.load(tiny_s3fd_file, weights_only=True)
    del state["fc7_mbox_loc.bias"]
    state["conv1_1.weight"] = torch.zeros(64, 3, 5, 5)
    bad = tmp_path / "bad.pth"
    torch.save(state, bad)
    with pytest.raises(CheckpointError,
                       match=r"1 missing(.|\n)*fc7_mbox_loc.bias(.|\n)*wrong shape: conv1_1.weight") as err:
        s3fd.S3FD(bad, device="cpu")
    assert "version='v1'" not in str(err.value)  # the UNet's v1 hint is no fix for a face detector


class _FakeNet:
    """Stands in for S3FDNet: records its input and reports one face at a fixed cell of its *input* grid."""

    def __init__(self, torch):
        self.torch = torch
        self.inputs = []

    def __call__(self, x):
        self.inputs.append(x.clone())
        b, _, h, w = x.shape
        maps = [(h // 4, w // 4), (h // 8, w // 8), (h // 16, w // 16), (h // 32 + 4, w // 32 + 4),
                (h // 64 + 2, w // 64 + 2), (h // 128 + 1, w // 128 + 1)]
        olist = built_outputs(maps, batch=b)
        put_face(olist, 0, 5, 10, 0.9)  # stride 4: centre (42, 22), side 16 -> (34, 14, 50, 30) in input pixels
        for k in range(0, 12, 2):  # the network returns logits
            olist[k] = np.log(np.clip(olist[k], 1e-9, 1.0))
        return [self.torch.from_numpy(o) for o in olist]


def test_detect_feeds_rgb_minus_bgr_means_and_scales_boxes_back(tiny_s3fd_file):
    torch = pytest.importorskip("torch")
    det = s3fd.S3FD(tiny_s3fd_file, device="cpu")
    det.net = _FakeNet(torch)
    frame = np.zeros((200, 400, 3), np.uint8)
    frame[..., 0], frame[..., 1], frame[..., 2] = 10, 120, 200  # B, G, R
    # Full resolution (official): the input is RGB minus (104, 117, 123) -> (200-104, 120-117, 10-123).
    (found,) = det.detect(frame)
    assert found[:4] == (34, 14, 50, 30) and found.score == pytest.approx(0.9)
    x = det.net.inputs[-1]
    assert tuple(x.shape) == (1, 3, 200, 400)
    assert x[0, :, 0, 0].tolist() == [96.0, 3.0, -113.0]
    # max_side=200: the 200x400 frame is detected at 100x200 and the box scaled back by 2:
    # (34, 14, 50, 30) * 2 = (68, 28, 100, 60).
    assert det.detect(frame, max_side=200)[0][:4] == (68, 28, 100, 60)
    assert tuple(det.net.inputs[-1].shape) == (1, 3, 100, 200)
    # Batches of frames give one result each, in order.
    assert [d[:4] for d in det.detect(np.stack([frame, frame, frame]))] == [(34, 14, 50, 30)] * 3


def test_tiny_writer_is_registered_with_nbhelpers_testing():
    assert testing.WRITERS.get("s3fd") is testing.write_tiny_s3fd


# ------------------------------------------------------------------------------------------------------------
# Precision and device input (issue 16: S3FD in fp16, batched, on the device)
# ------------------------------------------------------------------------------------------------------------

def test_half_on_cpu_falls_back_to_float32_and_auto_is_float32_there(tiny_s3fd_file):
    torch = pytest.importorskip("torch")
    from nbhelpers.errors import FallbackWarning

    with pytest.warns(FallbackWarning, match="float32"):
        det = s3fd.S3FD(tiny_s3fd_file, device="cpu", dtype="float16")
    assert det.dtype == torch.float32 and det.net.conv1_1.weight.dtype == torch.float32
    assert s3fd.S3FD(tiny_s3fd_file, device="cpu", dtype="auto").dtype == torch.float32


def test_torch_frames_give_the_same_boxes_as_numpy_frames(tiny_s3fd_file):
    torch = pytest.importorskip("torch")
    det = s3fd.S3FD(tiny_s3fd_file, device="cpu", batch_size=2)
    det.net = _FakeNet(torch)
    frames = np.zeros((3, 200, 400, 3), np.uint8)
    frames[..., 0], frames[..., 1], frames[..., 2] = 10, 120, 200
    assert det.detect(torch.from_numpy(frames)) == det.detect(frames)
    assert det.net.inputs[0][0, :, 0, 0].tolist() == [96.0, 3.0, -113.0]
    assert det.detect(torch.from_numpy(frames[0]), max_side=200)[0][:4] == (68, 28, 100, 60)
    with pytest.raises(InputError, match="uint8"):
        det.detect(torch.from_numpy(frames).float())


class _OverflowingNet(_FakeNet):
    """Returns non-finite outputs for half-precision input (an fp16 overflow), the fake face for float32."""

    def __call__(self, x):
        olist = super().__call__(x.float())
        if x.dtype != self.torch.float32:
            olist[1] = olist[1] * float("inf")
        return olist

    def float(self):
        return self

    def __deepcopy__(self, memo):  # the detector copies its net for the float32 rerun
        return self


def test_non_finite_half_outputs_rerun_in_float32_with_a_warning(tiny_s3fd_file):
    torch = pytest.importorskip("torch")
    from nbhelpers.errors import FallbackWarning

    det = s3fd.S3FD(tiny_s3fd_file, device="cpu")
    det.net, det.dtype = _OverflowingNet(torch), torch.float16  # as on CUDA in fp16, with a net that overflows
    frame = np.zeros((200, 400, 3), np.uint8)
    with pytest.warns(FallbackWarning, match="not finite"):
        (found,) = det.detect(frame)
    assert found[:4] == (34, 14, 50, 30)
    assert det._net32 is not None and det._net32.inputs[-1].dtype == torch.float32


@pytest.mark.gpu
def test_fp16_on_cuda_stays_within_tolerance_of_fp32(tiny_s3fd_file, shared_data, ffmpeg):
    import subprocess

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    raw = subprocess.run([ffmpeg, "-v", "error", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"),
                          "-frames:v", "4", "-f", "rawvideo", "-pix_fmt", "bgr24", "-"],
                         check=True, capture_output=True, stdin=subprocess.DEVNULL).stdout
    frames = torch.from_numpy(np.frombuffer(raw, np.uint8).reshape(-1, 768, 576, 3).copy()).cuda()
    full = s3fd.S3FD(tiny_s3fd_file, device="cuda", dtype="float32", batch_size=4)
    half = s3fd.S3FD(tiny_s3fd_file, device="cuda", dtype="auto", batch_size=4)
    assert half.dtype == torch.float16
    x = (frames.flip(-1).permute(0, 3, 1, 2).float() - torch.tensor(s3fd.MEAN, device="cuda").view(1, 3, 1, 1))
    with torch.inference_mode():
        o32 = [o.float() for o in full.net(x)]
        o16 = [o.float() for o in half.net(x.half())]
    for a, b in zip(o32, o16, strict=True):  # logits and box regressions: fp16 rounding only
        assert torch.isfinite(b).all()
        assert (a - b).abs().max() <= 0.01 * a.abs().max() + 0.02
    # (decoded boxes are not compared: random regressions make exp() sizes overflow; decoding is tested on
    # hand-built head outputs above, and it is the same float32 numpy code for both precisions)
    found = half.detections(frames)  # the detector's own fp16 path on frames resident on the GPU
    assert len(found) == len(frames) and all(np.isfinite(d[:, 4]).all() for d in found)
    assert half._net32 is None  # no batch overflowed fp16
