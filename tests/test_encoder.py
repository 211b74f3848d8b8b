"""The ``encoder`` setting: the choice logic with the NVENC test encode injected, the real test encode on this
machine (no GPU: it must fall back with the reason), every libx264 preset writing a valid file, and the setting in
the config, the CLI and the panel."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from nbhelpers import media
from nbhelpers.config import InferenceConfig
from nbhelpers.constants import ENCODERS
from nbhelpers.errors import FallbackWarning, InputError
from nbhelpers.media import writer as media_writer

pytestmark = pytest.mark.notorch

X264 = [e for e in ENCODERS if e.startswith("libx264")]


def test_every_setting_has_ffmpeg_options_and_libx264_is_crf18_medium(monkeypatch):
    assert set(media.ENCODER_SETTINGS) == set(ENCODERS)
    assert InferenceConfig().encoder == "libx264-veryfast"
    monkeypatch.setattr(media_writer, "nvenc_probe", lambda exe: pytest.fail("libx264 must not probe NVENC"))
    choice = media.choose_encoder("libx264")
    assert (choice.codec, choice.preset, choice.ffmpeg) == ("libx264", "medium", None)
    assert media.choose_encoder("libx264-veryfast").preset == "veryfast"
    with pytest.raises(InputError, match="encoder must be one of"):
        media.choose_encoder("x265")


@pytest.mark.parametrize("setting", ["auto", "nvenc"])
def test_nvenc_is_used_when_the_test_encode_works(setting, monkeypatch):
    tried = []

    def probe(exe):
        tried.append(exe)
        return (exe == "/usr/bin/ffmpeg", "" if exe == "/usr/bin/ffmpeg" else "Driver does not support the "
                "required nvenc API version. Required: 13.1 Found: 13.0")

    monkeypatch.setattr(media_writer, "nvenc_probe", probe)
    with no_fallback_warning():
        choice = media.choose_encoder(setting, ffmpegs=["/bundled/ffmpeg", "/usr/bin/ffmpeg"])
    assert tried == ["/bundled/ffmpeg", "/usr/bin/ffmpeg"]  # the bundled binary first, then the system one
    assert (choice.codec, choice.preset, choice.ffmpeg) == ("h264_nvenc", "p5", "/usr/bin/ffmpeg")


@pytest.mark.parametrize("setting", ["auto", "nvenc"])
def test_fallback_to_libx264_medium_says_why(setting, monkeypatch):
    probe = {"/a": (False, "Cannot load libcuda.so.1"), "/b": (False, "No capable devices found")}.__getitem__
    monkeypatch.setattr(media_writer, "nvenc_probe", probe)
    with pytest.warns(FallbackWarning, match=r"libcuda\.so\.1.*No capable devices.*libx264 CRF 18, preset medium"):
        choice = media.choose_encoder(setting, ffmpegs=["/a", "/b"])
    assert (choice.codec, choice.preset, choice.ffmpeg) == ("libx264", "medium", None)
    assert "Cannot load libcuda.so.1" in choice.reason


def _has_nvidia_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def test_real_probe_on_a_machine_without_gpu_falls_back_with_the_reason(ffmpeg, monkeypatch):
    if _has_nvidia_gpu():
        pytest.skip("this machine has an NVIDIA GPU: NVENC may work here")
    media_writer._probe_cache.clear()
    ok, why = media.nvenc_probe(ffmpeg)
    assert not ok and why  # e.g. "Cannot load libcuda.so.1", or "Unknown encoder" for a build without NVENC
    with pytest.warns(FallbackWarning, match="h264_nvenc is not usable") as record:
        choice = media.choose_encoder("auto", ffmpegs=[ffmpeg])
    assert why in str(record[0].message) and choice.codec == "libx264"
    # cached per process: a second choice runs no ffmpeg
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("probe not cached"))
    assert media.nvenc_probe(ffmpeg) == (ok, why)


@pytest.mark.parametrize("setting", X264)
def test_each_libx264_preset_writes_a_valid_file(tmp_path, setting):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (12, 48, 64, 3), dtype=np.uint8)
    out = tmp_path / f"{setting}.mp4"
    with media.VideoWriter(out, 64, 48, encoder=setting) as writer:
        writer.write(frames)
    preset = media.ENCODER_SETTINGS[setting][1]
    assert writer.args[writer.args.index("-preset") + 1] == preset and "libx264" in writer.args
    assert writer.encoder.setting == setting
    info = media.probe(out)
    assert info.video_codec == "h264" and info.frame_count == 12 and (info.width, info.height) == (64, 48)
    assert info.comment == media.SYNTHETIC_TAG


def test_writer_with_auto_falls_back_and_still_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(media_writer, "nvenc_probe", lambda exe: (False, "Cannot load libcuda.so.1"))
    with pytest.warns(FallbackWarning, match="libcuda"):
        with media.VideoWriter(tmp_path / "a.mp4", 64, 48, encoder="auto") as writer:
            writer.write(np.zeros((3, 48, 64, 3), np.uint8))
    assert writer.args[writer.args.index("-c:v") + 1] == "libx264"
    assert media.probe(tmp_path / "a.mp4").frame_count == 3
    # a choice made once is reused without probing or warning again
    monkeypatch.setattr(media_writer, "nvenc_probe", lambda exe: pytest.fail("probed again"))
    with no_fallback_warning():
        with media.VideoWriter(tmp_path / "b.mp4", 64, 48, encoder=writer.encoder) as again:
            again.write(np.zeros((2, 48, 64, 3), np.uint8))
    assert again.encoder is writer.encoder and media.probe(tmp_path / "b.mp4").frame_count == 2


def test_config_cli_and_panel_carry_the_setting():
    from nbhelpers.cli.flags import inference_config as _config
    from nbhelpers.cli.parser import build_parser
    from nbhelpers.ui import settings_panel

    with pytest.raises(InputError, match="encoder"):
        InferenceConfig(encoder="h265")
    args = build_parser().parse_args(["lipsync", "v.mp4", "a.wav", "--encoder", "libx264-veryfast"])
    assert _config(args).encoder == "libx264-veryfast"
    assert _config(build_parser().parse_args(["lipsync", "v.mp4", "a.wav"])).encoder == "libx264-veryfast"
    gen = build_parser().parse_args(["avatar", "generate", "dir", "a.wav", "--encoder", "auto"])
    assert gen.encoder == "auto"
    assert build_parser().parse_args(["avatar", "generate", "dir", "a.wav"]).encoder is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["lipsync", "v.mp4", "a.wav", "--encoder", "h265"])
    panel = settings_panel(InferenceConfig(), {"encoder": "libx264-fast"}, use_widgets=False)
    assert panel.config.encoder == "libx264-fast" and dict(panel.rows())["video encoder"] == "libx264-fast"
    with pytest.raises(InputError, match="encoder"):
        settings_panel(InferenceConfig(), {"encoder": "h265"}, use_widgets=False)


class no_fallback_warning:
    """Fail when the block emits a FallbackWarning (NVENC chosen: nothing to warn about)."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", FallbackWarning)

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
