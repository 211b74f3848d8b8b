"""Probing: what a media file holds (streams, fps, duration, rotation), parsed from ``ffmpeg -i``'s own output."""

from __future__ import annotations

import dataclasses
import html
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ..errors import FFmpegError
from .ffmpeg import QUIET, _existing_file, _run, _tail, ffmpeg_exe

_IMAGE_CODECS = {"png", "mjpeg", "jpeg2000", "bmp", "tiff", "webp", "targa", "ppm", "pgm", "pbm", "pam", "sgi",
                 "dpx", "exr", "qoi", "jpegxl", "pcx", "xbm", "xwd", "sunrast", "hdr", "photocd", "pgx"}
_CHANNEL_LAYOUTS = {"mono": 1, "stereo": 2, "downmix": 2, "quad": 4, "quad(side)": 4, "hexagonal": 6,
                    "octagonal": 8, "cube": 8, "hexadecagonal": 16, "binaural": 2}


@dataclass(frozen=True)
class StreamInfo:
    """One stream of a media file, as ffmpeg reports it (fields of another kind of stream are None).

    ``index`` is what ``-map 0:<index>`` selects; ``kind`` ``"video"``, ``"audio"``, ``"subtitle"``, ``"data"`` or
    ``"attachment"``; ``codec`` the decoder name; ``language`` an ISO 639 code or None. Video: the stored frame size
    in pixels before rotation, the pixel format, the average ``fps`` as a Fraction (29.97 is 30000/1001; None when
    not reported), the ``rotation`` in degrees clockwise a player turns the picture to show it upright (0, 90, 180,
    270), ``attached_pic`` for cover art. Audio: ``sample_rate`` in Hz, ``channels`` and ffmpeg's layout name.
    ``default`` is the container's "default" flag; ``line`` the stream line ffmpeg printed."""

    index: int
    kind: str
    codec: str
    language: str | None = None
    width: int | None = None
    height: int | None = None
    pix_fmt: str | None = None
    fps: Fraction | None = None
    rotation: int = 0
    sample_rate: int | None = None
    channels: int | None = None
    channel_layout: str | None = None
    attached_pic: bool = False
    default: bool = False
    line: str = ""


@dataclass(frozen=True, repr=False)
class MediaInfo:
    """What a media file holds, read from ``ffmpeg -i`` (imageio-ffmpeg ships no ffprobe). Shows itself as a table.

    ``container`` is ffmpeg's demuxer name (``"mov,mp4,m4a,3gp,3g2,mj2"``, ``"wav"``, ``"png_pipe"``); duration and
    start are seconds, the bitrate kb/s (None when not said). ``is_image`` (a single still) is told from the
    content, not the file name; ``has_video`` ignores cover art. The video fields are the first video stream's, its
    size upright in pixels (what :func:`load_video` yields) and ``frame_count`` the frames stored, counted by
    demuxing (1 for an image, None when not counted; :attr:`VideoReader.frame_count` is the count at 25 fps). The
    audio fields are the first audio stream's (native rate, Hz). ``comment`` is the container's tag (e.g.
    :data:`SYNTHETIC_TAG`); ``exif_orientation`` (1-8) of a still is applied by the reader as ``cv2.imread`` does,
    and size and rotation describe the picture after it."""

    path: Path
    container: str
    duration_s: float | None
    start_s: float | None
    bitrate_kbps: int | None
    streams: tuple[StreamInfo, ...]
    is_image: bool
    has_video: bool
    has_audio: bool
    width: int | None
    height: int | None
    fps: Fraction | None
    rotation: int
    pix_fmt: str | None
    video_codec: str | None
    frame_count: int | None
    sample_rate: int | None
    channels: int | None
    audio_codec: str | None
    comment: str | None = None
    exif_orientation: int = 1

    @property
    def video_stream(self) -> StreamInfo | None:
        """The first video stream that is not cover art, or None."""
        return next((s for s in self.streams if s.kind == "video" and not s.attached_pic), None)

    @property
    def audio_stream(self) -> StreamInfo | None:
        """The first audio stream, or None."""
        return next((s for s in self.streams if s.kind == "audio"), None)

    def _rows(self) -> list[tuple[str, str]]:
        rows = [("file", self.path.name), ("container", self.container)]
        if self.duration_s is not None:
            rows.append(("duration", f"{self.duration_s:.3f} s"))
        if self.has_video:
            kind = "image" if self.is_image else "video"
            desc = f"{self.video_codec}, {self.width}x{self.height} px, {self.pix_fmt}"
            if not self.is_image and self.fps is not None:
                desc += f", {_fps_text(self.fps)} fps"
            if self.rotation:
                desc += f", rotated {self.rotation}° clockwise"
            if self.frame_count is not None and not self.is_image:
                desc += f", {self.frame_count} frames"
            rows.append((kind, desc))
        if self.has_audio:
            rows.append(("audio", f"{self.audio_codec}, {self.sample_rate} Hz, {self.channels} ch"))
        if self.comment:
            rows.append(("comment", self.comment))
        return rows

    def __repr__(self) -> str:
        return "MediaInfo(" + "; ".join(f"{k}: {v}" for k, v in self._rows()) + ")"

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                       f"{html.escape(str(v))}</td></tr>" for k, v in self._rows())
        return f"<table><caption style='text-align:left'><b>MediaInfo</b></caption>{body}</table>"


