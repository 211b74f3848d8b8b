"""The ``dwpose`` backend: DWPose (RTMPose-l whole-body 384x288) in plain torch, from the official ``.pth``.

Checked against independent facts: the official checkpoint's parameter names and shapes (reference keys.json);
the numpy codec the ONNX backend uses (decoding, flip merge, normalisation); and the ``dwpose-onnx`` backend
itself, on the same random weights written into an ONNX file by ``torch.onnx.export`` and run by onnxruntime, on
frames of the shared video: landmarks within 0.1 px in float32 and identical crop boxes. (The comparison with
mmpose lives in tests/test_mmpose.py, which runs in the mmpose overlay.)
"""

from __future__ import annotations

import importlib.util
import json
import warnings

import numpy as np
import pytest
from helpers import (
    FACE_VIDEO,
    REFERENCE,
    ROOT,
    SHARED_DATA,
    StubDetector,
    face_frames,
    loaded_by,
    max_landmark_difference,
)

from nbhelpers import faces, testing, weights
from nbhelpers.errors import CheckpointError, InputError, WeightsError
from nbhelpers.faces import dwpose_codec as codec
from nbhelpers.faces import dwpose_onnx
from nbhelpers.faces import registry as registry_module
from nbhelpers.hashing import sha256_file
from nbhelpers.weights import verification

torch = pytest.importorskip("torch")
from nbhelpers.faces import dwpose_net  # noqa: E402
from nbhelpers.faces import dwpose_torch as dt  # noqa: E402

KEYS_JSON = REFERENCE / "checkpoints" / "dwpose-rtmpose-l-384x288.keys.json"
W, H = 576, 768
FACE = (120.6, 150.2, 460.9, 560.5, 0.97)  # the stand-in detector's box around the face of the shared video


# ------------------------------------------------------------------------------------------ architecture

def test_parameter_names_and_shapes_equal_the_official_checkpoint():
    if not KEYS_JSON.is_file():
        pytest.skip(f"{KEYS_JSON} not found (the shared reference folder)")
    expected = json.loads(KEYS_JSON.read_text())
    model = dt.build_model("meta")
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert set(got) == set(expected), (sorted(set(got) - set(expected))[:5], sorted(set(expected) - set(got))[:5])
    assert got == expected
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - 33.6) < 0.05
    assert set(testing.random_dwpose_state_dict(0)) == set(expected)


def test_module_import_is_light():
    assert loaded_by("import nbhelpers.faces.dwpose_torch, nbhelpers.faces.registry",
                     ("torch", "onnxruntime", "cv2", "mmpose")) == []


def test_blocks_compute_what_their_definitions_say():
    """Spot checks of the layers against their formulas, with hand-set weights."""
    torch.manual_seed(0)
    norm = dwpose_net.ScaleNorm(4)
    norm.g.data.fill_(2.0)
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]])
    # ||x|| / sqrt(4) = 2.5 -> x / 2.5 * 2
    torch.testing.assert_close(norm(x), x / 2.5 * 2.0)
    gau = dwpose_net.GatedAttentionUnit()
    tokens = torch.randn(2, 5, 256)
    h = gau.ln(tokens)
    u, v, z = torch.split(torch.nn.functional.silu(h @ gau.uv.weight.T), [512, 512, 128], dim=-1)
    q, k = z * gau.gamma[0] + gau.beta[0], z * gau.gamma[1] + gau.beta[1]
    a = torch.relu(q @ k.transpose(1, 2) / 128 ** 0.5) ** 2
    expected = tokens * gau.res_scale.scale + (u * (a @ v)) @ gau.o.weight.T
    torch.testing.assert_close(gau(tokens), expected, rtol=1e-4, atol=1e-4)
    net = dt.build_model("cpu")
    feats = net.backbone(torch.zeros(1, 3, 384, 288))
    assert feats.shape == (1, 1024, 12, 9)  # stride 32, the head's in_featuremap_size (9, 12)
    sx, sy = net.head(feats)
    assert sx.shape == (1, 133, 576) and sy.shape == (1, 133, 768) and sx.dtype == torch.float32


