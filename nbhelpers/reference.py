"""MuseTalk as one plain loop, one frame at a time: the readable account of the algorithm and the engine's oracle.

Each step is a function a notebook cell can call (``06_inside_musetalk``), in the order of ``scripts/inference.py:
150-227``; :func:`lipsync` chains them with no batching, streaming or device tricks, and tests check that the engine
gives the same frames within 1 level. "§" is docs/official-behaviour.md; "paper" MuseTalk (Zhang et al. 2024,
arXiv:2410.10122), §3 its method. Frames are (H, W, 3) uint8 BGR. As the engine does, the VAE sample is seeded per
source frame (quirk Q1) and a frame without a face is kept as it is (Q6, Q7)."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from . import blending, faces, latents, parsing
from .audio import PAD_LEFT_STEPS
from .constants import AUDIO_WINDOW, FPS, SAMPLE_RATE, SEGMENT_SAMPLES, WHISPER_DIM, WHISPER_FPS

STEP = WHISPER_FPS // FPS  # whisper encoder frames (20 ms each) per video frame (40 ms): 2


def source_index(t: int, n_frames: int) -> int:
    """Output frame ``t``'s source frame: the video plays forward, back, and again, never jumping (§4.5)."""
    k = t % (2 * n_frames)
    return k if k < n_frames else 2 * n_frames - 1 - k


def find_face(frame: np.ndarray, detector: Any, config: Any) -> tuple[tuple[int, int, int, int] | None, Any]:
    """Step 1: the crop box spans the 68 landmarks across and reaches as far above landmark 29 (nose bridge, moved by
    ``bbox_shift``) as the chin is below it, so its midline, the top of the repainted half, is on the nose; v1.5 adds
    ``extra_margin`` px under the chin. Returns ``(box or None, the detector's FaceResult or None)``. Source:
    ``preprocessing.py:84-137``, ``inference.py:170-172`` (§3.3)."""
    found = detector.detect(frame[None])[0]
    if found is None:
        return None, None
    lms, box = np.asarray(found.landmarks, np.float32).reshape(68, 2), np.asarray(found.face_box, float).reshape(4)
    return faces.crop_box(lms, box, frame.shape, config.version, config.bbox_shift, config.extra_margin), found


def crop_face(frame: np.ndarray, box: Sequence[int]) -> np.ndarray:
    """Step 2: the box resized to the 256 x 256 crop the networks know, whatever the face's size (§3.3)."""
    return latents.crop_and_resize(frame, box)


def encode(crop: np.ndarray, vae: Any, config: Any, index: int):
    """Step 3: the VAE turns two images into 4 x 32 x 32 latents, stacked to (1, 8, 32, 32): the crop with rows
    128..255 masked (the mouth hidden, so the network must draw it from the audio) and the whole crop (the reference:
    who it is, lit how); 32 x 32 makes MuseTalk fast (paper §3). Seeded by (``config.seed``, source frame ``index``).
    Source: ``vae.py:40-122`` (§4.1-4.3)."""
    return latents.encode(crop[None], vae, generator=config.seed, mode=config.latent_mode, first_index=index)


