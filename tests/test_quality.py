"""quality: the SyncNet evaluation protocol (MFCC, offset search, crops, the model's names and shapes, loading), and
the weight-free mouth-audio lag on the shared face video with its own audio.

Known answers: python_speech_features' MFCC, a brute-force offset search, embeddings built to agree at a known
offset, synthetic clips whose picture and sound carry the same random sequence at a known offset, and a voice built
from the shared video's own mouth curve at a known lag.
"""

from __future__ import annotations

import math
import pickle
import re

import numpy as np
import pytest
from helpers import loaded_by

from nbhelpers import quality
from nbhelpers.errors import CheckpointError, InputError, WeightsError

SR = 16_000
HOP = 640  # samples per 25 fps frame

# The published SyncNet v2 (syncnet_python SyncNetModel.py, class S, 1024-d embeddings), written out by hand from
# its layer list: Sequential index -> (kind, weight shape). Conv: (out, in, *kernel); BN: (channels,).
_AUD = {0: (64, 1, 3, 3), 4: (192, 64, 3, 3), 8: (384, 192, 3, 3), 11: (256, 384, 3, 3), 14: (256, 256, 3, 3),
        18: (512, 256, 5, 4)}
_LIP = {0: (96, 3, 5, 7, 7), 4: (256, 96, 1, 5, 5), 8: (256, 256, 1, 3, 3), 11: (256, 256, 1, 3, 3),
        14: (256, 256, 1, 3, 3), 18: (512, 256, 1, 6, 6)}
_FC = {0: (512, 512), 3: (1024, 512)}


def published_keys() -> dict[str, tuple[int, ...]]:
    keys: dict[str, tuple[int, ...]] = {}
    for seq, convs in (("netcnnaud", _AUD), ("netcnnlip", _LIP)):
        for i, shape in convs.items():
            keys[f"{seq}.{i}.weight"] = shape
            keys[f"{seq}.{i}.bias"] = (shape[0],)
            for name in ("weight", "bias", "running_mean", "running_var"):
                keys[f"{seq}.{i + 1}.{name}"] = (shape[0],)
    for seq in ("netfcaud", "netfclip"):
        keys[f"{seq}.0.weight"], keys[f"{seq}.0.bias"] = _FC[0], (512,)
        for name in ("weight", "bias", "running_mean", "running_var"):
            keys[f"{seq}.1.{name}"] = (512,)
        keys[f"{seq}.3.weight"], keys[f"{seq}.3.bias"] = _FC[3], (1024,)
    return keys


# --------------------------------------------------------------------------------------------------------------
# MFCC
# --------------------------------------------------------------------------------------------------------------

