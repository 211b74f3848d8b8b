"""nbhelpers.ui: the settings panel (widgets and headless), inline video/audio, and the plots.

Widget behaviour is tested with real ipywidgets objects (7.7 in this environment, as on Colab) and, in a
subprocess, with ipywidgets 8 installed into a throwaway folder. Media tests use clips made with ffmpeg's lavfi
sources; expected values are computed independently (file bytes, PIL image sizes, the plotted bar widths).
"""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import ROOT, T4

from nbhelpers import ui
from nbhelpers.config import InferenceConfig
from nbhelpers.errors import InputError

# ------------------------------------------------------------------------------------------------ settings panel


@pytest.fixture(params=[True, False], ids=["widgets", "plain"])
def use_widgets(request):
    if request.param:
        pytest.importorskip("ipywidgets")
    return request.param


class FakePlan:
    """What the panel reads from a gpu.plan: its filled config (batch and precision chosen, with reasons)."""

    def __init__(self, batch_size=16, fp16=True):
        self.config = InferenceConfig(batch_size=batch_size, fp16=fp16, device="cuda:0")
        self.config.reasons["batch_size"] = "largest batch that fits 14.7 GiB"


def test_untouched_panel_gives_the_base_config(use_widgets):
    plan = FakePlan()
    panel = ui.settings_panel(plan, use_widgets=use_widgets)
    assert panel.config == plan.config
    assert panel.config.batch_size == 16 and panel.config.fp16 is True
    assert panel.uses_widgets is use_widgets


def test_planner_choice_is_shown(use_widgets):
    panel = ui.settings_panel(FakePlan(batch_size=16, fp16=True), use_widgets=use_widgets)
    rows = dict(panel.rows())
    assert rows["batch (frames)"] == "auto (planner: 16)"
    assert rows["precision"] == "auto (planner: fp16)"
    assert panel.planner_notes() == ["batch_size: largest batch that fits 14.7 GiB"]
    shown = panel.widget.children[-1].value if use_widgets else panel._repr_html_()
    assert "largest batch that fits 14.7 GiB" in shown


def test_values_set_the_config_headless(use_widgets):
    values = {"extra_margin": 25, "parsing_mode": "neck", "left_cheek_width": 60, "batch_size": 4, "fp16": False}
    config = ui.settings_panel(FakePlan(), values=values, use_widgets=use_widgets).config
    assert (config.extra_margin, config.parsing_mode, config.left_cheek_width) == (25, "neck", 60)
    assert (config.batch_size, config.fp16) == (4, False)
    assert config.device == "cuda:0"  # what the panel does not show stays as planned


def test_widgets_and_plain_panels_agree():
    pytest.importorskip("ipywidgets")
    values = {"version": "v1", "bbox_shift": -7, "batch_size": 8}
    assert (ui.settings_panel(values=values, use_widgets=True).config
            == ui.settings_panel(values=values, use_widgets=False).config)


def test_bbox_shift_applies_to_both_versions(use_widgets):
    # One rule in docs, CLI and panel: bbox_shift applies to v1.5 too, as the official app does (quirk Q27).
    v15 = ui.settings_panel(values={"bbox_shift": 12}, use_widgets=use_widgets)
    assert v15.config.bbox_shift == 12 and v15.config.version == "v15"
    assert dict(v15.rows())["bbox_shift (px)"] == "12"
    assert "app" in v15.config.reasons["bbox_shift"]
    v1 = ui.settings_panel(values={"version": "v1", "bbox_shift": 12}, use_widgets=use_widgets)
    assert v1.config.bbox_shift == 12 and v1.config.version == "v1"
    assert dict(v1.rows())["bbox_shift (px)"] == "12"
    assert v1.controls["parsing_mode"].disabled  # v1.0 always uses the raw mask
    assert v1.config.effective_parsing_mode == "raw"


