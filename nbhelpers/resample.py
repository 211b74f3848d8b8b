"""Bit-exact torch versions of the two uint8 image filters of the official mask sequence, on any device.

PIL's resizes and ``cv2.GaussianBlur`` are separable integer filters on uint8 images, so both are written as
"gather K taps along one axis, multiply by integer weights, sum, shift" in int32 torch ops, which give the same
integers on the CPU and a GPU. Each frame of a batch may have its own geometry (tap tables padded with zero
weights). Importing this module loads numpy only.

Source: Pillow ``libImaging/Resample.c`` (``precompute_coeffs``, ``normalize_coeffs_8bpc``, 22 fractional bits,
bilinear support 1, bicubic a = -0.5 support 2, horizontal pass first); OpenCV ``imgproc/src/smooth``
(``getGaussianKernelBitExact``: tables for k <= 9, else ``sigma = 0.15 k + 0.35``; taps quantised to 8 bits with
error diffusion, summing to 256; the column pass rounds ``(v + 2^15) >> 16``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InputError

__all__ = ["PIL_FILTERS", "pil_taps", "gaussian_taps", "reflect_101", "resize_axis", "taps_table",
           "crop_resize_batch", "resize_batch", "gaussian_blur_batch"]

_PIL_BITS = 22  # PRECISION_BITS = 32 - 8 - 2 (Resample.c), 8-bit images
_CV_BITS = 8  # ufixedpoint16 fractional bits of OpenCV's bit-exact 8U Gaussian


def _bilinear(x: float) -> float:
    x = -x if x < 0.0 else x
    return 1.0 - x if x < 1.0 else 0.0


def _bicubic(x: float) -> float:
    a = -0.5
    x = -x if x < 0.0 else x
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


PIL_FILTERS = {"bilinear": (_bilinear, 1.0), "bicubic": (_bicubic, 2.0)}  # name -> (filter, support)


@functools.lru_cache(maxsize=4096)
def pil_taps(in_size: int, out_size: int, filter: str) -> tuple[np.ndarray, np.ndarray]:
    """PIL's resize taps for one axis of ``in_size`` -> ``out_size`` samples with ``filter`` (``"bilinear"``,
    ``"bicubic"``; sizes >= 1, else InputError): read-only (out_size, K) int64 ``(index, weight)``, output ``j`` being
    ``clip(sum_k in[index[j, k]] * weight[j, k] + 2^21 >> 22, 0, 255)``; unused taps weigh 0."""
    if filter not in PIL_FILTERS:
        raise InputError(f"filter must be one of {sorted(PIL_FILTERS)}; got {filter!r}.")
    if in_size < 1 or out_size < 1:
        raise InputError(f"resize sizes must be >= 1; got {in_size} -> {out_size}.")
    func, support0 = PIL_FILTERS[filter]
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = support0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    index = np.zeros((out_size, ksize), np.int64)
    weight = np.zeros((out_size, ksize), np.int64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        ks = [func((x + xmin - center + 0.5) * ss) for x in range(xmax)]
        ww = 0.0
        for w in ks:
            ww += w
        for x, w in enumerate(ks):
            w = w / ww if ww != 0.0 else w
            index[xx, x] = xmin + x
            weight[xx, x] = int(-0.5 + w * (1 << _PIL_BITS)) if w < 0 else int(0.5 + w * (1 << _PIL_BITS))
    index.setflags(write=False)
    weight.setflags(write=False)
    return index, weight


@functools.lru_cache(maxsize=512)
def gaussian_taps(ksize: int) -> np.ndarray:
    """The integer kernel of ``cv2.GaussianBlur(src_uint8, (ksize, ksize), 0)`` along one axis (``ksize`` a positive
    odd integer, else InputError): read-only (ksize,) int64 taps in 1/256 units, summing to 256."""
    if isinstance(ksize, bool) or not isinstance(ksize, (int, np.integer)) or ksize < 1 or ksize % 2 == 0:
        raise InputError(f"ksize must be a positive odd integer; got {ksize!r}.")
    n = int(ksize)
    tables = {1: (1.0,), 3: (0.25, 0.5, 0.25), 5: (0.0625, 0.25, 0.375, 0.25, 0.0625),
              7: (0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125),
              9: tuple(v / 256 for v in (4, 13, 30, 51, 60, 51, 30, 13, 4))}
    if n in tables:
        kernel = list(tables[n])
    else:
        sigma = n * 0.15 + 0.35
        scale2 = -0.125 / (sigma * sigma)
        half = (n - 1) // 2
        values = [math.exp(float(x * x) * scale2) for x in range(1 - n, 1 - n + 2 * half, 2)]
        total = 0.0
        for v in values:
            total += v
        total = total * 2 + 1.0
        mul = 1.0 / total
        kernel = [v * mul for v in values] + [mul] + [v * mul for v in reversed(values)]
    unit = 1 << _CV_BITS
    taps = np.zeros(n, np.int64)
    err, used = 0.0, 0
    for i in range(n // 2):
        adjusted = kernel[i] * unit + err
        v = int(math.floor(adjusted + 0.5))  # cvRound of a positive value
        err = adjusted - v
        taps[i] = taps[n - 1 - i] = v
        used += v
    taps[n // 2] = unit - 2 * used
    taps.setflags(write=False)
    return taps


def reflect_101(index: np.ndarray, size: int) -> np.ndarray:
    """OpenCV ``BORDER_REFLECT_101`` (``gfedcb|abcdefgh|gfedcba``) of integer positions into ``0 .. size - 1`` (int64).
    """
    index = np.asarray(index, np.int64)
    if size == 1:
        return np.zeros_like(index)
    period = 2 * (size - 1)
    folded = np.mod(index, period)
    return np.where(folded >= size, period - folded, folded)


def taps_table(rows: Sequence[tuple[np.ndarray, np.ndarray]], length: int,
               offsets: Sequence[int] | None = None, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Stack B per-frame ``rows`` ``(index (O_b, K_b), weight (O_b, K_b))`` into one (B, ``length``, K) int64 table;
    ``offsets`` (B ints) shift each frame's indices, then taps outside ``0 .. limit - 1`` weigh 0 (PIL's black
    outside the frame) with a clamped index."""
    k = max(int(r[0].shape[1]) for r in rows)
    index = np.zeros((len(rows), length, k), np.int64)
    weight = np.zeros((len(rows), length, k), np.int64)
    for b, (idx, w) in enumerate(rows):
        o, kb = idx.shape
        idx = idx + (0 if offsets is None else int(offsets[b]))
        w = np.array(w)
        if limit is not None:
            w[(idx < 0) | (idx >= limit)] = 0
            idx = np.clip(idx, 0, limit - 1)
        index[b, :o, :kb] = idx
        weight[b, :o, :kb] = w
    return index, weight


