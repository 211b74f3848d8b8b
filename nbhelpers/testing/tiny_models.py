"""Tiny and random weights of the core models in their official files: UNet, sd-vae, whisper, BiSeNet.

The tiny UNet, VAE and whisper have the real block types at small widths; BiSeNet is the full network with random
weights. Files are written through temporary names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import models, parsing
from ..constants import VERSIONS
from ..hashing import atomic_path

if TYPE_CHECKING:
    import torch

TINY_UNET_CHANGES = {"block_out_channels": [32, 64, 64, 64], "norm_num_groups": 8}  # same blocks, small widths


def _atomic_torch_save(obj: Any, path: Path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, str(tmp))


def _atomic_json(data: Mapping[str, Any], path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _atomic_safetensors(state: Mapping[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file  # the same library the loaders read with

    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})


def tiny_unet_config() -> dict[str, Any]:
    """The real UNet config with ``block_out_channels`` [32, 64, 64, 64] and 8 norm groups."""
    return {**models.unet_config("v15"), **TINY_UNET_CHANGES}


def write_tiny_unet(directory: str | os.PathLike, versions: Sequence[str] = ("v15",)) -> list[Path]:
    """Write tiny random UNets into weights dir ``directory`` in the official formats (``musetalk.json`` and a
    ``torch.save`` state dict) and return the paths: ``"v15"`` in ``versions`` writes ``musetalkV15/{musetalk.json,
    unet.pth}``, ``"v1"`` ``musetalk/{musetalk.json, pytorch_model.bin}`` (other random weights).
    Source: ``musetalk/utils/utils.py:206-243``."""
    import torch

    root = Path(directory)
    out = []
    cfg = tiny_unet_config()
    for version in versions:  # checked by make_tiny_weights
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1000 + VERSIONS.index(version))
            unet = models.build_unet(cfg, device="cpu")
        cfg_rel, w_rel = models.UNET_FILES[version]
        _atomic_json(cfg, root / cfg_rel)
        _atomic_torch_save(unet.state_dict(), root / w_rel)
        out += [root / cfg_rel, root / w_rel]
    return out


_LEGACY_ATTENTION_NAMES = ((".to_q.", ".query."), (".to_k.", ".key."), (".to_v.", ".value."),
                           (".to_out.0.", ".proj_attn."))


def write_tiny_vae(directory: str | os.PathLike) -> list[Path]:
    """Write a tiny random sd-vae-ft-mse, ``sd-vae/{config.json, diffusion_pytorch_model.safetensors}``, into
    ``directory`` and return the paths: four blocks of width 32 (256 px -> 32 latent pixels), the mid-block attention
    under diffusers' pre-0.14 names (``query``/``key``/``value``/``proj_attn``) so diffusers' conversion runs.
    Source: ``musetalk/models/vae.py:24``."""
    import diffusers
    import torch

    cfg = models.bundled_config("sd-vae-ft-mse.json")
    cfg.update(block_out_channels=[32, 32, 32, 32], norm_num_groups=8)
    kwargs = {k: v for k, v in cfg.items() if not k.startswith("_")}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2000)
        vae = diffusers.AutoencoderKL(**kwargs)
    state = {}
    for key, value in vae.state_dict().items():
        if ".attentions." in key:
            for new, old in _LEGACY_ATTENTION_NAMES:
                key = key.replace(new, old)
        state[key] = value
    folder = Path(directory) / models.VAE_DIR
    _atomic_json(cfg, folder / "config.json")
    _atomic_safetensors(state, folder / "diffusion_pytorch_model.safetensors")
    return [folder / "config.json", folder / "diffusion_pytorch_model.safetensors"]


def tiny_whisper_config() -> dict[str, Any]:
    """whisper-tiny's config with d_model 384 and 4 encoder layers (5 hidden states of 384), a small
    feed-forward, 1 decoder layer and a 64-token vocabulary."""
    cfg = {k: v for k, v in models.bundled_config("whisper-tiny.json").items() if not k.startswith("_")}
    cfg.update(encoder_ffn_dim=64, decoder_layers=1, decoder_ffn_dim=64, vocab_size=64, max_target_positions=32,
               pad_token_id=60, bos_token_id=60, eos_token_id=60, decoder_start_token_id=61,
               suppress_tokens=[], begin_suppress_tokens=[])
    return cfg


def write_tiny_whisper(directory: str | os.PathLike) -> list[Path]:
    """Write a tiny random whisper, ``whisper/{config.json, model.safetensors, preprocessor_config.json}``, into
    ``directory`` and return the paths: a ``WhisperForConditionalGeneration``'s weights without the tied ``proj_out``
    (as the hub file), whisper-tiny's preprocessor values. Source: ``scripts/inference.py:64-66``."""
    import torch
    import transformers

    cfg = tiny_whisper_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3000)
        model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**cfg))
    state = {k: v for k, v in model.state_dict().items() if k != "proj_out.weight"}
    folder = Path(directory) / models.WHISPER_DIR
    _atomic_json(cfg, folder / "config.json")
    _atomic_safetensors(state, folder / "model.safetensors")
    _atomic_json(models.bundled_config("whisper-tiny-preprocessor.json"), folder / "preprocessor_config.json")
    return [folder / "config.json", folder / "model.safetensors", folder / "preprocessor_config.json"]


def write_random_bisenet(path: str | os.PathLike, seed: int = 0, dtype: Any = None) -> Path:
    """Write a BiSeNet plain state dict with random weights (``seed``) to ``path`` (parents made) and return it;
    ``dtype`` is the stored float dtype (None = float32, 53 MB; ``torch.float16`` halves it)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = parsing.build_bisenet()
        # Give the BatchNorm layers non-trivial statistics so that eval-mode outputs are not degenerate.
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.data.uniform_(0.5, 1.5)
                module.bias.data.uniform_(-0.1, 0.1)
    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).clone()
             for k, v in model.state_dict().items()}
    path = Path(path)
    _atomic_torch_save(state, path)
    return path


def write_tiny_bisenet(directory: str | os.PathLike) -> Path:
    """Write ``face-parse-bisent/79999_iter.pth``: the real architecture, random, in float16 (27 MB)."""
    import torch

    return write_random_bisenet(Path(directory) / parsing.BISENET_FILE, seed=0, dtype=torch.float16)