def test_changing_a_widget_updates_what_is_shown_and_the_config():
    pytest.importorskip("ipywidgets")
    panel = ui.settings_panel(use_widgets=True)
    shift = panel.controls["bbox_shift"]
    assert not shift.disabled and shift.layout.display == ""  # shown for v1.5 as well
    panel.controls["version"].value = "v1"  # as a person picking "MuseTalk 1.0" in the dropdown
    assert not shift.disabled and shift.layout.display == ""
    shift.value = -5
    panel.controls["parsing_mode"].value = "raw"
    assert panel.config.bbox_shift == -5
    panel.controls["version"].value = "v15"
    assert panel.controls["left_cheek_width"].disabled  # cheek widths apply to the jaw mode only
    assert panel.config.bbox_shift == -5 and panel.config.version == "v15"


def test_restore_off_is_a_selected_choice(use_widgets):
    panel = ui.settings_panel(use_widgets=use_widgets)
    assert panel.values["restore"] is None and panel.config.restore is None
    assert dict(panel.rows())["face restoration"] == "off"
    if use_widgets:
        assert panel.controls["restore"].label == "off"  # not an empty box
        assert panel.controls["restore_strength"].disabled
    panel.set(restore="restoreformer")
    assert panel.config.restore == "restoreformer" and dict(panel.rows())["face restoration"] == "RestoreFormer"
    panel.set(restore=None)
    assert panel.config.restore is None and dict(panel.rows())["face restoration"] == "off"


def test_set_validates_and_extends_slider_ranges(use_widgets):
    panel = ui.settings_panel(use_widgets=use_widgets)
    panel.set(extra_margin=120)  # above the app's 0-40 slider, allowed by the config
    assert panel.config.extra_margin == 120
    panel.set(batch_size=12)  # not one of the offered batch sizes
    assert panel.config.batch_size == 12
    with pytest.raises(InputError, match="extra_margin"):
        panel.set(extra_margin=500)
    assert panel.config.extra_margin == 120  # a refused change leaves the panel as it was


@pytest.mark.parametrize("values, match", [
    ({"margin": 3}, "unknown names"),
    ({"extra_margin": 999}, "extra_margin"),
    ({"parsing_mode": "chin"}, "parsing_mode"),
    ({"version": "v2"}, "version"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": "big"}, "batch_size"),
    ({"fp16": "yes"}, "fp16"),
    ({"extra_margin": 2.5}, "extra_margin"),
])
def test_bad_values_raise_before_any_widget(values, match):
    with pytest.raises(InputError, match=match):
        ui.settings_panel(values=values, use_widgets=False)


def test_panel_displays_without_a_frontend():
    pytest.importorskip("IPython")
    from IPython.display import display

    display(ui.settings_panel(use_widgets=False))  # outside a kernel: must not fail
    html = ui.settings_panel(use_widgets=False)._repr_html_()
    assert "<table>" in html and "panel.set" in html


def test_settings_panel_rejects_other_objects():
    with pytest.raises(InputError, match="gpu plan or an InferenceConfig"):
        ui.settings_panel(object())


def test_real_gpu_plan_feeds_the_panel():
    gpu = pytest.importorskip("nbhelpers.gpu")
    plan = gpu.plan("lipsync", report=T4, n_frames=250, frame_size=(720, 1280))
    panel = ui.settings_panel(plan, use_widgets=False)
    assert panel.config.batch_size == plan.batch_size and panel.config.fp16 is True
    assert f"planner: {plan.batch_size}" in dict(panel.rows())["batch (frames)"]


WIDGETS8 = textwrap.dedent("""
    import ipywidgets, sys
    assert ipywidgets.__version__.startswith("8"), ipywidgets.__version__
    from nbhelpers import ui
    panel = ui.settings_panel(values={"extra_margin": 20}, use_widgets=True)
    assert panel.config.extra_margin == 20
    panel.controls["version"].value = "v1"
    panel.controls["bbox_shift"].value = 6
    assert panel.config.bbox_shift == 6 and not panel.controls["bbox_shift"].disabled
    assert panel.controls["extra_margin"].tooltip  # ipywidgets 8's name for the tooltip
    assert panel.widget is not None
    # "off" is selected and shown (ipywidgets 8 shows an empty box for a Dropdown value of None).
    assert panel.controls["restore"].label == "off" and panel.config.restore is None
    panel.set(restore="gfpgan")
    assert panel.config.restore == "gfpgan" and not panel.controls["restore_strength"].disabled
    panel.set(restore=None)
    assert panel.controls["restore"].label == "off" and panel.config.restore is None
    print("ok", ipywidgets.__version__)
""")


def test_panel_works_on_ipywidgets_8(tmp_path_factory):
    """Install ipywidgets 8 into a throwaway folder (this environment keeps Colab's 7.7.1) and run the panel."""
    target = tmp_path_factory.mktemp("ipywidgets8")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                              str(target), "ipywidgets>=8,<9", "widgetsnbextension>=4,<5", "jupyterlab_widgets>=3,<4",
                              "comm>=0.1.3"],  # ipywidgets 8 needs comm; Colab's ipykernel 6.17.1 does not bring it
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if install.returncode != 0:
        pytest.skip(f"could not install ipywidgets 8 from the package index: {install.stderr[-300:]}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", WIDGETS8], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok 8.")


