"""The CUDA allocator setting made when :mod:`nbhelpers.gpu` is imported."""

from __future__ import annotations

import os
import sys

ALLOCATOR_SETTING = "expandable_segments:True"


def prefer_expandable_segments() -> bool:
    """Ask PyTorch's CUDA caching allocator for expandable segments, unless the allocator is configured already.

    A job's batches come in several sizes (VAE encode, UNet, decode, paste-back) and the default allocator keeps
    blocks it cannot reuse; expandable segments lower the peak reserved memory (bench/RESULTS.md, "Memory by stage").
    Runs at import of :mod:`nbhelpers.gpu`. Sets ``PYTORCH_CUDA_ALLOC_CONF`` for this process and its children only
    when neither ``PYTORCH_CUDA_ALLOC_CONF`` nor ``PYTORCH_ALLOC_CONF`` is set, the platform is Linux,
    ``NBHELPERS_ALLOCATOR`` is not ``default`` and CUDA has not started in this process.

    Returns:
        True when this call set it.
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
