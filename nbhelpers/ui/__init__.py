"""Notebook front end: a settings panel that only sets parameters, inline video and audio, and charts.

Importing this package imports numpy only; ipywidgets, IPython and matplotlib are imported when used.
"""

from __future__ import annotations

from ..display import PREVIEW_WIDTH, MediaView, first_frame_png, show_video, video_html
from .inside import (
    Comparison,
    compare_frames,
    crop_box_explorer,
    cut_speech,
    first_frames,
    plot_stage_ms,
    show_crop,
    show_face,
    show_images,
    show_latents,
    show_parsing,
    show_paste,
    show_whisper,
)
from .media import AudioView, SideBySide, show_audio, side_by_side
from .panel import BATCH_CHOICES, PANEL_FIELDS, RESTORE_CHOICES, SettingsPanel, settings_panel, widgets_available
from .plots import Chart, FpsTable, compare_restore, fps_table, plot_faces, plot_sync, plot_timings

__all__ = ["BATCH_CHOICES", "PANEL_FIELDS", "PREVIEW_WIDTH", "RESTORE_CHOICES", "AudioView", "Chart", "Comparison",
           "FpsTable", "MediaView", "SettingsPanel", "SideBySide", "compare_frames", "compare_restore",
           "crop_box_explorer", "cut_speech", "first_frame_png", "first_frames", "fps_table", "plot_faces",
           "plot_stage_ms", "plot_sync", "plot_timings", "settings_panel", "show_audio", "show_crop", "show_face",
           "show_images", "show_latents", "show_parsing", "show_paste", "show_video", "show_whisper", "side_by_side",
           "video_html", "widgets_available"]