def test_mfcc_equals_python_speech_features_on_speech_and_silence():
    psf = pytest.importorskip("python_speech_features")
    rng = np.random.default_rng(0)
    t = np.arange(SR * 2) / SR
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.standard_normal(t.size)
    wave[SR // 2:SR // 2 + 4000] = 0.0  # digital silence: zero energy -> log(eps), as the reference does
    pcm = np.clip(np.round(wave * 32768), -32768, 32767).astype(np.int16)
    ref = psf.mfcc(pcm, SR).T
    ours = quality.mfcc(pcm, SR)
    assert ours.shape == ref.shape == (13, 1 + math.ceil((pcm.size - 400) / 160))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(quality.mfcc(wave.astype(np.float32)), ref, rtol=1e-4, atol=1e-3)  # float input


def test_mfcc_frame_count_and_energy_coefficient():
    # 1 s at 16 kHz: 1 + ceil((16000 - 400) / 160) = 99 frames. Coefficient 0 is the log of the frame's power
    # spectrum summed (|rfft_512|^2 / 512) of the pre-emphasised samples 160 t .. 160 t + 399, computed here by hand.
    n = np.arange(SR)
    pcm = np.round(8000 * np.sin(2 * np.pi * 1000 * n / SR)).astype(np.int16)
    c = quality.mfcc(pcm, SR)
    assert c.shape == (13, 99)
    x = pcm.astype(np.float64)
    pre = np.append(x[0], x[1:] - 0.97 * x[:-1])
    frame = pre[160 * 10:160 * 10 + 400]
    expected = np.log(np.sum(np.abs(np.fft.rfft(frame, 512)) ** 2) / 512)
    assert c[0, 10] == pytest.approx(expected, rel=1e-5)


# --------------------------------------------------------------------------------------------------------------
# The offset search
# --------------------------------------------------------------------------------------------------------------

def brute_force(v, a, vshift):
    """syncnet_python's calc_pdist + evaluate, written as plain loops."""
    w, d = v.shape
    means = []
    for j in range(2 * vshift + 1):
        total = 0.0
        for i in range(w):
            k = i + j - vshift
            other = a[k] if 0 <= k < w else np.zeros(d)
            total += math.sqrt(sum((v[i, c] - other[c] + 1e-6) ** 2 for c in range(d)))
        means.append(total / w)
    means = np.array(means)
    jmin = int(np.argmin(means))
    median = sorted(means)[vshift]  # torch.median of 2*vshift+1 values: the middle one
    return vshift - jmin, means[jmin], median - means[jmin], means


@pytest.mark.parametrize("k", range(-5, 6))
def test_offset_search_finds_a_known_offset_with_the_confidence_it_should_have(k):
    # Video window i equals audio window i - k (syncnet_python's sign: positive = the sound comes earlier).
    rng = np.random.default_rng(10 + k)
    w, d, vshift = 40, 8, quality.VSHIFT
    a = rng.standard_normal((w, d))
    v = rng.standard_normal((w, d))
    for i in range(w):
        if 0 <= i - k < w:
            v[i] = a[i - k]
    got = quality.score_embeddings(v, a)
    offset, lse_d, lse_c, means = brute_force(v, a, vshift)
    assert got.offset_frames == offset == k
    assert got.audio_delay_frames == -k
    np.testing.assert_allclose(got.mean_distances, means, rtol=1e-12)
    assert got.lse_d == pytest.approx(lse_d, rel=1e-12)
    assert got.lse_c == pytest.approx(lse_c, rel=1e-12)
    # At the true offset only the |k| windows whose partner falls off the end contribute (against zero padding).
    unmatched = [i for i in range(w) if not 0 <= i - k < w]
    expected_d = (sum(np.linalg.norm(v[i] + 1e-6) for i in unmatched) + (w - len(unmatched)) * 1e-6 * math.sqrt(d)) / w
    assert got.lse_d == pytest.approx(expected_d, rel=1e-9)
    # Unrelated unit-variance vectors lie about sqrt(2 d) = 4 apart: the confidence is most of that.
    assert got.lse_c > 0.7 * math.sqrt(2 * d)
    assert list(got.offsets) == list(range(vshift, -vshift - 1, -1))
    assert got.frame_distances.shape == (w,)


def test_offset_search_rejects_bad_shapes():
    with pytest.raises(InputError, match="same shape"):
        quality.score_embeddings(np.zeros((5, 4)), np.zeros((6, 4)))
    with pytest.raises(InputError, match="no windows"):
        quality.score_embeddings(np.zeros((0, 4)), np.zeros((0, 4)))


# --------------------------------------------------------------------------------------------------------------
# sync_score end to end with an injected embedding model
# --------------------------------------------------------------------------------------------------------------

class LevelEmbedder:
    """Embeds what the synthetic clips carry: the level u per frame, from brightness (30 + 60 u) and from the
    log energy of the sound (amplitude 0.01 exp(u), so MFCC coefficient 0 = 2 u + const at steps 4j + 1). Both are
    centred per window, which removes the constants."""

    def __init__(self):
        self.video, self.audio = [], []

    def embed_video(self, stacks):
        assert stacks.shape[1:] == (3, 5, 224, 224) and stacks.dtype == np.float32
        u = (stacks.mean(axis=(1, 3, 4)) - 30.0) / 60.0  # (B, 5)
        out = u - u.mean(axis=1, keepdims=True)
        self.video.append(out)
        return out

    def embed_audio(self, windows):
        assert windows.shape[1:] == (1, 13, 20) and windows.dtype == np.float32
        # Step 4j + 1 (samples 160..559 of frame j) lies inside frame j's tone, its pre-emphasis too (step 4j would
        # start on the frame boundary, where pre-emphasis subtracts the previous frame's louder last sample).
        u = windows[:, 0, 0, 1::4] / 2.0
        out = u - u.mean(axis=1, keepdims=True)
        self.audio.append(out)
        return out


def level_clip(k: int, n: int = 60, side: int = 96, seed: int = 0):
    """Frames whose brightness shows level u[t - k] and a 1 kHz tone whose frame t has level u[t]."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.0, 3.0, n + 20)  # u[t + 10] is the level of frame t (t may be -10..n+9)
    frames = np.empty((n, side, side, 3), np.uint8)
    for t in range(n):
        frames[t] = np.uint8(round(30 + 60 * u[t - k + 10]))
    tone = np.sin(2 * np.pi * 1000 * np.arange(n * HOP) / SR)
    amp = np.repeat(0.01 * np.exp(u[10:10 + n]), HOP)
    return frames, (tone * amp).astype(np.float32), u


@pytest.mark.parametrize("k", range(-5, 6))
def test_sync_score_with_an_injected_model_finds_the_offset_of_a_synthetic_clip(k):
    frames, wave, u = level_clip(k)
    model = LevelEmbedder()
    got = quality.sync_score(frames, wave, model=model, boxes=(24, 24, 72, 72))
    n_windows = 60 - 5  # min(60 frames, 60 frames of audio) - 5, the published count
    assert got.n_windows == n_windows and got.detector == "boxes"
    assert got.offset_frames == k
    # The score it should have: the same search over embeddings computed from u itself (no pixels, no MFCC).
    def centred(x):
        return x - x.mean(axis=1, keepdims=True)
    v = centred(np.stack([u[i - k + 10:i - k + 15] for i in range(n_windows)]))
    a = centred(np.stack([u[i + 10:i + 15] for i in range(n_windows)]))
    want = quality.score_embeddings(v, a)
    assert got.lse_d == pytest.approx(want.lse_d, abs=0.02)
    assert got.lse_c == pytest.approx(want.lse_c, abs=0.02)
    assert got.lse_c > 1.0 and got.lse_d < 0.3 * got.lse_c
    # The model saw exactly the published windows: video i = frames i..i+4, audio i = MFCC steps 4i..4i+19.
    np.testing.assert_allclose(np.concatenate(model.video), v, atol=0.02)
    np.testing.assert_allclose(np.concatenate(model.audio), a, atol=0.02)


def test_sync_score_takes_a_list_holding_one_box_as_that_box_for_every_frame():
    """``boxes=[box]`` means the box for the whole clip, as for the lip-sync jobs, not one frame's box (which a
    60-frame clip would fail as a frame count)."""
    frames, wave, _ = level_clip(2)
    bare = quality.sync_score(frames, wave, model=LevelEmbedder(), boxes=(24, 24, 72, 72))
    for one in ([(24, 24, 72, 72)], np.array([[24, 24, 72, 72]])):
        got = quality.sync_score(frames, wave, model=LevelEmbedder(), boxes=one)
        assert (got.offset_frames, got.n_windows) == (bare.offset_frames, bare.n_windows) == (2, 55)
        assert got.lse_c == bare.lse_c and got.lse_d == bare.lse_d


def test_sync_score_checks_inputs_before_loading_anything(tmp_path):
    frames, wave, _ = level_clip(0, n=10)
    with pytest.raises(InputError, match="carries no sound"):
        quality.sync_score(frames, None, model=LevelEmbedder(), boxes=(24, 24, 72, 72))
    with pytest.raises(InputError, match="does not exist"):
        quality.sync_score(tmp_path / "nope.mp4", wave, model=LevelEmbedder())
    with pytest.raises(WeightsError, match="--sets quality"):  # no model, no weights: says how to get them
        quality.sync_score(frames, wave, weights_dir=tmp_path, boxes=(24, 24, 72, 72))
    with pytest.raises(InputError, match="too short"):
        quality.sync_score(frames[:5], wave, model=LevelEmbedder(), boxes=(24, 24, 72, 72))


# --------------------------------------------------------------------------------------------------------------
# Crops and box smoothing
# --------------------------------------------------------------------------------------------------------------

def test_box_smoothing_interpolates_gaps_and_median_filters_with_zero_padding():
    boxes = np.tile([100.0, 100.0, 160.0, 180.0], (40, 1))  # w 60, h 80 -> s = 40, centre (130, 140)
    boxes[10:13] = np.nan
    boxes[20] = [300, 300, 360, 380]  # one outlier frame: removed by the 13-frame median
    sq = quality.smooth_face_boxes(boxes)
    np.testing.assert_allclose(sq[6:34], np.tile([40.0, 130.0, 140.0], (28, 1)))
    # First frame: median of 6 zeros and 7 values of 40 -> 40; the zero padding shows only past 6 frames of it.
    assert sq[0, 0] == 40.0
    gap = boxes.copy()
    gap[5:31] = np.nan
    with pytest.raises(InputError, match="26 frames"):
        quality.smooth_face_boxes(gap)


def test_protocol_crop_takes_the_published_region():
    # A frame with a distinct value per row and column band; s = 20 at centre (60, 50):
    # rows 50 - 20 = 30 .. 50 + 36 = 86, columns 60 - 28 = 32 .. 60 + 28 = 88 (56 x 56 -> 224 x 224).
    frame = np.zeros((120, 120, 3), np.uint8)
    frame[:, :, 0] = np.arange(120)[:, None]  # B channel = row index
    frame[:, :, 1] = np.arange(120)[None, :]  # G channel = column index
    crop = quality.protocol_crops(frame[None], np.array([[20.0, 60.0, 50.0]]))[0]
    assert crop.shape == (224, 224, 3)
    assert abs(int(crop[0, 112, 0]) - 30) <= 1 and abs(int(crop[-1, 112, 0]) - 85) <= 1
    assert abs(int(crop[112, 0, 1]) - 32) <= 1 and abs(int(crop[112, -1, 1]) - 87) <= 1
    # Outside the frame the crop shows the grey padding (110).
    edge = quality.protocol_crops(frame[None], np.array([[20.0, 5.0, 50.0]]))[0]
    assert tuple(edge[112, 0]) == (110, 110, 110)


# --------------------------------------------------------------------------------------------------------------
# SyncNet v2: names, shapes, loading
# --------------------------------------------------------------------------------------------------------------

def test_syncnet_parameter_names_and_shapes_equal_the_published_checkpoint():
    torch = pytest.importorskip("torch")
    from nbhelpers.quality.network import SyncNetV2

    with torch.device("meta"):
        net = SyncNetV2()
    got = {k: tuple(v.shape) for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert got == published_keys()
    assert sum(p.numel() for p in net.parameters()) == 13_631_616  # 54.5 MB in float32: the manifest estimate
    from nbhelpers import weights

    assert weights.MANIFEST.get("syncnet-v2").approx_bytes == 4 * 13_631_616
    assert weights.MANIFEST.get("syncnet-v2").path == quality.SYNCNET_FILE
    assert "quality" in weights.SETS and "syncnet-v2" not in {e.name for e in weights.MANIFEST.select()}


@pytest.fixture(scope="module")
def tiny_syncnet(tmp_path_factory):
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("syncnet")
    quality.write_tiny_syncnet(folder, seed=1)
    return folder


def test_syncnet_loads_the_published_format_weights_only(tiny_syncnet, tmp_path):
    torch = pytest.importorskip("torch")
    path = tiny_syncnet / quality.SYNCNET_FILE
    with open(path, "rb") as f:
        assert f.read(1) == b"\x80"  # legacy (non-zip) torch pickle, like a 2018 file
    stored = torch.load(str(path), weights_only=True)
    assert set(stored) == set(published_keys())  # no num_batches_tracked, as torch < 0.4.1 saved it
    emb = quality.load_syncnet(tiny_syncnet, device="cpu")
    for key, value in stored.items():
        torch.testing.assert_close(emb.net.state_dict()[key], value)
    assert emb.embed_video(np.zeros((2, 3, 5, 224, 224), np.float32)).shape == (2, 1024)
    assert emb.embed_audio(np.zeros((2, 1, 13, 20), np.float32)).shape == (2, 1024)
    zipped = tmp_path / quality.SYNCNET_FILE
    zipped.parent.mkdir()
    torch.save(stored, str(zipped))
    quality.load_syncnet(tmp_path, device="cpu")  # the zip format loads too


def test_syncnet_refuses_a_pickled_model_and_wrong_shapes(tmp_path):
    torch = pytest.importorskip("torch")
    from nbhelpers.quality.network import SyncNetV2

    path = tmp_path / quality.SYNCNET_FILE
    path.parent.mkdir(parents=True)
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), str(path))  # a pickled module: unpickling runs code
    with pytest.raises(WeightsError, match="Python objects besides tensors"):
        quality.load_syncnet(tmp_path, device="cpu")
    state = SyncNetV2().state_dict()
    state["netfcaud.3.weight"] = torch.zeros(512, 512)
    torch.save(state, str(path))
    with pytest.raises(CheckpointError, match="netfcaud.3.weight"):
        quality.load_syncnet(tmp_path, device="cpu")
    path.write_bytes(pickle.dumps({"a": 1})[:5])
    with pytest.raises(WeightsError):
        quality.load_syncnet(tmp_path, device="cpu")


def test_syncnet_without_torch_names_the_install_line(tmp_path, monkeypatch):
    import sys

    from nbhelpers.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError, as where it is not installed
    with pytest.raises(MissingDependencyError, match="pip install"):
        quality.load_syncnet(tmp_path, device="cpu")


# --------------------------------------------------------------------------------------------------------------
# mouth_audio_lag on the shared face video and its own audio (landmarks computed once, dlib)
# --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sing(shared_data):
    pytest.importorskip("dlib")
    from nbhelpers import faces, media

    track = faces.track(shared_data / "face-sing-576x768-25fps.mp4", backend="dlib")  # 550 frames, once
    wave = media.load_audio(shared_data / "sing-44k1-mono.wav")
    return track, wave


def shifted(wave: np.ndarray, d: int) -> np.ndarray:
    """The sound moved d frames later (d > 0: d * 40 ms of silence first) or earlier (d < 0: cut)."""
    return np.concatenate([np.zeros(d * HOP, wave.dtype), wave]) if d >= 0 else wave[-d * HOP:]


def test_shifting_the_own_audio_moves_the_whole_correlation_by_d(sing):
    # The lag follows a shift exactly when the correlation curve itself moves by d: r_d(L) = r_0(L - d).
    track, wave = sing
    base = quality.mouth_audio_lag(None, wave, track=track, max_lag=40)
    for d in range(-10, 11):
        got = quality.mouth_audio_lag(None, shifted(wave, d), track=track, max_lag=40)
        both = [(L, L - d) for L in range(-40, 41) if -40 <= L - d <= 40]
        r_d = np.array([got.correlations[L + 40] for L, _ in both])
        r_0 = np.array([base.correlations[m + 40] for _, m in both])
        tol = 1e-9 if d >= 0 else 0.05  # a cut start turns |d| frames of sound into silence: a real change
        np.testing.assert_allclose(r_d, r_0, atol=tol, err_msg=f"shift {d:+d} frames")


def test_the_own_audio_shows_no_sync_evidence_because_the_mouth_does_not_move(sing):
    # The finding of issue 19: the shared clip's mouth stays in one smile (inner-lip gap 6.7-8.7 px for 22 s, std
    # 0.4 px, landmark jitter), so nothing in the singing voice can correlate with it. Any "lag" is a noise peak.
    track, wave = sing
    opening = quality.mouth_opening(track.landmarks)
    lo, hi = np.percentile(opening, [5, 95])
    assert hi - lo < 0.04  # < 3 px of a 75-px eye width; speech moves the inner lips by 10-40 % of it
    got = quality.mouth_audio_lag(None, wave, track=track)
    assert not got.reliable and abs(got.peak_correlation) < 0.15 and got.z_score < 2.5
    assert "NOT reliable" in got.summary()


def test_a_voice_that_follows_the_real_mouth_gives_its_lag_for_every_shift(sing):
    # Known answer on the real landmarks: a noise voice whose loudness follows this clip's own mouth curve three
    # frames later. Shifting it by d must move the measured lag to 3 + d, with a reliable peak, for every d.
    track, _ = sing
    mouth = quality.mouth_opening(track.landmarks)
    level = (mouth - mouth.mean()) / mouth.std()
    rng = np.random.default_rng(3)
    n = mouth.shape[0]
    gain = np.repeat(np.exp(0.5 * np.concatenate([np.zeros(3), level[:n - 3]])), HOP)  # frame t: mouth[t - 3]
    voice = (0.05 * gain * rng.standard_normal(n * HOP)).astype(np.float32)
    for d in range(-10, 11):
        got = quality.mouth_audio_lag(None, shifted(voice, d), track=track)
        assert abs(got.lag_frames - (3 + d)) <= 1, (d, got.summary())
        assert got.reliable and got.peak_correlation > 0.5, (d, got.summary())


def test_plot_sync_draws_both_curves_and_the_correlation(sing):
    from nbhelpers import ui

    track, wave = sing
    got = quality.mouth_audio_lag(None, wave, track=track)
    chart = ui.plot_sync(got)
    top, bottom = chart.figure.axes[:2]
    assert len(top.lines) == 2 and top.lines[0].get_xdata().shape == (550,)
    np.testing.assert_allclose(bottom.lines[0].get_ydata(), got.correlations)
    assert chart.png()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InputError):
        ui.plot_sync(object())


def test_plot_sync_shades_who_spoke_when(sing):
    from types import SimpleNamespace

    from matplotlib.colors import to_rgb

    from nbhelpers import ui
    from nbhelpers.faces.speaker import Turn
    from nbhelpers.faces.tracks import COLOURS

    got = quality.mouth_audio_lag(None, sing[1], track=sing[0])
    result = SimpleNamespace(turns=(Turn(0, 49, 1, 0.8), Turn(50, 124, 0, 0.6, "LSE-C")))
    top = ui.plot_sync(got, turns=result).figure.axes[0]
    assert [t.get_text().strip() for t in top.texts] == ["1", "0"] and len(top.patches) == 2
    for span, colour, (start, end) in zip(top.patches, (COLOURS[1], COLOURS[0]), ((0, 2), (2, 5)), strict=True):
        assert span.get_facecolor()[:3] == pytest.approx(to_rgb(colour))
        box = span.get_bbox()  # in data units: seconds
        assert (box.x0, box.x1) == pytest.approx((start, end))
    assert not ui.plot_sync(got).figure.axes[0].patches


def test_mouth_opening_and_envelope_known_answers():
    lm = np.zeros((1, 68, 2))
    lm[0, 36] = (0, 0)
    lm[0, 45] = (50, 0)
    for up, lo in zip((61, 62, 63), (67, 66, 65), strict=True):
        lm[0, up, 1], lm[0, lo, 1] = 10.0, 20.0  # a 10-px gap over a 50-px eye width
    assert quality.mouth_opening(lm)[0] == pytest.approx(0.2)
    wave = np.concatenate([np.full(HOP, 0.5), np.zeros(HOP)])  # frame 0: RMS 0.5 = -6.02 dB; frame 1 silent
    env = quality.speech_envelope(wave, 3)
    assert env[0] == pytest.approx(20 * math.log10(0.5))
    assert env[1] == env[2] == pytest.approx(env[0] - 60.0)
    with pytest.raises(InputError):
        quality.mouth_opening(np.zeros((3, 5, 2)))


def test_importing_quality_loads_neither_torch_nor_the_ui():
    code = "import nbhelpers.quality as q; q.MouthAudioLag; q.sync_score"
    assert loaded_by(code, ("torch", "cv2", "matplotlib", "nbhelpers.ui")) == []


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def short_clip(shared_data, ffmpeg, tmp_path_factory):
    """The first 2 s (50 frames) of the shared face video with its own audio muxed in."""
    import subprocess

    out = tmp_path_factory.mktemp("clip") / "sing-2s.mp4"
    subprocess.run([ffmpeg, "-v", "error", "-nostdin", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-i",
                    str(shared_data / "sing-44k1-mono.wav"), "-t", "2", "-map", "0:v", "-map", "1:a", "-c:v",
                    "libx264", "-crf", "18", "-c:a", "aac", str(out)], check=True)
    return out


def test_cli_score_prints_the_lag_and_names_the_download_without_weights(short_clip, tmp_path, capsys):
    pytest.importorskip("dlib")
    from nbhelpers.cli.main import main

    assert main(["score", str(short_clip), "--backend", "dlib", "--weights", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "mouth-audio lag" in out and "50 frames" in out
    assert "LSE-D / LSE-C not computed" in err
    assert f"python -m nbhelpers download --weights {tmp_path} --sets quality" in err  # the folder the job read


def test_cli_score_prints_lse_with_the_weights(short_clip, tiny_syncnet, capsys):
    pytest.importorskip("dlib")
    from nbhelpers.cli.main import main

    assert main(["score", str(short_clip), "--backend", "dlib", "--weights", str(tiny_syncnet),
                 "--device", "cpu"]) == 0
    out, _ = capsys.readouterr()
    assert "SyncNet: LSE-D" in out and "faces from dlib" in out
    assert re.search(r"over 4[45] windows", out)  # 50 frames - 5 (49 - 5 if the AAC decode ends a few samples short)


def test_sync_score_auto_detector_uses_s3fd_when_its_weights_are_there(tmp_path):
    # Random S3FD weights give meaningless boxes, so only the choice and the shape of the result are checked.
    pytest.importorskip("torch")
    from nbhelpers import testing
    from nbhelpers.quality.crops import detect_boxes

    frames, _, _ = level_clip(0, n=12)
    boxes, used, notes = detect_boxes(frames, tmp_path, "cpu")
    assert used == "dlib" and "s3fd-619a316812.pth is missing" in notes[0]
    testing.write_tiny_s3fd(tmp_path)
    boxes, used, notes = detect_boxes(frames, tmp_path, "cpu")
    assert used == "s3fd" and notes == [] and boxes.shape == (12, 4)


def test_a_silent_track_leaves_the_lag_undetermined(sing):
    """Silence correlates equally (zero) at every lag: no lag is claimed, the peak/sidelobe ratio is 0 and the
    summary says why."""
    track, _ = sing
    got = quality.mouth_audio_lag(None, np.zeros(track.landmarks.shape[0] * HOP, np.float32), track=track)
    assert not got.reliable and got.peak_to_sidelobe == 0.0 and float(np.ptp(got.correlations)) == 0.0
    assert "undetermined" in got.summary() and "silent track" in got.summary()
