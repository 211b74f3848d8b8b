"""Latents (nbhelpers.latents): crop, encode (masking, order, noise), decode (scaling, clamping, rounding, BGR) and
the UNet step. The ordered, out-of-memory-safe generation loop is the engine's: tests/test_engine.py."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
cv2 = pytest.importorskip("cv2")

from nbhelpers.errors import InputError  # noqa: E402
from nbhelpers.latents import crop_and_resize, decode, encode, unet_step  # noqa: E402

SCALE = 0.18215


# ----------------------------------------------------------------------------------------------------------------
# Fixtures: tiny real models (random, seeded; the VAE is conftest.py's tiny_vae) and fakes that record what
# they are given


@pytest.fixture(scope="module")
def tiny_unet():
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        sample_size=32, in_channels=8, out_channels=4, layers_per_block=1, block_out_channels=(32, 64, 64, 64),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=384, attention_head_dim=8, norm_num_groups=32).eval()


@pytest.fixture(scope="module")
def pe():
    """nbhelpers.models.PositionalEncoding when it exists, else a callable adding a fixed sinusoid-like table."""
    try:
        from nbhelpers.models import PositionalEncoding
    except ImportError:
        table = torch.sin(torch.arange(50 * 384, dtype=torch.float32).reshape(1, 50, 384) * 0.01)
        return lambda x: x + table.to(x.dtype)
    return PositionalEncoding(d_model=384).eval()


@pytest.fixture(scope="module")
def crops():
    """Six 256x256 BGR crops: a colour ramp, shifted per crop, with a little noise."""
    rng = np.random.default_rng(0)
    base = np.zeros((256, 256, 3), np.uint8)
    yy, xx = np.mgrid[0:256, 0:256]
    base[..., 0], base[..., 1], base[..., 2] = xx, yy, (xx + yy) // 2
    return np.stack([np.roll(base, 9 * i, axis=1) ^ rng.integers(0, 8, base.shape, dtype=np.uint8)
                     for i in range(6)])


class RecordingVAE(torch.nn.Module):
    """A batch-invariant stand-in for AutoencoderKL: posterior mean = 8x8 average of the RGB input (+ a zero 4th
    channel), std = 0.5 everywhere; ``decode`` returns ``image`` when set, else z's first 3 channels upsampled x8."""

    def __init__(self, dtype=torch.float32, image=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=dtype))
        self.config = SimpleNamespace(scaling_factor=SCALE)
        self.inputs, self.decoded = [], []
        self.image = image

    def encode(self, x):
        self.inputs.append(x.clone())
        pooled = torch.nn.functional.avg_pool2d(x, 8)
        mean = torch.cat([pooled, torch.zeros_like(pooled[:, :1])], dim=1)
        return SimpleNamespace(latent_dist=SimpleNamespace(mean=mean, std=torch.full_like(mean, 0.5)))

    def decode(self, z):
        self.decoded.append(z.clone())
        if self.image is not None:
            return SimpleNamespace(sample=self.image.to(z.dtype))
        return SimpleNamespace(sample=z[:, :3].repeat_interleave(8, dim=2).repeat_interleave(8, dim=3))


def normalise_like_the_reference(crops_bgr: np.ndarray) -> np.ndarray:
    """official-behaviour.md §4.1: BGR->RGB, /255 in float64, float32, CHW, (x - 0.5) / 0.5."""
    rgb = crops_bgr[..., ::-1]
    x = (rgb.astype(np.float64) / 255).astype(np.float32).transpose(0, 3, 1, 2)
    return (x - np.float32(0.5)) / np.float32(0.5)


# ----------------------------------------------------------------------------------------------------------------
# crop_and_resize


def test_crop_and_resize_is_the_official_slice_and_lanczos4():
    rng = np.random.default_rng(1)
    frame = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    out = crop_and_resize(frame, (50, 20, 250, 260))
    assert out.shape == (256, 256, 3) and out.dtype == np.uint8
    want = cv2.resize(frame[20:260, 50:250], (256, 256), interpolation=cv2.INTER_LANCZOS4)
    assert np.array_equal(out, want)
    # past the bottom/right edges: clipped like numpy slicing (v15's y2 + extra_margin can pass the frame)
    assert np.array_equal(crop_and_resize(frame, (300, 100, 450, 330)),
                          cv2.resize(frame[100:300, 300:400], (256, 256), interpolation=cv2.INTER_LANCZOS4))
    # a negative start is clipped to 0 rather than wrapped around
    assert np.array_equal(crop_and_resize(frame, (-10, -5, 100, 100)),
                          cv2.resize(frame[0:100, 0:100], (256, 256), interpolation=cv2.INTER_LANCZOS4))


