"""Media views beyond a single video: an inline audio player, and two views side by side."""

from __future__ import annotations

import base64
import html
import mimetypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..display import MediaView, media_path, show_video

__all__ = ["AudioView", "SideBySide", "show_audio", "side_by_side"]


@dataclass(frozen=True)
class AudioView:
    """The audio file ``path`` shown as an inline ``<audio controls>`` player when ``embedded``, else by its path;
    ``size_mb`` is its size in MB (10**6 bytes)."""

    path: Path
    embedded: bool
    size_mb: float

    def _repr_html_(self) -> str:
        if not self.embedded:
            return (f"<div>{html.escape(self.path.name)}: {self.size_mb:.1f} MB, too large to embed; it is at "
                    f"<code>{html.escape(str(self.path))}</code>.</div>")
        mime = mimetypes.guess_type(self.path.name)[0] or "audio/wav"
        if mime == "audio/x-wav":
            mime = "audio/wav"
        data = base64.b64encode(self.path.read_bytes()).decode("ascii")
        return (f"<div><b>{html.escape(self.path.name)}</b><br><audio controls src='data:{mime};base64,{data}'>"
                "Your browser cannot play this audio inline.</audio></div>")


def show_audio(path: str | os.PathLike, max_embed_mb: float = 10) -> AudioView:
    """An inline audio player for ``path`` (wav, mp3, m4a, ogg...), embedded up to ``max_embed_mb`` MB; InputError
    when the file does not exist."""
    file = media_path(path)
    size_mb = file.stat().st_size / 1e6
    return AudioView(file, size_mb <= max_embed_mb, size_mb)


@dataclass(frozen=True)
class SideBySide:
    """Two media views next to each other (e.g. the source and the lip-synced result)."""

    left: MediaView
    right: MediaView

    def _repr_html_(self) -> str:
        return (f"<div style='display:flex;gap:16px;align-items:flex-start'>{self.left._repr_html_()}"
                f"{self.right._repr_html_()}</div>")


def side_by_side(source: Any, result: Any, *, titles: Sequence[str] = ("source", "result")) -> SideBySide:
    """The ``source`` path and the ``result`` (a path or a result with ``output``) next to each other, captioned
    ``titles``, each embedded up to 10 MB and 360 pixels wide; InputError when a file is missing."""
    return SideBySide(show_video(source, title=titles[0], width=360), show_video(result, title=titles[1], width=360))
