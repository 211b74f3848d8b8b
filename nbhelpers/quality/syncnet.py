"""SyncNet v2's weight file: what a model must offer, loading the published file, and a writer of random weights.

Importing this module loads no torch; the network (:mod:`nbhelpers.quality.network`) loads when SyncNet is built.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import models, weights
from ..errors import INSTALL_TORCH, CheckpointError, WeightsError, require
from ..hashing import atomic_path

__all__ = ["SYNCNET_FILE", "SyncEmbedder", "load_syncnet", "write_tiny_syncnet"]

SYNCNET_FILE = "syncnet/syncnet_v2.model"  # relative to a weights dir; manifest entry "syncnet-v2", set "quality"


@runtime_checkable
class SyncEmbedder(Protocol):
    """What :func:`~nbhelpers.quality.sync_score` needs from a model: one embedding per video and audio window.

    ``embed_video(stacks)``: (B, 3, 5, 224, 224) float32 BGR 0..255 (channels, time, rows, columns) -> (B, D).
    ``embed_audio(windows)``: (B, 1, 13, 20) float32 MFCC windows -> (B, D). Both return numpy float arrays."""

    def embed_video(self, stacks: np.ndarray) -> np.ndarray: ...

    def embed_audio(self, windows: np.ndarray) -> np.ndarray: ...


def load_syncnet(weights_dir: str | os.PathLike | None = None, device: str | None = None) -> Any:
    """SyncNet v2 (float32, eval) loaded from ``syncnet/syncnet_v2.model`` under ``weights_dir`` (None = the default),
    on ``device`` (None = CUDA when available), as a :class:`SyncEmbedder`.

    Read through :func:`nbhelpers.models.load_checkpoint`; the BatchNorm ``num_batches_tracked`` entries a pre-0.4.1
    torch file lacks are kept at 0. MissingDependencyError without torch; WeightsError when the file is missing
    (with the download command) or unreadable; CheckpointError when names or shapes differ from SyncNet v2's.
    Source: syncnet_python ``SyncNetInstance.py`` ``loadParameters``."""
    torch = require("torch", INSTALL_TORCH)
    network = require("nbhelpers.quality.network", INSTALL_TORCH)
    root = weights.resolve_dir(weights_dir)
    path, hint = root / SYNCNET_FILE, f"{weights.DOWNLOAD_COMMAND} --weights {shlex.quote(str(root))} --sets quality"
    if not path.is_file() and weights.is_tiny(root):  # not a folder to download real weights into
        raise WeightsError(f"the SyncNet weights are missing: {root} holds tiny random test weights. LSE-D/LSE-C "
                           "need the optional 'quality' weight set (about 52 MB) in a folder of real weights: run "
                           f"`{weights.DOWNLOAD_COMMAND} --sets quality` (into {weights.default_dir()}) and score "
                           "with that folder (or pass weights_dir= the folder that holds syncnet/syncnet_v2.model). "
                           "The mouth-audio lag needs no weights.")
    if not path.is_file():
        raise WeightsError(f"the SyncNet weights are missing: {path}. LSE-D/LSE-C need the optional 'quality' "
                           f"weight set (about 52 MB): run `{hint}` (or pass weights_dir= the folder "
                           "that holds syncnet/syncnet_v2.model). The mouth-audio lag needs no weights.")
    exp = weights.expected_facts(root, "syncnet-v2")
    state = models.load_checkpoint(path, trusted_sha256=exp.sha256, expected_size=None, mmap=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict of SyncNet v2 parameters; "
                              f"delete it and run `{hint}`.")
    with torch.device("meta"):
        net = network.SyncNetV2()
    state = dict(state)
    for key, value in net.state_dict().items():
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = torch.zeros((), dtype=value.dtype)
    models.check_state_dict(net, state, path, "SyncNet v2")
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    net = network.SyncNetV2()
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    return network.TorchEmbedder(net.to(dev), dev)


def write_tiny_syncnet(directory: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write and return ``<directory>/syncnet/syncnet_v2.model``: the real (52 MB) network with random weights
    (``seed``), a plain state dict without ``num_batches_tracked``, in the legacy non-zip torch format."""
    torch = require("torch", INSTALL_TORCH)
    network = require("nbhelpers.quality.network", INSTALL_TORCH)
    torch.manual_seed(int(seed))
    net = network.SyncNetV2()
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    out = Path(directory) / SYNCNET_FILE
    with atomic_path(out) as tmp:
        torch.save(state, str(tmp), _use_new_zipfile_serialization=False)
    return out