def test_crop_and_resize_keeps_colours_and_orientation():
    frame = np.zeros((100, 100, 3), np.uint8)
    frame[:50, :, 0] = 255  # top half blue (BGR)
    frame[50:, :, 2] = 255  # bottom half red
    out = crop_and_resize(frame, (0, 0, 100, 100))
    assert out[:100, :, 0].min() >= 250 and out[:100, :, 2].max() <= 5
    assert out[156:, :, 2].min() >= 250 and out[156:, :, 0].max() <= 5


@pytest.mark.parametrize("frame, box, match", [
    (np.zeros((10, 10, 3), np.uint8), (5, 5, 5, 9), "does not overlap"),
    (np.zeros((10, 10, 3), np.uint8), (20, 0, 30, 9), "does not overlap"),
    (np.zeros((10, 10, 3), np.uint8), (0, 0, 5), "four numbers"),
    (np.zeros((10, 10), np.uint8), (0, 0, 5, 5), "uint8 BGR"),
    (np.zeros((10, 10, 3), np.float32), (0, 0, 5, 5), "uint8 BGR"),
])
def test_crop_and_resize_rejects_bad_input(frame, box, match):
    with pytest.raises(InputError, match=match):
        crop_and_resize(frame, box)


# ----------------------------------------------------------------------------------------------------------------
# encode


def test_encode_masks_rows_128_to_255_to_exactly_minus_one(crops):
    vae = RecordingVAE()
    lat = encode(crops[:3], vae, mode="mode")
    assert lat.shape == (3, 8, 32, 32) and lat.dtype == torch.float32
    (x,) = vae.inputs
    assert x.shape == (6, 3, 256, 256)
    masked, reference = x[:3].numpy(), x[3:].numpy()
    want = normalise_like_the_reference(crops[:3])
    assert np.all(masked[:, :, 128:, :] == -1.0)
    assert np.array_equal(masked[:, :, :128, :], want[:, :, :128, :])
    assert np.array_equal(reference, want)  # RGB order, exact float32 values
    # channels 0-3 come from the masked crop, 4-7 from the same crop unmasked, both times 0.18215
    pooled = torch.nn.functional.avg_pool2d(x, 8)
    torch.testing.assert_close(lat[:, :3], pooled[:3] * SCALE, rtol=0, atol=0)
    torch.testing.assert_close(lat[:, 4:7], pooled[3:] * SCALE, rtol=0, atol=0)
    assert torch.all(lat[:, :3, 16:, :] == -SCALE)  # the masked half's latent is exactly black * scale


def test_encode_casts_the_input_to_the_vae_dtype_and_takes_torch_input(crops):
    vae = RecordingVAE(dtype=torch.float64)
    lat = encode(torch.from_numpy(crops[:2]), vae, mode="mode")
    assert vae.inputs[0].dtype == torch.float64 and lat.dtype == torch.float64
    lat_np = encode(list(crops[:2]), RecordingVAE(dtype=torch.float64), mode="mode")
    assert torch.equal(lat, lat_np)


def test_encode_noise_is_per_frame_and_independent_of_batch_size(crops):
    ref = encode(crops, RecordingVAE(), generator=7, batch_size=6)
    for batch_size in (1, 4):
        assert torch.equal(encode(crops, RecordingVAE(), generator=7, batch_size=batch_size), ref)
    # pieces with their first_index give the same latents as one call
    pieces = torch.cat([encode(crops[:2], RecordingVAE(), generator=7),
                        encode(crops[2:], RecordingVAE(), generator=7, first_index=2)])
    assert torch.equal(pieces, ref)
    assert not torch.allclose(encode(crops, RecordingVAE(), generator=8), ref)
    # sample = mean + std * noise: with std 0.5 the noise is (sample - mode) / (0.5 * scale), a standard normal,
    # different for the masked and the reference draws
    mode = encode(crops, RecordingVAE(), mode="mode")
    noise = (ref - mode) / (0.5 * SCALE)
    assert abs(float(noise.mean())) < 0.05 and abs(float(noise.std()) - 1) < 0.05
    assert abs(float(torch.corrcoef(torch.stack([noise[:, :4].flatten(), noise[:, 4:].flatten()]))[0, 1])) < 0.05


