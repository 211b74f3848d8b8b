"""GPU report, precision and batch-size planning, and the out-of-memory fallback loop.

(report() and plan() are being written; ``batched`` is the contract other modules use now.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import TypeVar

from .errors import OutOfMemoryError

T = TypeVar("T")


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` is a CUDA (or MPS/CPU allocator) out-of-memory error from torch."""
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "CudaOutOfMemoryError"):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def batched(n_items: int, batch_size: int, step: Callable[[slice], T], *, stage: str = "batch",
            on_oom: Callable[[], None] | None = None) -> Iterator[tuple[slice, T]]:
    """Run ``step`` over ``range(n_items)`` in consecutive slices, halving the batch on out-of-memory.

    Items are processed strictly in order and each exactly once: when ``step(slice(i, i + b))`` raises a CUDA
    out-of-memory error, the caches are emptied, ``b`` is halved and the *same* start ``i`` is retried, so no
    item is lost or reordered and nothing before ``i`` is recomputed. The smaller batch is kept for the rest of
    the stage.

    Args:
        n_items: Number of items (frames) to process, >= 0.
        batch_size: Initial items per call, >= 1.
        step: Called with a ``slice`` of item indices; returns that batch's result.
        stage: Stage name used in the warning (e.g. ``"generate"``).
        on_oom: Called after an out-of-memory error, before retrying (default: ``torch.cuda.empty_cache``).

    Yields:
        ``(slice, result)`` for each batch, in order.

    Raises:
        OutOfMemoryError: When a batch of 1 still runs out of memory.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    start = 0
    size = int(batch_size)
    while start < n_items:
        stop = min(start + size, n_items)
        try:
            result = step(slice(start, stop))
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(exc):
                raise
            del exc
            (on_oom or _empty_cache)()
            if size == 1:
                raise OutOfMemoryError(
                    f"{stage}: the GPU ran out of memory even at batch size 1. Free GPU memory (restart the "
                    "runtime, close other notebooks) or run on a larger GPU.") from None
            new_size = max(1, size // 2)
            warnings.warn(f"{stage}: CUDA out of memory at batch size {size} (items {start}-{stop - 1}); "
                          f"retrying from item {start} at batch size {new_size}. No frame is lost.",
                          RuntimeWarning, stacklevel=2)
            size = new_size
            continue
        yield slice(start, stop), result
        start = stop


def _empty_cache() -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
