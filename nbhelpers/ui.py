"""Notebook front end: a settings panel that only sets parameters, inline video, and plots.

The panel edits an :class:`~nbhelpers.config.InferenceConfig` and nothing else: the work runs in the next cell,
never in a widget callback, so *Run all*, papermill and nbval do exactly what a person does. With no person (or no
ipywidgets) the same panel takes its values from a dict (``settings_panel(plan, values={...})``) and shows a
table. It works on ipywidgets 7.7 (Colab) and 8.x.

Videos are embedded as ``<video controls>`` with a base64 data URL up to ``max_embed_mb``; larger files show
their first frame and a download hint, which works in Colab (no file server) and in Jupyter.

Plots are matplotlib figures made without pyplot (no global state); they display as PNG anywhere.
"""

from __future__ import annotations

import base64
import html
import io
import mimetypes
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import PARSING_MODES, InferenceConfig
from .constants import ENCODERS, VERSIONS
from .errors import InputError, MediaError

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")
BATCH_CHOICES = (1, 2, 4, 8, 16, 20, 32, 48, 64)  # frames per batch offered by the panel
PREVIEW_WIDTH = 480  # pixels: width of the first-frame preview of a video too large to embed

# Panel fields in display order: name -> (label, help). Ranges follow the official app where it has one.
_LABELS = {
    "version": ("Model version", "MuseTalk 1.5 (default) or 1.0 weights"),
    "extra_margin": ("extra_margin (px)", "pixels added below the crop box, v1.5 only (app: 0-40, default 10)"),
    "parsing_mode": ("parsing_mode", "face-parsing mask: jaw (v1.5 default), raw, neck; v1.0 always uses raw"),
    "left_cheek_width": ("left cheek (px)", "jaw-mode cheek band in 512-px parsing space (app: 20-160)"),
    "right_cheek_width": ("right cheek (px)", "jaw-mode cheek band in 512-px parsing space (app: 20-160)"),
    "bbox_shift": ("bbox_shift (px)", "moves the repainted half's upper edge down (+, more mouth openness) or "
                   "up (-); both versions, as the official app"),
    "batch_size": ("batch (frames)", "frames per UNet/VAE batch; auto = the planner's choice"),
    "fp16": ("precision", "fp16 on CUDA, fp32 on CPU; auto = the planner's choice"),
    "encoder": ("video encoder", "libx264 CRF 18 preset medium (official); faster presets give bigger files or a "
                "little less quality; nvenc/auto use the GPU's encoder when a test encode works, else libx264"),
    "restore": ("face restoration", "restore the repainted face before paste-back (only the masked region changes); "
                "needs spandrel and the weight set restore-<name>; CodeFormer is for non-commercial use only"),
    "restore_strength": ("restore strength", "blend of restored and unrestored face: 0 = unrestored, 1 = restored"),
}
_ENCODER_TEXT = {"libx264": "libx264 medium (official, CRF 18)", "libx264-fast": "libx264 fast",
                 "libx264-faster": "libx264 faster", "libx264-veryfast": "libx264 veryfast",
                 "libx264-superfast": "libx264 superfast", "libx264-ultrafast": "libx264 ultrafast",
                 "auto": "auto (NVENC if it works, else libx264 medium)", "nvenc": "NVENC (GPU)"}
RESTORE_CHOICES = [("off", None), ("GFPGAN v1.4", "gfpgan"), ("RestoreFormer", "restoreformer"),
                   ("CodeFormer (non-commercial licence)", "codeformer")]
PANEL_FIELDS = tuple(_LABELS)
# The restore dropdown's value for "off": ipywidgets 8 reads a Dropdown value of None as "nothing selected" and
# shows an empty box (seen in the browser test), so the widget holds this string and the panel reports None.
_RESTORE_OFF = "off"


def widgets_available() -> bool:
    """True when ipywidgets imports and ``NBHELPERS_WIDGETS`` is not ``0`` (set it to force the plain panel)."""
    if os.environ.get("NBHELPERS_WIDGETS", "1").lower() in ("0", "false", "no"):
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class _Plain:
    """Stand-in for a widget when ipywidgets is absent: holds ``value`` and ``disabled``; observers are called."""

    def __init__(self, value: Any):
        self.value = value
        self.disabled = False
        self.visible = True