def _fps_text(fps: Fraction) -> str:
    return str(fps.numerator) if fps.denominator == 1 else f"{fps.numerator}/{fps.denominator} ({float(fps):.3f})"


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses or brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _parse_rate(text: str) -> Fraction | None:
    """'25' -> 25, '29.97' -> 30000/1001, '1k' -> 1000 (ffmpeg prints rates with at most 2 decimals)."""
    text = text.strip()
    try:
        value = Fraction(text.rstrip("k")) * (1000 if text.endswith("k") else 1)
    except (ValueError, ZeroDivisionError):
        return None
    if value <= 0:
        return None
    if value.denominator != 1:  # NTSC-style rates N*1000/1001 print as e.g. 23.98, 29.97, 59.94, 119.88
        ntsc = round(value * Fraction(1001, 1000))
        if ntsc > 0 and abs(Fraction(ntsc * 1000, 1001) - value) < Fraction(1, 100):
            return Fraction(ntsc * 1000, 1001)
    return value


def _channel_count(layout: str) -> int | None:
    layout = layout.strip().lower()
    if layout in _CHANNEL_LAYOUTS:
        return _CHANNEL_LAYOUTS[layout]
    match = re.match(r"(\d+) channels", layout)
    if match:
        return int(match.group(1))
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", layout)
    return sum(int(g) for g in match.groups() if g) if match else None


def _rotation_cw(ccw_degrees: float) -> int:
    """ffmpeg's display-matrix angle (counter-clockwise) -> clockwise degrees in [0, 360), snapped to 90s."""
    cw = (-ccw_degrees) % 360.0
    snapped = round(cw / 90.0) * 90
    return int(snapped if abs(cw - snapped) < 1.0 else round(cw)) % 360


_STREAM_RE = re.compile(r"^\s*Stream #(\d+):(\d+)(?:\[[^\]]*\])?(?:\(([^)]*)\))?: (\w+): (.*)$")
_DURATION_RE = re.compile(r"^\s*Duration: (N/A|(\d+):(\d+):(\d+(?:\.\d+)?))(?:, start: (-?\d+(?:\.\d+)?))?"
                          r"(?:, bitrate: (?:N/A|(\d+) kb/s))?")
_MATRIX_RE = re.compile(r"display\s?matrix\s*:\s*rotation of (-?\d+(?:\.\d+)?|-?nan) degrees", re.IGNORECASE)
_ROTATE_TAG_RE = re.compile(r"^\s*rotate\s*:\s*(-?\d+(?:\.\d+)?)\s*$")


