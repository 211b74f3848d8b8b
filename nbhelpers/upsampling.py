"""The VAE decoder's upsampling: nearest 2x then a 3x3 convolution, computed as one transposed convolution.

Output pixel ``(2i + a, 2j + b)`` of nearest-2x upsampling followed by a 3x3, padding-1 convolution reads input rows
``i - 1 + a`` and ``i + a`` (and the same for columns): row taps ``(w0, w1 + w2)`` for ``a = 0`` and ``(w0 + w1, w2)``
for ``a = 1``. A stride-2 transposed convolution with a 4x4 kernel writes input row ``i`` to output rows
``2i - 1 + k``, ``k = 0..3`` (padding 1; PyTorch's ``conv_transpose2d``), so output row ``2i`` takes kernel rows
``k = 1, 3`` from input rows ``i, i - 1`` and row ``2i + 1`` kernel rows ``k = 0, 2`` from rows ``i + 1, i``. Kernel
rows ``(w2, w1 + w2, w0 + w1, w0)``, and the same for columns, give exactly those sums: in real arithmetic the same
output with 16 multiply-adds per input pixel and output channel instead of 36, no upsampled tensor, and the four
phases written in place by the library's kernel. Eagerly the same taps run as one 2x2 convolution with four times
the output channels over the input padded by one, each phase cropped at its offset and interleaved: faster than the
transposed kernel there, slower compiled (``bench/RESULTS.md``). Source: diffusers ``Upsample2D``
(``F.interpolate(scale_factor=2.0, mode="nearest")`` then ``conv``), as the sd-vae-ft-mse decoder uses it.
"""

from __future__ import annotations

from typing import Any

from .groupnorm import compiling, route_forward

__all__ = ["phase_upsample", "phase_upsampling"]


def phase_upsample(x: Any, conv: Any, transposed: bool | None = None) -> Any:
    """``conv(F.interpolate(x, scale_factor=2, mode="nearest"))`` for a 3x3, stride-1, padding-1 ``conv``: as one
    transposed convolution (``transposed``; None: while ``torch.compile`` traces) or as a cropped 2x2 convolution of
    the four phases (module docstring).

    ``x``: (B, C, H, W) float tensor; returns (B, O, 2H, 2W) in ``x``'s dtype. The tap sums are formed in at least
    float32 from the live weights on every call, so a later ``.to()`` or weight change is followed.
    """
    import torch
    import torch.nn.functional as F

    w = conv.weight.to(torch.promote_types(conv.weight.dtype, torch.float32))  # (O, C, 3, 3)

    def taps(t: Any, dim: int) -> Any:  # kernel rows k = 0..3 of the transposed convolution
        w0, w1, w2 = t.unbind(dim)
        return torch.stack([w2, w1 + w2, w0 + w1, w0], dim)

    kernel = taps(taps(w, 2), 3)  # (O, C, 4, 4)
    bias = None if conv.bias is None else conv.bias.to(x.dtype)
    if compiling() if transposed is None else transposed:
        return F.conv_transpose2d(x, kernel.transpose(0, 1).to(x.dtype), bias, stride=2, padding=1)
    # Phase a reads input rows i - 1 + a and i + a: kernel rows (3, 1) for a = 0, (2, 0) for a = 1; columns alike.
    phases = kernel[:, :, [3, 1, 2, 0]][..., [3, 1, 2, 0]].view(-1, w.shape[1], 2, 2, 2, 2)  # (O, C, a, r, b, s)
    phases = phases.permute(2, 4, 0, 1, 3, 5).reshape(4 * w.shape[0], w.shape[1], 2, 2)  # (a, b, O) x C x 2 x 2
    n, o, (h, wd) = x.shape[0], w.shape[0], x.shape[-2:]
    y = F.conv2d(F.pad(x, (1, 1, 1, 1)), phases.to(x.dtype), None if bias is None else bias.repeat(4))
    y = y.view(n, 2, 2, o, h + 1, wd + 1)
    out = torch.stack([torch.stack([y[:, a, b, :, a:a + h, b:b + wd] for b in (0, 1)], -1) for a in (0, 1)], 3)
    return out.reshape(n, o, 2 * h, 2 * wd)  # (n, o, h, 2, w, 2): row 2i + a, column 2j + b


def _phase_forward(self: Any, hidden_states: Any, output_size: Any = None, *args: Any, **kwargs: Any) -> Any:
    if output_size is not None:
        return type(self).forward(self, hidden_states, output_size, *args, **kwargs)
    return phase_upsample(hidden_states, self.conv)


def phase_upsampling(decoder: Any, on: bool = True) -> int:
    """Route each nearest-2x ``Upsample2D`` with a 3x3 convolution in ``decoder`` through :func:`phase_upsample`
    (parameters and their names unchanged, a deep copy included), or with ``on=False`` back to diffusers' own path.
    Calls that pass an ``output_size`` keep diffusers' path. Returns how many modules changed."""
    def routable(module: Any) -> bool:
        conv = getattr(module, "conv", None)
        return (type(module).__name__ == "Upsample2D" and conv is not None and getattr(module, "use_conv", False)
                and not getattr(module, "use_conv_transpose", False) and getattr(module, "norm", None) is None
                and getattr(module, "interpolate", True) is True
                and (*conv.kernel_size, *conv.padding, *conv.stride, *conv.dilation, conv.groups) == (3, 3) + (1,) * 7)

    return sum(route_forward(module, _phase_forward, on) for module in decoder.modules() if routable(module))
