"""The VAE decoder's upsampling in phase form (nbhelpers.upsampling) against diffusers' own path."""

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
from diffusers.models.upsampling import Upsample2D  # noqa: E402

from nbhelpers.upsampling import phase_upsample, phase_upsampling  # noqa: E402


def test_phase_form_equals_nearest_upsampling_then_the_convolution():
    """In float64 the phase form, as a transposed convolution and as cropped phases, equals diffusers'
    interpolate-then-conv to rounding, for odd and even sizes and with the bias; a reference by hand
    (repeat_interleave, then conv2d) agrees with diffusers."""
    torch.manual_seed(3)
    up = Upsample2D(5, use_conv=True, out_channels=7).double()
    for h, w in ((1, 1), (4, 6), (5, 3)):
        x = torch.randn(2, 5, h, w, dtype=torch.float64)
        by_hand = torch.nn.functional.conv2d(x.repeat_interleave(2, 2).repeat_interleave(2, 3), up.conv.weight,
                                             up.conv.bias, padding=1)
        ref = up(x)
        assert ref.shape == (2, 7, 2 * h, 2 * w)
        torch.testing.assert_close(ref, by_hand, rtol=0, atol=1e-12)
        for transposed in (True, False, None):  # None: eager here, so the cropped phases
            torch.testing.assert_close(phase_upsample(x, up.conv, transposed), ref, rtol=0, atol=1e-12)


def test_compiled_code_takes_the_transposed_convolution_and_eager_code_the_cropped_phases(monkeypatch):
    """torch.compile traces the transposed convolution (the graph dynamo hands its backend holds it); an eager call
    runs the 2x2 phase convolution."""
    up = Upsample2D(4, use_conv=True, out_channels=4)
    x = torch.randn(1, 4, 3, 3)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    with torch.no_grad():
        out = torch.compile(lambda t: phase_upsample(t, up.conv), backend=backend, fullgraph=True)(x)
        torch.testing.assert_close(out, up(x), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 1 and "conv_transpose2d" in graphs[0] and "conv2d" not in graphs[0].replace(
        "conv_transpose2d", "")
    seen = []
    real = torch.nn.functional.conv2d
    monkeypatch.setattr(torch.nn.functional, "conv2d", lambda *a, **k: seen.append(a[1].shape) or real(*a, **k))
    phase_upsample(x, up.conv)
    assert seen == [(16, 4, 2, 2)]


def test_routing_a_decoder_on_off_and_through_a_deep_copy(tiny_vae):
    """A decoder's three upsamplers are routed (its parameters and their names unchanged), again routes none, and
    the decoded image differs from diffusers' path only by float32 rounding; off restores diffusers' path exactly;
    a deep copy in another dtype uses its own weights; an output_size call keeps diffusers' path."""
    vae = copy.deepcopy(tiny_vae)
    dec = vae.decoder
    z = torch.randn(2, 4, 8, 8)
    names = list(dec.state_dict())
    with torch.no_grad():
        ref = dec(z)
        assert phase_upsampling(dec) == 3 and phase_upsampling(dec) == 0
        assert list(dec.state_dict()) == names
        routed = dec(z)
        twin = copy.deepcopy(dec).double()
        assert phase_upsampling(dec, on=False) == 3
        assert torch.equal(dec(z), ref)
        torch.testing.assert_close(routed, ref, rtol=0, atol=1e-5)
        assert not torch.equal(routed, ref)  # the phase path ran, not diffusers'
        torch.testing.assert_close(twin(z.double()).float(), ref, rtol=0, atol=1e-5)
        up = next(m for m in twin.modules() if isinstance(m, Upsample2D))
        x = torch.randn(1, up.channels, 3, 3, dtype=torch.float64)
        assert torch.equal(up(x, output_size=(7, 5)), Upsample2D.forward(up, x, output_size=(7, 5)))


def test_load_vae_routes_the_decoder(tiny_weights):
    """Every loaded VAE decodes through the phase form."""
    from nbhelpers import models

    vae = models.load_vae(tiny_weights)
    ups = [m for m in vae.decoder.modules() if isinstance(m, Upsample2D)]
    assert ups and all("forward" in m.__dict__ for m in ups)
    assert phase_upsampling(vae.decoder, on=False) == len(ups)


@pytest.mark.gpu
def test_phase_form_on_cuda_in_fp16_is_within_one_level(tiny_vae):
    """On CUDA in fp16 the decoded images (the engine's decode to uint8) differ from diffusers' path by at most one
    level, eager and compiled, with the decoder's GroupNorms routed as models.load_vae routes them."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nbhelpers import latents
    from nbhelpers.groupnorm import channel_moment_norms

    vae = copy.deepcopy(tiny_vae).half().cuda()
    z = torch.randn(4, 4, 32, 32, device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(5))
    with torch.inference_mode():
        ref = latents.decode(z, vae).int()
        assert phase_upsampling(vae.decoder) == 3 and channel_moment_norms(vae.decoder) > 0
        eager = latents.decode(z, vae).int()
        vae.decoder.forward = torch.compile(vae.decoder.forward)
        compiled = latents.decode(z, vae).int()
    assert int((eager - ref).abs().max()) <= 1 and int((compiled - ref).abs().max()) <= 1