# ------------------------------------------------------------------------------------------ codec parity

def test_decoding_on_the_device_equals_the_numpy_codec():
    rng = np.random.default_rng(3)
    sx = rng.normal(size=(3, 133, 576)).astype(np.float32)
    sy = rng.normal(size=(3, 133, 768)).astype(np.float32)
    fx = rng.normal(size=(3, 133, 576)).astype(np.float32)
    fy = rng.normal(size=(3, 133, 768)).astype(np.float32)
    sx[0, 4, [10, 30]] = sx[0, 4].max() + 1  # a tie: the first bin wins in both
    sy[1, 7] -= 50  # a rejected keypoint (peak <= 0)
    for flipped in (None, (fx, fy)):
        if flipped is None:
            ex, ey = sx, sy
        else:
            ex, ey = codec.merge_flip((sx, sy), flipped)
        want_kp, want_sc = codec.decode_simcc(ex, ey)
        t = [torch.from_numpy(a) for a in (sx, sy)]
        tf = None if flipped is None else tuple(torch.from_numpy(a) for a in flipped)
        kp, sc = dt.simcc_to_keypoints(t[0], t[1], tf)
        np.testing.assert_array_equal(kp, want_kp)
        np.testing.assert_array_equal(sc, want_sc)
        assert kp[1, 7].tolist() == [-0.5, -0.5] and kp[0, 4, 0] == 5.0 or flipped is not None


def test_inputs_equal_the_codec_crop_and_normalisation():
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8), rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)]
    pose = dt.DWPoseTorch(model=dt.build_model("cpu"), device="cpu")
    for frame in frames:
        x, c, s = pose._inputs([frame])
        warped, wc, ws = codec.warp_frames([frame])
        np.testing.assert_array_equal(x.numpy(), codec.normalize(warped))
        np.testing.assert_array_equal(c, wc)
        np.testing.assert_array_equal(s, ws)


# ------------------------------------------------------------------------------------------ checkpoints

def test_official_layout_checkpoint_loads_through_the_package_policy(tmp_path):
    path = testing.write_random_dwpose_checkpoint(tmp_path, seed=1)
    assert path == tmp_path / "dwpose" / "dw-ll_ucoco_384.pth"
    model = dt.load_model(path)
    want = testing.random_dwpose_state_dict(1)
    assert all(torch.equal(model.state_dict()[k], want[k]) for k in want)
    # a DataParallel save ("module." on every key) loads too
    torch.save({"state_dict": {"module." + k: v for k, v in want.items()}}, path)
    assert torch.equal(dt.load_model(path).state_dict()["head.gau.gamma"], want["head.gau.gamma"])
    # a missing key is named
    del want["head.cls_x.weight"]
    torch.save({"meta": {}, "state_dict": want}, path)
    with pytest.raises(CheckpointError, match=r"1 missing(.|\n)*head.cls_x.weight"):
        dt.load_model(path)


class _Pickled:  # stands in for the training objects mmengine pickles into the official file's meta
    pass


def test_a_pickled_checkpoint_is_unpickled_only_when_its_recorded_hash_matches(tmp_path):
    path = tmp_path / "dwpose" / "dw-ll_ucoco_384.pth"
    path.parent.mkdir()
    torch.save({"meta": {"hub": _Pickled()}, "state_dict": testing.random_dwpose_state_dict(2)}, path)
    with pytest.raises(WeightsError, match="Python objects"):
        dt.load_model(path)
    state = verification._State(tmp_path)
    state.record_facts("dwpose/dw-ll_ucoco_384.pth", path.stat().st_size, sha256_file(path), "hub test")
    state.save()
    assert dt.load_model(path, tmp_path).state_dict()["head.final_layer.bias"].shape == (133,)