def test_encode_generator_forms(crops):
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = encode(crops[:2], RecordingVAE(), generator=g1)
    assert torch.equal(a, encode(crops[:2], RecordingVAE(), generator=g2))
    torch.manual_seed(11)
    b = encode(crops[:2], RecordingVAE())
    torch.manual_seed(11)
    assert torch.equal(b, encode(crops[:2], RecordingVAE()))
    for bad in (-1, 1.5, "seed"):
        with pytest.raises(InputError, match="generator"):
            encode(crops[:1], RecordingVAE(), generator=bad)


def test_encode_with_a_real_vae(crops, tiny_vae):
    # float64 copy: CPU convolution kernels round differently per batch size (up to ~5e-4 relative in float32),
    # which would hide real differences; in float64 that noise is ~1e-12.
    vae64 = copy.deepcopy(tiny_vae).double()
    # mode: the posterior mean times the scaling factor, computed here from the reference's description
    lat = encode(crops[:2], vae64, mode="mode", batch_size=1)
    x = torch.from_numpy(normalise_like_the_reference(crops[:2])).double()
    xm = x.clone()
    xm[:, :, 128:, :] = -1
    with torch.no_grad():
        want = torch.cat([vae64.encode(xm).latent_dist.mean, vae64.encode(x).latent_dist.mean], 1) * SCALE
    assert lat.shape == (2, 8, 32, 32) and lat.dtype == torch.float64
    torch.testing.assert_close(lat, want, rtol=1e-9, atol=1e-9)
    assert torch.equal(lat, encode(crops[:2], vae64, mode="mode", batch_size=1))  # deterministic
    # sample: same seed, same latents at any batch size; another seed, other latents
    s1 = encode(crops[:2], vae64, generator=5, batch_size=1)
    s3 = encode(crops[:2], vae64, generator=5, batch_size=2)
    torch.testing.assert_close(s1, s3, rtol=1e-9, atol=1e-9)
    assert (encode(crops[:2], vae64, generator=6) - s3).abs().max() > 1e-3
    # float32 model: the same latents up to kernel rounding
    torch.testing.assert_close(encode(crops[:2], tiny_vae, generator=5).double(), s3, rtol=0,
                               atol=2e-3 * float(s3.abs().max()))


@pytest.mark.parametrize("bad, match", [
    (np.zeros((2, 128, 128, 3), np.uint8), "256, 256, 3"),
    (np.zeros((256, 256, 3), np.uint8), "256, 256, 3"),
    (np.zeros((1, 256, 256, 3), np.float32), "uint8"),
])
def test_encode_rejects_bad_crops(bad, match):
    with pytest.raises(InputError, match=match):
        encode(bad, RecordingVAE())


def test_encode_rejects_bad_options(crops):
    with pytest.raises(InputError, match="mode"):
        encode(crops[:1], RecordingVAE(), mode="mean")
    with pytest.raises(InputError, match="batch_size"):
        encode(crops[:1], RecordingVAE(), batch_size=0)
    with pytest.raises(InputError, match="first_index"):
        encode(crops[:1], RecordingVAE(), first_index=-1)
    assert encode(np.zeros((0, 256, 256, 3), np.uint8), RecordingVAE()).shape == (0, 8, 32, 32)


# ----------------------------------------------------------------------------------------------------------------
# decode


def test_decode_scaling_on_a_constant_latent():
    vae = RecordingVAE()
    values = torch.tensor([-0.5, -0.1, 0.0, 0.05, 0.1, 0.2, 0.5])  # scaled latent values
    latents = values.reshape(-1, 1, 1, 1).repeat(1, 4, 32, 32).contiguous()
    out = decode(latents, vae)
    assert out.shape == (7, 256, 256, 3) and out.dtype == torch.uint8
    # the decoder got (1 / 0.18215) * z, the official order (vae.py:96-108)
    torch.testing.assert_close(vae.decoded[0], (1 / SCALE) * latents, rtol=0, atol=0)
    # the official numpy steps: (x / 2 + 0.5).clamp(0, 1), float32 x 255, round half to even
    z = (values.numpy() * np.float32(1 / SCALE)).astype(np.float32)
    want = (np.clip(z / 2 + np.float32(0.5), 0, 1).astype(np.float32) * np.float32(255)).round().astype(np.uint8)
    assert out[:, 0, 0, 0].tolist() == want.tolist()
    assert want[0] == 0 and want[-1] == 255  # -0.5/0.18215 and 0.5/0.18215 are clamped
    assert bool((out == out[:, :1, :1, :1]).all())


