"""Face restoration of the generated crops: GFPGAN v1.4, RestoreFormer or CodeFormer through spandrel.

The (F, 256, 256, 3) uint8 BGR faces from the VAE decode are restored on their device before paste-back, so only
pixels under the blend mask change. Weights are the optional sets ``restore-<name>``; spandrel builds them
(CodeFormer, from ``spandrel-extra-arches``, is non-commercial: S-Lab License 1.0, warned once). All three work at
512x512: the crop is resized up bicubically and back by the exact 2x2 mean. spandrel takes [0, 1] RGB, but
GFPGAN and CodeFormer were trained on [-1, 1] and spandrel passes their tensor through (:data:`SIGNED_RANGE`), so
they are mapped there and back. ``restore_strength`` blends: ``face + strength * (restored - face)``, rounded.

Source: spandrel 0.4.2 ``ImageModelDescriptor``, GFPGAN ``GFPGANer.enhance``, CodeFormer ``inference_codeformer.py``.
"""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import models, weights
from .config import NONCOMMERCIAL_NOTE, RESTORERS, warn_licence
from .errors import CheckpointError, InputError, MissingDependencyError, NbHelpersWarning, WeightsError
from .hashing import atomic_path

# spandrel architecture ids whose call_fn hands the network our tensor unchanged although it was trained on [-1, 1]
SIGNED_RANGE = frozenset({"GFPGAN", "CodeFormer"})
RESTORE_SIZE = 512  # pixels: the face size the three networks were trained at (FFHQ 512x512)
FACE_SIZE = 256  # pixels: MuseTalk's generated crop

# Name -> (manifest entry name, weight set, layout path, spandrel architecture id).
_SPECS: dict[str, tuple[str, str, str, str]] = {
    "gfpgan": ("gfpgan-v1.4", "restore-gfpgan", "restore/GFPGANv1.4.pth", "GFPGAN"),
    "restoreformer": ("restoreformer", "restore-restoreformer", "restore/RestoreFormer.pth", "RestoreFormer"),
    "codeformer": ("codeformer", "restore-codeformer", "restore/codeformer.pth", "CodeFormer"),
}
INSTALL_LINE = "pip install --no-deps spandrel spandrel-extra-arches einops"  # --no-deps: pip must not touch torch


def check_name(name: Any) -> str:
    """``name`` when it is one of :data:`RESTORERS`, else InputError."""
    if name not in RESTORERS:
        raise InputError(f"restore must be None or one of {', '.join(map(repr, RESTORERS))}; got {name!r}.")
    return str(name)


def weight_path(name: str, weights_dir: str | os.PathLike) -> Path:
    """The layout path of restorer ``name``'s weight file under ``weights_dir`` (it may not exist)."""
    return Path(weights_dir) / _SPECS[check_name(name)][2]


def download_command(name: str, weights_dir: str | os.PathLike | None = None) -> str:
    """The command that downloads restorer ``name``'s weights (into ``weights_dir`` when given)."""
    where = f" --weights {weights_dir}" if weights_dir is not None else ""
    return f"{weights.DOWNLOAD_COMMAND}{where} --sets {_SPECS[check_name(name)][1]}"


def import_spandrel(name: str):
    """Import spandrel (and spandrel_extra_arches for CodeFormer); returns ``(spandrel, architecture object)``.
    MissingDependencyError with the install line when spandrel, spandrel-extra-arches or torchvision is missing."""
    try:
        import spandrel
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "torchvision":
            raise MissingDependencyError(
                "spandrel imports torchvision when it loads (RestoreFormer's input normalisation, LaMa's rotation), "
                "and torchvision is not installed. Install the torchvision build that matches your torch (Colab and "
                "the conda environment have it; with pip, from the same index as torch, e.g. `pip install "
                "torchvision==<the version paired with your torch>`). Never let pip pick torchvision alone: it "
                "would replace torch.") from exc
        raise MissingDependencyError(
            f"face restoration needs spandrel: `{INSTALL_LINE}`. Keep --no-deps: spandrel requires torchvision, and "
            "pip picking one would replace your torch (on a CPU build, with the whole CUDA stack). spandrel's other "
            "needs (torch, torchvision, numpy, safetensors) must be there already: Colab and the conda environment "
            "have them; elsewhere install torchvision from the same index as your torch first.") from exc
    arch_id = _SPECS[name][3]
    arch = getattr(_arch_module(name), f"{arch_id}Arch")()
    if arch.id != arch_id:  # spandrel renamed it
        raise MissingDependencyError(f"spandrel's {name} architecture is called {arch.id!r}, not {arch_id!r}; this "
                                     "spandrel version is not supported (tested: spandrel 0.4.2, extra arches 0.2.0).")
    return spandrel, arch