class SettingsPanel:
    """Widgets (or plain values) for the inference settings; ``.config`` is the resulting config.

    Build it with :func:`settings_panel`. Displaying it shows the controls (or a table without ipywidgets);
    reading :attr:`config` in a later cell gives an :class:`InferenceConfig` from the current values.

    Attributes:
        base: The config the panel started from (the planner's config, or the one given).
        controls: Field name -> ipywidgets control (or a plain stand-in).
        uses_widgets: True when real ipywidgets controls are used.
    """

    def __init__(self, base: InferenceConfig, values: Mapping[str, Any] | None = None,
                 use_widgets: bool | None = None, plan: Any = None):
        self.base = base
        self.plan = plan
        self.uses_widgets = widgets_available() if use_widgets is None else bool(use_widgets)
        initial = self._initial(base, values or {})
        self.controls = {name: self._make(name, value) for name, value in initial.items()}
        self._box = None
        self._sync()
        if self.uses_widgets:
            for control in self.controls.values():
                control.observe(lambda change: self._sync(), names="value")

    # -- values ------------------------------------------------------------------------------------------------

    @staticmethod
    def _initial(base: InferenceConfig, values: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(values) - set(PANEL_FIELDS))
        if unknown:
            raise InputError(f"settings_panel values has unknown names {unknown}; the panel sets "
                             f"{', '.join(PANEL_FIELDS)}. Put other settings in the config you pass.")
        initial = {name: getattr(base, name) for name in PANEL_FIELDS}
        initial["batch_size"] = "auto"  # the base config's value is what "auto" means
        initial["fp16"] = "auto"
        for name, value in values.items():
            if name in ("batch_size", "fp16") and value is None:
                value = "auto"
            initial[name] = value
        # Validate every value now, through the config's own rules, before any widget is made.
        try:
            _to_config(base, initial)
        except TypeError as exc:
            raise InputError(f"settings_panel values: {exc}") from None
        return initial

    @property
    def values(self) -> dict[str, Any]:
        """Current value of every field (``"auto"`` for batch and precision left to the planner)."""
        values = {name: control.value for name, control in self.controls.items()}
        if values.get("restore") == _RESTORE_OFF:
            values["restore"] = None
        return values

    @property
    def config(self) -> InferenceConfig:
        """The :class:`InferenceConfig` of the current values (validated).

        Raises:
            InputError: A value is out of range (the config's own check).
        """
        return _to_config(self.base, self.values)

    def set(self, **values: Any) -> SettingsPanel:
        """Change values as a person would with the controls (validated first); returns the panel."""
        merged = {**self.values, **values}
        self._initial(self.base, {k: v for k, v in merged.items()})
        for name, value in values.items():
            control = self.controls[name]
            if self.uses_widgets and hasattr(control, "max") and isinstance(value, int) and value > control.max:
                control.max = value
            if self.uses_widgets and hasattr(control, "min") and isinstance(value, int) and value < control.min:
                control.min = value
            if (self.uses_widgets and name == "batch_size" and isinstance(value, int)
                    and value not in [v for _, v in control.options]):
                control.options = [*control.options, (str(value), value)]
            if value is None and name in ("batch_size", "fp16"):
                value = "auto"
            elif value is None and name == "restore" and self.uses_widgets:
                value = _RESTORE_OFF
            control.value = value
        self._sync()
        return self

    # -- controls ----------------------------------------------------------------------------------------------

    def _planned(self) -> tuple[str, str]:
        batch = self.base.batch_size
        fp16 = self.base.fp16
        batch_text = f"auto (planner: {batch})" if batch else "auto"
        precision_text = "auto" if fp16 is None else f"auto (planner: {'fp16' if fp16 else 'fp32'})"
        return batch_text, precision_text

    def planner_notes(self) -> list[str]:
        """Why the planner chose the device, precision and batch size (from the plan's reasons)."""
        reasons = self.base.reasons or {}
        return [f"{name}: {reasons[name]}" for name in ("device", "fp16", "batch_size") if reasons.get(name)]

    def _make(self, name: str, value: Any) -> Any:
        if not self.uses_widgets:
            return _Plain(value)
        import ipywidgets as w

        label, help_text = _LABELS[name]
        common = {"description": label, "style": {"description_width": "140px"},
                  "layout": w.Layout(width="520px")}
        if name == "version":
            control = w.Dropdown(options=[("MuseTalk 1.5", "v15"), ("MuseTalk 1.0", "v1")], value=value, **common)
        elif name == "parsing_mode":
            control = w.Dropdown(options=list(PARSING_MODES), value=value, **common)
        elif name == "extra_margin":
            control = w.IntSlider(value=value, min=0, max=max(40, value), **common)
        elif name in ("left_cheek_width", "right_cheek_width"):
            control = w.IntSlider(value=value, min=min(20, value), max=max(160, value), **common)
        elif name == "bbox_shift":
            control = w.IntSlider(value=value, min=min(-40, value), max=max(40, value), **common)
        elif name == "batch_size":
            batch_text, _ = self._planned()
            options = [(batch_text, "auto")] + [(str(b), b) for b in sorted(set(BATCH_CHOICES) | (
                {value} if isinstance(value, int) else set()))]
            control = w.Dropdown(options=options, value=value, **common)
        elif name == "fp16":
            _, precision_text = self._planned()
            control = w.Dropdown(options=[(precision_text, "auto"), ("fp16", True), ("fp32", False)], value=value,
                                 **common)
        elif name == "encoder":
            control = w.Dropdown(options=[(_ENCODER_TEXT.get(e, e), e) for e in ENCODERS], value=value, **common)
        elif name == "restore":
            control = w.Dropdown(options=[(label, _RESTORE_OFF if v is None else v) for label, v in RESTORE_CHOICES],
                                 value=_RESTORE_OFF if value is None else value, **common)
        elif name == "restore_strength":
            control = w.FloatSlider(value=float(value), min=0.0, max=1.0, step=0.05, **common)
        else:  # pragma: no cover - PANEL_FIELDS and this list are kept together
            raise KeyError(name)
        _set_tooltip(control, help_text)
        return control

    def _sync(self) -> None:
        """Enable and show only what applies: parsing and cheeks for v1.5 (cheeks: jaw mode); bbox_shift always."""
        v1 = self.controls["version"].value == "v1"
        jaw = self.controls["parsing_mode"].value == "jaw"
        rules = {"bbox_shift": (True, True), "extra_margin": (not v1, True), "parsing_mode": (not v1, True),
                 "left_cheek_width": (not v1 and jaw, True), "right_cheek_width": (not v1 and jaw, True),
                 "restore_strength": (self.controls["restore"].value not in (None, _RESTORE_OFF), True)}
        for name, (enabled, visible) in rules.items():
            control = self.controls[name]
            control.disabled = not enabled
            if self.uses_widgets:
                control.layout.display = "" if visible else "none"
            else:
                control.visible = visible

    # -- display -----------------------------------------------------------------------------------------------

    @property
    def widget(self) -> Any:
        """The ipywidgets ``VBox`` holding the controls (None without ipywidgets)."""
        if not self.uses_widgets:
            return None
        if self._box is None:
            import ipywidgets as w

            note = w.HTML("<i>These controls only set parameters: run the next cell to use them.</i>"
                          + "".join(f"<br><small>{html.escape(n)}</small>" for n in self.planner_notes()))
            self._box = w.VBox([*self.controls.values(), note])
        return self._box

    def rows(self) -> list[tuple[str, str]]:
        """``(label, value)`` for each field that applies to the chosen version."""
        batch_text, precision_text = self._planned()
        out = []
        for name, control in self.controls.items():
            if not (control.layout.display != "none" if self.uses_widgets else control.visible):
                continue
            value = control.value
            if name == "batch_size" and value == "auto":
                value = batch_text
            elif name == "fp16":
                value = precision_text if value == "auto" else ("fp16" if value else "fp32")
            elif name == "restore":
                value = dict((v, k) for k, v in RESTORE_CHOICES).get(None if value == _RESTORE_OFF else value, value)
            out.append((_LABELS[name][0], str(value)))
        return out

    def __repr__(self) -> str:
        return "SettingsPanel(" + ", ".join(f"{k}={v!r}" for k, v in self.values.items()) + ")"

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(a)}</th><td style='text-align:left'>"
                       f"{html.escape(b)}</td></tr>" for a, b in self.rows())
        notes = "".join(f"<br><small>{html.escape(n)}</small>" for n in self.planner_notes())
        return f"<table>{body}</table><i>Settings (no widgets here): change them with panel.set(...).</i>{notes}"

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        display(self.widget if self.uses_widgets else HTML(self._repr_html_()))