def test_missing_checkpoint_and_bad_arguments_raise_clear_errors(tmp_path):
    with pytest.raises(WeightsError, match="dw-ll_ucoco_384.pth"):
        dt.DWPoseBackend(tmp_path, "cpu", face_detector=StubDetector(FACE))
    model = dt.build_model("cpu")
    with pytest.raises(InputError, match="device="):
        dt.DWPoseTorch(model=model, device="tpu")
    with pytest.raises(InputError, match="half precision is for the GPU"):
        dt.DWPoseTorch(model=model, device="cpu", dtype="float16")
    with pytest.raises(InputError, match="batch_size"):
        dt.DWPoseTorch(model=model, device="cpu", batch_size=0)
    with pytest.raises(InputError, match="batch_size"):
        dt.DWPoseTorch(model=model, device="cpu", batch_size=True)
    backend = dt.DWPoseBackend(device="cpu", model=model, face_detector=StubDetector(FACE))
    with pytest.raises(InputError, match="uint8"):
        backend.detect(np.zeros((1, 8, 8, 3), np.float32))


# ------------------------------------------------------------------------------------------ dwpose == dwpose-onnx

@pytest.fixture(scope="module")
def weights_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("dwpose-weights")
    testing.write_random_dwpose_checkpoint(root, seed=0)
    return root


@pytest.fixture(scope="module")
def torch_backend(weights_tree):
    torch.set_num_threads(2)
    return dt.DWPoseBackend(weights_tree, "cpu", face_detector=StubDetector(FACE, none={1}))


