"""One switch for every progress bar: ``tqdm.auto`` bars, one per stage, in domain units.

``NBHELPERS_PROGRESS=0`` in the environment, or :func:`configure`, turns them off.
"""

from __future__ import annotations

import os
from typing import Any

_settings: dict[str, Any] = {"disable": os.environ.get("NBHELPERS_PROGRESS", "1") in ("0", "false", "no")}


def configure(disable: bool | None = None, **tqdm_kwargs: Any) -> None:
    """Change how every later progress bar is made.

    Args:
        disable: True hides all bars; None leaves the current choice.
        **tqdm_kwargs: Extra keyword arguments passed to each ``tqdm`` (e.g. ``mininterval=1.0``).
    """
    if disable is not None:
        _settings["disable"] = bool(disable)
    _settings.update(tqdm_kwargs)


def bar(total: int | float | None = None, desc: str = "", unit: str = "frame", **kwargs: Any):
    """A ``tqdm.auto`` progress bar for one stage; use it as a context manager.

    Args:
        total: Number of units in the stage, or None when unknown.
        desc: Stage name shown at the left (e.g. ``"faces"``).
        unit: Domain unit counted (``"frame"``, ``"batch"``, ``"B"`` for bytes).
        **kwargs: Passed to ``tqdm``, over the global settings.
    """
    from tqdm.auto import tqdm

    options = dict(_settings)
    options.update(kwargs)
    return tqdm(total=total, desc=desc, unit=unit, **options)
