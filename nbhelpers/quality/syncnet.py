"""SyncNet v2's weight file: what a model must offer, loading the published file, and a writer of random weights.

Importing this module imports numpy only; torch and the network (:mod:`nbhelpers.quality.network`) are loaded when
SyncNet is built.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import models, weights
from ..errors import CheckpointError, WeightsError, require

__all__ = ["SYNCNET_FILE", "SyncEmbedder", "load_syncnet", "write_tiny_syncnet"]

SYNCNET_FILE = "syncnet/syncnet_v2.model"  # relative to a weights dir; manifest entry "syncnet-v2", set "quality"
INSTALL_TORCH = "pip install torch  (on Colab it is preinstalled; never reinstall it there)"


@runtime_checkable
class SyncEmbedder(Protocol):
    """What :func:`~nbhelpers.quality.sync_score` needs from a model: one embedding per video and audio window.

    ``embed_video(stacks)``: (B, 3, 5, 224, 224) float32 BGR 0..255 (channels, time, rows, columns) -> (B, D).
    ``embed_audio(windows)``: (B, 1, 13, 20) float32 MFCC windows -> (B, D). Both return numpy float arrays.
    """

    def embed_video(self, stacks: np.ndarray) -> np.ndarray: ...

    def embed_audio(self, windows: np.ndarray) -> np.ndarray: ...


def _download_hint() -> str:
    return f"{weights.DOWNLOAD_COMMAND} --sets quality"


def load_syncnet(weights_dir: str | os.PathLike | None = None, device: str | None = None) -> Any:
    """Build SyncNet v2 and load ``syncnet/syncnet_v2.model`` unchanged; returns a :class:`SyncEmbedder`.

    Loading goes through :func:`nbhelpers.models.load_checkpoint`: the file is inspected first (web pages, git-lfs
    pointers and cut-off files are refused) and read with ``torch.load(weights_only=True)``, which unpickles
    tensors and plain containers only. The published file is a state dict (syncnet_python's ``loadParameters``
    iterates ``loaded_state.items()`` and copies each tensor into the model; current syncnet_python and
    LatentSync load it with ``weights_only=True``), so no code is ever unpickled from it. Only if a file were a
    full pickle would ``load_checkpoint`` unpickle it, and then only when its sha256 equals the one the hub
    reported at download time; a non-state-dict result is refused. The checkpoint may come from torch < 0.4.1
    without BatchNorm ``num_batches_tracked`` entries (unused in eval mode); they are then kept at 0.

    Args:
        weights_dir: The weights dir; None = :func:`nbhelpers.weights.default_dir`.
        device: ``"cuda"``, ``"cpu"``...; None = CUDA when available.

    Returns:
        A :class:`SyncEmbedder` (``embed_video``, ``embed_audio``) wrapping the network in eval mode, float32.

    Raises:
        WeightsError: The file is missing (the message gives the download command) or unreadable.
        CheckpointError: Names or shapes differ from SyncNet v2's.

    Source: syncnet_python SyncNetInstance.py ``loadParameters``; download_model.sh (``syncnet_v2.model``).
    """
    import torch

    network = require("nbhelpers.quality.network", INSTALL_TORCH)
    root = Path(weights_dir).expanduser() if weights_dir is not None else weights.default_dir()
    path = root / SYNCNET_FILE
    if not path.is_file():
        raise WeightsError(f"the SyncNet weights are missing: {path}. LSE-D/LSE-C need the optional 'quality' "
                           f"weight set (about 52 MB): run `{_download_hint()}` (or pass weights_dir= the folder "
                           "that holds syncnet/syncnet_v2.model). mouth_audio_lag needs no weights.")
    exp = weights.expected_facts(root, "syncnet-v2")
    state = models.load_checkpoint(path, trusted_sha256=exp.sha256, expected_size=None, mmap=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict of SyncNet v2 parameters; "
                              f"delete it and run `{_download_hint()}`.")
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


def write_tiny_syncnet(directory: str | os.PathLike, *, seed: int = 0, legacy: bool = True) -> Path:
    """Write ``<directory>/syncnet/syncnet_v2.model``: random weights in the published architecture and format.

    SyncNet v2 is small (13.6 M parameters, about 52 MB), so this is the real network. The file is a plain state
    dict without ``num_batches_tracked`` (as a pre-0.4.1 torch saved it), in the legacy (non-zip) torch format by
    default, the format of a 2018 file.

    Args:
        directory: The weights dir.
        seed: Seed of the random weights.
        legacy: Write the legacy pickle format (``_use_new_zipfile_serialization=False``); False = zip format.

    Returns:
        The path written (under a temporary name, then renamed).

    Source: syncnet_python SyncNetModel.py (the architecture), download_model.sh (the file name).
    """
    import torch

    network = require("nbhelpers.quality.network", INSTALL_TORCH)
    torch.manual_seed(int(seed))
    net = network.SyncNetV2()
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    out = Path(directory) / SYNCNET_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(state, str(tmp), _use_new_zipfile_serialization=not legacy)
    os.replace(tmp, out)
    return out
