"""GroupNorm statistics from per-channel moments (nbhelpers.groupnorm) against PyTorch's own group_norm."""

import copy

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from nbhelpers import groupnorm  # noqa: E402
from nbhelpers.groupnorm import channel_moment_norms, group_norm_from_channel_moments  # noqa: E402


@pytest.mark.parametrize("shape,groups", [((2, 8, 5, 3), 4), ((3, 6, 7), 3), ((1, 32, 4, 4), 32), ((2, 4, 1, 1), 1)])
def test_channel_moments_give_group_norm(shape, groups):
    """In float64 the result equals F.group_norm to rounding, with and without the affine parameters, for a
    channels-last input and channel means far from zero (the law of total variance, not E[x^2] - E[x]^2)."""
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64) * 3 + torch.arange(shape[1], dtype=torch.float64).view(
        1, -1, *[1] * (len(shape) - 2)) * 50
    if x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    w, b = torch.randn(shape[1], dtype=torch.float64), torch.randn(shape[1], dtype=torch.float64)
    for weight, bias in ((w, b), (None, None), (w, None)):
        ref = F.group_norm(x, groups, weight, bias, 1e-6)
        got = group_norm_from_channel_moments(x, groups, weight, bias, 1e-6)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-9)


def test_half_input_keeps_its_dtype_and_matches_within_half_rounding():
    torch.manual_seed(1)
    x = (torch.randn(2, 16, 8, 8) * 4 + 2).half()
    norm = torch.nn.GroupNorm(4, 16).half()
    torch.nn.init.normal_(norm.weight)
    with torch.no_grad():
        out = group_norm_from_channel_moments(x, 4, norm.weight, norm.bias, norm.eps)
        ref = F.group_norm(x.float(), 4, norm.weight.float(), norm.bias.float(), norm.eps)
    assert out.dtype == torch.float16
    assert float((out.float() - ref).abs().max()) < 4e-3 * float(ref.abs().max())


def test_channels_that_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="divide evenly"):
        group_norm_from_channel_moments(torch.zeros(1, 6, 2, 2), 4)


def test_routing_applies_while_compiling_only(monkeypatch):
    """Routed modules use the moments path while compiling and F.group_norm eagerly; off routes none back; a deep
    copy keeps the routing with its own parameters; a traced graph has no break."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.GroupNorm(2, 8), torch.nn.SiLU(), torch.nn.GroupNorm(4, 8, eps=1e-3))
    for m in model:
        if isinstance(m, torch.nn.GroupNorm):
            torch.nn.init.normal_(m.weight), torch.nn.init.normal_(m.bias)
    x = torch.randn(2, 8, 6, 6) + 5
    with torch.no_grad():
        ref = model(x)
        assert channel_moment_norms(model) == 2 and channel_moment_norms(model) == 0
        calls = []
        real = groupnorm.group_norm_from_channel_moments
        monkeypatch.setattr(groupnorm, "group_norm_from_channel_moments", lambda *a: calls.append(1) or real(*a))
        torch.testing.assert_close(model(x), ref, rtol=0, atol=0)
        assert calls == []
        monkeypatch.setattr(groupnorm, "compiling", lambda: True)
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)
        assert len(calls) == 2
        twin = copy.deepcopy(model)
        twin[0].weight.mul_(2)
        calls.clear()
        assert not torch.allclose(twin(x), model(x)) and len(calls) == 4
        monkeypatch.undo()
        traced = torch.compile(model, backend="eager", fullgraph=True)
        torch.testing.assert_close(traced(x), ref, rtol=1e-5, atol=1e-5)
        assert channel_moment_norms(model, on=False) == 2
        assert all("forward" not in m.__dict__ for m in model)
