"""The CUDA allocator setting made when :mod:`nbhelpers.gpu` is imported.

Owns :func:`prefer_expandable_segments` and its import-time call: ``PYTORCH_CUDA_ALLOC_CONF`` is set to
expandable segments before torch starts CUDA, unless the user configured the allocator.
"""

from __future__ import annotations

import os
import sys

ALLOCATOR_SETTING = "expandable_segments:True"


def prefer_expandable_segments() -> bool:
    """Ask PyTorch's CUDA caching allocator for expandable segments, unless the allocator is configured already.

    The job's batches have several sizes (VAE encode, UNet, VAE decode, full-frame paste-back), and the default
    allocator keeps the blocks of one size it cannot reuse for the next, so what the process holds grows well
    past what it uses. Measured with ``bench/memory.py`` on an H200 held to a 4 GiB and a 15 GiB card (fp16, full
    v1.5 core, 500 frames): peak reserved 2.95 -> 2.65 GiB at batch 4 (with the CUDA context: 3.63 -> 3.33 GiB,
    under the 3.5 GiB target only with this setting) and 10.03 -> 7.93 GiB at batch 32 (bench/RESULTS.md).

    Runs when :mod:`nbhelpers.gpu` is imported. It sets ``PYTORCH_CUDA_ALLOC_CONF`` for this process and its
    children only when neither ``PYTORCH_CUDA_ALLOC_CONF`` nor ``PYTORCH_ALLOC_CONF`` is set, the platform is
    Linux (Windows has no expandable segments), ``NBHELPERS_ALLOCATOR`` is not ``default`` and CUDA has not
    started in this process (after that, the allocator no longer reads it).

    Returns:
        True when this call set it.

    Source: none (ours); the setting is PyTorch's (``torch.cuda`` memory management notes, since torch 2.1).
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
