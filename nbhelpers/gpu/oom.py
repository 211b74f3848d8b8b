"""Recovery from out-of-memory: stages run in ordered batches that halve on OOM without losing a frame."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

from ..errors import FallbackWarning, InputError, OutOfMemoryError
from .memory import empty_cache
from .model import T


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` is an out-of-memory error that a smaller batch may avoid: torch's ``OutOfMemoryError``, a
    RuntimeError saying "out of memory", "CUBLAS_STATUS_ALLOC_FAILED" or "can't allocate memory", or
    :class:`~nbhelpers.errors.OutOfMemoryError` (an inner :func:`batched` that failed at batch 1)."""
    if type(exc).__name__ in ("OutOfMemoryError", "CudaOutOfMemoryError"):
        return True
    text = str(exc).lower() if isinstance(exc, RuntimeError) else ""
    return any(s in text for s in ("out of memory", "cublas_status_alloc_failed", "can't allocate memory"))


def batched(n_items: int, batch_size: int, step: Callable[[slice], T], *, stage: str = "batch",
            on_oom: Callable[[], None] | None = None) -> Iterator[tuple[slice, T]]:
    """Run ``step`` over ``range(n_items)`` in consecutive slices, halving the batch on out-of-memory.

    ``step`` gets a ``slice`` of item indices (frames), ``batch_size`` items at first, and returns that batch's
    result, keeping no partial effect. Items run in order, each once: on an out-of-memory error (:func:`is_oom`)
    ``on_oom`` runs (default :func:`empty_cache`), the failed batch's length is halved, kept for the rest of the
    stage, and the same start is retried, with a warning naming ``stage``. Yields ``(slice, result)`` in order.
    Raises InputError: ``n_items`` < 0 or ``batch_size`` < 1; OutOfMemoryError: A batch of 1 still runs out of memory.
    Source: ``utils.py:49-74``, ``inference.py:187-206`` (fixed-size batches in order); the halving is ours."""
    for name, value, least in (("n_items", n_items, 0), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{name} must be a whole number >= {least}; got {value!r}.")
    return _batched(n_items, batch_size, step, stage, on_oom)


def _batched(n_items: int, size: int, step: Callable[[slice], T], stage: str,
             on_oom: Callable[[], None] | None) -> Iterator[tuple[slice, T]]:
    start = 0
    while start < n_items:
        stop = min(start + size, n_items)
        try:
            result = step(slice(start, stop))
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(exc):
                raise
        else:
            yield slice(start, stop), result
            result = None  # do not hold batch k's output (GPU frames) while batch k+1 runs
            start = stop
            continue
        # Outside the except block: the exception and its traceback (which holds the failed call's frames and their
        # tensors) are gone, so emptying the cache can return that memory.
        (on_oom or empty_cache)()
        tried = stop - start  # may be less than size at the end of the stage, or when n_items < batch_size
        if tried == 1:
            raise OutOfMemoryError(
                f"{stage}: the GPU ran out of memory even at batch size 1 (item {start}). Free GPU memory "
                "(close other notebooks, restart the runtime) or run on a larger GPU.")
        size = tried // 2
        warnings.warn(f"{stage}: CUDA out of memory at batch size {tried} (items {start}-{stop - 1}); "
                      f"retrying from item {start} at batch size {size}, kept for the rest of the stage. "
                      "No frame is lost.", FallbackWarning, stacklevel=2)