@pytest.fixture(scope="module")
def onnx_backend(torch_backend, tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    net = dt.load_model(torch_backend.weights_dir / dt.CHECKPOINT_FILE)  # the same file, read again
    path = dt.export_onnx(net, tmp_path_factory.mktemp("onnx") / "dw-ll_ucoco_384.onnx")
    backend = dwpose_onnx.DWPoseOnnxBackend.__new__(dwpose_onnx.DWPoseOnnxBackend)  # our ONNX file, stub detector
    backend.weights_dir, backend.face_detector, backend.device = path.parent, StubDetector(FACE, none={1}), "cpu"
    backend.pose = dwpose_onnx.DWPoseOnnx(path, "cpu")
    return backend


@pytest.fixture(scope="module")
def video_frames(shared_data):
    return face_frames([0, 20, 39])


def test_dwpose_equals_dwpose_onnx_on_the_same_weights_and_video_frames(torch_backend, onnx_backend, video_frames):
    a = torch_backend.detect(video_frames)
    b = onnx_backend.detect(video_frames)
    assert a[1] is None and b[1] is None  # no face from the detector: no landmarks
    worst = max_landmark_difference(a, b, video_frames.shape[1:])
    print(f"dwpose vs dwpose-onnx, fp32, shared video frames: max landmark difference {worst:.4f} px")
    assert worst <= 0.1
    # not vacuous: the random network's landmarks spread out and follow the input
    face = a[0].landmarks
    assert len(np.unique(face, axis=0)) > 20 and not np.allclose(face, a[2].landmarks)
    # whole-body keypoints and the raw SimCC vectors agree too, also on a landscape frame (the other aspect branch)
    wide = np.ascontiguousarray(np.repeat(np.linspace(0, 255, 640, dtype=np.uint8)[None, :, None], 360, 0)
                                .repeat(3, 2))
    kp_t, sc_t = torch_backend.pose.keypoints(wide[None])
    kp_o, sc_o = onnx_backend.pose.keypoints(wide[None])
    assert np.abs(kp_t - kp_o).max() <= 0.1
    np.testing.assert_allclose(sc_t, sc_o, rtol=1e-3, atol=1e-2 * np.abs(sc_o).max())


def test_flip_test_matters_and_both_backends_apply_it_alike(torch_backend, onnx_backend, video_frames):
    plain_t = dt.DWPoseTorch(model=torch_backend.pose.net, device="cpu", flip_test=False)
    plain_o = dwpose_onnx.DWPoseOnnx(onnx_backend.pose.path, "cpu", flip_test=False)
    kp_t, _ = plain_t.keypoints(video_frames[:1])
    kp_o, _ = plain_o.keypoints(video_frames[:1])
    assert np.abs(kp_t - kp_o).max() <= 0.1
    flipped, _ = torch_backend.pose.keypoints(video_frames[:1])
    assert np.abs(flipped - kp_t).max() > 5  # the flip test is doing something


def test_frames_without_a_face_run_no_pose_model(torch_backend):
    backend = dt.DWPoseBackend(device="cpu", model=torch_backend.pose.net,
                               face_detector=StubDetector(FACE, none={0, 1}))
    backend.pose.net = None  # would fail if DWPose ran
    assert backend.detect(np.zeros((2, 64, 48, 3), np.uint8)) == [None, None]


def test_batches_give_the_same_answer_as_one_call(torch_backend, video_frames):
    one = dt.DWPoseTorch(model=torch_backend.pose.net, device="cpu", batch_size=1)
    a, sa = one.keypoints(video_frames[:2])
    b, sb = torch_backend.pose.keypoints(video_frames[:2])
    assert np.abs(a - b).max() <= 0.1
    np.testing.assert_allclose(sa, sb, rtol=1e-4, atol=1e-3)


def test_tiny_tree_checkpoint_draws_the_template_face_on_any_frame(tmp_path):
    """The tiny weights tree's .pth (official names and shapes, about 1.5 MB) makes the real network draw the
    cartoon face of the tiny ONNX model, whatever the frame: each landmark within one SimCC bin (1.25 px) of it."""
    path = testing.write_tiny_dwpose(tmp_path)
    assert path.stat().st_size < 3_000_000
    backend = dt.DWPoseBackend(tmp_path, "cpu", face_detector=StubDetector(FACE))
    frames = np.stack([np.zeros((H, W, 3), np.uint8), np.random.default_rng(0).integers(0, 256, (H, W, 3),
                                                                                         dtype=np.uint8)])
    a, b = (r.landmarks for r in backend.detect(frames))
    np.testing.assert_array_equal(a, b)  # input-independent
    template = testing.face_template_input_px()[codec.FACE_START:codec.FACE_STOP]
    expected = template * 2.5 - np.array([72.0, 96.0])  # 576x768 frame: box 720x960 around the centre
    assert np.abs(a - expected).max() <= 1.3
    lm = a
    assert lm[0, 0] < lm[30, 0] < lm[16, 0]
    assert lm[19, 1] < lm[37, 1] < lm[30, 1] < lm[51, 1] < lm[57, 1] < lm[8, 1]
    box = faces.crop_box(lm, np.array([120.0, 150, 460, 560]), (H, W))
    assert box[2] - box[0] > 50 and box[3] - box[1] > 50


# ------------------------------------------------------------------------------------------ choice and install

def test_auto_prefers_mmpose_then_dwpose_then_dwpose_onnx(monkeypatch, tmp_path):
    class Fake:
        name = "fake"

        def __init__(self, **kw):
            self.kw = kw

        def detect(self, frames):
            return [None] * len(frames)

        def close(self):
            pass

    monkeypatch.setattr(faces.BACKENDS, "data", {n: Fake for n in ("mmpose", "dwpose", "dwpose-onnx", "dlib")})
    ok = {}
    monkeypatch.setattr(registry_module, "_imports",
                        lambda m: (True, f"{m} imports") if ok.get(m) else (False, f"{m} is not installed"))
    for f in (registry_module.DWPOSE_PTH_FILE, registry_module.DWPOSE_ONNX_FILE, registry_module.S3FD_FILE):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"x")
    ok.update(mmpose=True, torch=True, onnxruntime=True)
    assert faces.get_backend("auto", weights_dir=tmp_path).reason.endswith("-> mmpose")
    ok["mmpose"] = False
    reason = faces.get_backend("auto", weights_dir=tmp_path).reason
    assert reason.endswith("-> dwpose") and "mmpose is not installed" in reason and "torch imports" in reason
    ok["torch"] = False
    assert faces.get_backend("auto", weights_dir=tmp_path).reason.endswith("-> dwpose-onnx")
    ok["torch"] = True
    (tmp_path / registry_module.DWPOSE_PTH_FILE).unlink()  # only the ONNX file: dwpose is skipped, with the reason
    reason = faces.get_backend("auto", weights_dir=tmp_path).reason
    assert reason.endswith("-> dwpose-onnx") and "dwpose/dw-ll_ucoco_384.pth missing" in reason
    monkeypatch.undo()
    assert faces.BACKENDS.data["dwpose"] == "nbhelpers.faces.dwpose_torch:DWPoseBackend"


