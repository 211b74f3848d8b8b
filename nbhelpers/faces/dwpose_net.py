"""DWPose's network in plain torch, without mmcv, mmdet or mmpose: RTMPose-l whole-body 384x288, a CSPNeXt-P5
backbone and an RTMCC head, with the parameter names and shapes of ``dwpose/dw-ll_ucoco_384.pth``. Imports torch.

Source: rtmpose-l_8xb32-270e_coco-ubody-wholebody-384x288.py:53-100 (docs/official-behaviour.md §3.1); CSPNeXt as in
RTMDet (Lyu et al. 2022, arXiv:2212.07784), the RTMCC head and its GAU as in RTMPose (Jiang et al. 2023,
arXiv:2303.07399) and "Transformer Quality in Linear Time" (Hua et al. 2022, arXiv:2202.10447).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from . import dwpose_codec as codec

__all__ = ["CSPNeXt", "ConvBNAct", "GatedAttentionUnit", "RTMCCHead", "RTMPoseWholebody", "ScaleNorm", "fuse_batchnorm"]

# ---- architecture facts (rtmpose-...py:53-99; CSPNeXt P5 arch settings) --------------------------------------
#: CSPNeXt-P5 stages: (in channels, out channels, CSP blocks, identity in the blocks, SPP before the CSP layer).
CSPNEXT_P5 = ((64, 128, 3, True, False), (128, 256, 6, True, False), (256, 512, 6, True, False),
              (512, 1024, 3, False, True))
EXPAND_RATIO = 0.5        # CSP layer: hidden channels = out x 0.5
BLOCK_KERNEL = 5          # the depthwise conv of a CSPNeXt block
SPP_KERNELS = (5, 9, 13)  # max-pool sizes of the SPP bottleneck (stride 1, same padding)
BN_EPS = 1e-5             # config norm_cfg=dict(type='SyncBN') gives no eps: the SyncBatchNorm default 1e-5
HEAD_IN_CHANNELS = 1024
FEATURE_MAP = (9, 12)     # (w, h) of the backbone output: 288/32 x 384/32
FINAL_KERNEL = 7          # head.final_layer kernel (padding 3)
GAU_HIDDEN = 256          # token width
GAU_S = 128               # width of the shared q/k base
GAU_EXPANSION = 2         # u and v width = 2 x 256
SCALE_NORM_EPS = 1e-5


class ConvBNAct(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d (eps 1e-5) -> SiLU; same padding. Names ``conv``, ``bn``."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS)

    def forward(self, x):
        return F.silu(self.bn(self.conv(x)))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the (eval-mode) BatchNorm into the conv: ``w' = w * g / sqrt(var + eps)``,
        ``b' = beta - mean * g / sqrt(var + eps)``; ``bn`` becomes an identity. Inference only; idempotent."""
        if isinstance(self.bn, nn.Identity):
            return
        bn, conv = self.bn, self.conv
        factor = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
        fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                          groups=conv.groups, bias=True, device=conv.weight.device, dtype=conv.weight.dtype)
        fused.weight.copy_((conv.weight.double() * factor.view(-1, 1, 1, 1)).to(conv.weight.dtype))
        fused.bias.copy_((bn.bias.double() - bn.running_mean.double() * factor).to(conv.weight.dtype))
        self.conv, self.bn = fused, nn.Identity()


class DepthwiseSeparable(nn.Module):
    """Depthwise k x k ConvBNAct, then pointwise 1x1 ConvBNAct (both with norm and SiLU)."""

    def __init__(self, c_in: int, c_out: int, kernel: int):
        super().__init__()
        self.depthwise_conv = ConvBNAct(c_in, c_in, kernel, groups=c_in)
        self.pointwise_conv = ConvBNAct(c_in, c_out, 1)

    def forward(self, x):
        return self.pointwise_conv(self.depthwise_conv(x))


