"""The one long-lived thread per avatar that runs the model work of all its live sessions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..engine import PinnedRing


class ModelThread:
    """The one long-lived thread that runs an avatar's model work for all its live sessions (kept in its state).

    Why a thread of its own: PyTorch caches the cuDNN execution plan of each convolution shape per thread
    (``thread_local`` caches in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``), so work on a fresh thread re-plans
    every convolution of the UNet, the VAE decoder and whisper's front-end on its first call of each shape, which
    a warm-up done on another thread does not spare it. Here the warm-up and every session's whisper passes and
    renders run on the same thread, which outlives the sessions: each shape is planned once per avatar. The
    pinned host buffers of the rendered batches (:class:`~nbhelpers.engine.PinnedRing`) live here too, for the
    same reason: made once, not inside a session's first frame. The ring is only used on this thread and each
    batch is copied out before the next render call, so sessions can share it.

    Sessions of one avatar hand their work over one at a time (the device runs it in turn anyway); a call made
    from this thread itself runs inline. Waiting for a result blocks on the future (no polling).
    """

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nbhelpers-live-models",
                                        initializer=self._started)
        self.ident: int | None = None  # the thread's id once it runs
        self.ring = PinnedRing()
        self.warm: set = set()  # what the warm-ups have run on this thread: "whisper", ("render", frames)

    def _started(self) -> None:
        self.ident = threading.get_ident()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this thread; returns its result or raises its exception in the caller."""
        if threading.get_ident() == self.ident:
            return fn(*args)
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        """Let the thread end once its queued work is done (a later :meth:`call` raises RuntimeError)."""
        self._pool.shutdown(wait=False)


def model_thread(avatar: Any) -> ModelThread:
    """The avatar's :class:`ModelThread` (made on first use, kept in its device state until ``avatar.close()``)."""
    return avatar.keep("live_models_thread", ModelThread)


__all__ = ["ModelThread", "model_thread"]