# ------------------------------------------------------------------------------------------------ video and audio


@pytest.fixture(scope="module")
def clip(lavfi_video):
    return lavfi_video("testsrc", "320x240", seconds=1)


@pytest.fixture(scope="module")
def big_clip(lavfi_video):
    return lavfi_video("testsrc", "960x540", seconds=1)


def _data_urls(html: str) -> list[tuple[str, bytes]]:
    return [(mime, base64.b64decode(data)) for mime, data in re.findall(r"data:([\w/+-]+);base64,([A-Za-z0-9+/=]+)",
                                                                       html)]


def test_small_video_is_embedded_as_a_playable_data_url(clip):
    view = ui.show_video(clip)
    html = view._repr_html_()
    assert view.embedded and "<video controls" in html
    [(mime, data)] = _data_urls(html)
    assert mime == "video/mp4" and data == Path(clip).read_bytes()


def test_large_video_shows_its_first_frame_and_a_link(big_clip, monkeypatch, tmp_path):
    from PIL import Image

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.chdir(Path(big_clip).parent)
    view = ui.show_video(big_clip, max_embed_mb=0.001)
    html = view._repr_html_()
    assert not view.embedded and "<video" not in html
    [(mime, png)] = _data_urls(html)
    image = Image.open(io.BytesIO(png))
    assert mime == "image/png" and image.size == (ui.PREVIEW_WIDTH, 270)  # 960x540 scaled to 480 wide
    assert f"href='{Path(big_clip).name}' download" in html  # a relative link the notebook server can serve


