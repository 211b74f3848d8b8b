"""Loading MuseTalk's UNet, sd-vae-ft-mse, whisper-tiny and positional encoding from the official ``models/`` layout.

The UNet checkpoint is memory-mapped, assigned into a model built on the meta device, then cast and moved one tensor
at a time (no extra float32 copy). Loading is strict: a missing, unexpected or mis-shaped key raises
:class:`~nbhelpers.errors.CheckpointError`. Importing this module loads no torch. Source: ``musetalk/models/unet.py``,
``musetalk/models/vae.py``, ``scripts/inference.py:45-67``; docs/official-behaviour.md §1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.resources
import importlib.util
import json
import math
import os
import pickle
import shlex
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import hashing, progress
from . import weights as _weights
from .constants import VERSIONS, WHISPER_DIM
from .errors import CheckpointError, InputError, MissingDependencyError, WeightsError, require
from .groupnorm import channel_moment_norms
from .upsampling import phase_upsampling

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "PositionalEncoding",  # noqa: F822 - defined on first access (module __getattr__), so importing needs no torch
    "Models", "unet_config", "bundled_config", "build_unet", "load_checkpoint",
    "check_state_dict", "load_unet", "load_vae", "load_whisper", "load_feature_extractor", "load_models",
    "LOAD_LOCK",
]

UNET_FILES = {  # version -> (config, weights), relative to the weights dir (docs/official-behaviour.md §1.1)
    "v15": ("musetalkV15/musetalk.json", "musetalkV15/unet.pth"),
    "v1": ("musetalk/musetalk.json", "musetalk/pytorch_model.bin"),
}
VAE_DIR = "sd-vae"  # utils.py:21-23 (--vae_type default sd-vae)
WHISPER_DIR = "whisper"  # inference.py:64-66
_FIX = f"`{_weights.DOWNLOAD_COMMAND}` (or {_weights.NOTEBOOK})"


def __getattr__(name: str) -> Any:  # PEP 562: `models.PositionalEncoding` defines the torch class on first access
    if name == "PositionalEncoding":
        return _torch_classes()["PositionalEncoding"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _torch_classes() -> dict[str, type]:
    """Define this module's torch classes (needs torch; called on first use, once)."""
    import torch
    from torch import nn

    class PositionalEncoding(nn.Module):
        """Sinusoidal positional encoding of the whisper tokens (width ``d_model``, even; ``max_len`` positions):
        ``pe[0, pos, 2i] = sin(pos * exp(-2i * ln(10000) / d_model))``, ``pe[0, pos, 2i+1] = cos(same)``, a float32
        buffer [1, max_len, d_model] that ``.half()`` casts as the official ``--use_float16`` path does.
        Source: ``musetalk/models/unet.py:12-27``, ``scripts/inference.py:54``; docs/official-behaviour.md §5.4."""

        def __init__(self, d_model: int = WHISPER_DIM, max_len: int = 5000):
            super().__init__()
            if d_model <= 0 or d_model % 2:
                raise InputError(f"d_model must be a positive even number; got {d_model!r}.")
            if max_len <= 0:
                raise InputError(f"max_len must be positive; got {max_len!r}.")
            position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # [max_len, 1]
            rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
            pe = torch.zeros(max_len, d_model, dtype=torch.float32)
            pe[:, 0::2] = torch.sin(position * rate)
            pe[:, 1::2] = torch.cos(position * rate)
            self.register_buffer("pe", pe.unsqueeze(0))  # [1, max_len, d_model]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """``x + pe[:, :seq_len]`` in ``x``'s dtype for tokens ``x`` [B, seq_len <= max_len, d_model], else
            InputError."""
            if x.dim() != 3 or x.shape[-1] != self.pe.shape[-1] or x.shape[1] > self.pe.shape[1]:
                raise InputError(f"x must be [B, seq_len <= {self.pe.shape[1]}, {self.pe.shape[-1]}]; got "
                                 f"{list(x.shape)}.")
            return x + self.pe[:, : x.shape[1]].to(dtype=x.dtype)

    return {"PositionalEncoding": PositionalEncoding}


def bundled_config(name: str) -> dict[str, Any]:
    """A fresh dict of the config ``name`` shipped in ``nbhelpers/configs`` (InputError listing them otherwise).
    Source: docs/official-behaviour.md §1.1, §1.3."""
    folder = importlib.resources.files("nbhelpers").joinpath("configs")
    try:
        return json.loads(folder.joinpath(name).read_text(encoding="utf-8"))
    except (FileNotFoundError, OSError):
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
        raise InputError(f"no bundled config {name!r}; available: {', '.join(names)}.") from None


def unet_config(version: str = "v15") -> dict[str, Any]:
    """The full-size MuseTalk UNet config (``UNet2DConditionModel`` kwargs) as a fresh dict: SD-1.x's UNet with 8
    input channels and cross-attention width 384, shared by both ``version`` values (InputError for another).
    Source: ``models/musetalkV15/musetalk.json`` (not in the official repository); docs/official-behaviour.md §1.3."""
    _check_version(version)
    return bundled_config("musetalkV15-unet.json")


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise InputError(f"version must be one of {', '.join(VERSIONS)}; got {version!r}.")


def _read_json(path: Path) -> dict[str, Any]:
    _check_content(path, "json", "config")
    return json.loads(path.read_text(encoding="utf-8-sig"))


def _require(root: Path, paths: Sequence[str], what: str, set_hint: str = "") -> None:
    missing = _weights.missing_files(root, paths)
    if missing:
        cmd = f"`{_weights.DOWNLOAD_COMMAND} --weights {shlex.quote(str(root))}{set_hint}` (or {_weights.NOTEBOOK})"
        raise WeightsError(f"{len(missing)} weight file(s) for {what} missing under {root}: {', '.join(missing)}. "
                           f"Download them with {cmd}, or pass weights_dir= the folder that holds the official "
                           "models/ layout.")


def _present(root: Path, *candidates: str) -> Path:
    return next((root / rel for rel in candidates if (root / rel).is_file()), root / candidates[0])


def _check_content(path: Path, fmt: str | None = None, what: str = "weight file") -> Any:
    insp = _weights.inspect_file(path, fmt)
    if insp.bad:
        raise WeightsError(f"{path} is not a usable {what}: {insp.state} ({insp.detail}). Delete it and "
                           f"download it again: {_FIX}.")
    return insp


def _torch_load(path: Path, weights_only: bool, mmap: bool) -> Any:
    import torch

    kwargs: dict[str, Any] = {"map_location": "cpu", "weights_only": weights_only}
    if mmap:  # torch >= 2.1
        try:
            return torch.load(str(path), mmap=True, **kwargs)
        except (OSError, RuntimeError, ValueError, TypeError):
            pass  # a filesystem without mmap (some network mounts): read it into memory instead
    return torch.load(str(path), **kwargs)


def load_checkpoint(path: str | os.PathLike, trusted_sha256: str | None = None, expected_size: int | None = None,
                    *, allow_pickle: bool = False, mmap: bool = True) -> Any:
    """What a ``torch.save`` file ``path`` holds (usually a dict of CPU tensors), inspected first, zip files
    memory-mapped (``mmap``). Plain state dicts load with ``weights_only=True``; other Python objects are unpickled
    only when the sha256 equals ``trusted_sha256`` (hex), else the size equals ``expected_size`` (bytes), else with
    ``allow_pickle=True``. WeightsError when the file is missing, an HTML page, a git-lfs pointer, truncated,
    damaged, or an untrusted pickle. Source: ``musetalk/models/unet.py:44-45``."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"checkpoint {path} does not exist. Download the weights with {_FIX}.")
    insp = _check_content(path, "torch", "checkpoint")
    use_mmap = mmap and insp.container == "zip"
    try:
        return _torch_load(path, weights_only=True, mmap=use_mmap)
    except pickle.UnpicklingError as exc:
        refusal = exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise WeightsError(f"{path} could not be read as a checkpoint ({type(exc).__name__}: {exc}). It is "
                           f"damaged: delete it and download it again with {_FIX}.") from exc
    size = path.stat().st_size
    if trusted_sha256:
        digest = hashing.sha256_file(path)
        if digest != trusted_sha256.strip().lower():
            raise WeightsError(f"{path} holds Python objects besides tensors and its sha256 {digest[:16]}... is "
                               f"not the expected {trusted_sha256[:16]}...; it is not unpickled. Delete it and "
                               f"download it again with {_FIX}.") from refusal
    elif expected_size is not None:
        if size != int(expected_size):
            raise WeightsError(f"{path} holds Python objects besides tensors and has {size} bytes, not the "
                               f"expected {expected_size}; it is not unpickled. Delete it and download it again "
                               f"with {_FIX}.") from refusal
    elif not allow_pickle:
        first = str(refusal).strip().splitlines()
        raise WeightsError(
            f"{path} holds Python objects besides tensors ({first[0][:160] if first else 'weights_only refused'}"
            "). Unpickling such a file can run code, so it is loaded only when its sha256 or size matches the "
            f"manifest or the hub: fetch it with {_FIX} (which records the hub's sha256), pass trusted_sha256= "
            "or expected_size=, or allow_pickle=True for a file you trust.") from refusal
    try:
        return _torch_load(path, weights_only=False, mmap=use_mmap)
    except Exception as exc:  # noqa: BLE001 - any failure here means a damaged or foreign file
        raise WeightsError(f"{path} could not be unpickled ({type(exc).__name__}: {exc}). Delete it and download "
                           f"it again with {_FIX}.") from exc