def _set_tooltip(control: Any, text: str) -> None:
    # ipywidgets 8 renamed description_tooltip to tooltip; set whichever this version has.
    for attr in ("tooltip", "description_tooltip"):
        if attr in getattr(control, "keys", ()):
            setattr(control, attr, text)
            return


def _to_config(base: InferenceConfig, values: Mapping[str, Any]) -> InferenceConfig:
    changes = {name: values[name] for name in PANEL_FIELDS if name in values}
    if changes.get("version", base.version) not in VERSIONS:
        raise InputError(f"version must be one of {', '.join(VERSIONS)}; got {changes.get('version')!r}.")
    for name in ("batch_size", "fp16"):
        if changes.get(name, "auto") == "auto":
            changes[name] = getattr(base, name)
    for name in ("extra_margin", "left_cheek_width", "right_cheek_width", "bbox_shift"):
        if not isinstance(changes.get(name, 0), (int, np.integer)) or isinstance(changes.get(name), bool):
            raise InputError(f"{name} must be an integer number of pixels; got {changes[name]!r}.")
    if changes["batch_size"] is not None and not isinstance(changes["batch_size"], (int, np.integer)):
        raise InputError(f"batch_size must be a positive integer or 'auto'; got {changes['batch_size']!r}.")
    if changes["fp16"] not in (None, True, False):
        raise InputError(f"fp16 must be True (fp16), False (fp32) or 'auto'; got {changes['fp16']!r}.")
    return base.replace(**changes)