def _upload(t: Any, device: Any) -> Any:
    """A host table on ``device``, through pinned memory on CUDA so that the copy does not wait for the GPU."""
    if t.device == device or getattr(device, "type", str(device)) != "cuda":
        return t.to(device)
    return (t if t.is_cuda else t.pin_memory()).to(device, non_blocking=True)


def resize_axis(x: Any, index: Any, weight: Any) -> Any:
    """One PIL pass along the last axis: ``out[b, ..., j] = clip8((sum_k x[b, ..., index[b, j, k]] * weight[b, j, k]
    + 2^21) >> 22)``.

    ``x`` is (B, ..., L) uint8 or int32 torch; ``index`` and ``weight`` (B, O, K) integer tensors or arrays. Returns
    (B, ..., O) uint8 on ``x``'s device."""
    import torch

    device = x.device
    if isinstance(weight, torch.Tensor):
        active = range(int(weight.shape[-1]))
    else:  # host tables: skip the all-zero tap columns without asking the device
        active = [int(k) for k in np.flatnonzero(np.any(np.asarray(weight) != 0, axis=(0, 1)))]
    index = _upload(torch.as_tensor(index, dtype=torch.int64), device)
    weight = _upload(torch.as_tensor(weight, dtype=torch.int64).to(torch.int32), device)
    batch, n_out, _ = index.shape
    lead = x.shape[1:-1]
    xi = x.to(torch.int32)
    view = (batch,) + (1,) * len(lead) + (n_out,)
    full = (batch,) + tuple(lead) + (n_out,)
    acc = torch.full(full, 1 << (_PIL_BITS - 1), dtype=torch.int32, device=device)
    for k in active:
        taps = torch.gather(xi, -1, index[:, :, k].reshape(view).expand(full))
        acc += taps * weight[:, :, k].reshape(view)
    return torch.bitwise_right_shift(acc, _PIL_BITS).clamp_(0, 255).to(torch.uint8)