def _arch_module(name: str) -> Any:
    """spandrel's module of restorer ``name``, holding the network class ``<id>`` and its ``<id>Arch``."""
    arch_id = _SPECS[name][3]
    if name != "codeformer":
        return importlib.import_module(f"spandrel.architectures.{arch_id}")
    try:
        return importlib.import_module(f"spandrel_extra_arches.architectures.{arch_id}")
    except ModuleNotFoundError as exc:
        raise MissingDependencyError("CodeFormer is in spandrel's extra architectures (non-commercial licence): "
                                     "`pip install spandrel-extra-arches`.") from exc


def check_available(name: str, weights_dir: str | os.PathLike) -> Path:
    """The weight file of restorer ``name``, after checking it exists and spandrel imports (nothing is read):
    InputError, WeightsError (with the download command) or MissingDependencyError as :func:`load_restorer`."""
    path = weight_path(name, weights_dir)
    if not path.is_file():
        raise WeightsError(f"restore={name!r} needs {path}, which is missing. Download the optional weight set with "
                           f"`{download_command(name, weights_dir)}` (or run notebook 01_weights), or set "
                           "restore=None.")
    import_spandrel(name)
    return path


# Architectures (spandrel ids) that fail in reduced precision although spandrel marks bf16 as supported.
FLOAT32_ONLY = {
    # spandrel_extra_arches 0.2.0 CodeFormer/__arch/codeformer.py get_codebook_feat
    "CodeFormer": "spandrel's CodeFormer multiplies a float32 one-hot by its codebook, which fails in bfloat16",
}


def run_dtype(descriptor: Any, device: Any, dtype: Any) -> tuple[Any, str]:
    """``(dtype, reason)`` a restorer runs in on ``device`` when the pipeline runs in ``dtype``: float32 on the CPU,
    with a float32 pipeline, or for :data:`FLOAT32_ONLY`; else fp16 where spandrel supports it; else bfloat16 where
    spandrel supports it and the GPU has compute capability >= 8.0; else float32."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or dtype == torch.float32:
        return torch.float32, "float32 (as the pipeline)"
    arch = str(getattr(getattr(descriptor, "architecture", None), "id", ""))
    if arch in FLOAT32_ONLY:
        return torch.float32, f"float32 ({FLOAT32_ONLY[arch]})"
    if getattr(descriptor, "supports_half", False):
        return torch.float16, "float16 (as the pipeline)"
    major, _ = torch.cuda.get_device_capability(device)
    if getattr(descriptor, "supports_bfloat16", False) and major >= 8:
        return torch.bfloat16, "bfloat16 (spandrel marks this network unsafe in float16; this GPU has native bf16)"
    return torch.float32, "float32 (spandrel marks this network unsafe in float16 and this GPU has no native bf16)"


@dataclass
class Restorer:
    """A loaded face restorer ``name`` (spandrel's ``ImageModelDescriptor`` in eval mode on ``device`` in ``dtype``,
    :func:`run_dtype`, for ``reason``) applied to batches of generated crops on their device. ``strength`` blends
    restored and unrestored face, 0..1 (1 = restored only). ``path`` is the weight file."""

    name: str
    descriptor: Any = field(repr=False)
    device: Any
    dtype: Any
    strength: float = 1.0
    reason: str = ""
    path: Path | None = None

    def at(self, strength: float) -> Restorer:
        """The same loaded network with another ``strength`` (0..1; InputError outside); nothing is copied."""
        return replace(self, strength=check_strength(strength))

    def __call__(self, faces_256: Any) -> Any:
        """Restore (F, 256, 256, 3) uint8 BGR ``faces_256`` on the restorer's device (:func:`nbhelpers.latents.decode`'s
        output) into the same shape; the input itself when ``strength == 0``. InputError for another shape or dtype."""
        import torch
        import torch.nn.functional as F

        shape = tuple(getattr(faces_256, "shape", ()))
        if len(shape) != 4 or shape[1:] != (FACE_SIZE, FACE_SIZE, 3) or faces_256.dtype != torch.uint8:
            raise InputError(f"the restorer takes (F, {FACE_SIZE}, {FACE_SIZE}, 3) uint8 BGR faces; got shape {shape} "
                             f"{getattr(faces_256, 'dtype', type(faces_256).__name__)}.")
        if self.strength == 0 or shape[0] == 0:
            return faces_256
        with torch.inference_mode():
            # (F, 3, 256, 256) RGB 0..1, contiguous: GFPGAN's style code uses view()
            x = (faces_256.to(self.device).flip(-1).permute(0, 3, 1, 2).float() / 255).contiguous()
            x = F.interpolate(x, size=(RESTORE_SIZE, RESTORE_SIZE), mode="bicubic", align_corners=False).clamp_(0, 1)
            signed = str(getattr(getattr(self.descriptor, "architecture", None), "id", "")) in SIGNED_RANGE
            if signed:  # GFPGAN and CodeFormer take and give [-1, 1] (module docstring)
                x = x * 2 - 1
            y = self.descriptor(x.to(self.dtype).contiguous())  # (F, 3, 512, 512) RGB 0..1 ([-1, 1] if signed)
            if signed:
                y = (y.float() + 1) / 2
            y = F.interpolate(y.float(), size=(FACE_SIZE, FACE_SIZE), mode="area")  # exact 2x2 mean
            restored = y.clamp_(0, 1).mul_(255).permute(0, 2, 3, 1).flip(-1)  # (F, 256, 256, 3) BGR, 0..255
            if self.strength != 1:
                base = faces_256.to(self.device, torch.float32)
                restored = base + self.strength * (restored - base)
            return restored.round_().clamp_(0, 255).to(torch.uint8)

    def close(self) -> None:
        """Free the network's memory (weights move to the meta device); views made with :meth:`at` stop working too."""
        self.descriptor.model.to("meta")

    def __repr__(self) -> str:
        return (f"Restorer({self.name}, strength {self.strength:g}, {str(self.dtype).replace('torch.', '')} on "
                f"{self.device}; {self.reason})")


