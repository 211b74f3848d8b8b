"""Recovery from out-of-memory: stages run in ordered batches that halve on OOM without losing a frame.

Owns :func:`is_oom` (which errors are out-of-memory) and :func:`batched` (the halving, resuming batch loop
that the render engine, latents, parsing and face detection run through).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

from ..errors import FallbackWarning, InputError, OutOfMemoryError
from .memory import empty_cache
from .model import T

# =====================================================================================================================
# Out-of-memory fallback
# =====================================================================================================================


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` is an out-of-memory error: torch's CUDA/MPS ``OutOfMemoryError`` (also raised by
    ``set_per_process_memory_fraction``), a RuntimeError saying "out of memory" or "CUBLAS_STATUS_ALLOC_FAILED",
    the CPU allocator's "can't allocate memory", or this package's :class:`~nbhelpers.errors.OutOfMemoryError`
    (so an inner :func:`batched` that failed at batch 1 makes an outer one halve).

    Args:
        exc: Any exception.

    Returns:
        Whether retrying with a smaller batch may succeed.

    Source: none (the official code has no out-of-memory handling; failure kind F13).
    """
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "CudaOutOfMemoryError"):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return ("out of memory" in text or "cublas_status_alloc_failed" in text or "can't allocate memory" in text)


def batched(n_items: int, batch_size: int, step: Callable[[slice], T], *, stage: str = "batch",
            on_oom: Callable[[], None] | None = None) -> Iterator[tuple[slice, T]]:
    """Run ``step`` over ``range(n_items)`` in consecutive slices, halving the batch on out-of-memory.

    Items are processed strictly in order and each exactly once: when ``step(slice(i, i + b))`` raises an
    out-of-memory error (:func:`is_oom`), the failed call's references are dropped, the caches are emptied,
    ``b`` is halved and the *same* start ``i`` is retried, so no item is lost or reordered and nothing before
    ``i`` is recomputed. The batch that failed is halved (its real length: at the end of a stage, or when
    ``n_items < batch_size``, that is less than ``batch_size``), and the smaller size is kept for the rest of the
    stage (memory that ran out once is likely to run out again). Each halving emits a ``RuntimeWarning`` that says what happened.

    Args:
        n_items: Number of items (frames) to process, >= 0.
        batch_size: Initial items per call, >= 1.
        step: Called with a ``slice`` of item indices; returns that batch's result. It must not keep partial
            effects of a failed call (write results only from what it returns).
        stage: Stage name used in the warning (e.g. ``"generate"``).
        on_oom: Called after an out-of-memory error, outside the ``except`` block (so the failed call's tensors
            are already unreferenced), before retrying. Default: :func:`empty_cache` (``gc.collect()`` and
            ``torch.cuda.empty_cache()``).

    Yields:
        ``(slice, result)`` for each batch, in order. The loop does not keep a batch's result once the next
        batch starts; drop yours too (``del``) when it is large.

    Raises:
        InputError: ``n_items`` < 0 or ``batch_size`` < 1 (checked before the first call).
        OutOfMemoryError: When a batch of 1 still runs out of memory.

    Source: the official loop ``datagen`` batches in order with a fixed size (``utils.py:49-74``,
    ``inference.py:187-206``); the halving is ours (failure kind F13).
    """
    if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 0:
        raise InputError(f"n_items must be a whole number >= 0; got {n_items!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number >= 1; got {batch_size!r}.")
    return _batched(n_items, batch_size, step, stage, on_oom)


def _batched(n_items: int, size: int, step: Callable[[slice], T], stage: str,
             on_oom: Callable[[], None] | None) -> Iterator[tuple[slice, T]]:
    start = 0
    while start < n_items:
        stop = min(start + size, n_items)
        failed = False
        try:
            result = step(slice(start, stop))
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(exc):
                raise
            failed = True
        if failed:
            # Outside the except block: the exception and its traceback (which holds the failed call's frames
            # and their tensors) are gone, so emptying the cache can return that memory.
            (on_oom or empty_cache)()
            tried = stop - start  # may be less than size at the end of the stage, or when n_items < batch_size
            if tried == 1:
                raise OutOfMemoryError(
                    f"{stage}: the GPU ran out of memory even at batch size 1 (item {start}). Free GPU memory "
                    "(close other notebooks, restart the runtime) or run on a larger GPU.")
            new_size = max(1, tried // 2)
            warnings.warn(f"{stage}: CUDA out of memory at batch size {tried} (items {start}-{stop - 1}); "
                          f"retrying from item {start} at batch size {new_size}, kept for the rest of the stage. "
                          "No frame is lost.", FallbackWarning, stacklevel=2)
            size = new_size
            continue
        yield slice(start, stop), result
        result = None  # do not hold batch k's output (GPU frames) while batch k+1 runs
        start = stop