def test_decode_hands_the_decoder_nchw_latents_when_the_unet_returns_channels_last():
    """A channels-last UNet returns channels-last latents; the decoder's compiled code is made for NCHW input, and a
    call with other strides would not match it (nbhelpers.gpu.compile signatures include strides)."""
    vae = RecordingVAE()
    latents = torch.randn(3, 4, 32, 32).contiguous(memory_format=torch.channels_last)
    assert not latents.is_contiguous()
    decode(latents, vae)
    assert vae.decoded[0].is_contiguous()
    torch.testing.assert_close(vae.decoded[0], (1 / SCALE) * latents, rtol=0, atol=0)


def half_values(parity: int) -> list[tuple[float, int]]:
    """Decoder outputs x for which float32 (x / 2 + 0.5) * 255 is exactly k + 0.5 with k of the given parity."""
    found = []
    for k in range(parity, 254, 2):
        u = np.float32((k + 0.5) / 255)
        x = (u - np.float32(0.5)) * np.float32(2)
        if x / np.float32(2) + np.float32(0.5) == u and u * np.float32(255) == np.float32(k + 0.5):
            found.append((float(x), k))
    return found


def test_decode_rounds_half_to_even_clamps_and_writes_bgr():
    evens, odds = half_values(0), half_values(1)
    assert evens and odds, "need exact .5 cases of both parities"
    (xe, ke), (xo, ko) = evens[0], odds[0]
    image = torch.zeros(1, 3, 256, 256)
    image[0, 0, :, :128] = xe  # R: k + 0.5 with k even -> k
    image[0, 0, :, 128:] = xo  # R: k + 0.5 with k odd -> k + 1
    image[0, 1] = -3.0  # G: below -1 -> 0
    image[0, 2] = 7.0  # B: above 1 -> 255
    out = decode(torch.zeros(1, 4, 32, 32), RecordingVAE(image=image))
    assert out.shape == (1, 256, 256, 3)
    assert int(out[0, 0, 0, 2]) == ke and int(out[0, 0, 200, 2]) == ko + 1  # R is the last channel (BGR)
    assert int(out[0, 0, 0, 1]) == 0 and int(out[0, 0, 0, 0]) == 255
    assert torch.round(torch.tensor([0.5, 1.5, 2.5])).tolist() == [0.0, 2.0, 2.0]  # torch.round is half-to-even


def test_decode_matches_the_official_numpy_path_on_a_real_vae(tiny_vae):
    torch.manual_seed(0)
    latents = torch.randn(2, 4, 32, 32) * 0.5
    out = decode(latents, tiny_vae)
    with torch.no_grad():
        image = tiny_vae.decode((1 / SCALE) * latents).sample
    image = (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().numpy()
    want = (image * 255).round().astype(np.uint8)[..., ::-1]
    assert np.array_equal(out.numpy(), want)


def test_decode_rejects_bad_latents():
    with pytest.raises(InputError, match="latents"):
        decode(torch.zeros(1, 8, 32, 32), RecordingVAE())
    with pytest.raises(InputError, match="latents"):
        decode(np.zeros((1, 4, 32, 32), np.float32), RecordingVAE())


# ----------------------------------------------------------------------------------------------------------------
# unet_step and generate


class RecordingUNet(torch.nn.Module):
    """Wraps a UNet: records each call's arguments; raises CUDA out-of-memory for batches above ``oom_above``."""

    def __init__(self, unet, oom_above=None):
        super().__init__()
        self.unet = unet
        self.oom_above = oom_above
        self.calls = []

    def forward(self, sample, timestep, encoder_hidden_states):
        self.calls.append((sample.clone(), timestep.clone(), encoder_hidden_states.clone()))
        if self.oom_above is not None and sample.shape[0] > self.oom_above:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by test)")
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states)


def test_unet_step_calls_the_unet_at_timestep_zero_with_pe_features(tiny_unet, pe):
    torch.manual_seed(1)
    lat, feat = torch.randn(3, 8, 32, 32), torch.randn(3, 50, 384)
    rec = RecordingUNet(tiny_unet)
    out = unet_step(rec, pe, lat, feat)
    assert out.shape == (3, 4, 32, 32) and out.dtype == torch.float32
    ((sample, t, hidden),) = rec.calls
    assert t.dtype == torch.int64 and t.tolist() == [0]
    assert torch.equal(sample, lat)
    with torch.no_grad():
        assert torch.equal(hidden, pe(feat))
        assert not torch.equal(hidden, feat)
        assert torch.equal(out, tiny_unet(lat, 0, encoder_hidden_states=pe(feat)).sample)