def settings_panel(plan_or_config: Any = None, values: Mapping[str, Any] | None = None, *,
                   use_widgets: bool | None = None) -> SettingsPanel:
    """A panel of the inference settings that only sets parameters.

    Args:
        plan_or_config: A plan from :func:`nbhelpers.gpu.plan` (its chosen batch size and precision are shown as
            "auto"), an :class:`InferenceConfig`, or None for the defaults.
        values: Field name -> value to start from (the headless path: a parameters cell supplies them). Names:
            version, extra_margin, parsing_mode, left_cheek_width, right_cheek_width, bbox_shift,
            batch_size (int or "auto"), fp16 (True, False or "auto"), encoder (one of
            :data:`nbhelpers.constants.ENCODERS`), restore (None, "gfpgan", "restoreformer", "codeformer"),
            restore_strength (0..1).
        use_widgets: Force (True) or avoid (False) ipywidgets; None uses them when installed.

    Returns:
        A :class:`SettingsPanel`; read ``panel.config`` in the next cell.

    Raises:
        InputError: An unknown name or a value out of range in ``values``.
    """
    base = _base_config(plan_or_config)
    return SettingsPanel(base, values, use_widgets, plan=None if isinstance(plan_or_config, InferenceConfig)
                         else plan_or_config)


def _base_config(plan_or_config: Any) -> InferenceConfig:
    if plan_or_config is None:
        return InferenceConfig()
    if isinstance(plan_or_config, InferenceConfig):
        return plan_or_config
    config = getattr(plan_or_config, "config", None)
    if isinstance(config, InferenceConfig):
        return config
    fields = {name: getattr(plan_or_config, name) for name in ("batch_size", "fp16", "device")
              if getattr(plan_or_config, name, None) is not None}
    if not fields:
        raise InputError(f"settings_panel needs a gpu plan or an InferenceConfig; got {type(plan_or_config).__name__}.")
    reasons = getattr(plan_or_config, "reasons", None)
    config = InferenceConfig(**fields)
    if isinstance(reasons, Mapping):
        config.reasons.update(reasons)
    return config


# ------------------------------------------------------------------------------------------------ video and images


def _path_of(media: Any) -> Path:
    path = getattr(media, "output", media)
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"expected a file path or a result with an output path; got {type(media).__name__}.")
    path = Path(path)
    if not path.is_file():
        raise InputError(f"media file {str(path)!r} does not exist.")
    return path


def first_frame_png(path: str | os.PathLike, width: int = PREVIEW_WIDTH) -> bytes:
    """The first frame of a video (or an image) as PNG bytes, at most ``width`` pixels wide.

    Args:
        path: Any file ffmpeg reads.
        width: Maximum width in pixels (aspect ratio kept; never enlarged).

    Returns:
        PNG file bytes.

    Raises:
        MediaError: ffmpeg could not read a frame.
    """
    from .env import _ffmpeg

    command = [_ffmpeg(), "-v", "error", "-i", str(path), "-frames:v", "1",
               "-vf", f"scale='min({int(width)},iw)':-2", "-f", "image2pipe", "-vcodec", "png", "-"]
    done = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout:
        raise MediaError(f"could not read the first frame of {path}: "
                         f"{done.stderr.decode(errors='replace').strip()[-400:]}")
    return done.stdout


