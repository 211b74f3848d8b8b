"""Avatars: prepare a face once, then turn any number of speech clips into video as fast as the GPU allows.

- :mod:`nbhelpers.avatar.cache`: the folder on disk (lossless frames, arrays, manifest, fingerprints, staleness).
- :mod:`nbhelpers.avatar.prepare`: :func:`prepare_avatar` and :func:`load_avatar`.
- :mod:`nbhelpers.avatar.avatar`: :class:`Avatar`, which generates clips with the pipeline it is handed.
"""

from __future__ import annotations

from .avatar import Avatar
from .cache import AVATAR_FORMAT, LosslessFrames, write_lossless
from .prepare import load_avatar, prepare_avatar

__all__ = ["AVATAR_FORMAT", "Avatar", "LosslessFrames", "load_avatar", "prepare_avatar", "write_lossless"]