def gaussian_blur_batch(masks: Any, sides: Sequence[int], ksizes: Sequence[int]) -> Any:
    """``cv2.GaussianBlur(mask, (k, k), 0)`` of each frame's top-left ``side x side`` square, batched and bit-exact:
    (B, S, S) uint8 torch ``masks`` and B ``sides`` and odd ``ksizes`` (else InputError) give (B, S, S) uint8, each
    square blurred with ``BORDER_REFLECT_101`` on the square alone, 0 elsewhere."""
    import torch

    if not len(sides) == len(ksizes) == masks.shape[0]:
        raise InputError(f"sides and ksizes need one entry per mask ({masks.shape[0]}); got {len(sides)} and "
                         f"{len(ksizes)}.")
    length = int(masks.shape[-1])
    taps = [gaussian_taps(int(k)) for k in ksizes]
    radius = max(len(t) // 2 for t in taps)
    positions = np.arange(-radius, length + radius)
    index = np.stack([reflect_101(positions, int(side)) for side in sides])        # (B, L + 2r), per-frame border
    weight = np.zeros((len(taps), 2 * radius + 1), np.int64)
    for b, t in enumerate(taps):
        weight[b, radius - len(t) // 2:radius + len(t) // 2 + 1] = t
    active = [int(k) for k in np.flatnonzero(weight.any(axis=0))]
    device = masks.device
    index_t = _upload(torch.from_numpy(index), device)
    weight_t = _upload(torch.from_numpy(weight).to(torch.int32), device)

    def one_pass(x):  # along the last axis: reflect-pad once per frame, then one shifted slice per tap
        batch, rows, _ = x.shape
        padded = torch.gather(x.to(torch.int32), -1, index_t[:, None, :].expand(batch, rows, length + 2 * radius))
        acc = torch.zeros((batch, rows, length), dtype=torch.int32, device=device)
        for k in active:
            acc += padded[..., k:k + length] * weight_t[:, k].view(batch, 1, 1)
        return acc

    across = one_pass(masks)                                                      # rows pass: exact, x 256
    down = one_pass(across.transpose(-1, -2).contiguous())                        # columns pass, x 65536
    down = torch.bitwise_right_shift(down + (1 << (2 * _CV_BITS - 1)), 2 * _CV_BITS).clamp_(0, 255)
    sides_t = _upload(torch.as_tensor(list(sides), dtype=torch.int64), device)
    inside = torch.arange(length, device=device)[None] < sides_t[:, None]
    keep = (inside[:, :, None] & inside[:, None, :]).to(torch.uint8)
    return down.to(torch.uint8).transpose(-1, -2) * keep


def crop_resize_batch(images: Any, squares: Sequence[Sequence[int]], size: int, filter: str = "bilinear") -> Any:
    """PIL ``image.crop(square).resize((size, size), filter)`` of each of (B, C, H, W) uint8 torch ``images``, exact,
    on its device: (B, C, size, size) uint8. ``squares``: B ``(xs, ys, xe, ye)`` in image pixels, possibly past an
    edge (black there, as PIL's ``crop``)."""
    height, width = int(images.shape[-2]), int(images.shape[-1])
    sides = [int(sq[2]) - int(sq[0]) for sq in squares]
    across = [pil_taps(side, size, filter) for side in sides]
    h_index, h_weight = taps_table(across, size, offsets=[int(sq[0]) for sq in squares], limit=width)
    v_index, v_weight = taps_table(across, size, offsets=[int(sq[1]) for sq in squares], limit=height)
    rows = resize_axis(images, h_index, h_weight)                                 # (B, C, H, size)
    return resize_axis(rows.transpose(-1, -2), v_index, v_weight).transpose(-1, -2).contiguous()


def resize_batch(images: Any, sides: Sequence[int], filter: str = "bicubic") -> Any:
    """PIL ``resize((side_b, side_b), filter)`` of each (N, N) uint8 image of a (B, N, N) tensor to its own side, exact:
    a (B, S, S) uint8 tensor, ``S = max(sides)``, frame ``b`` in ``[:sides[b], :sides[b]]``, 0 elsewhere."""
    n = int(images.shape[-1])
    length = max(int(s) for s in sides)
    index, weight = taps_table([pil_taps(n, int(s), filter) for s in sides], length)
    rows = resize_axis(images, index, weight)                                     # (B, N, S)
    return resize_axis(rows.transpose(-1, -2), index, weight).transpose(-1, -2).contiguous()