def whisper_states(waveform: np.ndarray, models: Any):
    """Step 4a: whisper-tiny's encoder hears speech as 50 vectors a second, all 5 hidden states kept (low layers:
    sound, high: phonemes): (E, 5, 384), E = seconds x 50. Source: ``audio_processor.py:21-65`` (§5.1)."""
    import torch
    pieces = []
    with torch.no_grad():
        for start in range(0, len(waveform), SEGMENT_SAMPLES):  # 30 s segments, each a log-mel of its own
            mel = models.feature_extractor(waveform[start:start + SEGMENT_SAMPLES], sampling_rate=SAMPLE_RATE,
                                           return_tensors="pt")["input_features"].to(models.device, models.dtype)
            hidden = models.whisper.encoder(mel, output_hidden_states=True).hidden_states
            pieces.append(torch.stack(tuple(hidden), dim=2)[0])
    return torch.cat(pieces)[:len(waveform) * WHISPER_FPS // SAMPLE_RATE]


def window_frames(t: int) -> np.ndarray:
    """The 10 encoder frames frame ``t`` hears: its own 40 ms and 80 ms on each side, as a mouth's shape depends on
    the sounds around it. Source: ``audio_processor.py:48,67-90`` (§5.1 step 7)."""
    return STEP * t - STEP * PAD_LEFT_STEPS + np.arange(AUDIO_WINDOW)


def audio_window(states: Any, t: int):
    """Step 4b: frame ``t``'s (50, 384) tokens, ``time x 5 + layer``, zeros outside the speech (§5.1 steps 6-8)."""
    idx = window_frames(t)
    inside = (idx >= 0) & (idx < len(states))
    window = states.new_zeros((AUDIO_WINDOW, *states.shape[1:]))
    window[np.flatnonzero(inside)] = states[idx[inside]]
    return window.reshape(-1, WHISPER_DIM)


def generate(latent: Any, tokens: Any, models: Any):
    """Step 5: one UNet pass at timestep 0, no noise, no sampling loop: it inpaints in one step (paper §3). The tokens
    plus a sinusoidal code of their position reach every level through cross-attention. Returns (1, 4, 32, 32).
    Source: ``inference.py:50,199-203``, ``unet.py:12-27`` (§5.4, §6)."""
    import torch
    with torch.no_grad():
        audio = models.pe(tokens[None].to(models.device, models.dtype)).to(models.dtype)
        step = torch.tensor([0], device=models.device)
        return models.unet(latent.to(models.device, models.dtype), step, encoder_hidden_states=audio).sample


def decode(latent: Any, vae: Any) -> np.ndarray:
    """Step 6: the VAE decoder turns the latent back into a (256, 256, 3) uint8 BGR face (``vae.py:96-108``, §6)."""
    return latents.decode(latent, vae)[0].cpu().numpy()


def parse_face(frame: np.ndarray, box: Sequence[int], parser: Any) -> np.ndarray:
    """Step 7a: BiSeNet labels each pixel of the square 1.5 times the box (skin, lips, nose, neck...), so that only
    face pixels change: (512, 512) uint8 labels. Source: ``blending.py:7-13,51-65`` (§7.2-7.3)."""
    square = blending.expanded_square(box)
    return parser.labels([np.ascontiguousarray(blending.crop_padded(frame, square)[:, :, ::-1])])[0]


def blend_mask(labels: np.ndarray, box: Sequence[int], config: Any) -> np.ndarray:
    """Step 7b: the labels of ``config``'s parsing mode, kept inside the box and below its midline, feathered so no
    seam shows: (2s, 2s) uint8 over the square. Source: ``blending.py:65-82`` (§7.2)."""
    mask = parsing.face_mask(labels, config.effective_parsing_mode, config.left_cheek_width, config.right_cheek_width)
    return blending.prepare_mask(mask, box, blending.expanded_square(box), config.blur_ratio)


def paste_back(frame: np.ndarray, face: np.ndarray, box: Sequence[int], mask: np.ndarray) -> np.ndarray:
    """Step 8: the face, resized to the box, mixed into a copy of the frame through the mask (§7.1-7.2)."""
    return blending.blend_cpu(frame, face, box, mask, blending.expanded_square(box))


def lipsync(frames: Sequence[np.ndarray], waveform: np.ndarray, models: Any, parser: Any, config: Any, *,
            detector: Any = None, boxes: Sequence[Any] | None = None,
            timings: dict[str, float] | None = None) -> Iterator[np.ndarray]:
    """Yield the ``floor(seconds x 25)`` output frames, each made from scratch by the steps above, from ``frames``
    (N at 25 fps), ``waveform`` (16 kHz float32), ``pipe.models``, ``pipe.face_parser``, an InferenceConfig and a
    landmark ``detector`` or ``boxes`` (a box or None per source frame); ``timings`` collects each stage's seconds."""
    run = functools.partial(_timed, timings)
    states = run("audio", whisper_states, waveform, models)
    for t in range(len(waveform) * FPS // SAMPLE_RATE):
        j = source_index(t, len(frames))
        frame = frames[j]
        box = boxes[j] if boxes is not None else run("faces", find_face, frame, detector, config)[0]
        if box is None:
            yield np.array(frame)  # no face: the frame as it is
            continue
        latent = run("latents", encode, run("crop", crop_face, frame, box), models.vae, config, j)
        face = run("decode", decode, run("unet", generate, latent, audio_window(states, t), models), models.vae)
        mask = run("mask", blend_mask, run("parsing", parse_face, frame, box, parser), box, config)
        yield run("blending", paste_back, frame, face, box, mask)


def _timed(timings: dict[str, float] | None, stage: str, step: Any, *args: Any) -> Any:
    """``step(*args)``, adding its seconds (GPU work included) to ``timings[stage]``."""
    start, out = time.perf_counter(), step(*args)
    if timings is not None:
        import torch
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start
    return out