def check_strength(strength: Any) -> float:
    """``strength`` as a float in 0..1, else InputError."""
    try:
        value = float(strength)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(strength, bool) or not 0.0 <= value <= 1.0:
        raise InputError(f"restore_strength must be a number from 0 (unrestored) to 1 (fully restored); got "
                         f"{strength!r}.")
    return value


def load_restorer(name: str, weights_dir: str | os.PathLike | None, device: Any = "cpu", dtype: Any = None) -> Restorer:
    """Load restorer ``name`` (codeformer, non-commercial, warns) from its published ``.pth`` file under
    ``weights_dir`` (None: the default folder) onto ``device``, in the dtype :func:`run_dtype` picks for the
    pipeline's ``dtype`` (a float32 fallback under an fp16 pipeline warns), at strength 1 (:meth:`Restorer.at`).
    spandrel loads the checkpoint (:func:`nbhelpers.models.load_checkpoint`) with only that architecture registered.

    Raises:
        InputError: An unknown name.
        MissingDependencyError: spandrel, spandrel-extra-arches or torchvision is missing.
        WeightsError: The weight file is missing (with the download command) or unreadable.
        CheckpointError: The file is not a model of that architecture.
    """
    import torch

    warn_licence(name)
    root = weights.resolve_dir(weights_dir)
    path = check_available(name, root)  # InputError for an unknown name
    spandrel, arch = import_spandrel(name)
    exp = weights.expected_facts(root, _SPECS[name][0])
    state = models.load_checkpoint(path, trusted_sha256=exp.sha256, mmap=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict; delete it and run "
                              f"`{download_command(name, root)}`.")
    registry = spandrel.ArchRegistry()
    registry.add(spandrel.ArchSupport.from_architecture(arch))
    try:
        descriptor = spandrel.ModelLoader(device="cpu", registry=registry).load_from_state_dict(state)
    except spandrel.UnsupportedModelError as exc:
        raise CheckpointError(f"{path} is not a {arch.id} checkpoint (its keys do not match spandrel's {arch.id} "
                              f"layout). Delete it and run `{download_command(name, root)}`.") from exc
    except (RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{path} could not be loaded as {arch.id} ({type(exc).__name__}: {exc}). Delete it and "
                              f"run `{download_command(name, root)}`.") from exc
    dev = torch.device(device)
    run_as, reason = run_dtype(descriptor, dev, dtype if dtype is not None else torch.float32)
    if dev.type == "cuda" and run_as == torch.float32 and dtype == torch.float16:
        warnings.warn(f"the {name} restorer runs in float32 on this GPU: {reason}. It is slower and takes more "
                      "memory than the rest of the pipeline.", NbHelpersWarning, stacklevel=2)
    descriptor.model.to(device=dev, dtype=run_as)  # spandrel's .to() refuses a dtype it marks unsupported
    descriptor.model.eval()
    descriptor.model.requires_grad_(False)
    return Restorer(name=name, descriptor=descriptor, device=dev, dtype=run_as, reason=reason, path=path)


