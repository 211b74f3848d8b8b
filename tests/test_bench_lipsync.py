"""bench/lipsync.py's pieces that decide what it measures: the transcribed official get_image (PIL) against our numpy
blend, the stand-in landmarks against the official crop-box rules, and the speech cut. No torch needed."""

from __future__ import annotations

import importlib.util
import wave

import numpy as np
import pytest
from helpers import ROOT, gpu_card


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_lipsync", ROOT / "bench" / "lipsync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FixedLabels:
    """A parser stand-in: the same 512x512 label map for any image (skin, nose, lips, mouth, neck regions)."""

    def __init__(self):
        lab = np.zeros((512, 512), np.uint8)
        lab[120:470, 90:420] = 1  # skin
        lab[150:260, 220:290] = 10  # nose
        lab[300:330, 180:330] = 12  # upper lip
        lab[330:345, 190:320] = 11  # mouth
        lab[345:375, 180:330] = 13  # lower lip
        lab[470:512, 150:360] = 14  # neck
        self.lab = lab
        self.calls = 0

    def labels(self, images, batch_size=None):
        self.calls += 1
        assert len(images) == 1 and images[0].dtype == np.uint8 and images[0].shape[2] == 3
        return self.lab[None].copy()


@pytest.mark.parametrize("box", [(190, 160, 360, 330), (2, 10, 150, 170), (470, 600, 575, 767)])
@pytest.mark.parametrize("mode", ["jaw", "raw"])
def test_official_get_image_equals_the_numpy_blend(bench, box, mode):
    from nbhelpers.blending import blend_cpu, expanded_square, prepare_mask, resize_face
    from nbhelpers.parsing import face_mask

    rng = np.random.default_rng(sum(box))
    frame = rng.integers(0, 256, (768, 576, 3), dtype=np.uint8)
    face = resize_face(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), box)
    parser = FixedLabels()
    timer = {}
    got = bench.official_get_image(frame.copy(), face, list(box), parser, mode, (90, 90), timer=timer)
    square = expanded_square(box)
    want = blend_cpu(frame, face, box, prepare_mask(face_mask(parser.lab, mode, 90, 90), box, square), square)
    assert got.shape == frame.shape and got.dtype == np.uint8
    assert np.array_equal(got, want)
    assert not np.array_equal(got, frame)  # the generated face shows somewhere
    assert parser.calls == 1 and list(timer) == ["parsing"]  # the parsing call was timed, nothing else
    assert bench.official_crop_box(box)[0] == list(square)


def test_stand_in_landmarks_give_the_known_crop_box(bench):
    from nbhelpers.faces import crop_box

    for extra_margin in (10, 0):
        lm, face_box = bench.known_landmarks(bench.BOX, extra_margin)
        assert lm.shape == (68, 2) and lm.dtype == np.float32
        got = crop_box(lm, face_box, (768, 576), "v15", 0, extra_margin)
        assert got == bench.BOX


def test_cut_wav_keeps_the_first_samples(bench, tmp_path):
    src = tmp_path / "a.wav"
    samples = (np.arange(22050 * 2) % 3000 - 1500).astype("<i2")
    with wave.open(str(src), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(samples.tobytes())
    out = bench.cut_wav(src, tmp_path / "b.wav", 0.5)
    with wave.open(str(out)) as r:
        assert r.getframerate() == 22050 and r.getnframes() == 11025
        assert np.array_equal(np.frombuffer(r.readframes(r.getnframes()), "<i2"), samples[:11025])


def test_the_capped_report_is_what_a_4_gib_card_would_give_after_the_warm_up_job(bench):
    from nbhelpers import gpu

    def h200(reserved, allocated, context=0.69):  # a real report read through torch on the 139.8 GiB card
        return gpu_card("NVIDIA H200", 139.8, 139.8 - context - reserved, cc=(9, 0), reserved_gib=reserved,
                        allocated_gib=allocated)

    # Before any job: the whole 4 GiB less the context (which has grown from 0.6 at start to 0.69).
    start = bench.capped(h200(0.0, 0.0), 4.0, 0.6)
    assert (start.total_gib, start.reserved_gib) == (4.0, 0.0) and start.free_gib == pytest.approx(3.31)
    # After the warm-up job: 2.89 GiB reserved by this process, 1.9 of it the loaded models. A real 4 GiB card's
    # free memory leaves the pool out: 4 - 0.69 - 2.89 = 0.42 GiB (the fixed 3.31 counted the pool twice).
    warm = bench.capped(h200(2.89, 1.9), 4.0, 0.6)
    assert warm.free_gib == pytest.approx(0.42) and (warm.reserved_gib, warm.allocated_gib) == (2.89, 1.9)
    assert warm.outside_torch_gib == pytest.approx(0.69)  # the context, as a real card would show it
    # The planner adds back the cached 0.99 GiB and the loaded models, so both jobs get the same budget and batch.
    first = gpu.plan("lipsync", report=start, n_frames=500, frame_size=(768, 576))
    later = gpu.plan("lipsync", report=warm, n_frames=500, frame_size=(768, 576), loaded_gib=1.9)
    mm = gpu.MEMORY_MODEL
    assert first.budget_gib == pytest.approx(later.budget_gib)
    assert first.budget_gib == pytest.approx((3.31 - mm.workspace_gib) * (1 - mm.safety_fraction))
    assert first.batch_size == later.batch_size
    # Never below zero, whatever the pool holds.
    assert bench.capped(h200(3.5, 3.4), 4.0, 0.6).free_gib == 0.0
