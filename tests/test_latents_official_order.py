"""Latents follow the official order of operations bit for bit (issue 14, item 14).

The reference (§4.1, §6) gives the official steps: the crop goes BGR -> RGB, ``/ 255`` in float64, a numpy
``transpose`` to CHW and ``torch.from_numpy`` (a contiguous NCHW tensor), then ``(x - 0.5) / 0.5``; decode takes
``(1 / scaling_factor) * z`` (``vae.py:96-108``). These tests compute both independently, with numpy and plain torch
calls on the same tiny random VAE, and ask for equal bits: a channels-last encoder input or a division in decode
changes the rounding of the convolutions and of the scaling, which the tests see.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from nbhelpers.latents import decode, encode  # noqa: E402

SCALE = 0.18215  # diffusers' default scaling factor, used for sd-vae-ft-mse (official-behaviour.md §4.2)


@pytest.fixture(scope="module")
def crops():
    """Three 256x256 BGR uint8 crops of seeded noise over a ramp."""
    rng = np.random.default_rng(14)
    yy, xx = np.mgrid[0:256, 0:256]
    base = np.stack([xx, yy, (xx + yy) // 2], axis=-1).astype(np.uint8)
    return np.stack([base ^ rng.integers(0, 32, base.shape, dtype=np.uint8) for _ in range(3)])


def official_input(crops_bgr: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """official-behaviour.md §4.1 with numpy: (masked, reference) float32 NCHW tensors as the official code builds
    them."""
    rgb = crops_bgr[..., ::-1]
    x = (rgb.astype(np.float64) / 255).transpose(0, 3, 1, 2).astype(np.float32)  # vae.py:72-74
    mask = np.zeros((256, 256), np.float32)
    mask[:128] = 1  # rows 0..127 kept, 128..255 zeroed (vae.py:40-49,75-76)
    masked = x * mask
    norm = lambda a: (torch.from_numpy(np.ascontiguousarray(a)) - 0.5) / 0.5  # noqa: E731 - Normalize(0.5, 0.5)
    return norm(masked), norm(x)


def test_encoder_input_is_contiguous_nchw_as_in_the_official_code(crops, tiny_vae, monkeypatch):
    seen = []
    real = tiny_vae.encode

    def recording(x, *args, **kwargs):
        seen.append(x)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(tiny_vae, "encode", recording)
    got = encode(crops, tiny_vae, mode="mode", batch_size=3)
    assert len(seen) == 1 and seen[0].shape == (6, 3, 256, 256)
    assert seen[0].is_contiguous(), f"the VAE got strides {seen[0].stride()} (channels-last), not NCHW"

    # Independent: the official normalisation, then the encoder on the same batch (masked crops, then references).
    masked, reference = official_input(crops)
    torch.testing.assert_close(seen[0], torch.cat([masked, reference]), rtol=0, atol=0)
    with torch.no_grad():
        mean = real(torch.cat([masked, reference])).latent_dist.mean
    want = torch.cat([SCALE * mean[:3], SCALE * mean[3:]], dim=1)
    assert got.shape == (3, 8, 32, 32)
    assert torch.equal(got, want), f"max difference {(got - want).abs().max().item():.3g}"


def test_decode_multiplies_by_the_inverse_scaling_factor(tiny_vae, monkeypatch):
    torch.manual_seed(1)
    latents = torch.randn(2, 4, 32, 32) * 0.5
    official_z = (1 / SCALE) * latents  # vae.py:96-108
    # The test can tell the two orders apart: for these values they differ in the last bit somewhere.
    assert not torch.equal(official_z, latents / SCALE)

    seen = []
    real = tiny_vae.decode

    def recording(z, *args, **kwargs):
        seen.append(z.clone())
        return real(z, *args, **kwargs)

    monkeypatch.setattr(tiny_vae, "decode", recording)
    out = decode(latents, tiny_vae)
    assert torch.equal(seen[0], official_z)

    with torch.no_grad():
        image = real(official_z).sample
    image = (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().numpy()
    want = (image * 255).round().astype(np.uint8)[..., ::-1]  # numpy round half to even, RGB -> BGR
    assert np.array_equal(out.numpy(), want)