def test_config_cli_and_weight_sets_know_the_backend():
    from nbhelpers import InferenceConfig
    from nbhelpers.cli.lipsync import weight_sets as _sets_for
    from nbhelpers.cli.parser import build_parser

    assert InferenceConfig(landmark_backend="dwpose").landmark_backend == "dwpose"
    for backend, sets in (("auto", "faces"), ("dwpose", "faces"), ("mmpose", "faces"), ("dwpose-onnx", "faces-onnx")):
        args = build_parser().parse_args(["lipsync", "a.mp4", "b.wav", "--backend", backend])
        assert sets in _sets_for(args) and "s3fd" in _sets_for(args), backend
    assert "faces-onnx" not in _sets_for(build_parser().parse_args(["lipsync", "a.mp4", "b.wav"]))
    assert "dwpose-mmpose" in {e.name for e in weights.MANIFEST.select("default")}
    assert "dwpose-onnx" not in {e.name for e in weights.MANIFEST.select("default")}
    assert weights.MANIFEST.get("dwpose-onnx").sets == ("faces-onnx",)


def test_job_files_know_the_dwpose_backend(tmp_path, monkeypatch):
    """A job with landmark_backend='dwpose' checks the .pth and S3FD; 'auto' predicts dwpose where torch is
    installed and the .pth is there (before dwpose-onnx), as the registry's order does."""
    names = {e.name for e in weights.job_files("v15", "dwpose")}
    assert {"dwpose-mmpose", "s3fd"} <= names and "dwpose-onnx" not in names
    for rel in (registry_module.DWPOSE_PTH_FILE, registry_module.DWPOSE_ONNX_FILE, registry_module.S3FD_FILE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    auto = {e.name for e in weights.job_files("v15", "auto", directory=tmp_path)}
    if importlib.util.find_spec("mmpose") is None:
        assert "dwpose-mmpose" in auto and "dwpose-onnx" not in auto
    assert [b for b, _ in verification._AUTO_ORDER] == [b for b, _ in registry_module.AUTO_ORDER]


@pytest.mark.parametrize("cuda, want", [(None, "onnxruntime"), ("11.8", "onnxruntime-gpu>=1.16,<1.19"),
                                        ("12.8", "onnxruntime-gpu>=1.19,<1.27"), ("13.0", "onnxruntime-gpu>=1.27")])
def test_onnx_install_hint_matches_torch_cuda(cuda, want):
    assert dwpose_onnx.onnxruntime_requirement(cuda) == want


def test_onnx_install_hint_reads_the_installed_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert '"onnxruntime-gpu>=1.19,<1.27"' in dwpose_onnx.install_hint() and "12.4" in dwpose_onnx.install_hint()
    monkeypatch.setattr(torch.version, "cuda", None)
    assert 'pip install "onnxruntime"' in dwpose_onnx.install_hint()


def test_the_colab_install_has_no_onnxruntime():
    from nbhelpers import env

    reqs = env.colab_requirements()  # the package's [colab] extra, which the setup cell installs
    assert reqs and not [r for r in reqs if r.lower().startswith("onnxruntime")], reqs


# ------------------------------------------------------------------------------------------ GPU

def _merged_simcc(pose, frames):
    """The flip-merged SimCC vectors of a DWPoseTorch, as numpy float32 (what the argmax sees)."""
    x, _, _ = pose._inputs(frames)
    sx, sy, flipped = pose.simcc(x)
    plain = (sx.float().cpu().numpy(), sy.float().cpu().numpy())
    return codec.merge_flip(plain, tuple(t.float().cpu().numpy() for t in flipped))


def _decisive(vectors, near: int = 2, margin: float = 0.01):
    """(N, K) True where the peak beats every bin more than ``near`` bins away by ``margin`` x the vector's range:
    keypoints whose argmax a small rounding change cannot move (random weights also make near-ties)."""
    v = np.asarray(vectors, np.float64)
    top = v.argmax(-1)
    bins = np.arange(v.shape[-1])
    rest = np.where(np.abs(bins - top[..., None]) > near, v, -np.inf).max(-1)
    span = v.max(-1) - v.min(-1)
    return (v.max(-1) - rest) > margin * span


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fp16_batched_landmarks_follow_fp32(video_frames_or_random):
    """float16 at batch 16 (the GPU default precision) against a float32, batch-1 reference on the same GPU: the
    SimCC vectors agree to about 1 % of their range, most landmarks are identical, and every keypoint with a
    decisive peak lands in the same SimCC bin (a bin is 1.25 px on a 576x768 frame)."""
    frames = video_frames_or_random
    model = dt.build_model("cpu")
    model.load_state_dict(testing.random_dwpose_state_dict(0))
    torch.backends.cudnn.allow_tf32 = False  # a float32 reference
    try:
        fp32 = dt.DWPoseTorch(model=model, device="cuda", dtype="float32", batch_size=1)
        ref, ref_sc = fp32.keypoints(frames)
        ref_x, ref_y = _merged_simcc(fp32, frames)
    finally:
        torch.backends.cudnn.allow_tf32 = True
    half = dt.DWPoseTorch(model=model, device="cuda", batch_size=len(frames))
    assert half.dtype == torch.float16 and half.net.head.cls_x.weight.dtype == torch.float32
    got, got_sc = half.keypoints(frames)
    got_x, got_y = _merged_simcc(half, frames)
    rel = max(np.abs(got_x - ref_x).max() / np.ptp(ref_x), np.abs(got_y - ref_y).max() / np.ptp(ref_y))
    diff = np.linalg.norm(got - ref, axis=-1)  # px
    decisive = _decisive(ref_x) & _decisive(ref_y)
    same = diff <= 1.3
    print(f"fp16 batch {len(frames)} vs fp32 batch 1: SimCC max difference {100 * rel:.2f} % of the range; "
          f"landmarks identical for {same.mean():.3f} (median {np.median(diff):.3f} px, max {diff.max():.2f} px); "
          f"keypoints with a decisive peak: {decisive.mean():.3f}, "
          f"of which in the same bin {same[decisive].mean():.4f}")
    assert rel < 0.02
    assert np.median(diff) == 0 and same.mean() >= 0.9
    assert decisive.mean() >= 0.5 and same[decisive].mean() >= 0.99
    face = (slice(None), slice(codec.FACE_START, codec.FACE_STOP))
    assert same[face][decisive[face]].mean() >= 0.99
    # a batch of one gives what the batch gives (no cross-talk between frames; cuDNN may pick other kernels)
    one_pose = dt.DWPoseTorch(model=model, device="cuda", batch_size=1)
    one, _ = one_pose.keypoints(frames[:4])
    same_one = np.linalg.norm(one - got[:4], axis=-1) <= 1.3
    assert same_one.mean() >= 0.9 and same_one[decisive[:4]].mean() >= 0.99


@pytest.fixture
def video_frames_or_random():
    path = SHARED_DATA / FACE_VIDEO
    if not path.is_file():
        path = ROOT / ".benchdata" / FACE_VIDEO
    if path.is_file():
        cv2 = pytest.importorskip("cv2")
        cap = cv2.VideoCapture(str(path))
        out = []
        while len(out) < 16:
            ok, frame = cap.read()
            if not ok:
                break
            out.append(frame)
        cap.release()
        if len(out) == 16:
            return np.stack(out)
    with warnings.catch_warnings():
        return np.random.default_rng(0).integers(0, 256, (16, H, W, 3), dtype=np.uint8)


class ContentDetector:
    """A face box that depends on the pixels (numpy or torch alike): records what type of frames it was given."""

    def __init__(self):
        self.kinds: list[str] = []

    def detect(self, frames):
        self.kinds.append(type(frames).__module__.split(".")[0])
        arr = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
        out = []
        for f in arr:
            m = float(f[..., 0].mean())
            out.append(None if m < 60 else (100.0 + m, 120.0, 420.0 + m, 560.0, 0.9))
        return out


def test_detect_with_frames_on_the_device_gives_the_same_results(torch_backend, tiny_weights):
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (3, H, W, 3), dtype=np.uint8)
    frames[1] //= 8  # dark: no face from the content detector
    det = ContentDetector()
    backend = dt.DWPoseBackend(device="cpu", model=torch_backend.pose.net, face_detector=det)
    a = backend.detect(frames)
    b = backend.detect(frames, frames_device=torch.from_numpy(frames))
    assert det.kinds == ["numpy", "torch"]  # the detector read the tensor the second time
    assert a[1] is None and b[1] is None and a[0] is not None and a[2] is not None
    for x, y in zip((a[0], a[2]), (b[0], b[2]), strict=True):
        np.testing.assert_array_equal(x.face_box, y.face_box)
        np.testing.assert_array_equal(x.landmarks, y.landmarks)
    # the real S3FD of the tiny weights tree (random weights) reads a CPU tensor as it reads the array
    real = dt.DWPoseBackend(tiny_weights, "cpu", model=torch_backend.pose.net)
    small = frames[:, :160, :120]
    c, d = real.detect(small), real.detect(small, frames_device=torch.from_numpy(np.ascontiguousarray(small)))
    assert [r is None for r in c] == [r is None for r in d]
    for x, y in zip(c, d, strict=True):
        if x is not None:
            np.testing.assert_array_equal(x.face_box, y.face_box)
            np.testing.assert_array_equal(x.landmarks, y.landmarks)
    raw_a = real.face_detector.detections(small)
    raw_b = real.face_detector.detections(torch.from_numpy(np.ascontiguousarray(small)))
    for x, y in zip(raw_a, raw_b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_detect_with_pose_refuses_frames_device_of_another_shape(torch_backend):
    frames = np.full((2, 64, 48, 3), 200, np.uint8)
    det = ContentDetector()
    backend = dt.DWPoseBackend(device="cpu", model=torch_backend.pose.net, face_detector=det)
    for bad in (torch.from_numpy(frames[:1]), torch.from_numpy(frames[:, :32])):
        with pytest.raises(InputError, match="frames_device has shape"):
            backend.detect(frames, frames_device=bad)
    assert det.kinds == []  # refused before the detector ran


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_keypoints_of_a_padded_short_batch_equal_batch_1(video_frames_or_random):
    """5 frames at batch 4 on CUDA: the second batch (1 frame) is padded to 4 and its extra outputs dropped; the
    keypoints equal those of batch 1 (no padding) within a SimCC bin, and 5 come back, in order."""
    frames = video_frames_or_random[:5]
    model = dt.build_model("cpu")
    model.load_state_dict(testing.random_dwpose_state_dict(0))
    four = dt.DWPoseTorch(model=model, device="cuda", batch_size=4)
    one = dt.DWPoseTorch(model=model, device="cuda", batch_size=1)
    kp4, sc4 = four.keypoints(frames)
    kp1, sc1 = one.keypoints(frames)
    assert kp4.shape == kp1.shape == (5, codec.NUM_KEYPOINTS, 2) and sc4.shape == (5, codec.NUM_KEYPOINTS)
    same = np.linalg.norm(kp4 - kp1, axis=-1) <= 1.3
    assert same.mean() >= 0.9 and same[4].mean() >= 0.9  # the padded frame too
    np.testing.assert_allclose(sc4, sc1, rtol=0.05, atol=0.05 * np.abs(sc1).max())
