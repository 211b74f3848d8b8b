"""SyncNet v2, the network of ``syncnet_v2.model``, and the embedder that runs it on numpy windows.

This module imports torch; :func:`nbhelpers.quality.load_syncnet` loads it when SyncNet is first built.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["SyncNetV2", "TorchEmbedder"]


def _conv_bn(conv: nn.Module, channels: int, bn: type[nn.Module], pool: nn.Module | None = None) -> list[nn.Module]:
    layers = [conv, bn(channels), nn.ReLU(inplace=True)]
    return layers + ([pool] if pool is not None else [])


class SyncNetV2(nn.Module):
    """SyncNet v2, the model of ``syncnet_v2.model``: an audio and a lip stream, 1024-d embeddings each.

    Layer order and indices are those of the published ``SyncNetModel.S``, so the checkpoint's names
    (``netcnnaud.0.weight`` ... ``netcnnlip.19.running_var``) load unchanged.

    Source: syncnet_python ``SyncNetModel.py`` (class ``S``)."""

    def __init__(self):
        super().__init__()
        c2, b2, p2 = nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d
        self.netcnnaud = nn.Sequential(
            *_conv_bn(c2(1, 64, (3, 3), (1, 1), (1, 1)), 64, b2, p2((1, 1), (1, 1))),
            *_conv_bn(c2(64, 192, (3, 3), (1, 1), (1, 1)), 192, b2, p2((3, 3), (1, 2))),
            *_conv_bn(c2(192, 384, (3, 3), padding=(1, 1)), 384, b2),
            *_conv_bn(c2(384, 256, (3, 3), padding=(1, 1)), 256, b2),
            *_conv_bn(c2(256, 256, (3, 3), padding=(1, 1)), 256, b2, p2((3, 3), (2, 2))),
            *_conv_bn(c2(256, 512, (5, 4), padding=(0, 0)), 512, b2),
        )
        self.netfcaud = nn.Sequential(nn.Linear(512, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 1024))
        self.netfclip = nn.Sequential(nn.Linear(512, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 1024))
        c3, b3, p3 = nn.Conv3d, nn.BatchNorm3d, nn.MaxPool3d
        self.netcnnlip = nn.Sequential(
            *_conv_bn(c3(3, 96, (5, 7, 7), (1, 2, 2), 0), 96, b3, p3((1, 3, 3), (1, 2, 2))),
            *_conv_bn(c3(96, 256, (1, 5, 5), (1, 2, 2), (0, 1, 1)), 256, b3, p3((1, 3, 3), (1, 2, 2), (0, 1, 1))),
            *_conv_bn(c3(256, 256, (1, 3, 3), padding=(0, 1, 1)), 256, b3),
            *_conv_bn(c3(256, 256, (1, 3, 3), padding=(0, 1, 1)), 256, b3),
            *_conv_bn(c3(256, 256, (1, 3, 3), padding=(0, 1, 1)), 256, b3, p3((1, 3, 3), (1, 2, 2))),
            *_conv_bn(c3(256, 512, (1, 6, 6), padding=0), 512, b3),
        )

    def forward_aud(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 1, 13, 20) MFCC windows -> (B, 1024) audio embeddings."""
        mid = self.netcnnaud(x)
        return self.netfcaud(mid.reshape(mid.shape[0], -1))

    def forward_lip(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, 5, 224, 224) BGR 0..255 -> (B, 1024) video embeddings."""
        mid = self.netcnnlip(x)
        return self.netfclip(mid.reshape(mid.shape[0], -1))


class TorchEmbedder:
    """A :class:`~nbhelpers.quality.SyncEmbedder` over a :class:`SyncNetV2` on one device, inference mode, eval BN."""

    def __init__(self, net: SyncNetV2, device: Any):
        self.net = net.eval()
        self.device = device

    def _run(self, fn: Any, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)
            return fn(t).float().cpu().numpy()

    def embed_video(self, stacks: np.ndarray) -> np.ndarray:
        return self._run(self.net.forward_lip, stacks)

    def embed_audio(self, windows: np.ndarray) -> np.ndarray:
        return self._run(self.net.forward_aud, windows)

    def __repr__(self) -> str:
        return f"SyncNetV2 embedder on {self.device}"