def test_unet_step_casts_to_the_unet_dtype(tiny_unet, pe):
    rec = RecordingUNet(tiny_unet)
    unet_step(rec, pe, torch.zeros(1, 8, 32, 32, dtype=torch.float64), torch.zeros(1, 50, 384, dtype=torch.float64))
    sample, _, hidden = rec.calls[0]
    assert sample.dtype == hidden.dtype == torch.float32


def test_unet_step_rejects_mismatched_shapes(tiny_unet, pe):
    with pytest.raises(InputError, match="same batch size"):
        unet_step(tiny_unet, pe, torch.zeros(2, 8, 32, 32), torch.zeros(3, 50, 384))
    with pytest.raises(InputError, match="feature_batch"):
        unet_step(tiny_unet, pe, torch.zeros(2, 8, 32, 32), torch.zeros(2, 10, 5, 384))
    with pytest.raises(InputError, match="latent_batch"):
        unet_step(tiny_unet, pe, torch.zeros(2, 4, 32, 32), torch.zeros(2, 50, 384))


class DtypeUNet(torch.nn.Module):
    """Records the dtypes it is called with and returns the first 4 channels of its input."""

    def __init__(self, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=dtype))
        self.seen = []

    def forward(self, sample, timestep, encoder_hidden_states):
        self.seen.append((sample.dtype, timestep.dtype, encoder_hidden_states.dtype))
        return SimpleNamespace(sample=sample[:, :4] + self.weight)


def test_fp16_path_keeps_half_precision_end_to_end(crops, pe):
    # fp16 as on a GPU (the official --use_float16 / realtime path), checked with cheap stand-ins on the CPU
    half_pe = pe.half() if isinstance(pe, torch.nn.Module) else pe
    vae = RecordingVAE(dtype=torch.float16)
    lat = encode(crops[:2], vae, generator=0)
    assert vae.inputs[0].dtype == torch.float16 and lat.dtype == torch.float16
    unet = DtypeUNet(torch.float16)
    out = unet_step(unet, half_pe, lat, torch.zeros(2, 50, 384))
    assert unet.seen == [(torch.float16, torch.int64, torch.float16)] and out.dtype == torch.float16
    frames = decode(out, vae)
    assert vae.decoded[0].dtype == torch.float16 and frames.dtype == torch.uint8
    one_by_one = [decode(unet_step(unet, half_pe, lat[k:k + 1], torch.zeros(1, 50, 384, dtype=torch.float16)), vae)
                  for k in range(2)]
    assert all(f.dtype == torch.uint8 for f in one_by_one)
    assert torch.equal(torch.cat(one_by_one), frames)


@pytest.mark.gpu
def test_cuda_encode_frames_pads_a_short_batch_and_matches_one_frame_at_a_time(tiny_vae):
    """5 face frames at batch 4 on CUDA in fp16: the second batch (1 frame) is padded to 4 with copies of its crop
    and the extra latents dropped; every frame's latents equal encoding it alone (batch 1, no padding: noise is
    seeded by the frame's index) within fp16 rounding, and 5 rows come back."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs on the project's GPU machine)")
    from nbhelpers.latents import encode_frames

    vae = copy.deepcopy(tiny_vae).to("cuda", torch.float16)
    rng = np.random.default_rng(6)
    frames = rng.integers(0, 256, (7, 300, 280, 3), dtype=np.uint8)
    boxes = np.array([[10 + i, 20, 250 + i, 280] for i in range(7)], np.int32)
    face_frames = [0, 1, 2, 3, 4]
    batched = encode_frames(frames, boxes, face_frames, vae, seed=3, batch_size=4, progress=False)
    alone = encode_frames(frames, boxes, face_frames, vae, seed=3, batch_size=1, progress=False)
    assert batched.shape == alone.shape == (5, 8, 32, 32) and batched.dtype == torch.float16
    diff = (batched.float() - alone.float()).abs().max().item()
    assert diff <= 2e-2 * alone.float().abs().max().item(), diff
    # not vacuous: the frames' latents differ from one another
    assert (alone[4].float() - alone[3].float()).abs().max().item() > 10 * diff + 1e-3