@dataclass(frozen=True)
class MediaView:
    """A video or image shown inline. Embedded when small, else a first-frame preview and a download hint.

    Attributes:
        path: The file.
        embedded: True when the file itself is embedded (data URL).
        size_mb: File size in MB (10**6 bytes).
        title: Caption shown above it.
    """

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
        from .env import in_colab

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
    """Show a video (or image) inline in Colab and Jupyter.

    Args:
        path: A video/image path, or a result with an ``output`` path (e.g. :class:`LipsyncResult`).
        max_embed_mb: Largest file embedded as a base64 ``<video controls>`` (MB, 10**6 bytes); larger files show
            the first frame and how to download the file.
        title: Caption above the player.
        width: Display width in pixels.

    Returns:
        A :class:`MediaView` (renders when it is the last value of a cell).

    Raises:
        InputError: The file does not exist.
    """
    file = _path_of(path)
    size_mb = file.stat().st_size / 1e6
    return MediaView(file, size_mb <= max_embed_mb, size_mb, title, int(width))


def video_html(path: Any, max_embed_mb: float = 10, *, title: str = "", width: int = PREVIEW_WIDTH) -> str:
    """HTML of :func:`show_video` (for result objects' ``_repr_html_``)."""
    return show_video(path, max_embed_mb, title=title, width=width)._repr_html_()


@dataclass(frozen=True)
class AudioView:
    """An audio file shown as an inline ``<audio controls>`` player (embedded up to ``max_embed_mb``).

    Attributes:
        path: The file.
        embedded: True when the file is embedded; otherwise only its path is shown.
        size_mb: File size in MB (10**6 bytes).
    """

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
    """An inline audio player for ``path`` (wav, mp3, m4a, ogg...), embedded up to ``max_embed_mb`` MB.

    Raises:
        InputError: The file does not exist.
    """
    file = _path_of(path)
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


def side_by_side(source: Any, result: Any, *, titles: Sequence[str] = ("source", "result"),
                 max_embed_mb: float = 10, width: int = 360) -> SideBySide:
    """Show the source and the result next to each other (video or photo on either side).

    Args:
        source: The input video or photo path.
        result: The output path, or a result with an ``output`` path.
        titles: Captions of the two sides.
        max_embed_mb: Per-file embedding limit in MB (see :func:`show_video`).
        width: Display width of each side in pixels.

    Returns:
        A :class:`SideBySide` view.

    Raises:
        InputError: A file does not exist.
    """
    return SideBySide(show_video(source, max_embed_mb, title=titles[0], width=width),
                      show_video(result, max_embed_mb, title=titles[1], width=width))


# ------------------------------------------------------------------------------------------------------- plots