def _parse_ffmpeg_info(text: str, path: Path) -> MediaInfo | None:
    """Parse what ``ffmpeg -i <path>`` prints (ffmpeg 4.4 to 9). None when there is no ``Input #0`` block."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Input #0, ")), None)
    if start is None:
        return None
    head = re.match(r"Input #0, (.+?), from '", lines[start])
    container = head.group(1) if head else lines[start][len("Input #0, "):].split(",")[0]
    duration_s = start_s = bitrate = comment = None
    streams: list[StreamInfo] = []
    blocks: list[tuple[re.Match, list[str]]] = []
    for line in lines[start + 1:]:
        if line.startswith(("Input #", "Output #", "At least one output", "Stream mapping")):
            break
        match = _STREAM_RE.match(line)
        if match and match.group(1) == "0":
            blocks.append((match, []))
            continue
        if blocks:
            blocks[-1][1].append(line)
            continue
        dur = _DURATION_RE.match(line)
        if dur:
            if dur.group(1) != "N/A":
                duration_s = int(dur.group(2)) * 3600 + int(dur.group(3)) * 60 + float(dur.group(4))
            if dur.group(5) is not None:
                start_s = float(dur.group(5))
            if dur.group(6) is not None:
                bitrate = int(dur.group(6))
            continue
        tag = re.match(r"^\s{4}comment\s*:\s?(.*)$", line)
        if tag and comment is None:
            comment = tag.group(1).strip()
    for match, block in blocks:
        if all(s.index != int(match.group(2)) for s in streams):  # programs (mpegts) list a stream more than once
            streams.append(_parse_stream(match, block))

    video = next((s for s in streams if s.kind == "video" and not s.attached_pic), None)
    audio = next((s for s in streams if s.kind == "audio"), None)
    # a still: its only audio or video stream is the picture, in an image container or an image codec without duration
    single = len([s for s in streams if s.kind in ("video", "audio")]) == 1
    is_image = video is not None and single and (container.endswith("_pipe") or container == "image2" or (
        video.codec in _IMAGE_CODECS and duration_s is None))
    width, height = (video.width, video.height) if video is not None else (None, None)
    if video is not None and video.rotation in (90, 270):  # the upright size
        width, height = height, width
    return MediaInfo(
        path=path, container=container, duration_s=duration_s, start_s=start_s, bitrate_kbps=bitrate,
        streams=tuple(streams), is_image=is_image, has_video=video is not None, has_audio=audio is not None,
        width=width, height=height, fps=video.fps if video else None, rotation=video.rotation if video else 0,
        pix_fmt=video.pix_fmt if video else None, video_codec=video.codec if video else None,
        frame_count=1 if is_image else None, sample_rate=audio.sample_rate if audio else None,
        channels=audio.channels if audio else None, audio_codec=audio.codec if audio else None, comment=comment,
    )


def _parse_stream(match: re.Match, block: list[str]) -> StreamInfo:
    index, language, kind, rest = int(match.group(2)), match.group(3), match.group(4).lower(), match.group(5)
    parts = _split_top(rest)
    codec = parts[0].split()[0] if parts else "unknown"
    info: dict = {"index": index, "kind": kind, "codec": codec, "language": language if language != "und" else None,
                  "attached_pic": "(attached pic)" in rest, "default": "(default)" in rest,
                  "line": match.group(0).strip()}
    if kind == "video":
        size_at = None
        for i, part in enumerate(parts[1:], start=1):
            size = re.match(r"^(\d+)x(\d+)", part)
            if size and size_at is None:
                info["width"], info["height"] = int(size.group(1)), int(size.group(2))
                size_at = i
            rate = re.match(r"^(\d+(?:\.\d+)?k?) (fps|tbr)", part)  # tbr only where no fps is printed
            if rate and (rate.group(2) == "fps" or "fps" not in info):
                info["fps"] = _parse_rate(rate.group(1))
        if size_at is not None and size_at >= 2:
            info["pix_fmt"] = parts[1].split("(")[0].strip() or None
        info["rotation"] = _block_rotation(block)
    elif kind == "audio":
        for i, part in enumerate(parts[1:], start=1):
            hz = re.match(r"^(\d+) Hz$", part)
            if hz:
                info["sample_rate"] = int(hz.group(1))
                if i + 1 < len(parts):
                    info["channel_layout"] = parts[i + 1]
                    info["channels"] = _channel_count(parts[i + 1])
                break
    return StreamInfo(**info)


def _block_rotation(block: list[str]) -> int:
    """Clockwise degrees from a video stream's lines: the display matrix's, else the ``rotate`` tag's, else 0."""
    matrix = rotate_tag = None
    for line in block:
        m = _MATRIX_RE.search(line)
        if m and "nan" not in m.group(1):
            matrix = float(m.group(1))
        t = _ROTATE_TAG_RE.match(line)
        if t:
            rotate_tag = float(t.group(1))
    if matrix is not None:
        return _rotation_cw(matrix)
    return 0 if rotate_tag is None else _rotation_cw(-rotate_tag)


