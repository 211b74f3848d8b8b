"""HTML for objects that show themselves in a notebook: a video (embedded up to ``max_embed_mb``, else its first
frame and a download hint), image or table as a string of HTML. Nothing here imports IPython.
"""

from __future__ import annotations

import base64
import html
import mimetypes
import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError, MediaError
from .media import ffmpeg_exe
from .weights.manifest import in_colab

__all__ = ["IMAGE_SUFFIXES", "PREVIEW_WIDTH", "MediaView", "first_frame_png", "media_path",
           "show_video", "table_html", "video_html"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")
PREVIEW_WIDTH = 480  # pixels: width of the first-frame preview of a video too large to embed


def table_html(rows: Iterable[Sequence[Any]], header: Sequence[str] = ()) -> str:
    """An HTML ``<table>`` of the rows' cells as escaped text, ``header`` (if any) as its first row."""
    head = "<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def media_path(media: Any) -> Path:
    """The existing file of a path or of a result with an ``output`` path; InputError for anything else or a file
    that does not exist."""
    path = getattr(media, "output", media)
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"expected a file path or a result with an output path; got {type(media).__name__}.")
    path = Path(path)
    if not path.is_file():
        raise InputError(f"media file {str(path)!r} does not exist.")
    return path


def first_frame_png(path: str | os.PathLike, width: int = PREVIEW_WIDTH) -> bytes:
    """PNG bytes of the first frame of a video (or an image), at most ``width`` pixels wide (never enlarged);
    MediaError when ffmpeg could not read a frame."""
    command = [str(ffmpeg_exe()), "-v", "error", "-i", str(path), "-frames:v", "1",
               "-vf", f"scale='min({int(width)},iw)':-2", "-f", "image2pipe", "-vcodec", "png", "-"]
    done = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout:
        raise MediaError(f"could not read the first frame of {path}: "
                         f"{done.stderr.decode(errors='replace').strip()[-400:]}")
    return done.stdout


@dataclass(frozen=True)
class MediaView:
    """A video or image shown inline: the file at ``path`` embedded when small, else a first-frame preview and a
    download hint; ``size_mb`` in 10**6 bytes, ``title`` above it, ``width`` in pixels."""

    path: Path
    embedded: bool
    size_mb: float
    title: str = ""
    width: int = PREVIEW_WIDTH

    @property
    def is_image(self) -> bool:
        return self.path.suffix.lower() in IMAGE_SUFFIXES

    def _repr_html_(self) -> str:
        caption = f"<div><b>{html.escape(self.title)}</b></div>" if self.title else ""
        if self.embedded:
            mime = mimetypes.guess_type(self.path.name)[0] or ("image/png" if self.is_image else "video/mp4")
            data = base64.b64encode(self.path.read_bytes()).decode("ascii")
            if self.is_image:
                body = f"<img src='data:{mime};base64,{data}' style='max-width:{self.width}px'/>"
            else:
                body = (f"<video controls style='max-width:{self.width}px' src='data:{mime};base64,{data}'>"
                        "Your browser cannot play this video inline.</video>")
            return f"<div style='display:inline-block'>{caption}{body}</div>"
        png = base64.b64encode(first_frame_png(self.path, self.width)).decode("ascii")
        return (f"<div style='display:inline-block'>{caption}<img src='data:image/png;base64,{png}' "
                f"style='max-width:{self.width}px'/><div>First frame only: the file is {self.size_mb:.1f} MB, "
                f"over the inline limit. {self._download_hint()}</div></div>")

    def _download_hint(self) -> str:
        if in_colab():
            return ("Download it with <code>from google.colab import files; files.download("
                    f"{html.escape(repr(str(self.path)))})</code>, or open the Files panel on the left.")
        try:
            rel = Path(os.path.relpath(self.path.resolve(), Path.cwd()))
        except ValueError:  # another drive on Windows
            rel = None
        if rel is not None and not str(rel).startswith(".."):
            return f"<a href='{html.escape(rel.as_posix())}' download>Download {html.escape(self.path.name)}</a>."
        return f"The file is at <code>{html.escape(str(self.path))}</code>."

    def __repr__(self) -> str:
        return f"MediaView({str(self.path)!r}, embedded={self.embedded}, {self.size_mb:.2f} MB)"


def show_video(path: Any, max_embed_mb: float = 10, *, title: str = "", width: int = PREVIEW_WIDTH) -> MediaView:
    """Show a video or image (a path, or a result with an ``output`` path) inline in Colab and Jupyter: a
    :class:`MediaView`, embedded up to ``max_embed_mb`` (10**6 bytes), ``title`` above it, ``width`` pixels wide.
    InputError when the file does not exist."""
    file = media_path(path)
    size_mb = file.stat().st_size / 1e6
    return MediaView(file, size_mb <= max_embed_mb, size_mb, title, int(width))


def video_html(path: Any) -> str:
    """HTML of :func:`show_video` with its defaults (for result objects' ``_repr_html_``)."""
    return show_video(path)._repr_html_()
