"""GroupNorm for compiled channels-last code: the group statistics from per-channel moments.

``torch.compile`` keeps a decoder's activations channels-last (the convolutions' layout). Reduced per (sample,
group), as ``F.group_norm`` decomposes, each group's few channels are a short run of every pixel's row, so each
pass reads memory in small scattered pieces. Reduced per (sample, channel) over the pixels, every row is read whole.
The group's moments follow exactly from the channels' (law of total variance, equal channel sizes): the mean of the
channel means, and the mean over channels of ``var_c + (mean_c - mean_g) ** 2``. Statistics in at least float32, the
population variance (no correction) and ``(x - mean) / sqrt(var + eps) * weight + bias``, as ``nn.GroupNorm``
defines it (PyTorch documentation, ``torch.nn.GroupNorm``). Eager calls keep ``F.group_norm``.
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["channel_moment_norms", "compiling", "group_norm_from_channel_moments", "route_forward"]


def group_norm_from_channel_moments(x: Any, groups: int, weight: Any = None, bias: Any = None,
                                    eps: float = 1e-5) -> Any:
    """``F.group_norm(x, groups, weight, bias, eps)`` with the statistics from per-channel moments (module docstring).

    ``x``: (N, C, *spatial) float tensor, C divisible by ``groups``; ``weight``, ``bias``: (C,) or None. Returns
    ``x``'s shape and dtype. ValueError when C is not divisible by ``groups``."""
    import torch

    n, c = x.shape[:2]
    if c % groups:
        raise ValueError(f"GroupNorm over {c} channels in {groups} groups: the channels must divide evenly.")
    spatial = tuple(range(2, x.dim()))
    xf = x.to(acc := torch.promote_types(x.dtype, torch.float32))
    var_c, mean_c = torch.var_mean(xf, dim=spatial, correction=0)  # (N, C)
    mean_c, var_c = mean_c.view(n, groups, -1), var_c.view(n, groups, -1)
    mean_g = mean_c.mean(-1, keepdim=True)
    var_g = (var_c + (mean_c - mean_g) ** 2).mean(-1, keepdim=True)  # (N, G, 1)
    scale = torch.rsqrt(var_g + eps).expand(n, groups, c // groups)
    if weight is not None:
        scale = scale * weight.to(acc).view(groups, -1)
    shift = -mean_g * scale
    if bias is not None:
        shift = shift + bias.to(acc).view(groups, -1)
    tail = (1,) * len(spatial)
    return (xf * scale.reshape(n, c, *tail) + shift.reshape(n, c, *tail)).to(x.dtype)


def compiling() -> bool:
    """True while ``torch.compile`` traces the calling code (``torch.compiler.is_compiling``; torch < 2.3:
    ``torch._dynamo.is_compiling``)."""
    import torch

    check = getattr(getattr(torch, "compiler", None), "is_compiling", None) or torch._dynamo.is_compiling
    return bool(check())


def _forward(self: Any, x: Any) -> Any:
    if not compiling():
        return type(self).forward(self, x)
    return group_norm_from_channel_moments(x, self.num_groups, self.weight, self.bias, self.eps)


def route_forward(module: Any, function: Any, on: bool) -> bool:
    """Give ``module`` an instance ``forward``, ``function`` bound to it (``on``), or remove it (``on=False``), so
    that calls fall back to the class's ``forward``. The same bound method every time: compiled code that guards on
    it stays valid, and a deep copy binds its own. Returns whether ``module`` changed."""
    if ("forward" in module.__dict__) == on:
        return False
    if on:
        module.forward = module.__dict__.get("_routed_forward") or types.MethodType(function, module)
        module._routed_forward = module.forward
    else:
        del module.forward
    return True


def channel_moment_norms(model: Any, on: bool = True) -> int:
    """Route every ``nn.GroupNorm`` in ``model`` through :func:`group_norm_from_channel_moments` while it is being
    compiled (eager calls unchanged), or with ``on=False`` back. Parameters and their names are unchanged; a deep
    copy keeps the routing with its own parameters. Returns how many modules changed."""
    import torch

    return sum(route_forward(module, _forward, on) for module in model.modules()
               if isinstance(module, torch.nn.GroupNorm))
