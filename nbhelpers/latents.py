"""Latents: VAE encode of the masked and reference crops, the single UNet step, and VAE decode to uint8 frames.

Source: ``musetalk/models/vae.py``; docs/official-behaviour.md §4, §6.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .constants import AUDIO_TOKENS, CROP_SIZE, LATENT_CHANNELS, LATENT_MODES, LATENT_SIZE, VAE_SCALING, WHISPER_DIM
from .errors import InputError
from .gpu import batched, device_constant, to_device
from .progress import stage_bar

MASK_ROW = CROP_SIZE // 2  # first masked row of the 256-px crop: rows 128..255 become -1 (vae.py:40-49)


def crop_and_resize(frame: np.ndarray, box: Sequence[float]) -> np.ndarray:
    """Cut crop box ``box = (x1, y1, x2, y2)`` (frame pixels, exclusive ends, truncated to int; for v15 ``y2``
    includes ``extra_margin``) out of an (H, W, 3) uint8 BGR frame, edges clipped to the frame as the official numpy
    slice does, and resize it to (256, 256, 3) with Lanczos-4. InputError for a bad frame or box, or a box that misses
    the frame. Source: ``scripts/inference.py:173-174``; docs/official-behaviour.md §3.3."""
    import cv2

    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise InputError(f"frame must be an (H, W, 3) uint8 BGR numpy array; got "
                         f"{_describe(frame)}. Read frames with nbhelpers.media.load_video(path).")
    try:
        x1, y1, x2, y2 = (int(v) for v in box)
    except (TypeError, ValueError):
        raise InputError(f"box must be four numbers (x1, y1, x2, y2) in pixels; got {box!r}.") from None
    height, width = frame.shape[:2]
    xa, ya, xb, yb = max(x1, 0), max(y1, 0), min(x2, width), min(y2, height)
    if xb <= xa or yb <= ya:
        raise InputError(f"box {(x1, y1, x2, y2)} does not overlap the {width}x{height} frame (it needs x1 < x2, y1 < "
                         "y2 inside the frame). Check the face boxes (nbhelpers.faces.track) or the boxes you passed.")
    crop = np.ascontiguousarray(frame[ya:yb, xa:xb])
    return cv2.resize(crop, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_LANCZOS4)


def encode(crops_256: Any, vae: Any, generator: Any = None, mode: str = "sample", *, first_index: int = 0,
           batch_size: int = 8):
    """VAE-encode (N, 256, 256, 3) uint8 BGR ``crops_256`` (an array, a list of arrays, or a tensor on any device) into
    MuseTalk's (N, 8, 32, 32) latents in the VAE dtype on its device: channels 0-3 the masked crop's, 4-7 the whole's.

    Per crop: BGR to RGB, ``/255``, ``(x - 0.5) / 0.5``, rows 128..255 set to -1 in the masked copy; both copies in
    one VAE call (``batch_size`` crops a call, halved on CUDA out-of-memory); each posterior sampled (``mode``
    ``"sample"``, official: ``mean + std * noise``) or at its mean (``"mode"``), times the scaling factor (0.18215).
    The official noise is unseeded (quirk Q1); here frame ``first_index + i`` draws its masked then reference noise,
    (1, 4, 32, 32) float32 each, from a CPU generator seeded by :func:`frame_seed` of the base seed ``generator`` (an
    int >= 0, one drawn from a ``torch.Generator``, or None: torch's global RNG), so a seed gives the same latents on
    every device, batch size and split of the video. InputError for a bad argument; OutOfMemoryError when batch
    size 1 does not fit. Source: ``musetalk/models/vae.py:35-94,110-122``, ``musetalk/utils/utils.py:154,159``;
    docs/official-behaviour.md §4.1-§4.3, #q1."""
    import torch

    if mode not in LATENT_MODES:
        raise InputError(f"mode must be one of {LATENT_MODES}; got {mode!r}. 'sample' is the official inference, "
                         "'mode' the deterministic posterior mean.")
    crops = _check_crops(crops_256)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InputError(f"batch_size must be an integer >= 1; got {batch_size!r}.")
    if isinstance(first_index, bool) or int(first_index) != first_index or first_index < 0:
        raise InputError(f"first_index must be an integer >= 0 (the frame index of the first crop); got "
                         f"{first_index!r}.")

    device, dtype = _device_dtype(vae, "vae")
    scaling = _scaling_factor(vae)
    base_seed = _base_seed(generator) if mode == "sample" else None
    n = int(crops.shape[0])

    def step(sl: slice):
        with torch.no_grad():
            batch = crops[sl]
            x = torch.from_numpy(batch) if isinstance(batch, np.ndarray) else batch
            b = x.shape[0]
            reference = _normalise(to_device(x, device) if x.device.type == "cpu" else x.to(device), dtype)
            masked = reference.clone()
            masked[:, :, MASK_ROW:, :] = -1.0
            posterior = vae.encode(torch.cat([masked, reference], dim=0)).latent_dist
            if mode == "mode":
                z = posterior.mean
            else:
                noise = _frame_noise(base_seed, range(first_index + sl.start, first_index + sl.stop),
                                     tuple(posterior.mean.shape[1:]))
                z = posterior.mean + posterior.std * to_device(noise, device).to(posterior.mean.dtype)
            z = z * scaling
            return torch.cat([z[:b], z[b:]], dim=1)  # masked ‖ reference, per frame

    out = [latents for _, latents in batched(n, batch_size, step, stage="encode")]
    if not out:
        return torch.empty((0, LATENT_CHANNELS, LATENT_SIZE, LATENT_SIZE), device=device, dtype=dtype)
    return torch.cat(out, dim=0) if len(out) > 1 else out[0]


def _normalise(x_uint8_bhwc, dtype):
    """(B, 256, 256, 3) uint8 BGR -> contiguous (B, 3, 256, 256) RGB in [-1, 1] (float32 maths, then ``dtype``),
    NCHW as the official ``transpose`` gives (``vae.py:72-80``): a channels-last tensor rounds differently."""
    x = x_uint8_bhwc.flip(-1).permute(0, 3, 1, 2).contiguous().float() / 255.0
    return ((x - 0.5) / 0.5).to(dtype)


def _frame_noise(base_seed: int, frame_indices: range, latent_shape: tuple[int, ...]):
    """(2B, C, h, w) float32 CPU noise: the masked draws of the B frames, then their reference draws."""
    import torch

    masked, reference = [], []
    for i in frame_indices:
        g = torch.Generator(device="cpu").manual_seed(frame_seed(base_seed, i))
        masked.append(torch.randn((1, *latent_shape), generator=g, dtype=torch.float32))
        reference.append(torch.randn((1, *latent_shape), generator=g, dtype=torch.float32))
    return torch.cat(masked + reference, dim=0)


def frame_seed(base_seed: int, frame_index: int) -> int:
    """The seed of frame ``frame_index``'s noise generator in a run seeded ``base_seed``: int in [0, 2**63) from
    numpy's ``SeedSequence``."""
    state = np.random.SeedSequence([int(base_seed), int(frame_index)]).generate_state(1, dtype=np.uint64)
    return int(state[0]) & (2**63 - 1)


def _base_seed(generator: Any) -> int:
    import torch

    if isinstance(generator, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    if generator is None:
        return int(torch.randint(0, 2**62, (1,)).item())
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool) and generator >= 0:
        return int(generator)
    raise InputError(f"generator must be a seed (an int >= 0), a torch.Generator or None; got {generator!r}. Use "
                     "InferenceConfig.seed.")


def decode(latents: Any, vae: Any):
    """Decode (B, 4, 32, 32) float UNet latents (any device; else InputError) to (B, 256, 256, 3) uint8 BGR crops on
    the VAE's device, an inference tensor: ``(1 / scaling_factor) * z`` (the official order), VAE decode,
    ``(x / 2 + 0.5).clamp(0, 1)``, then ``x 255`` in float32 rounded half to even.
    Source: ``musetalk/models/vae.py:96-108``; docs/official-behaviour.md §6."""
    import torch

    if not isinstance(latents, torch.Tensor) or latents.ndim != 4 or latents.shape[1] != 4 \
            or not latents.is_floating_point():
        raise InputError(f"latents must be a float tensor (B, 4, 32, 32) (the UNet output); got {_describe(latents)}.")
    device, dtype = _device_dtype(vae, "vae")
    scaling = _scaling_factor(vae)
    with torch.inference_mode():
        z = (1 / scaling) * latents.to(device)  # official order (vae.py:96-108): times the inverse
        # NCHW, as the decoder's compiled code expects: the channels-last UNet returns channels-last latents
        image = vae.decode(z.to(dtype).contiguous()).sample
        image = (image / 2 + 0.5).clamp(0, 1)
        pixels = (image.float() * 255).round().to(torch.uint8)  # (B, 3, H, W) RGB
        return pixels.flip(1).permute(0, 2, 3, 1).contiguous()  # (B, H, W, 3) BGR


def unet_step(unet: Any, pe: Callable[[Any], Any], latent_batch: Any, feature_batch: Any):
    """One MuseTalk UNet call at timestep 0, ``unet(latents, 0, encoder_hidden_states=pe(features)).sample``: a
    (B, 4, 32, 32) tensor in the UNet dtype on its device from ``latent_batch`` (B, 8, 32, 32) and ``feature_batch``
    (B, 50, 384) on any device (else InputError), the positional encoding added here as officially. No scheduler.
    Source: ``scripts/inference.py:50,199-203``, ``musetalk/models/unet.py:12-27``; docs/official-behaviour.md §6."""
    import torch

    _check_pair(latent_batch, feature_batch)
    device, dtype = _device_dtype(unet, "unet")

    with torch.inference_mode():
        timesteps = device_constant([0], device)  # int64 0, made once per device
        hidden = pe(feature_batch.to(device=device, dtype=dtype)).to(dtype)
        return unet(latent_batch.to(device=device, dtype=dtype), timesteps, encoder_hidden_states=hidden).sample


def encode_frames(frames: Any, crop_boxes: Any, face_frames: Sequence[int], vae: Any, *, seed: int = 0,
                  mode: str = "sample", batch_size: int = 8, progress: Any = True):
    """(M, 8, 32, 32) contiguous latents (VAE dtype) of the M >= 1 increasing ``face_frames`` of N (H, W, 3) uint8
    BGR ``frames`` (random access) with (N, 4) ``crop_boxes``: crops (:func:`crop_and_resize`) encoded in runs of
    consecutive frames, ``batch_size`` a call, each frame's noise seeded by its index. ``progress``: show a
    ``latents`` bar, or a bar to advance. InputError for no face frame or a bad crop or option.
    Source: ``scripts/inference.py:163-176``; docs/official-behaviour.md §4."""
    import torch

    face_frames = np.asarray(face_frames, dtype=np.int64)
    if face_frames.size == 0:
        raise InputError("face_frames is empty: there is no frame with a face to encode.")
    batch = max(1, int(batch_size))
    starts = [0] + [k for k in range(1, len(face_frames)) if face_frames[k] != face_frames[k - 1] + 1]
    bounds = list(zip(starts, starts[1:] + [len(face_frames)], strict=True))
    # On CUDA a short batch is padded with copies of its last crop (latents dropped), so every VAE call has one
    # shape and cuDNN plans once.
    pad = _device_dtype(vae, "vae")[0].type == "cuda"
    chunks = []
    with stage_bar(progress, len(face_frames), "latents") as pbar:
        for run_start, run_stop in bounds:
            for start in range(run_start, run_stop, batch):
                idx = face_frames[start:min(start + batch, run_stop)]
                crops = np.stack([crop_and_resize(frames[int(i)], crop_boxes[int(i)]) for i in idx])
                if pad and len(idx) < batch:
                    crops = np.concatenate([crops, np.repeat(crops[-1:], batch - len(idx), axis=0)])
                chunks.append(encode(crops, vae, generator=int(seed), mode=mode, first_index=int(idx[0]),
                                     batch_size=batch)[:len(idx)])
                pbar.update(len(idx))
    return torch.cat(chunks).contiguous()


def _check_crops(crops: Any):
    import torch

    if isinstance(crops, (list, tuple)):
        if not crops:
            return np.zeros((0, CROP_SIZE, CROP_SIZE, 3), np.uint8)
        if all(isinstance(c, np.ndarray) for c in crops):
            shapes = {c.shape for c in crops}
            if len(shapes) != 1:
                raise InputError(f"crops_256 must all be (256, 256, 3); got shapes {sorted(shapes)}. Make each with "
                                 "nbhelpers.latents.crop_and_resize(frame, box).")
            crops = np.stack(crops)
    ok = ((isinstance(crops, np.ndarray) and crops.dtype == np.uint8)
          or (isinstance(crops, torch.Tensor) and crops.dtype == torch.uint8))
    if not ok or crops.ndim != 4 or tuple(crops.shape[1:]) != (CROP_SIZE, CROP_SIZE, 3):
        raise InputError(f"crops_256 must be (N, 256, 256, 3) uint8 BGR crops (numpy or torch); got "
                         f"{_describe(crops)}. Make each with nbhelpers.latents.crop_and_resize(frame, box).")
    return crops


def _check_pair(latent_batch: Any, feature_batch: Any) -> None:
    import torch

    if not isinstance(latent_batch, torch.Tensor) or latent_batch.ndim != 4 \
            or latent_batch.shape[1] != LATENT_CHANNELS:
        raise InputError(f"latent_batch must be a tensor (B, 8, 32, 32) from nbhelpers.latents.encode; got "
                         f"{_describe(latent_batch)}.")
    if not isinstance(feature_batch, torch.Tensor) or feature_batch.ndim != 3 \
            or tuple(feature_batch.shape[1:]) != (AUDIO_TOKENS, WHISPER_DIM):
        raise InputError(f"feature_batch must be a tensor (B, {AUDIO_TOKENS}, {WHISPER_DIM}) of whisper tokens; got "
                         f"{_describe(feature_batch)}.")
    if latent_batch.shape[0] != feature_batch.shape[0]:
        raise InputError(f"latent_batch and feature_batch must have the same batch size B; got "
                         f"{latent_batch.shape[0]} and {feature_batch.shape[0]}.")


def _device_dtype(model: Any, name: str):
    try:
        p = next(model.parameters())
    except (StopIteration, AttributeError, TypeError):
        raise InputError(f"{name} must be a torch module with parameters; got {type(model).__name__}. Load it "
                         f"with nbhelpers.models.load_{name}(weights_dir).") from None
    return p.device, p.dtype


def _scaling_factor(vae: Any) -> float:
    """``vae.config.scaling_factor``, else diffusers' default 0.18215 (sd-vae-ft-mse's config has none)."""
    value = getattr(getattr(vae, "config", None), "scaling_factor", None)  # diffusers' FrozenDict has attributes
    return float(value) if value is not None else VAE_SCALING


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"{type(x).__name__} of shape {tuple(shape)} and dtype {getattr(x, 'dtype', None)}"
    return f"{type(x).__name__} {x!r}"[:200]
