"""BiSeNet, the face-parsing network of face-parsing.PyTorch (ResNet-18 context path, 19 CelebAMask-HQ classes).

Parameter names and shapes equal ``face-parse-bisent/79999_iter.pth``'s: ``cp.resnet.*``, ``cp.arm16/32``
(attention refinement), ``cp.conv_head16/32``, ``cp.conv_avg``, ``ffm`` (feature fusion) and the heads ``conv_out``
(main) and ``conv_out16/32`` (auxiliary). Convolutions have no bias and a BatchNorm (eps 1e-5) except the 1x1
attention and classifier ones. Imports torch.
Source: ``musetalk/utils/face_parsing/model.py:230-254``, ``resnet.py`` (docs/official-behaviour.md §7.3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .masks import N_CLASSES


class ConvBNReLU(nn.Module):
    """conv (no bias) -> BatchNorm -> ReLU. Keys: ``conv.weight``, ``bn.*``."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, padding: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class BasicBlock(nn.Module):
    """ResNet basic block; ``downsample`` (1x1 conv + BN) when the stride or the width changes."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        branch = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(shortcut + branch)


class ResNet18(nn.Module):
    """ResNet-18 trunk returning the 1/8, 1/16 and 1/32 feature maps (128, 256, 512 channels)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(64, 64), BasicBlock(64, 64))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512))

    def forward(self, x):
        x = self.layer1(self.maxpool(F.relu(self.bn1(self.conv1(x)))))
        feat8 = self.layer2(x)
        feat16 = self.layer3(feat8)
        feat32 = self.layer4(feat16)
        return feat8, feat16, feat32


def global_pool(x):
    return x.mean(dim=(2, 3), keepdim=True)


class AttentionRefinement(nn.Module):
    """Features times a channel attention (global pool -> 1x1 conv -> BN -> sigmoid)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = ConvBNReLU(cin, cout)
        self.conv_atten = nn.Conv2d(cout, cout, 1, bias=False)
        self.bn_atten = nn.BatchNorm2d(cout)

    def forward(self, x):
        feat = self.conv(x)
        return feat * torch.sigmoid(self.bn_atten(self.conv_atten(global_pool(feat))))


class ContextPath(nn.Module):
    """ResNet-18 plus attention refinement of the 1/16 and 1/32 maps, merged top-down (nearest upsampling)."""

    def __init__(self):
        super().__init__()
        self.resnet = ResNet18()
        self.arm16 = AttentionRefinement(256, 128)
        self.arm32 = AttentionRefinement(512, 128)
        self.conv_head32 = ConvBNReLU(128, 128)
        self.conv_head16 = ConvBNReLU(128, 128)
        self.conv_avg = ConvBNReLU(512, 128, kernel=1, padding=0)

    def forward(self, x):
        feat8, feat16, feat32 = self.resnet(x)
        context = self.conv_avg(global_pool(feat32))  # (N, 128, 1, 1), broadcast over the 1/32 map
        up32 = self.conv_head32(F.interpolate(self.arm32(feat32) + context, size=feat16.shape[2:], mode="nearest"))
        up16 = self.conv_head16(F.interpolate(self.arm16(feat16) + up32, size=feat8.shape[2:], mode="nearest"))
        return feat8, up16, up32  # 1/8 (128 ch), 1/8 (128 ch), 1/16 (128 ch)


class FeatureFusion(nn.Module):
    """Concatenate spatial and context features, 1x1 ConvBNReLU, then add a channel-attention copy."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.convblk = ConvBNReLU(cin, cout, kernel=1, padding=0)
        self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
        self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

    def forward(self, spatial, context):
        feat = self.convblk(torch.cat([spatial, context], dim=1))
        atten = torch.sigmoid(self.conv2(F.relu(self.conv1(global_pool(feat)))))
        return feat + feat * atten


class Head(nn.Module):
    """ConvBNReLU (3x3) followed by a 1x1 classifier to ``n_classes`` logits."""

    def __init__(self, cin: int, mid: int, n_classes: int):
        super().__init__()
        self.conv = ConvBNReLU(cin, mid)
        self.conv_out = nn.Conv2d(mid, n_classes, 1, bias=False)

    def forward(self, x):
        return self.conv_out(self.conv(x))


class BiSeNet(nn.Module):
    """BiSeNet face parser; its state dict equals ``79999_iter.pth``'s (191 entries, 13 313 119 values with the
    BatchNorm counters). ``forward`` returns the three heads, :meth:`parse` only the main one (MuseTalk's)."""

    def __init__(self, n_classes: int = N_CLASSES):
        super().__init__()
        self.cp = ContextPath()
        self.ffm = FeatureFusion(256, 256)
        self.conv_out = Head(256, 256, n_classes)
        self.conv_out16 = Head(128, 64, n_classes)
        self.conv_out32 = Head(128, 64, n_classes)

    def _upsample(self, logits, size):
        return F.interpolate(logits, size=size, mode="bilinear", align_corners=True)

    def parse(self, x):
        """``forward(x)[0]``: main-head logits (N, n_classes, H, W) of (N, 3, H, W) inputs, H and W multiples of 32."""
        feat8, context8, _ = self.cp(x)
        return self._upsample(self.conv_out(self.ffm(feat8, context8)), x.shape[2:])

    def forward(self, x):
        """(main, aux16, aux32) logits, each (N, n_classes, H, W), upsampled bilinearly (align_corners=True)."""
        feat8, context8, context16 = self.cp(x)
        heads = self.conv_out(self.ffm(feat8, context8)), self.conv_out16(context8), self.conv_out32(context16)
        return tuple(self._upsample(h, x.shape[2:]) for h in heads)