def test_large_video_in_colab_says_how_to_download(big_clip, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    html = ui.show_video(big_clip, max_embed_mb=0.001)._repr_html_()
    assert "files.download(" in html and str(big_clip) in html


def test_result_objects_and_photos(clip, tmp_path):
    class Result:
        output = Path(clip)

    assert ui.show_video(Result()).path == Path(clip)
    photo = tmp_path / "face.png"
    photo.write_bytes(ui.first_frame_png(clip))
    html = ui.show_video(photo)._repr_html_()
    assert "<img" in html and _data_urls(html)[0][0] == "image/png"
    assert ui.video_html(clip).startswith("<div")
    with pytest.raises(InputError, match="does not exist"):
        ui.show_video(tmp_path / "missing.mp4")


CLIP_RESULT_HTML = textwrap.dedent("""
    import sys
    from pathlib import Path
    from nbhelpers.config import InferenceConfig
    from nbhelpers.result import ClipResult
    r = ClipResult(output=Path(sys.argv[1]), n_frames=25, source_frames=25, no_face_frames=0, fps=25,
                   duration_s=1.0, config=InferenceConfig(), backend="dlib", timings={"generate": 0.5}, wall_s=2.0)
    page = r._repr_html_()
    assert "<video controls" in page and "<td>generate</td><td>0.500 s</td>" in page, page[:300]
    assert "nbhelpers.ui" not in sys.modules, "result imported the ui"
    print("ok")
""")


def test_clip_result_shows_its_video_and_timings_without_the_ui(clip):
    done = subprocess.run([sys.executable, "-c", CLIP_RESULT_HTML, str(clip)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_clip_from_a_photo_counts_its_source_frame_in_the_singular():
    from nbhelpers.config import InferenceConfig
    from nbhelpers.result import ClipResult

    r = ClipResult(output=None, n_frames=25, source_frames=1, no_face_frames=0, fps=25, duration_s=1.0,
                   config=InferenceConfig(), backend="dlib", timings={}, wall_s=2.0)
    assert r.summary().startswith("(not written): 25 frames at 25 fps (1.00 s), source 1 frame, 0 without a face; ")


def test_the_summary_gives_the_frames_duration_and_the_audios_when_it_is_longer():
    """37 frames at 25 fps last 1.48 s (as the live session says); audio of 1.50 s is named beside it."""
    from nbhelpers.config import InferenceConfig
    from nbhelpers.result import ClipResult

    r = ClipResult(output=None, n_frames=37, source_frames=1, no_face_frames=0, fps=25, duration_s=1.5,
                   config=InferenceConfig(), backend="dlib", timings={}, wall_s=2.0)
    assert r.summary().startswith("(not written): 37 frames at 25 fps (1.48 s, audio 1.50 s), source 1 frame, ")
    live = ClipResult(output=None, n_frames=37, source_frames=1, no_face_frames=0, fps=25, duration_s=1.48,
                      config=InferenceConfig(), backend="dlib", timings={}, wall_s=2.0, kind="stream")
    assert live.summary().startswith("(not written): 37 frames at 25 fps (1.48 s), source 1 frame, ")


def test_side_by_side_shows_both(clip, tmp_path):
    photo = tmp_path / "face.png"
    photo.write_bytes(ui.first_frame_png(clip))
    html = ui.side_by_side(photo, clip, titles=("your photo", "lip-synced"))._repr_html_()
    assert html.count("<video") == 1 and html.count("<img") == 1
    assert "your photo" in html and "lip-synced" in html and "display:flex" in html


def test_show_audio_embeds_the_file(lavfi_tone):
    wav = lavfi_tone(0.5, 440, 44100)
    html = ui.show_audio(wav)._repr_html_()
    [(mime, data)] = _data_urls(html)
    assert "<audio controls" in html and mime == "audio/wav" and data == Path(wav).read_bytes()
    assert "too large" in ui.show_audio(wav, max_embed_mb=0)._repr_html_()


# ------------------------------------------------------------------------------------------------ plots


def test_plot_timings_draws_one_bar_per_stage():
    timings = {"faces": 1.5, "encode": 0.25, "generate": 6.0}
    chart = ui.plot_timings(timings)
    ax = chart.figure.axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert widths == [1.5, 0.25, 6.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["faces", "encode", "generate"]
    assert "total 7.75 s" in ax.get_title()
    assert chart._repr_png_().startswith(b"\x89PNG")


def test_plot_timings_accepts_a_result_and_rejects_nonsense():
    class Result:
        timings = {"audio": 0.5}

    assert ui.plot_timings(Result()).figure.axes[0].patches[0].get_width() == 0.5
    for bad in ({}, {"a": -1.0}, {"a": "slow"}, None):
        with pytest.raises(InputError, match="timings"):
            ui.plot_timings(bad)


class FakeTrack:
    """The fields of faces.FaceTrack the plot reads (boxes is a method there, as in FaceTrack)."""

    def __init__(self):
        self.crop_boxes = np.array([[10, 20, 60, 80], [-1, -1, -1, -1], [12, 22, 62, 82]], np.int32)
        self.has_face = np.array([True, False, True])
        self.landmarks = np.full((3, 68, 2), np.nan, np.float32)
        self.landmarks[0] = np.stack([np.linspace(15, 55, 68), np.linspace(30, 75, 68)], axis=1)

    def boxes(self):  # pragma: no cover - must not be mistaken for the boxes array
        raise AssertionError


def test_plot_faces_draws_boxes_landmarks_and_no_face_titles():
    frames = np.zeros((3, 100, 80, 3), np.uint8)
    chart = ui.plot_faces(frames, FakeTrack(), indices=[0, 1, 2])
    axes = chart.figure.axes
    assert [a.get_title() for a in axes] == ["frame 0", "frame 1 (no face)", "frame 2"]
    rect = axes[0].patches[0]
    assert (rect.get_x(), rect.get_y(), rect.get_width(), rect.get_height()) == (10, 20, 50, 60)
    assert not axes[1].patches  # no box on a frame without a face
    assert len(axes[0].collections[0].get_offsets()) == 68 and not axes[2].collections  # NaN landmarks skipped


def test_plot_faces_overlays_blend_masks_of_an_avatar():
    class FakeAvatar:
        crop_boxes = np.array([[20, 20, 60, 60]], np.int32)
        has_face = np.array([True])
        squares = [(10, 10, 70, 70)]
        masks = [np.full((60, 60), 255, np.uint8)]

    frame = np.zeros((1, 100, 100, 3), np.uint8)
    ax = ui.plot_faces(frame, FakeAvatar()).figure.axes[0]
    overlay = ax.images[1].get_array()
    alpha = np.asarray(overlay)[..., 3]
    assert alpha[40, 40] == pytest.approx(0.45) and alpha[5, 5] == 0 and alpha[75, 75] == 0


def test_plot_faces_reads_a_stream_up_to_the_last_frame_shown():
    read = []

    def stream():
        for i in range(10):
            read.append(i)
            yield np.full((20, 20, 3), i, np.uint8)

    chart = ui.plot_faces(stream(), SimpleNamespace(boxes=np.tile([2, 2, 10, 10], (10, 1))), indices=[1, 3])
    assert [a.get_title() for a in chart.figure.axes] == ["frame 1", "frame 3"]
    assert read == [0, 1, 2, 3]
    with pytest.raises(InputError, match="indices"):
        ui.plot_faces(np.zeros((2, 8, 8, 3), np.uint8), indices=[5])


def test_plot_faces_decodes_only_the_frames_shown_from_a_file(clip):
    from nbhelpers import media

    chart = ui.plot_faces(clip, SimpleNamespace(boxes=np.tile([10, 10, 100, 100], (25, 1))), indices=[0, 24])
    axes = chart.figure.axes
    assert [a.get_title() for a in axes] == ["frame 0", "frame 24"]
    shown = np.asarray(axes[1].images[0].get_array())
    assert np.array_equal(shown, media.frames_at(clip, [24])[0][:, :, ::-1])  # displayed as RGB


@pytest.mark.parametrize("as_text", [True, False])
def test_plot_faces_of_a_file_alone_spreads_the_panels_over_all_its_frames(clip, as_text):
    # 25 frames at 25 fps: four panels at 0, 8, 16, 24 (np.linspace(0, 24, 4) rounded), not over len(str(path))
    chart = ui.plot_faces(str(clip) if as_text else Path(clip))
    assert [a.get_title() for a in chart.figure.axes] == ["frame 0", "frame 8", "frame 16", "frame 24"]


def test_fps_table():
    class Clip:
        def __init__(self, name, n, wall, gen):
            self.output, self.n_frames, self.wall_s, self.generation_fps = Path(name), n, wall, gen
            self.end_to_end_fps = n / wall

    table = ui.fps_table([Clip("a.mp4", 50, 2.0, 100.0), Clip("b.mp4", 25, 0.5, 200.0)])
    assert len(table) == 2
    assert table.rows[0] == ("a.mp4", 50, 2.0, 100.0, 25.0, 1.0)
    assert table.rows[1][4:] == (50.0, 2.0)
    assert "end-to-end fps" in str(table) and "<table>" in table._repr_html_()
    with pytest.raises(InputError):
        ui.fps_table([])
    with pytest.raises(InputError, match="results\\[0\\]"):
        ui.fps_table([object()])


def test_config_replace_does_not_share_reasons():
    from nbhelpers import InferenceConfig

    a = InferenceConfig()
    a.reasons["batch_size"] = "planned"
    b = a.replace(bbox_shift=5)
    assert "bbox_shift" in b.reasons and "bbox_shift" not in a.reasons
    assert b.reasons["batch_size"] == "planned"
    b.reasons["device"] = "x"
    assert "device" not in a.reasons