# The published architectures, as the official inference scripts build them (the file's key layout follows):
# GFPGAN gfpgan/utils.py GFPGANer (arch 'clean', channel_multiplier 2); CodeFormer inference_codeformer.py
# (dim_embd=512, codebook_size=1024, n_head=8, n_layers=9, connect_list 32..256); GFPGAN's RestoreFormer defaults.
PUBLISHED_KWARGS: dict[str, dict[str, Any]] = {
    "gfpgan": dict(out_size=512, num_style_feat=512, channel_multiplier=2, decoder_load_path=None, fix_decoder=False,
                   num_mlp=8, input_is_latent=True, different_w=True, narrow=1, sft_half=True),
    "restoreformer": dict(n_embed=1024, embed_dim=256, ch=64, out_ch=3, ch_mult=(1, 2, 2, 4, 4, 8), num_res_blocks=2,
                          attn_resolutions=(16,), dropout=0.0, in_channels=3, resolution=512, z_channels=256,
                          double_z=False, enable_mid=True, head_size=8),
    "codeformer": dict(dim_embd=512, n_head=8, n_layers=9, codebook_size=1024, latent_size=256,
                       connect_list=["32", "64", "128", "256"], fix_modules=["quantize", "generator"]),
}
# A small RestoreFormer with the same block types (GroupNorm needs 32 channels; 6 levels bring 512 down to 16, where
# the attention blocks are), for fast CPU tests; spandrel reads every size back from the state dict.
TINY_RESTOREFORMER = dict(PUBLISHED_KWARGS["restoreformer"], n_embed=64, embed_dim=32, ch=32, ch_mult=(1,) * 6,
                          num_res_blocks=1, z_channels=32)


def write_random_weights(directory: str | os.PathLike, name: str, *, seed: int = 0, tiny: bool = False) -> Path:
    """Write and return ``<directory>/restore/<file>``: spandrel's architecture ``name`` with random weights
    (``seed``) as ``{"params_ema": state_dict}`` like the published files: full size (:data:`PUBLISHED_KWARGS`,
    290-380 MB), or :data:`TINY_RESTOREFORMER` with ``tiny``. InputError for an unknown name or ``tiny`` with
    another architecture than RestoreFormer; MissingDependencyError without spandrel."""
    import torch

    check_name(name)
    if tiny and name != "restoreformer":
        raise InputError("tiny=True exists for restoreformer only (spandrel fixes GFPGAN's sizes, and CodeFormer's "
                         "VQ encoder widths).")
    import_spandrel(name)
    Net = getattr(_arch_module(name), _SPECS[name][3])  # noqa: N806 - a class
    torch.manual_seed(int(seed))
    net = Net(**(TINY_RESTOREFORMER if tiny else PUBLISHED_KWARGS[name]))
    path = weight_path(name, directory)
    with atomic_path(path) as tmp:
        torch.save({"params_ema": net.state_dict()}, tmp)
    return path


__all__ = ["FACE_SIZE", "NONCOMMERCIAL_NOTE", "RESTORERS", "RESTORE_SIZE", "Restorer", "check_available", "check_name",
           "check_strength", "download_command", "import_spandrel", "load_restorer", "run_dtype", "warn_licence",
           "weight_path", "write_random_weights", "PUBLISHED_KWARGS", "TINY_RESTOREFORMER"]
