"""The CUDA allocator setting made when :mod:`nbhelpers.gpu` is imported."""

from __future__ import annotations

import os
import sys

ALLOCATOR_SETTING = "expandable_segments:True"


def prefer_expandable_segments() -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF`` to :data:`ALLOCATOR_SETTING` on Linux unless an allocator setting exists,
    ``NBHELPERS_ALLOCATOR`` is ``default`` or CUDA has started; True when this call set it. Batches of several
    sizes leave the default allocator blocks it cannot reuse; expandable segments lower the peak reserved memory
    (bench/RESULTS.md, "Memory by stage").
    """
    if (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
            or os.environ.get("NBHELPERS_ALLOCATOR", "").lower() == "default" or not sys.platform.startswith("linux")):
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_SETTING
    return True


prefer_expandable_segments()
