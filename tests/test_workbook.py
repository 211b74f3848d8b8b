"""nbhelpers.workbook: where a notebook cell's weights and files go, the planner of the run mode, the final check."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbhelpers as nbh
from nbhelpers import env, workbook
from nbhelpers.errors import InputError


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("NBHELPERS_WORKDIR", str(tmp_path / "wb"))
    return tmp_path / "wb"


def test_path_is_inside_the_work_folder_with_its_parent_made(workdir):
    target = workbook.path("avatars", "my-avatar")
    assert target == workdir / "avatars" / "my-avatar"
    assert target.parent.is_dir() and not target.exists()
    assert workbook.path("lipsync.mp4") == workdir / "lipsync.mp4"
    assert nbh.workbook.path is workbook.path  # reachable as the notebooks write it


@pytest.mark.parametrize("parts", [(), ("/etc", "x.mp4"), ("..", "x.mp4"), ("a/../../x.mp4",)])
def test_path_refuses_what_leaves_the_work_folder(workdir, parts):
    with pytest.raises(InputError, match="workbook.path"):
        workbook.path(*parts)


@pytest.fixture
def clip_and_audio(lavfi_video, lavfi_tone):
    return lavfi_video(seconds=1), lavfi_tone(1, 440), lavfi_tone(2, 440)


def test_check_takes_the_duration_from_the_audio(clip_and_audio):
    video, audio_1s, audio_2s = clip_and_audio
    assert workbook.check(video, audio=audio_1s, since=0).startswith(f"OK: {video.name}")
    with pytest.raises(env.ResultCheckError, match="expected 2.000 s"):
        workbook.check(video, audio=audio_2s, since=0)
    with pytest.raises(InputError, match="not both"):
        workbook.check(video, audio=audio_1s, duration_s=1.0)


def test_plan_reads_the_run_mode_itself(monkeypatch):
    monkeypatch.setenv("NBHELPERS_MODE", "ci")
    with pytest.warns(Warning):  # the CPU warning of CI mode
        plan = workbook.plan("avatar")
    assert plan.config.device == "cpu" and plan.config.landmark_backend == "dlib" and plan.weights == "tiny"


def test_weights_and_setup_steps_are_the_env_ones(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(env, "weights_dir", lambda mode=None, *, download=True: calls.append((mode, download))
                        or tmp_path)
    assert workbook.weights(download=False) == tmp_path and calls == [(None, False)]
    assert workbook.install_missing is env.install_missing and workbook.check_setup is env.check_setup
    assert workbook.mount_drive is env.mount_drive and workbook.keep_audio is env.keep_audio


def test_keep_video_converts_into_the_media_folder(workdir, lavfi_video):
    source = lavfi_video(seconds=1, rate=30)
    info = workbook.keep_video(source)
    assert Path(info.path) == workdir / "media" / env.WORKBOOK_VIDEO
    assert info.fps == 25 and abs(info.duration_s - 1.0) <= 1 / 25