class Chart:
    """A matplotlib figure that shows itself as a PNG (no pyplot state involved).

    Attributes:
        figure: The ``matplotlib.figure.Figure``.
    """

    def __init__(self, figure: Any):
        self.figure = figure

    def png(self, dpi: int = 100) -> bytes:
        """The figure as PNG bytes."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
        return buffer.getvalue()

    def save(self, path: str | os.PathLike, dpi: int = 100) -> Path:
        """Write the figure to ``path`` (format from the suffix); returns the path."""
        self.figure.savefig(path, dpi=dpi, bbox_inches="tight")
        return Path(path)

    def _repr_png_(self) -> bytes:
        return self.png()

    def __repr__(self) -> str:
        return f"Chart({len(self.figure.axes)} axes)"


def _figure(width_in: float, height_in: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def compare_restore(before: Any, after: Any, title: str = "Face restoration: before and after") -> Chart:
    """The generated crop and the repainted mouth of one frame without and with face restoration, side by side.

    Args:
        before: :class:`~nbhelpers.pipeline.Preview` made with ``restore=None``.
        after: :class:`~nbhelpers.pipeline.Preview` of the same frame made with a restorer.

    Returns:
        :class:`Chart` (2x2: the (256, 256) generated crops on top, the frames zoomed on the crop box below).

    Raises:
        InputError: The previews are of different frames or crop boxes.
    """
    if tuple(before.crop_box) != tuple(after.crop_box) or before.frame.shape != after.frame.shape:
        raise InputError("compare_restore needs two previews of the same frame and crop box (the same video, "
                         "frame_index and settings apart from restore).")
    fig = _figure(8, 8)
    fig.suptitle(title)
    axes = fig.subplots(2, 2)
    x1, y1, x2, y2 = before.crop_box
    h, w = before.frame.shape[:2]
    pad = max(x2 - x1, y2 - y1) // 4
    for col, (preview, name) in enumerate(((before, "without restoration"), (after, "restored"))):
        axes[0, col].imshow(preview.face_256[:, :, ::-1])
        axes[0, col].set_title(f"generated crop, {name}")
        axes[1, col].imshow(preview.result[max(y1 - pad, 0):min(y2 + pad, h), max(x1 - pad, 0):min(x2 + pad, w), ::-1])
        axes[1, col].set_title(f"frame after paste-back, {name}")
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    return Chart(fig)


def plot_timings(timings: Any, title: str = "Time per stage") -> Chart:
    """A horizontal bar chart of seconds per stage, with each stage's share of the total.

    Args:
        timings: Mapping of stage name -> seconds (insertion order kept), or a result with a ``timings`` mapping.

    Returns:
        A :class:`Chart`.

    Raises:
        InputError: No timings, or a negative or non-numeric value.
    """
    timings = getattr(timings, "timings", timings)
    if not isinstance(timings, Mapping) or not timings:
        raise InputError(f"timings must be a non-empty mapping of stage -> seconds; got {timings!r}.")
    names = [str(k) for k in timings]
    try:
        seconds = np.array([float(v) for v in timings.values()])
    except (TypeError, ValueError):
        raise InputError(f"timings values must be seconds (numbers); got {dict(timings)!r}.") from None
    if (seconds < 0).any() or not np.isfinite(seconds).all():
        raise InputError(f"timings must be finite and >= 0 seconds; got {dict(timings)!r}.")
    total = float(seconds.sum())
    fig = _figure(7, 0.45 * len(names) + 1.2)
    ax = fig.add_subplot()
    y = np.arange(len(names))[::-1]
    ax.barh(y, seconds, color="#4c72b0")
    ax.set_yticks(y, names)
    ax.set_xlabel("seconds")
    ax.set_title(f"{title} (total {total:.2f} s)")
    for yi, s in zip(y, seconds, strict=True):
        share = 100 * s / total if total > 0 else 0.0
        ax.annotate(f" {s:.2f} s ({share:.0f}%)", (s, yi), va="center", fontsize=9)
    ax.set_xlim(0, max(total * 0.01, seconds.max() * 1.35, 1e-3))
    return Chart(fig)


def _zscore(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    if not ok.any():
        return x
    sd = x[ok].std()
    return (x - x[ok].mean()) / (sd if sd > 0 else 1.0)


def plot_sync(lag: Any, score: Any = None, title: str = "Does the mouth follow the voice?") -> Chart:
    """Draw the mouth opening and the speech envelope over time, and their correlation at each lag.

    Top: both curves per frame, each standardised (z score) so they share one axis, over seconds. Bottom: the
    correlation ``r(L)`` at each lag with the peak marked; with a SyncNet ``score``, its mean distance per offset
    on a second axis, on the same lag scale (audio delay = -offset).

    Args:
        lag: A :class:`nbhelpers.quality.MouthAudioLag` (``mouth``, ``envelope``, ``lags``, ``correlations``,
            ``lag_frames``, ``fps``).
        score: Optional :class:`nbhelpers.quality.SyncScore` (``offsets``, ``mean_distances``).
        title: Figure title.

    Returns:
        A :class:`Chart` (a matplotlib Figure made without pyplot).

    Raises:
        InputError: ``lag`` lacks those fields.
    """
    try:
        mouth, env = np.asarray(lag.mouth, float), np.asarray(lag.envelope, float)
        lags, corr, best, fps = np.asarray(lag.lags), np.asarray(lag.correlations), int(lag.lag_frames), lag.fps
    except AttributeError as exc:
        raise InputError(f"plot_sync needs a quality.mouth_audio_lag result; got {type(lag).__name__} ({exc}).") \
            from None
    fig = _figure(8, 5)
    top, bottom = fig.subplots(2, 1, height_ratios=(3, 2))
    t = np.arange(mouth.shape[0]) / float(fps)
    top.plot(t, _zscore(mouth), color="#c44e52", lw=1.0, label="mouth opening (inner lips / eye width)")
    top.plot(t, _zscore(env), color="#4c72b0", lw=1.0, alpha=0.8, label="speech envelope (log RMS)")
    top.set_xlabel("seconds")
    top.set_ylabel("z score")
    top.legend(loc="upper right", fontsize=8)
    top.set_title(title)
    bottom.plot(lags, corr, color="#55a868", marker=".", label="correlation r")
    bottom.axvline(best, color="#55a868", ls="--", lw=0.8)
    bottom.annotate(f" lag {best:+d} frames, r {float(np.max(corr)):.2f}", (best, float(np.max(corr))),
                    fontsize=8, va="bottom")
    bottom.axhline(0, color="0.6", lw=0.5)
    bottom.set_xlabel("lag, frames (+ = sound after mouth)")
    bottom.set_ylabel("r")
    if callable(getattr(lag, "summary", None)):
        bottom.set_title(lag.summary(), fontsize=7, wrap=True)
    if score is not None:
        twin = bottom.twinx()
        twin.plot(-np.asarray(score.offsets), np.asarray(score.mean_distances), color="#8172b2", lw=1.0,
                  label="SyncNet mean distance")
        twin.set_ylabel("SyncNet distance", color="#8172b2")
    return Chart(fig)


@dataclass(frozen=True)
class FpsTable:
    """Speed of several generated clips: frames, seconds, generation fps, end-to-end fps, real-time factor.

    Attributes:
        rows: One tuple per clip: ``(name, n_frames, wall_s, generation_fps, end_to_end_fps, realtime_factor)``.
    """

    rows: tuple[tuple[str, int, float, float, float, float], ...]

    HEADERS = ("clip", "frames", "wall (s)", "generation fps", "end-to-end fps", "x real time")

    def __len__(self) -> int:
        return len(self.rows)

    def _cells(self) -> list[list[str]]:
        return [[name, str(n), f"{wall:.2f}", f"{gen:.1f}", f"{e2e:.1f}", f"{rt:.2f}"]
                for name, n, wall, gen, e2e, rt in self.rows]

    def __str__(self) -> str:
        widths = [max(len(h), *(len(c[i]) for c in self._cells())) for i, h in enumerate(self.HEADERS)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(self.HEADERS, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in self._cells()]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.HEADERS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
                       for cells in self._cells())
        return (f"<table><tr>{head}</tr>{body}</table><i>Generation fps counts the UNet and VAE decoding only; "
                "end-to-end fps counts the wall clock from audio in to file closed. Real time is 25 fps.</i>")


def fps_table(results: Sequence[Any]) -> FpsTable:
    """A table of the speed of generated clips (e.g. ``Avatar.generate`` results).

    Args:
        results: Objects with ``n_frames``, ``wall_s``, ``generation_fps``, ``end_to_end_fps`` and optionally
            ``output`` (for the clip name).

    Returns:
        An :class:`FpsTable`.

    Raises:
        InputError: ``results`` is empty or an item lacks those fields.
    """
    if not results:
        raise InputError("fps_table needs at least one result (a list of Avatar.generate results).")
    rows = []
    for i, r in enumerate(results):
        try:
            e2e = float(r.end_to_end_fps)
            name = Path(r.output).name if getattr(r, "output", None) else f"clip {i}"
            rows.append((name, int(r.n_frames), float(r.wall_s), float(r.generation_fps), e2e, e2e / 25.0))
        except AttributeError as exc:
            raise InputError(f"results[{i}] is not a generation result ({exc}); pass Avatar.generate "
                             "results.") from None
    return FpsTable(tuple(rows))


def _frames_at(frames: Any, indices: Sequence[int]) -> list[np.ndarray]:
    if isinstance(frames, (str, os.PathLike)):  # a file: decode only the frames shown
        from .media import frames_at

        return list(frames_at(frames, indices))
    if isinstance(frames, np.ndarray) and frames.ndim == 3:
        frames = frames[None]
    if hasattr(frames, "__getitem__") and hasattr(frames, "__len__"):
        return [np.asarray(frames[i]) for i in indices]
    wanted, out = set(indices), {}
    for i, frame in enumerate(frames):  # a streaming reader: read up to the last wanted frame
        if i in wanted:
            out[i] = np.asarray(frame)
        if i >= max(indices):
            break
    missing = [i for i in indices if i not in out]
    if missing:
        raise InputError(f"frames has fewer frames than asked; missing indices {missing}.")
    return [out[i] for i in indices]


def _track_array(track: Any, names: Sequence[str]) -> np.ndarray | None:
    for name in names:
        value = getattr(track, name, None)
        if value is not None and not callable(value):
            return np.asarray(value)
    return None


@dataclass(frozen=True)
class _Material:
    mask: np.ndarray
    square: Any


def _track_masks(track: Any, has_face: np.ndarray | None) -> list[Any] | None:
    """Per-frame blend masks of an avatar-like object (``materials``, or ``masks`` with ``squares``)."""
    materials = getattr(track, "materials", None)
    if materials is not None:
        return list(materials)
    masks, squares = getattr(track, "masks", None), getattr(track, "squares", None)
    if masks is None:
        return None
    masks = list(masks)
    if squares is not None:
        masks = [_Material(m, s) for m, s in zip(masks, squares, strict=True)]
    if has_face is not None and len(masks) == int(has_face.sum()) != len(has_face):
        it = iter(masks)  # one mask per frame with a face: spread them over the frames
        masks = [next(it) if face else None for face in has_face]
    return masks


def _full_mask(item: Any, shape: tuple[int, int]) -> np.ndarray | None:
    """A (H, W) float mask in [0, 1] from a full-frame mask or from a blend material (mask over its square)."""
    if item is None:
        return None
    mask = np.asarray(getattr(item, "mask", item), dtype=np.float32)
    if mask.max(initial=0) > 1:
        mask = mask / 255.0
    square = getattr(item, "square", None)
    if square is None:
        return mask if mask.shape[:2] == shape else None
    xs, ys, xe, ye = (int(v) for v in square)
    canvas = np.zeros(shape, np.float32)
    x0, y0, x1, y1 = max(xs, 0), max(ys, 0), min(xe, shape[1]), min(ye, shape[0])
    if x1 > x0 and y1 > y0:
        canvas[y0:y1, x0:x1] = mask[y0 - ys:y1 - ys, x0 - xs:x1 - xs]
    return canvas


def plot_faces(frames: Any, track: Any = None, *, indices: Sequence[int] | None = None, boxes: Any = None,
               landmarks: Any = None, masks: Any = None, max_frames: int = 4, width_in: float = 3.2) -> Chart:
    """Frames with their crop boxes, landmarks and blend masks drawn over them.

    Args:
        frames: A video or photo path (only the frames shown are decoded, at 25 fps), (N, H, W, 3) uint8
            **BGR** frames, a list of them, or a frame reader (iterated up to the last index shown).
        track: A face track (``nbhelpers.faces.track``) or an avatar: its ``boxes`` (N, 4) crop boxes in pixels,
            ``landmarks`` (N, 68, 2) and ``has_face`` (N,) are used when present.
        indices: Frame indices to show; default ``max_frames`` evenly spaced ones.
        boxes: (N, 4) ``(x1, y1, x2, y2)`` crop boxes overriding the track's.
        landmarks: (N, 68, 2) ``(x, y)`` points overriding the track's.
        masks: Per frame: a (H, W) mask (0..1 or 0..255) or a blend material with ``mask`` and ``square``.
        max_frames: How many frames to show when ``indices`` is None.
        width_in: Width of each panel in inches.

    Returns:
        A :class:`Chart`, one panel per frame; frames without a face are titled so.

    Raises:
        InputError: No frames, or an index out of range.
    """
    boxes = _track_array(track, ("crop_boxes", "boxes")) if boxes is None else np.asarray(boxes)
    landmarks = _track_array(track, ("landmarks",)) if landmarks is None else np.asarray(landmarks)
    has_face = _track_array(track, ("has_face",))
    if masks is None:
        masks = _track_masks(track, has_face)
    n_known = next((len(a) for a in (boxes, landmarks, has_face, masks) if a is not None), None)
    if n_known is None:
        n_known = len(frames) if hasattr(frames, "__len__") else max_frames
    if indices is None:
        count = max(1, min(int(max_frames), n_known))
        indices = sorted({int(round(i)) for i in np.linspace(0, n_known - 1, count)})
    indices = [int(i) for i in indices]
    if not indices or min(indices) < 0 or (n_known and max(indices) >= n_known):
        raise InputError(f"indices must be frame numbers in 0..{n_known - 1}; got {indices}.")
    images = _frames_at(frames, indices)
    aspect = images[0].shape[0] / images[0].shape[1]
    fig = _figure(width_in * len(images), width_in * aspect + 0.5)
    for k, (i, frame) in enumerate(zip(indices, images, strict=True)):
        ax = fig.add_subplot(1, len(images), k + 1)
        ax.imshow(frame[:, :, ::-1])  # BGR -> RGB for display
        face = True if has_face is None else bool(has_face[i])
        mask = _full_mask(masks[i], frame.shape[:2]) if masks is not None and i < len(masks) else None
        if mask is not None:
            overlay = np.zeros((*frame.shape[:2], 4), np.float32)
            overlay[..., 0] = 1.0
            overlay[..., 3] = 0.45 * mask
            ax.imshow(overlay)
        if face and boxes is not None:
            x1, y1, x2, y2 = (float(v) for v in boxes[i])
            from matplotlib.patches import Rectangle

            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="#00e000", linewidth=1.5))
        if face and landmarks is not None and np.isfinite(landmarks[i]).all():
            ax.scatter(landmarks[i][:, 0], landmarks[i][:, 1], s=4, c="#00c0ff")
        ax.set_title(f"frame {i}" + ("" if face else " (no face)"), fontsize=9)
        ax.set_axis_off()
    return Chart(fig)