def probe(path, count_frames: bool = True) -> MediaInfo:
    """The :class:`MediaInfo` of ``path``, parsed from ``ffmpeg -i`` (ffmpeg 4.4 to 9); with ``count_frames`` also the
    exact video frame count, by demuxing (``-c copy -f framecrc``).
    Raises InputError: ``path`` does not exist or is a folder; FFmpegError: ffmpeg cannot read the file as media (a text
    file named ``.mp4``, a truncated download).
    Source: the official scripts read the fps with OpenCV (``utils.py:43-47``) and tell images from videos by
    extension (``utils.py:33-41``); here the content decides."""
    p = _existing_file(path, "media")
    exe = ffmpeg_exe()
    args = [exe, "-nostdin", "-hide_banner", "-i", str(p)]
    _, _, text = _run(args, "probe a file")
    info = _parse_ffmpeg_info(text, p)
    if info is None:
        raise FFmpegError(
            f"ffmpeg cannot read {str(p)!r} as a video, image or audio file. Check that it is a complete media "
            "file (not a web page or a partial download); re-export or re-download it.",
            args_list=args, stderr_tail=_tail(text))
    if count_frames and info.has_video and not info.is_image:
        # packets (= frames) by demuxing only, one framecrc line each (ffmpeg 7.0's progress report leaves out the
        # frame count when stream copying)
        rc, out, _ = _run([exe, *QUIET, "-i", str(p), "-map", f"0:{info.video_stream.index}", "-c", "copy", "-f",
                           "framecrc", "pipe:1"], "count video frames")
        count = sum(1 for line in out.splitlines() if line and not line.startswith(b"#"))
        info = dataclasses.replace(info, frame_count=count if rc == 0 else None)
    if info.is_image and info.width:
        try:  # the EXIF orientation tag (1-8), read with Pillow (header only)
            from PIL import Image

            with Image.open(p) as image:
                orientation = int(image.getexif().get(0x0112, 1))
        except Exception:  # no Pillow (a dependency), or no readable EXIF: the still is used as stored
            orientation = 1
        if orientation in _EXIF_ROTATION and orientation != 1:
            stored_w, stored_h = info.video_stream.width, info.video_stream.height
            swap = orientation >= 5
            info = dataclasses.replace(info, exif_orientation=orientation, rotation=_EXIF_ROTATION[orientation],
                                       width=stored_h if swap else stored_w, height=stored_w if swap else stored_h)
    return info


# EXIF orientation -> clockwise rotation of the upright picture (5 and 7 also mirror)
_EXIF_ROTATION = {1: 0, 2: 0, 3: 180, 4: 180, 5: 90, 6: 90, 7: 270, 8: 270}
