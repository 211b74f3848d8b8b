"""A job whose output cannot be written says so before any work (issue 37 #1), in one message:
``cannot write in <folder>/ (<why>)``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nbhelpers.errors import InputError


def _cannot_write_in(folder: Path) -> bool:
    try:
        (folder / ".nbh-probe").touch()
    except OSError:
        return True
    (folder / ".nbh-probe").unlink()
    return False


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A folder this process cannot write in: a tmp folder made read-only, or (root writes anyway) /sys when it
    refuses new files; skips when there is none."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)
        return
    if Path("/sys").is_dir() and _cannot_write_in(Path("/sys")):
        yield Path("/sys")
        return
    pytest.skip("running as root with no read-only folder to try")


@pytest.mark.notorch
def test_check_writable_names_the_folder_and_why(read_only, tmp_path):
    from nbhelpers.media import check_writable, write_problem

    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/ \((read-only or not yours|Permission "
                                         r"denied)\)"):
        check_writable(read_only)
    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/sub/deeper/ \(\S"):  # cannot be made
        check_writable(read_only / "sub" / "deeper")
    (tmp_path / "file").write_text("x")
    assert "is a file, not a folder" in write_problem(tmp_path / "file" / "sub")
    # a folder that can be made passes, and the check leaves no folder behind
    assert write_problem(tmp_path / "new" / "sub") == "" and not (tmp_path / "new").exists()
    assert check_writable(tmp_path) == tmp_path and os.listdir(tmp_path) == ["file"]


@pytest.mark.notorch
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="no /proc here")
@pytest.mark.parametrize("folder, shown", [("/proc", "/proc/"), ("/proc/nbh-x", "/proc/nbh-x/")])
def test_a_folder_of_proc_is_not_writable_rather_than_missing(folder, shown, tmp_path):
    """/proc is there, yet a file or folder made in it is "not found": the reason is that it cannot be written."""
    from nbhelpers.checks import output_path_for

    video, audio = tmp_path / "face.mp4", tmp_path / "speech.wav"
    video.write_bytes(b"v")
    audio.write_bytes(b"a")
    with pytest.raises(InputError) as caught:
        output_path_for(Path(folder) / "out.mp4", video, audio)
    text = str(caught.value)
    assert text.startswith(f"cannot write in {shown} (") and "No such file" not in text
    assert re.search(r"not writable|read-only|not yours|[Pp]ermission", text), text


@pytest.mark.notorch
def test_the_offline_jobs_output_is_checked_with_the_inputs(read_only, tmp_path):
    from nbhelpers.checks import output_path_for

    video, audio = tmp_path / "face.mp4", tmp_path / "speech.wav"
    video.write_bytes(b"v")
    audio.write_bytes(b"a")
    for out in (read_only / "out.mp4", read_only / "new" / "out.mp4"):
        with pytest.raises(InputError, match=rf"^cannot write in {out.parent}/ \("):
            output_path_for(out, video, audio)


@pytest.mark.notorch
def test_the_writers_refuse_an_unwritable_folder_before_ffmpeg_starts(read_only):
    from nbhelpers.media import VideoWriter
    from nbhelpers.media.stream import FFmpegSink

    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/new/ \("):
        VideoWriter(read_only / "new" / "out.mp4", 64, 64)
    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/new/ \("):
        FFmpegSink(read_only / "new" / "live.mp4", 64, 64)


@pytest.mark.slow
def test_every_job_refuses_an_unwritable_output_before_loading_a_model(read_only, tmp_path, make_media,
                                                                      tiny_weights):
    import nbhelpers as nbh
    from nbhelpers.live import LiveConfig, LiveSession

    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    speech = make_media("sine-0.4s.wav", "-f", "lavfi", "-i", "sine=frequency=300:duration=0.4")
    box = (16, 16, 80, 80)
    config = nbh.InferenceConfig(device="cpu", batch_size=4)
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, config)
    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/ \("):
        pipe.lipsync(video, speech, read_only / "out.mp4", boxes=box)
    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/sub/ \("):
        nbh.lipsync(video, speech, read_only / "sub" / "out.mp4", boxes=box, config=config,
                    weights_dir=tiny_weights)
    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/avatar/ \("):
        nbh.prepare_avatar(video, read_only / "avatar", pipe, config=config, boxes=box)
    assert pipe.loaded == []  # nothing heavy ran

    avatar = nbh.prepare_avatar(video, tmp_path / "avatar", pipe, config=config, boxes=box)
    pipe.release()
    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/clips/ \("):
        avatar.generate(speech, read_only / "clips" / "a.mp4")
    with pytest.raises(InputError, match=rf"^cannot write in {read_only}/ \("):
        LiveSession(avatar, LiveConfig(to=str(read_only / "live.mp4"), warm_up=False))
    assert not [p for p in tmp_path.rglob(".nbhelpers-write-check-*")]


def test_a_stopped_lipsync_removes_the_empty_folders_it_made(tmp_path, make_media, tiny_weights, monkeypatch):
    """The job fails once its encoder has made the output's folders: those it made go, a folder given stays."""
    import nbhelpers as nbh

    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    speech = make_media("sine-0.4s.wav", "-f", "lavfi", "-i", "sine=frequency=300:duration=0.4")
    made = []

    def stopped(*args, **kwargs):
        made.append(sorted(p.name for p in tmp_path.rglob("*") if p.is_dir()))
        raise KeyboardInterrupt("on purpose")

    monkeypatch.setattr("nbhelpers.pipeline.run", stopped)
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu", batch_size=4))
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "new" / "sub" / "out.mp4", tmp_path / "kept" / "out.mp4"):
        with pytest.raises(KeyboardInterrupt, match="on purpose"):
            pipe.lipsync(video, speech, out, boxes=(16, 16, 80, 80))
    assert made[0] == ["kept", "new", "sub"]  # the folders were there while the job ran
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and not any((tmp_path / "kept").iterdir())
