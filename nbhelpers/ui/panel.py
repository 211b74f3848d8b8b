"""The settings panel: widgets (or plain values) that edit an :class:`~nbhelpers.config.InferenceConfig`, nothing else.

The work runs in the next cell, never in a widget callback, so *Run all*, papermill and nbval do what a person
does. Headless, the same panel takes its values from a dict and shows a table. Works on ipywidgets 7.7 and 8.x.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from ..config import InferenceConfig
from ..config.fields import settings
from ..errors import InputError

__all__ = ["BATCH_CHOICES", "PANEL_FIELDS", "RESTORE_CHOICES", "SettingsPanel", "settings_panel", "widgets_available"]

BATCH_CHOICES = (1, 2, 4, 8, 16, 20, 32, 48, 64)  # frames per batch offered by the panel

_FIELDS = {f.name: f for f in settings(InferenceConfig)}  # each control's label, tooltip and choices
PANEL_FIELDS = ("version", "extra_margin", "parsing_mode", "left_cheek_width", "right_cheek_width", "bbox_shift",
                "batch_size", "fp16", "encoder", "restore", "restore_strength", "face")  # in display order
RESTORE_CHOICES = [(label, value) for value, label in _FIELDS["restore"].metadata["labels"].items()]
_RESTORE_OFF = "off"  # the restore dropdown's None (ipywidgets 8 shows None as an empty box); values gives None


def widgets_available() -> bool:
    """True when ipywidgets imports and ``NBHELPERS_WIDGETS`` is not ``0`` (set it to force the plain panel)."""
    if os.environ.get("NBHELPERS_WIDGETS", "1").lower() in ("0", "false", "no"):
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class SettingsPanel:
    """Widgets (or plain values) for the inference settings; :attr:`config` is the config of the current values.

    Attributes:
        base: The config the panel started from.
        controls: Field name -> ipywidgets control (or a plain stand-in).
        uses_widgets: True when real ipywidgets controls are used.
    """

    def __init__(self, base: InferenceConfig, values: Mapping[str, Any] | None = None, use_widgets: bool | None = None):
        self.base = base
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
        initial = {**{name: getattr(base, name) for name in PANEL_FIELDS}, **values}
        for name in ("batch_size", "fp16"):  # the base config's value is what "auto" means
            initial[name] = "auto" if values.get(name) is None else values[name]
        try:  # the config's own rules, before any widget is made
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
        self._initial(self.base, merged)
        for name, value in values.items():
            control = self.controls[name]
            if value is None and name in ("batch_size", "fp16"):
                value = "auto"
            elif self.uses_widgets and isinstance(value, int) and hasattr(control, "max"):  # widen a slider
                control.max, control.min = max(control.max, value), min(control.min, value)
            elif self.uses_widgets and name == "batch_size" and value not in [v for _, v in control.options]:
                control.options = [*control.options, (str(value), value)]
            elif self.uses_widgets and name == "restore" and value is None:
                value = _RESTORE_OFF
            elif self.uses_widgets and name == "face":
                value = str(value)  # a text box
            control.value = value
        self._sync()
        return self

    def _planned(self) -> tuple[str, str]:
        batch, fp16 = self.base.batch_size, self.base.fp16
        return (f"auto (planner: {batch})" if batch else "auto",
                "auto" if fp16 is None else f"auto (planner: {'fp16' if fp16 else 'fp32'})")

    def planner_notes(self) -> list[str]:
        """Why the planner chose the device, precision and batch size (from the plan's reasons)."""
        reasons = self.base.reasons or {}
        return [f"{name}: {reasons[name]}" for name in ("device", "fp16", "batch_size") if reasons.get(name)]

    def _make(self, name: str, value: Any) -> Any:
        if not self.uses_widgets:  # a stand-in control: its value, and whether it applies
            return SimpleNamespace(value=value, disabled=False)
        import ipywidgets as w

        m = _FIELDS[name].metadata
        common = {"description": m["label"], "style": {"description_width": "140px"},
                  "layout": w.Layout(width="520px", display="")}  # every control is shown, disabled where moot
        if name in ("version", "parsing_mode", "encoder", "restore"):
            labels = m.get("labels") or {c: c for c in m["choices"]}
            control = w.Dropdown(options=[(text, _RESTORE_OFF if c is None else c) for c, text in labels.items()],
                                 value=_RESTORE_OFF if value is None else value, **common)
        elif name in ("extra_margin", "left_cheek_width", "right_cheek_width", "bbox_shift"):
            low, high = m.get("app_range", (-40, 40))  # the official app's slider (bbox_shift: +-40), or wider
            control = w.IntSlider(value=value, min=min(low, value), max=max(high, value), **common)
        elif name == "batch_size":
            batch_text, _ = self._planned()
            options = [(batch_text, "auto")] + [(str(b), b) for b in sorted(set(BATCH_CHOICES) | (
                {value} if isinstance(value, int) else set()))]
            control = w.Dropdown(options=options, value=value, **common)
        elif name == "fp16":
            _, precision_text = self._planned()
            control = w.Dropdown(options=[(precision_text, "auto"), ("fp16", True), ("fp32", False)], value=value,
                                 **common)
        elif name == "restore_strength":
            control = w.FloatSlider(value=float(value), min=0.0, max=1.0, step=0.05, **common)
        else:  # face
            control = w.Text(value=str(value), placeholder="largest, 0, 1, ..., x,y or speaker", **common)
        for attr in ("tooltip", "description_tooltip"):  # ipywidgets 8 renamed description_tooltip to tooltip
            if attr in getattr(control, "keys", ()):
                setattr(control, attr, m["help"])
                break
        return control

    def _sync(self) -> None:
        """Enable only what applies: parsing and cheeks for v1.5 (cheeks: jaw mode), the strength with a restorer;
        bbox_shift always."""
        v1 = self.controls["version"].value == "v1"
        jaw = self.controls["parsing_mode"].value == "jaw"
        rules = {"extra_margin": not v1, "parsing_mode": not v1, "left_cheek_width": not v1 and jaw,
                 "right_cheek_width": not v1 and jaw,
                 "restore_strength": self.controls["restore"].value not in (None, _RESTORE_OFF)}
        for name, enabled in rules.items():
            self.controls[name].disabled = not enabled

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
        """``(label, value)`` for each field."""
        batch_text, precision_text = self._planned()
        out = []
        for name, control in self.controls.items():
            value = control.value
            if name == "batch_size" and value == "auto":
                value = batch_text
            elif name == "fp16":
                value = precision_text if value == "auto" else ("fp16" if value else "fp32")
            elif name == "restore":
                value = _FIELDS[name].metadata["labels"].get(None if value == _RESTORE_OFF else value, value)
            out.append((_FIELDS[name].metadata["label"], str(value)))
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


def _to_config(base: InferenceConfig, values: Mapping[str, Any]) -> InferenceConfig:
    changes = {name: values[name] for name in PANEL_FIELDS if name in values}
    for name in ("batch_size", "fp16"):
        if changes.get(name, "auto") == "auto":
            changes[name] = getattr(base, name)
    if "face" in changes and not str(changes["face"]).strip():  # an emptied box: the default
        changes["face"] = "largest"
    return base.replace(**changes)


def settings_panel(plan_or_config: Any = None, values: Mapping[str, Any] | None = None, *,
                   use_widgets: bool | None = None) -> SettingsPanel:
    """A panel of the inference settings that only sets parameters; read ``panel.config`` in the next cell.

    ``plan_or_config`` is a plan from :func:`nbhelpers.gpu.plan` (its batch size and precision shown as "auto"), an
    :class:`InferenceConfig`, or None for the defaults. ``values`` maps names of :data:`PANEL_FIELDS` to starting
    values (the headless path; ``batch_size`` and ``fp16`` also take ``"auto"``). ``use_widgets`` forces (True) or
    avoids (False) ipywidgets; None uses them when installed. InputError for an unknown name or a value out of range
    in ``values``."""
    return SettingsPanel(_base_config(plan_or_config), values, use_widgets)


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
