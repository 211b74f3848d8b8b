"""The one long-lived thread per avatar that runs the model work of all its live sessions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..engine import PinnedRing


class ModelThread:
    """The one long-lived thread that runs an avatar's model work (warm-up, whisper passes, renders) for all its
    live sessions, one call at a time; a call from the thread itself runs inline.

    PyTorch caches cuDNN plans per thread (``aten/src/ATen/native/cudnn/Conv_v8.cpp``), so one thread that outlives
    the sessions plans each shape once per avatar. Its :class:`~nbhelpers.engine.PinnedRing` is shared by the
    sessions (each batch is copied out before the next render)."""

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
        return fn(*args) if threading.get_ident() == self.ident else self._pool.submit(fn, *args).result()

    def close(self) -> None:
        """Let the thread end once its queued work is done (a later :meth:`call` raises RuntimeError)."""
        self._pool.shutdown(wait=False)


def model_thread(avatar: Any) -> ModelThread:
    """The avatar's :class:`ModelThread` (made on first use, kept in its device state until ``avatar.close()``)."""
    return avatar.keep("live_models_thread", ModelThread)