class CSPNeXtBlock(nn.Module):
    """3x3 ConvBNAct, then a 5x5 depthwise-separable conv; plus the input when ``identity``."""

    def __init__(self, channels: int, identity: bool):
        super().__init__()
        self.identity = identity
        self.conv1 = ConvBNAct(channels, channels, 3)
        self.conv2 = DepthwiseSeparable(channels, channels, BLOCK_KERNEL)

    def forward(self, x):
        out = self.conv2(self.conv1(x))
        return out + x if self.identity else out


class ChannelAttention(nn.Module):
    """``x * hardsigmoid(fc(global mean of x))`` with ``fc`` a 1x1 conv with bias (RTMDet's channel attention)."""

    def __init__(self, channels: int):
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, 1, bias=True)

    def forward(self, x):
        return x * F.hardsigmoid(self.fc(x.mean(dim=(2, 3), keepdim=True)))


class CSPLayer(nn.Module):
    """Cross-stage partial layer: ``final(attention(cat(blocks(main(x)), short(x))))``; 1x1 convs, width / 2."""

    def __init__(self, channels: int, n_blocks: int, identity: bool):
        super().__init__()
        mid = int(channels * EXPAND_RATIO)
        self.main_conv = ConvBNAct(channels, mid, 1)
        self.short_conv = ConvBNAct(channels, mid, 1)
        self.final_conv = ConvBNAct(2 * mid, channels, 1)
        self.blocks = nn.Sequential(*[CSPNeXtBlock(mid, identity) for _ in range(n_blocks)])
        self.attention = ChannelAttention(2 * mid)

    def forward(self, x):
        both = torch.cat([self.blocks(self.main_conv(x)), self.short_conv(x)], dim=1)
        return self.final_conv(self.attention(both))


