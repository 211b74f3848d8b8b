"""Whisper features (nbhelpers.audio): window known answers, token order, edge lengths, and an independent
computation on real speech with a random-weight whisper-tiny-shaped model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nbhelpers import audio as audio_module  # noqa: E402
from nbhelpers.audio import frame_windows, whisper_features  # noqa: E402
from nbhelpers.errors import InputError  # noqa: E402

SR = 16_000

# Durations of the known-answer cases, in samples: 0.2 s, 7.5 s, exactly 30 s, 44 s.
DURATIONS = {"0.2s": 3_200, "7.5s": 120_000, "30s": 480_000, "44s": 704_000}


# ----------------------------------------------------------------------------------------------------------------
# frame_windows: pure integers


@pytest.mark.parametrize("name, n_samples, n_frames, n_encoder", [
    ("0.2s", 3_200, 5, 10),
    ("7.5s", 120_000, 187, 375),
    ("30s", 480_000, 750, 1500),
    ("44s", 704_000, 1100, 2200),
])
def test_frame_windows_counts_and_ends(name, n_samples, n_frames, n_encoder):
    w = frame_windows(n_samples, 25)
    assert (w.n_frames, w.n_encoder_frames, w.pad_left, w.pad_right, w.window) == (n_frames, n_encoder, 4, 12, 10)
    idx = w.indices()
    assert idx.shape == (n_frames, 10)
    # start: frame 0 reads 4 zero frames then encoder frames 0..5 (official-behaviour.md §5.1 step 7: [2k-4, 2k+6))
    assert idx[0].tolist() == [-1, -1, -1, -1, 0, 1, 2, 3, 4, 5]
    # middle
    k = n_frames // 2
    assert idx[k].tolist() == [2 * k - 4 + i if 0 <= 2 * k - 4 + i < n_encoder else -1 for i in range(10)]
    # end: the last frame reads up to 2 frames past the audio's last encoder frame, which are zeros
    k = n_frames - 1
    assert w.starts[k] == 2 * k - 4
    assert idx[k].tolist() == [2 * k - 4 + i if 2 * k - 4 + i < n_encoder else -1 for i in range(10)]
    assert (idx[k] == -1).sum() == 2 * k + 6 - n_encoder


def test_frame_windows_other_fps_follow_the_reference_table():
    # official-behaviour.md §5.2: 30 fps -> p 2, start floor(1.667k) - 4; 24 fps -> p 3, start floor(2.083k) - 6
    w30 = frame_windows(SR * 2, 30)
    assert (w30.pad_left, w30.pad_right) == (4, 12)
    assert w30.starts.tolist() == [math.floor(k * 50 / 30) - 4 for k in range(60)]
    w24 = frame_windows(SR * 2, 24)
    assert (w24.pad_left, w24.pad_right, w24.n_frames) == (6, 18, 48)
    assert w24.starts.tolist() == [math.floor(k * 50 / 24) - 6 for k in range(48)]


def test_frame_windows_is_integer_exact_where_the_float_formula_is_not():
    # 18560 / 16000 * 25 is 29 exactly, but the official float expression gives 28.999999999999996.
    assert math.floor(18_560 / 16_000 * 25) == 28
    assert frame_windows(18_560).n_frames == 29
    assert frame_windows(18_560).n_encoder_frames == 58
    assert frame_windows(639).n_frames == 0 and frame_windows(640).n_frames == 1


@pytest.mark.parametrize("bad", [0, -5, 29.97, True, "25"])
def test_fps_must_be_a_positive_whole_number(bad):
    with pytest.raises(InputError, match="fps"):
        frame_windows(16_000, bad)


# ----------------------------------------------------------------------------------------------------------------
# A fake encoder whose hidden states say where they came from


class LabelEncoder(torch.nn.Module):
    """Hidden state ``layer`` of global encoder frame ``t`` is filled with ``1 + 8 t + layer`` (all 384 dims).

    Segments are numbered in the order the encoder sees them (a call counter); it records each mel's shape.
    """

    def __init__(self, dtype=torch.float64):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=dtype))
        self.seen = 0
        self.shapes = []

    def forward(self, mel, output_hidden_states=False):
        assert output_hidden_states is True
        self.shapes.append((tuple(mel.shape), mel.dtype))
        b = mel.shape[0]
        t = torch.arange(b * 1500, dtype=self.weight.dtype).reshape(b, 1500, 1) + self.seen * 1500
        self.seen += b
        states = tuple((1 + 8 * t + layer).expand(b, 1500, 384) for layer in range(5))
        return SimpleNamespace(hidden_states=states)


def decode_label(value: float) -> tuple[int, int] | None:
    """(encoder frame, layer) from a label value, or None for a zero-padding token."""
    if value == 0:
        return None
    v = int(value) - 1
    return v // 8, v % 8


def expected_label(k: int, token: int, n_encoder: int) -> tuple[int, int] | None:
    """official-behaviour.md §5.1 steps 7-8 at 25 fps: token = time_step * 5 + layer of encoder frame
    2k - 4 + time_step."""
    time_step, layer = divmod(token, 5)
    frame = 2 * k - 4 + time_step
    return (frame, layer) if 0 <= frame < n_encoder else None


@pytest.fixture(scope="module")
def noise_audio():
    rng = np.random.default_rng(0)
    return {name: (rng.standard_normal(n) * 0.1).astype(np.float32) for name, n in DURATIONS.items()}


@pytest.mark.parametrize("name", list(DURATIONS))
def test_windows_and_token_order_read_back_from_a_labelling_encoder(name, noise_audio):
    wave = noise_audio[name]
    enc = LabelEncoder()
    feats = whisper_features(wave, enc)
    n_frames, n_encoder = len(wave) * 25 // SR, len(wave) * 50 // SR
    n_segments = -(-len(wave) // 480_000)
    assert feats.shape == (n_frames, 50, 384) and feats.dtype == torch.float64
    # every segment was a full 30 s log-mel, all of them in one batched forward
    assert enc.shapes == [((n_segments, 80, 3000), torch.float64)]
    assert torch.equal(feats, feats[:, :, :1].expand_as(feats)), "all 384 dims of a token come from one state"
    labels = feats[:, :, 0].numpy()
    for k in sorted({0, 1, 2, n_frames // 2, n_frames - 3, n_frames - 2, n_frames - 1}):
        got = [decode_label(v) for v in labels[k]]
        assert got == [expected_label(k, j, n_encoder) for j in range(50)], f"frame {k}"
    # the zero padding is exactly where the reference puts it, and nowhere else
    zero = labels == 0
    want = np.array([[expected_label(k, j, n_encoder) is None for j in range(50)] for k in range(n_frames)])
    assert np.array_equal(zero, want)
    assert zero[0].sum() == 4 * 5 and zero[n_frames - 1].sum() == (2 * (n_frames - 1) + 6 - n_encoder) * 5


def test_44s_reads_across_the_segment_boundary_in_order(noise_audio, monkeypatch):
    batched = whisper_features(noise_audio["44s"], LabelEncoder())  # both segments in one encoder pass
    monkeypatch.setattr(audio_module, "SEGMENTS_PER_BATCH", 1)
    feats = whisper_features(noise_audio["44s"], LabelEncoder())
    labels = feats[:, :, 0].numpy()
    k = 750  # window 2k-4 .. 2k+5 = 1496..1505 straddles encoder frame 1500, the first of the second 30 s segment
    assert [decode_label(v)[0] for v in labels[k][::5]] == list(range(1496, 1506))
    assert torch.equal(feats, batched)


def test_exactly_30s_is_one_segment_and_31s_two(noise_audio, monkeypatch):
    monkeypatch.setattr(audio_module, "SEGMENTS_PER_BATCH", 1)
    enc = LabelEncoder()
    whisper_features(noise_audio["30s"], enc)
    assert [s for s, _ in enc.shapes] == [(1, 80, 3000)]
    enc = LabelEncoder()
    whisper_features(np.zeros(480_001, np.float32), enc)
    assert [s for s, _ in enc.shapes] == [(1, 80, 3000), (1, 80, 3000)]


def test_shortest_audio_has_full_zero_padding():
    # 640 samples = one video frame and 2 encoder frames. The official zeros_like padding would be 2 frames wide
    # on each side here (Q14) and its window check would exit; ours reads the intended 4 zeros first.
    feats = whisper_features(np.zeros(640, np.float32), LabelEncoder())
    assert feats.shape == (1, 50, 384)
    got = [decode_label(v) for v in feats[0, :, 0].tolist()]
    assert got == [expected_label(0, j, 2) for j in range(50)]
    assert got[20:30] == [(0, layer) for layer in range(5)] + [(1, layer) for layer in range(5)]


def test_output_follows_the_whisper_dtype():
    feats = whisper_features(np.zeros(SR, np.float32), LabelEncoder(torch.float32))
    assert feats.dtype == torch.float32 and feats.device.type == "cpu"


@pytest.mark.parametrize("wave, match", [
    (np.zeros(0, np.float32), "empty"),
    (np.zeros(639, np.float32), "shorter than one video frame"),
    (np.zeros((SR, 2), np.float32), "1-D"),
    (np.zeros(SR, np.int16), "float"),
    (np.full(SR, np.nan, np.float32), "non-finite"),
    ([0.0] * SR, "numpy array"),
])
def test_bad_waveforms_raise_input_error(wave, match):
    with pytest.raises(InputError, match=match):
        whisper_features(wave, LabelEncoder())


def test_bad_whisper_and_fps_raise_input_error():
    with pytest.raises(InputError, match="fps"):
        whisper_features(np.zeros(SR, np.float32), LabelEncoder(), fps=29.97)
    with pytest.raises(InputError, match="whisper"):
        whisper_features(np.zeros(SR, np.float32), torch.nn.Identity())


# ----------------------------------------------------------------------------------------------------------------
# Independent computation on real speech with a random whisper-tiny-shaped model


@pytest.fixture(scope="module")
def tiny_whisper():
    torch.manual_seed(1234)
    config = transformers.WhisperConfig(
        d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80,
        max_source_positions=1500, decoder_layers=1, decoder_attention_heads=6, decoder_ffn_dim=64, vocab_size=64,
        max_target_positions=16, pad_token_id=1, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return transformers.WhisperModel(config).eval()


def load_speech(path) -> np.ndarray:
    sf = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = data.mean(axis=1).astype(np.float32)
    return soxr.resample(mono, rate, SR, quality="HQ").astype(np.float32)


def run_layer(layer, hidden):
    try:
        out = layer(hidden, None)  # transformers 5.x: (hidden_states, attention_mask, **kwargs)
    except TypeError:
        out = layer(hidden, None, None)  # transformers 4.x: (hidden_states, attention_mask, layer_head_mask)
    return out[0] if isinstance(out, tuple) else out


def reference_features(wave: np.ndarray, model) -> torch.Tensor:
    """official-behaviour.md §5.1 written out plainly: per-segment log-mel, the encoder run layer by layer, float
    lengths, explicit zero padding and one window per video frame."""
    extractor = transformers.WhisperFeatureExtractor(
        feature_size=80, sampling_rate=SR, hop_length=160, chunk_length=30, n_fft=400, padding_value=0.0)
    enc = model.encoder
    per_segment = []
    with torch.no_grad():
        for start in range(0, len(wave), 480_000):
            mel = extractor(wave[start:start + 480_000], sampling_rate=SR, return_tensors="pt").input_features
            assert mel.shape == (1, 80, 3000)
            h = torch.nn.functional.gelu(enc.conv1(mel))
            h = torch.nn.functional.gelu(enc.conv2(h)).permute(0, 2, 1)
            h = h + enc.embed_positions.weight[:1500]
            states = [h]
            for layer in enc.layers:
                h = run_layer(layer, h)
                states.append(h)
            states[-1] = enc.layer_norm(states[-1])  # the 5th state is the final layer norm's output
            per_segment.append(torch.stack(states, dim=2))  # [1, 1500, 5, 384]
    feats = torch.cat(per_segment, dim=1)[0]
    fps = 25
    ratio = 50 / fps
    n_frames = math.floor(len(wave) / SR * fps)
    actual_len = math.floor(len(wave) / SR * 50)
    feats = feats[:actual_len]
    p = math.ceil(ratio)
    padded = torch.cat([torch.zeros(p * 2, 5, 384), feats, torch.zeros(p * 3 * 2, 5, 384)])
    out = []
    for k in range(n_frames):
        start = math.floor(k * ratio)
        clip = padded[start:start + 10]
        assert clip.shape[0] == 10
        out.append(clip.reshape(50, 384))
    return torch.stack(out)


@pytest.mark.parametrize("name, seconds", [("speech-en-short.wav", 7.5), ("speech-en-long.wav", 44.1)])
def test_matches_an_independent_computation_on_real_speech(shared_data, tiny_whisper, name, seconds):
    wave = load_speech(shared_data / name)
    assert abs(len(wave) / SR - seconds) < 0.1
    ours = whisper_features(wave, tiny_whisper)
    ref = reference_features(wave, tiny_whisper)
    assert ours.shape == ref.shape == (len(wave) * 25 // SR, 50, 384)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    # the padding tokens are exact zeros, the rest is real signal
    assert torch.count_nonzero(ours[0, :20]) == 0 and torch.count_nonzero(ours[0, 20:]) > 0
    # the encoder alone (a WhisperEncoder) gives the same tokens as the whole model
    if name == "speech-en-short.wav":
        torch.testing.assert_close(whisper_features(wave, tiny_whisper.encoder), ours, rtol=0, atol=0)


def test_transformers_hidden_states_are_the_five_the_reference_names(tiny_whisper):
    # transformers 5 records hidden states with hooks; the reference (4.39.2) says: embedding output, layers 1-3,
    # and the final layer norm applied to layer 4. Check that this transformers still returns those.
    torch.manual_seed(0)
    mel = torch.randn(1, 80, 3000)
    enc = tiny_whisper.encoder
    with torch.no_grad():
        states = enc(mel, output_hidden_states=True).hidden_states
        h = torch.nn.functional.gelu(enc.conv2(torch.nn.functional.gelu(enc.conv1(mel)))).permute(0, 2, 1)
        h = h + enc.embed_positions.weight[:1500]
        assert len(states) == 5
        torch.testing.assert_close(states[0], h)
        for layer in enc.layers:
            h = run_layer(layer, h)
        torch.testing.assert_close(states[4], enc.layer_norm(h))


def test_fp16_encoder_gives_fp16_tokens():
    enc = LabelEncoder(torch.float16)
    feats = whisper_features(np.zeros(3_200, np.float32), enc)
    assert enc.shapes == [((1, 80, 3000), torch.float16)] and feats.dtype == torch.float16
    assert [decode_label(v) for v in feats[4, :, 0].tolist()] == [expected_label(4, j, 10) for j in range(50)]


def _mel_cases():
    rng = np.random.default_rng(11)
    quiet_then_burst = (rng.standard_normal(SR * 3) * 1e-4).astype(np.float32)
    quiet_then_burst[SR:SR + 1600] += np.sin(np.arange(1600) * 0.3).astype(np.float32)  # the max - 8 clamp binds
    return {"one frame": (rng.standard_normal(640) * 0.1).astype(np.float32),
            "200 ms": (rng.standard_normal(3200) * 0.5).astype(np.float32),
            "30 s": (rng.standard_normal(480_000) * 0.3).astype(np.float32),
            "quiet with a burst": quiet_then_burst}


@pytest.mark.parametrize("name", list(_mel_cases()))
def test_log_mel_on_device_equals_the_feature_extractor(name):
    """The torch log-mel the pipeline runs on CUDA, run here on the CPU: the extractor's features (transformers'
    torch STFT path) within 1e-5 in log-mel units, its numpy path within 1e-4 (values span about 2.5; the quiet
    bins, whose log amplifies float rounding, differ most)."""
    from nbhelpers.audio import _log_mel, default_feature_extractor, log_mel_on_device

    wave = _mel_cases()[name]
    fe = default_feature_extractor()
    ours = log_mel_on_device(wave, fe, "cpu")
    assert ours.shape == (1, 80, 3000) and ours.dtype == torch.float32
    ref = _log_mel(fe, wave).numpy()
    numpy_path = fe._np_extract_fbank_features(np.pad(wave, (0, 480_000 - len(wave)))[None], "cpu")
    np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours.numpy(), numpy_path, rtol=0, atol=1e-4)
    if name == "quiet with a burst":  # the clamp at the segment's max - 8 is exercised
        assert np.isclose(ref.min(), ref.max() - 2.0, atol=1e-5)  # (max - 8 + 4) / 4 = (max + 4) / 4 - 2


def test_log_mel_stays_on_the_cpu_extractor_when_asked_for_what_the_device_path_does_not_do():
    """A dithering extractor, or a CPU device, keeps the extractor's own computation."""
    from nbhelpers.audio import _device_log_mel_ok, _log_mel, default_feature_extractor

    fe = default_feature_extractor()
    assert _device_log_mel_ok(fe)
    assert not _device_log_mel_ok(SimpleNamespace(**{k: getattr(fe, k) for k in (
        "n_fft", "hop_length", "n_samples", "nb_max_frames", "mel_filters", "sampling_rate")}, dither=1.0))
    wave = np.zeros(640, np.float32)
    assert _log_mel(fe, wave, torch.device("cpu")).device.type == "cpu"
    with pytest.raises(InputError, match="at most 480000 samples"):
        from nbhelpers.audio import log_mel_on_device

        log_mel_on_device(np.zeros(480_001, np.float32), fe, "cpu")


@pytest.mark.gpu
def test_log_mel_on_cuda_is_the_extractors_within_1e_4():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs on the project's GPU machine)")
    from nbhelpers.audio import _log_mel, default_feature_extractor

    fe = default_feature_extractor()
    for name, wave in _mel_cases().items():
        got = _log_mel(fe, wave, torch.device("cuda"))
        assert got.is_cuda and got.shape == (1, 80, 3000)
        np.testing.assert_allclose(got.cpu().numpy(), _log_mel(fe, wave).numpy(), rtol=0, atol=1e-4, err_msg=name)