def _few(keys: Sequence[str], n: int = 5) -> str:
    shown = ", ".join(keys[:n])
    return shown + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def check_state_dict(model: nn.Module, state_dict: Mapping[str, Any], path: str | os.PathLike,
                     what: str = "model") -> None:
    """Compare a checkpoint's keys and shapes with ``model``'s (on the meta device too); CheckpointError naming the
    first bad keys, the file ``path`` and the model ``what``. Source: ``musetalk/models/unet.py:44-45``; §1.2 of
    docs/official-behaviour.md."""
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(f"{path} holds a {type(state_dict).__name__}, not a state dict (key -> tensor) for "
                              f"the {what}. Use the official file: {_FIX}.")
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {str(k): tuple(getattr(v, "shape", ())) for k, v in state_dict.items()}
    missing = [k for k in expected if k not in got]
    unexpected = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    if not (missing or unexpected or wrong):
        return
    lines = [f"{path} does not fit the {what}: {len(missing)} missing, {len(unexpected)} unexpected, "
             f"{len(wrong)} wrong-shape key(s) (of {len(expected)})."]
    lines += [f"  {label}: {_few(keys)}" for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
    if wrong:
        lines.append("  wrong shape: " + "; ".join(f"{k} is {list(got[k])} in the file, {list(expected[k])} in "
                                                  f"the model" for k in wrong[:5]))
    wrappers = [k for k in ("state_dict", "model", "module", "params") if k in got]
    prefixes = {k.split(".", 1)[0] + "." for k in unexpected}
    if wrappers and len(got) < 10:
        lines.append(f"  The file is a wrapper dict (keys {sorted(got)[:6]}), not a plain state dict: a training "
                     "checkpoint, not the official release.")
    elif len(prefixes) == 1 and missing and all(k.split(".", 1)[-1] in expected for k in unexpected):
        lines.append(f"  Every key starts with {prefixes.pop()!r}: saved from a wrapped model; the official file "
                     "has no prefix.")
    elif missing and unexpected and len(missing) == len(unexpected):
        lines.append("  Same number of missing and unexpected keys: renamed keys (a different diffusers naming?).")
    if wrong and len(wrong) * 2 > len(expected):
        lines.append("  Most shapes differ: this is the file of another model or a different config.")
    v1_hint = "; for version='v1' use the musetalk/ folder (`--sets v1`)" if what.startswith("MuseTalk UNet") else ""
    lines.append(f"The file is damaged or is not the official one (or belongs to another version or model). "
                 f"Delete it and download it again with {_FIX}{v1_hint}.")
    raise CheckpointError("\n".join(lines))


# One model load at a time in this process, held by every loader: a second thread can see diffusers' and
# transformers' lazy modules half-imported, and accelerate patches torch.nn.Module process-wide while it builds.
LOAD_LOCK = threading.RLock()


def _one_load_at_a_time(load):
    """``load`` run under :data:`LOAD_LOCK`, from its start to its end (building, weights assigned, moved)."""

    @functools.wraps(load)
    def serialized(*args, **kwargs):
        with LOAD_LOCK:
            return load(*args, **kwargs)

    return serialized


def _library_class(module: str, name: str, install: str):
    """``module.name`` imported under :data:`LOAD_LOCK`; MissingDependencyError with ``install`` without it, or when
    the installed library cannot import it (diffusers and transformers import lazily: a package they use that does
    not match torch, such as a torchvision from another build, fails here, as RuntimeError or ImportError)."""
    with LOAD_LOCK:
        library = require(module, install)
        try:
            return getattr(library, name)
        except (ImportError, RuntimeError) as exc:
            cause = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
            raise MissingDependencyError(
                f"{module} is installed but cannot import {name}: {cause}. A package it uses does not match the "
                "others, often a torchvision from another build than torch: remove it or install the one for your "
                "torch from the index torch came from (https://pytorch.org/get-started/locally/), then restart."
            ) from exc


def _sdpa(model: nn.Module) -> None:
    """Make torch SDPA attention explicit (diffusers' AttnProcessor2_0), as diffusers 0.30.2 picks by default."""
    with LOAD_LOCK:
        from diffusers.models.attention_processor import AttnProcessor2_0
    if hasattr(model, "set_attn_processor") and getattr(model, "attn_processors", None):
        model.set_attn_processor(AttnProcessor2_0())


def build_unet(config: Mapping[str, Any] | str = "v15", device: str | torch.device = "meta") -> nn.Module:
    """Build the MuseTalk UNet (diffusers ``UNet2DConditionModel``) in eval mode, with SDPA attention.

    ``config`` is a ``musetalk.json`` dict or a version for the bundled config; ``device`` is ``"meta"`` (no memory;
    :func:`load_unet` assigns the checkpoint) or ``"cpu"`` (random float32). Raises MissingDependencyError without
    diffusers, WeightsError when the config builds no UNet. Source: ``musetalk/models/unet.py:36-38``."""
    import torch

    unet_class = _library_class("diffusers", "UNet2DConditionModel", "pip install diffusers")
    cfg = unet_config(config) if isinstance(config, str) else dict(config)
    try:
        with LOAD_LOCK, torch.device(device):
            unet = unet_class.from_config(cfg)
    except (TypeError, ValueError, KeyError) as exc:
        raise WeightsError(f"the UNet config does not build a UNet2DConditionModel ({exc}). Use the official "
                           f"musetalk.json (download: {_FIX}).") from exc
    _sdpa(unet)
    return unet.eval()


def _finish(model: nn.Module, device: str | torch.device, dtype: torch.dtype | None) -> nn.Module:
    import torch

    # nn.Module.to itself (not diffusers' or transformers' override, which only adds warnings): one tensor at a
    # time, so no second full copy in any dtype ever exists.
    torch.nn.Module.to(model, device=device, dtype=torch.float32 if dtype is None else dtype)
    model.eval()
    model.requires_grad_(False)
    return model


@_one_load_at_a_time
def load_unet(weights_dir: str | os.PathLike | None = None, version: str = "v15", device: str | torch.device = "cpu",
              dtype: torch.dtype | None = None) -> nn.Module:
    """Load the MuseTalk UNet strictly from :data:`UNET_FILES` of ``version`` under ``weights_dir`` (None: the
    default folder) onto ``device`` in ``dtype`` (None: float32), in eval mode without gradients:
    ``unet(latents [B, 8, 32, 32], 0, encoder_hidden_states=[B, 50, 384]).sample`` is [B, 4, 32, 32]. On the CPU in
    the checkpoint's dtype the parameters stay views of the memory-mapped file (replace it only with ``os.replace``).

    Raises InputError for an unknown version, WeightsError for a missing, HTML, git-lfs pointer or cut-off file,
    CheckpointError when keys or shapes do not match. Source: ``musetalk/models/unet.py:36-45``,
    ``scripts/inference.py:53-56``."""
    _check_version(version)
    root = _weights.resolve_dir(weights_dir)
    cfg_rel, w_rel = UNET_FILES[version]
    _require(root, [cfg_rel, w_rel], f"the {version} UNet", "" if version == "v15" else " --sets v1")
    cfg = _read_json(root / cfg_rel)
    path = root / w_rel
    state = load_checkpoint(path)
    unet = build_unet(cfg, device="meta")
    check_state_dict(unet, state, path, f"MuseTalk UNet ({version}, config {root / cfg_rel})")
    unet.load_state_dict(state, strict=True, assign=True)
    del state
    return _finish(unet, device, dtype)


@contextlib.contextmanager
def _library_bars_follow_ours(transformers):
    """Hide transformers' own "Loading weights" bar while nbhelpers' bars are off (NBHELPERS_PROGRESS=0) or print
    plain lines (:func:`nbhelpers.progress.in_log`): its redraws would put carriage returns in a log."""
    logging = transformers.utils.logging
    hide = (progress._settings.get("disable") or progress.in_log()) and logging.is_progress_bar_enabled()
    if hide:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if hide:
            logging.enable_progress_bar()


def _loading_problems(info: Mapping[str, Any] | None, path: Path, what: str) -> None:
    if not info:
        return
    missing = sorted(str(k) for k in info.get("missing_keys", []) or [])
    wrong = [str(k if isinstance(k, str) else k[0]) for k in info.get("mismatched_keys", []) or []]
    errors = [str(e) for e in info.get("error_msgs", []) or []]
    parts = [f"{label}: {_few(keys, n)}" for label, keys, n in
             (("missing", missing, 5), ("wrong shape", wrong, 5), ("errors", errors, 2)) if keys]
    if parts:
        raise CheckpointError(f"{path} does not fit the {what}: " + "; ".join(parts) + ". The file is damaged or "
                              f"not the official one: delete it and download it again with {_FIX}.")


@_one_load_at_a_time
def load_vae(weights_dir: str | os.PathLike | None = None, device: str | torch.device = "cpu",
             dtype: torch.dtype | None = None) -> nn.Module:
    """Load sd-vae-ft-mse (diffusers ``AutoencoderKL``) from ``<weights_dir>/sd-vae``, arguments as :func:`load_unet`:
    ``diffusion_pytorch_model.safetensors`` (preferred) or the official ``.bin``; it encodes 256x256 RGB in [-1, 1]
    to [B, 4, 32, 32]; its decoder upsamples in phase form (:mod:`nbhelpers.upsampling`) and, compiled, takes its
    GroupNorm statistics from per-channel moments (:mod:`nbhelpers.groupnorm`). WeightsError for a missing or damaged
    file, CheckpointError when the weights do not fit the config. Source: ``musetalk/models/vae.py:24``."""
    vae_class = _library_class("diffusers", "AutoencoderKL", "pip install diffusers")
    root = _weights.resolve_dir(weights_dir)
    _require(root, [f"{VAE_DIR}/config.json", f"{VAE_DIR}/diffusion_pytorch_model.safetensors"], "the VAE")
    _read_json(root / VAE_DIR / "config.json")
    path = _present(root, f"{VAE_DIR}/diffusion_pytorch_model.safetensors", f"{VAE_DIR}/diffusion_pytorch_model.bin")
    _check_content(path)
    kwargs: dict[str, Any] = {"local_files_only": True, "output_loading_info": True,
                              "use_safetensors": path.suffix == ".safetensors"}
    if importlib.util.find_spec("accelerate") is None:
        kwargs["low_cpu_mem_usage"] = False  # diffusers would warn and do this itself
    try:
        vae, info = vae_class.from_pretrained(str(root / VAE_DIR), **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{path} could not be loaded into AutoencoderKL ({type(exc).__name__}: "
                              f"{str(exc)[:400]}). Delete it and download it again with {_FIX}.") from exc
    _loading_problems(info, path, "VAE (sd-vae-ft-mse)")
    _sdpa(vae)
    phase_upsampling(vae.decoder)  # the same sums with 16 multiply-adds in place of 36
    channel_moment_norms(vae.decoder)  # compiled: whole channels-last rows read for the statistics
    return _finish(vae, device, dtype)


@_one_load_at_a_time
def load_whisper(weights_dir: str | os.PathLike | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None) -> nn.Module:
    """Load whisper-tiny (transformers ``WhisperModel``, SDPA attention) from ``<weights_dir>/whisper``, arguments
    as :func:`load_unet` (officially ``dtype`` is the UNet's): ``model.safetensors`` (preferred: transformers >= 4.50
    refuses ``.bin`` on torch < 2.6) or the official ``pytorch_model.bin``. ``.encoder(mel [B, 80, 3000],
    output_hidden_states=True)`` gives 5 hidden states [B, 1500, 384]. WeightsError for a missing, damaged or
    refused file, CheckpointError when the weights do not fit. Source: ``scripts/inference.py:64-66``; §5.1."""
    transformers = require("transformers", "pip install transformers")
    whisper_class = _library_class("transformers", "WhisperModel", "pip install transformers")
    root = _weights.resolve_dir(weights_dir)
    _require(root, [f"{WHISPER_DIR}/config.json", f"{WHISPER_DIR}/model.safetensors"], "whisper")
    _read_json(root / WHISPER_DIR / "config.json")
    path = _present(root, f"{WHISPER_DIR}/model.safetensors", f"{WHISPER_DIR}/pytorch_model.bin")
    _check_content(path)
    kwargs: dict[str, Any] = {"local_files_only": True, "output_loading_info": True,
                              "use_safetensors": path.suffix == ".safetensors", "attn_implementation": "sdpa"}
    try:
        with _library_bars_follow_ours(transformers):
            model, info = whisper_class.from_pretrained(str(root / WHISPER_DIR), **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        hint = (" transformers refuses .bin files on this torch version: download whisper/model.safetensors "
                f"with {_FIX}." if path.suffix == ".bin" and "torch" in str(exc).lower() else
                f" Delete it and download it again with {_FIX}.")
        raise (WeightsError if path.suffix == ".bin" else CheckpointError)(
            f"{path} could not be loaded into WhisperModel ({type(exc).__name__}: {str(exc)[:400]})." + hint) from exc
    _loading_problems(info, path, "whisper-tiny model")
    return _finish(model, device, dtype)


@_one_load_at_a_time
def load_feature_extractor(weights_dir: str | os.PathLike | None = None) -> Any:
    """Load the ``WhisperFeatureExtractor`` of ``<weights_dir>/whisper/preprocessor_config.json`` (None =
    :func:`nbhelpers.weights.default_dir`); WeightsError when missing or damaged.
    Source: ``musetalk/utils/audio_processor.py:12-13``."""
    extractor_class = _library_class("transformers", "WhisperFeatureExtractor", "pip install transformers")
    root = _weights.resolve_dir(weights_dir)
    _require(root, [f"{WHISPER_DIR}/preprocessor_config.json"], "the whisper feature extractor")
    _read_json(root / WHISPER_DIR / "preprocessor_config.json")
    return extractor_class.from_pretrained(str(root / WHISPER_DIR), local_files_only=True)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclasses.dataclass
class Models:
    """The models of one MuseTalk run, in eval mode without gradients, on one device and dtype: the UNet (8 -> 4
    channels, cross-attention 384), sd-vae-ft-mse, whisper-tiny (its ``.encoder`` is used), the CPU feature
    extractor, :class:`PositionalEncoding` (384, 5000), ``tiny`` for random test weights, and an optional face
    ``restorer`` for the decoded crops (:mod:`nbhelpers.restore`)."""

    unet: nn.Module
    vae: nn.Module
    whisper: nn.Module
    feature_extractor: Any
    pe: nn.Module
    device: torch.device
    dtype: torch.dtype
    version: str = "v15"
    weights_dir: Path | None = None
    tiny: bool = False
    restorer: Any = None

    def __repr__(self) -> str:
        kind = " (tiny random test weights)" if self.tiny else ""
        return (f"Models({self.version}{kind} on {self.device}, {str(self.dtype).replace('torch.', '')}: "
                f"UNet {_count(self.unet) / 1e6:.1f} M, VAE {_count(self.vae) / 1e6:.1f} M, "
                f"whisper {_count(self.whisper) / 1e6:.1f} M parameters; from {self.weights_dir})")


def load_models(weights_dir: str | os.PathLike | None = None, version: str = "v15",
                device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> Models:
    """Load UNet, VAE, whisper, feature extractor and positional encoding for one version, arguments as
    :func:`load_unet`. Every file is checked first: one WeightsError lists every missing or damaged file. InputError
    for an unknown version, device or dtype; CheckpointError when a checkpoint does not fit its model.
    Source: ``scripts/inference.py:45-67``."""
    import torch

    _check_version(version)
    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype must be a floating torch dtype (torch.float32, torch.float16); got {dtype!r}.")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device; got {device!r}.") from exc
    root = _weights.resolve_dir(weights_dir)
    needed = _weights.required_files(version, parsing=False)
    _require(root, needed, f"MuseTalk {version}", "" if version == "v15" else " --sets v1")
    bad = []  # look inside every file before loading any (a second or two, not minutes, to find a bad one)
    for rel in needed:
        path = _present(root, rel, *_weights.MANIFEST.get(rel).alternates)
        insp = _weights.inspect_file(path)
        if insp.bad:
            bad.append(f"{path.relative_to(root).as_posix()}: {insp.state} ({insp.detail})")
    if bad:
        raise WeightsError(f"{len(bad)} weight file(s) under {root} are not usable:\n  " + "\n  ".join(bad)
                           + f"\nDelete them and download them again with {_FIX}.")
    unet = load_unet(root, version, dev, dtype)
    vae = load_vae(root, dev, dtype)
    whisper = load_whisper(root, dev, dtype)
    extractor = load_feature_extractor(root)
    pe = _torch_classes()["PositionalEncoding"](WHISPER_DIM, 5000).to(device=dev, dtype=dtype).eval()
    return Models(unet=unet, vae=vae, whisper=whisper, feature_extractor=extractor, pe=pe, device=dev, dtype=dtype,
                  version=version, weights_dir=root, tiny=_weights.is_tiny(root))