class SPPBottleneck(nn.Module):
    """1x1 conv to half width, concat with its 5/9/13 max-pools (stride 1), 1x1 conv back."""

    def __init__(self, channels: int):
        super().__init__()
        mid = channels // 2
        self.conv1 = ConvBNAct(channels, mid, 1)
        self.conv2 = ConvBNAct(mid * (len(SPP_KERNELS) + 1), channels, 1)

    def forward(self, x):
        x = self.conv1(x)
        pools = [F.max_pool2d(x, k, stride=1, padding=k // 2) for k in SPP_KERNELS]
        return self.conv2(torch.cat([x, *pools], dim=1))


class CSPNeXt(nn.Module):
    """CSPNeXt-P5 "l": a 3-conv stem (stride 2) and four stages (stride-2 conv, [SPP], CSP layer).

    ``forward`` takes (N, 3, 384, 288) and returns the last stage, (N, 1024, 12, 9)."""

    def __init__(self):
        super().__init__()
        stem = CSPNEXT_P5[0][0]
        self.stem = nn.Sequential(ConvBNAct(3, stem // 2, 3, stride=2), ConvBNAct(stem // 2, stem // 2, 3),
                                  ConvBNAct(stem // 2, stem, 3))
        for i, (c_in, c_out, n_blocks, identity, spp) in enumerate(CSPNEXT_P5, start=1):
            layers = [ConvBNAct(c_in, c_out, 3, stride=2)]
            if spp:
                layers.append(SPPBottleneck(c_out))
            layers.append(CSPLayer(c_out, n_blocks, identity))
            setattr(self, f"stage{i}", nn.Sequential(*layers))

    def forward(self, x):
        x = self.stem(x)
        for i in range(1, len(CSPNEXT_P5) + 1):
            x = getattr(self, f"stage{i}")(x)
        return x


class ScaleNorm(nn.Module):
    """``x / max(||x||_2 / sqrt(d), eps) * g`` over the last axis, one learned scalar ``g``; in float32."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = dim ** -0.5
        self.g = nn.Parameter(torch.ones(1))

    def forward(self, x):
        xf = x.float()
        norm = (torch.linalg.vector_norm(xf, dim=-1, keepdim=True) * self.scale).clamp(min=SCALE_NORM_EPS)
        return (xf / norm * self.g.float()).to(x.dtype)


class Scale(nn.Module):
    """Element-wise learned scale vector (the GAU's residual scale)."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.scale


class GatedAttentionUnit(nn.Module):
    """RTMPose's GAU over the K keypoint tokens (self-attention, no relative bias, no rotary encoding).

    ``h = ScaleNorm(x)``; ``u, v, z = split(SiLU(h W_uv), [e, e, s])`` with e = 512, s = 128;
    ``q, k = z * gamma_i + beta_i``; ``A = relu(q k^T / sqrt(s))^2``; ``out = x * res_scale + (u * (A v)) W_o``."""

    def __init__(self, dim: int = GAU_HIDDEN, s: int = GAU_S, expansion: int = GAU_EXPANSION):
        super().__init__()
        self.e = int(dim * expansion)
        self.s = s
        self.uv = nn.Linear(dim, 2 * self.e + s, bias=False)
        self.o = nn.Linear(self.e, dim, bias=False)
        self.gamma = nn.Parameter(torch.rand(2, s))
        self.beta = nn.Parameter(torch.rand(2, s))
        self.ln = ScaleNorm(dim)
        self.res_scale = Scale(dim)

    def forward(self, x):
        uv = F.silu(self.uv(self.ln(x)))
        u, v, base = torch.split(uv, [self.e, self.e, self.s], dim=-1)
        qk = base.unsqueeze(2) * self.gamma + self.beta  # (N, K, 2, s)
        q, k = qk[:, :, 0], qk[:, :, 1]
        kernel = F.relu(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.s)).square()  # (N, K, K)
        return self.res_scale(x) + self.o(u * torch.bmm(kernel, v))


class RTMCCHead(nn.Module):
    """RTMCC head: 7x7 conv to K maps, flatten (K, 108), ScaleNorm + linear to 256, GAU, SimCC classifiers.

    ``forward`` takes (N, 1024, 12, 9) and returns ``(simcc_x (N, 133, 576), simcc_y (N, 133, 768))`` in
    float32. Everything after ``final_layer`` runs in the dtype of ``cls_x`` (float32 in
    :class:`~nbhelpers.faces.dwpose_torch.DWPoseTorch`)."""

    def __init__(self):
        super().__init__()
        tokens = FEATURE_MAP[0] * FEATURE_MAP[1]
        self.final_layer = nn.Conv2d(HEAD_IN_CHANNELS, codec.NUM_KEYPOINTS, FINAL_KERNEL, padding=FINAL_KERNEL // 2)
        self.mlp = nn.Sequential(ScaleNorm(tokens), nn.Linear(tokens, GAU_HIDDEN, bias=False))
        self.gau = GatedAttentionUnit()
        self.cls_x = nn.Linear(GAU_HIDDEN, codec.SIMCC_X_BINS, bias=False)
        self.cls_y = nn.Linear(GAU_HIDDEN, codec.SIMCC_Y_BINS, bias=False)

    def forward(self, feats):
        f = torch.flatten(self.final_layer(feats), 2).to(self.cls_x.weight.dtype)
        f = self.gau(self.mlp(f))
        return self.cls_x(f).float(), self.cls_y(f).float()


class RTMPoseWholebody(nn.Module):
    """RTMPose-l whole-body 384x288: ``backbone`` (CSPNeXt) + ``head`` (RTMCC); 33.6 M parameters.

    ``forward(x)``: x (N, 3, 384, 288) normalised RGB -> ``(simcc_x (N, 133, 576), simcc_y (N, 133, 768))``
    float32 raw SimCC vectors (no softmax), as the published ONNX file's outputs."""

    def __init__(self):
        super().__init__()
        self.backbone = CSPNeXt()
        self.head = RTMCCHead()

    def forward(self, x):
        return self.head(self.backbone(x))


def fuse_batchnorm(model):
    """A copy of an :class:`RTMPoseWholebody` with every BatchNorm folded into its conv: the same function up to
    float rounding (about 1e-6 relative in float32), 75 fewer layers, no ``bn`` keys (not for saving)."""
    fused = copy.deepcopy(model).eval()
    for module in fused.modules():
        if isinstance(module, ConvBNAct):
            module.fuse()
    return fused
