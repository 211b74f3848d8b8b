"""The settings panel: widgets (or plain values) that edit an :class:`~nbhelpers.config.InferenceConfig`, nothing else.

The work runs in the next cell, never in a widget callback, so *Run all*, papermill and nbval do what a person
does. Headless, the same panel takes its values from a dict and shows a table. Works on ipywidgets 7.7 and 8.x.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..config import PARSING_MODES, InferenceConfig
from ..constants import ENCODERS, VERSIONS
from ..errors import InputError

__all__ = ["BATCH_CHOICES", "PANEL_FIELDS", "RESTORE_CHOICES", "SettingsPanel", "settings_panel",
           "widgets_available"]

BATCH_CHOICES = (1, 2, 4, 8, 16, 20, 32, 48, 64)  # frames per batch offered by the panel

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
    "face": ("face", "with several faces: largest (default), a track number of pipe.faces(video), a point x,y in "
             "frame 0, or speaker (the face that speaks, lip-sync only)"),
}
_ENCODER_TEXT = {"libx264": "libx264 medium (official, CRF 18)", "libx264-fast": "libx264 fast",
                 "libx264-faster": "libx264 faster", "libx264-veryfast": "libx264 veryfast",
                 "libx264-superfast": "libx264 superfast", "libx264-ultrafast": "libx264 ultrafast",
                 "auto": "auto (NVENC if it works, else libx264 medium)", "nvenc": "NVENC (GPU)"}
RESTORE_CHOICES = [("off", None), ("GFPGAN v1.4", "gfpgan"), ("RestoreFormer", "restoreformer"),
                   ("CodeFormer (non-commercial licence)", "codeformer")]
PANEL_FIELDS = tuple(_LABELS)
# The restore dropdown holds this for "off" (ipywidgets 8 shows a value of None as an empty box); the panel
# reports None.
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
    """Widgets (or plain values) for the inference settings; :attr:`config` is the config of the current values.

    Attributes:
        base: The config the panel started from.
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
        """The validated :class:`InferenceConfig` of the current values; InputError when one is out of range."""
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
            elif name == "face" and self.uses_widgets:
                value = str(value)  # a text box
            control.value = value
        self._sync()
        return self

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
        elif name == "face":
            control = w.Text(value=str(value), placeholder="largest, 0, 1, ..., x,y or speaker", **common)
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
    if "face" in changes and not str(changes["face"]).strip():  # an emptied box: the default
        changes["face"] = "largest"
    return base.replace(**changes)


def settings_panel(plan_or_config: Any = None, values: Mapping[str, Any] | None = None, *,
                   use_widgets: bool | None = None) -> SettingsPanel:
    """A panel of the inference settings that only sets parameters; read ``panel.config`` in the next cell.

    Args:
        plan_or_config: A plan from :func:`nbhelpers.gpu.plan` (its batch size and precision shown as "auto"), an
            :class:`InferenceConfig`, or None for the defaults.
        values: Field name -> starting value (the headless path), for the names in :data:`PANEL_FIELDS`;
            ``batch_size`` and ``fp16`` also take ``"auto"``.
        use_widgets: Force (True) or avoid (False) ipywidgets; None uses them when installed.

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
