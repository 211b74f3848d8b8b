"""Small defects of issue 37 #7, each with its test."""

from __future__ import annotations

import pytest


@pytest.mark.notorch
@pytest.mark.parametrize(("name", "args", "frames"), [
    ("one-frame-25fps.mp4", ["-f", "lavfi", "-i", "testsrc=size=64x64:rate=25", "-frames:v", "1"], 1),
    ("eight-frames-25fps.mp4", ["-f", "lavfi", "-i", "testsrc=size=64x64:rate=25", "-frames:v", "8"], 8),
])
def test_the_plans_source_frames_are_the_frames_the_job_reads(make_media, name, args, frames):
    """A 1-frame video was planned as "2 source frames" and its result said 1."""
    from nbhelpers import media
    from nbhelpers.framestore import expected_frames

    video = make_media(name, *args, "-pix_fmt", "yuv420p")
    with media.load_video(video) as reader:
        assert reader.frame_count == frames
    assert expected_frames(media.probe(video), 100) == frames


@pytest.mark.notorch
def test_a_video_of_another_rate_keeps_an_upper_estimate(make_media):
    from nbhelpers import media
    from nbhelpers.framestore import expected_frames

    video = make_media("ten-frames-30fps.mp4", "-f", "lavfi", "-i", "testsrc=size=64x64:rate=30", "-frames:v", "10",
                       "-pix_fmt", "yuv420p")
    with media.load_video(video) as reader:
        assert expected_frames(media.probe(video), 100) >= reader.frame_count


@pytest.mark.notorch
def test_a_drive_error_is_reported_whole_not_cut_mid_text():
    """gdown's error starts with a line "Failed to retrieve file url:" and says why on the next lines; the download
    row kept the first line, cut at 200 characters."""
    from nbhelpers.weights.downloads import _short

    class FileURLRetrievalError(Exception):
        pass

    why = ("Cannot retrieve the public link of the file. You may need to change the permission to 'Anyone with the "
           "link', or have had many accesses. Check FAQ in https://github.com/wkentaro/gdown?tab=readme-ov-file#faq.")
    exc = FileURLRetrievalError(f"Failed to retrieve file url:\n\n\t{why}\n\nYou may still be able to access the "
                                "file from the browser:\n\n\thttps://drive.google.com/uc?id=abc\n\nbut Gdown can't. "
                                "Please check connections and permissions.")
    text = _short(exc)
    assert text.startswith(f"FileURLRetrievalError: Failed to retrieve file url: {why} You may still")
    assert text.endswith("Please check connections and permissions.") and "\n" not in text
    long = _short(RuntimeError("A first sentence. " * 60))
    assert long.endswith("sentence. [...]") and len(long) < 640


@pytest.mark.notorch
def test_verifys_header_says_what_it_did_not_check(tmp_path):
    """Without deep mode the header read "checked sizes and contents (deep=True / --deep also hashes)": checked ...
    deep=True, the opposite of what ran."""
    from nbhelpers.weights import verify

    header = str(verify(tmp_path)).splitlines()[0]
    assert header.endswith("; checked sizes and contents; sha256 not computed (--deep, or deep=True in Python, "
                           "computes it)"), header
    assert str(verify(tmp_path, deep=True)).splitlines()[0].endswith("; checked sizes, contents and sha256")


def _streams(ffmpeg: str, path) -> tuple[str, str]:
    import subprocess

    text = subprocess.run([ffmpeg, "-hide_banner", "-i", str(path)], capture_output=True, text=True).stderr
    video = next(line for line in text.splitlines() if "Video:" in line)
    audio = next(line for line in text.splitlines() if "Audio:" in line)
    return video, audio


@pytest.mark.notorch
def test_the_live_file_carries_what_the_other_outputs_carry(tmp_path, ffmpeg):
    """The live file was 16 kHz audio, Constrained Baseline, without the BT.709 tags of the offline outputs."""
    import numpy as np

    from nbhelpers.media import VideoWriter
    from nbhelpers.media.stream import FFmpegSink

    frame = np.random.default_rng(0).integers(0, 255, (64, 80, 3), dtype=np.uint8)
    sink = FFmpegSink(tmp_path / "live.mp4", 80, 64)
    for _ in range(10):
        sink.write(frame, np.zeros(640, np.float32))
    live = _streams(ffmpeg, sink.close())
    speech = tmp_path / "speech.wav"
    import subprocess

    subprocess.run([ffmpeg, "-v", "error", "-f", "lavfi", "-i", "sine=frequency=300:duration=0.4:sample_rate=48000",
                    str(speech)], check=True)
    with VideoWriter(tmp_path / "offline.mp4", 80, 64, audio=speech) as writer:
        writer.write(np.stack([frame] * 10))
    offline = _streams(ffmpeg, writer.path)
    for line in (live[0], offline[0]):
        assert "h264 (High)" in line and "yuv420p(tv, bt709" in line, line
    for line in (live[1], offline[1]):
        assert "aac (LC)" in line and "48000 Hz" in line, line


@pytest.mark.notorch
def test_a_scripts_warnings_do_not_say_run_the_notebook_again():
    """The CPU warning and the GPU errors of a script (no notebook kernel) said "run the notebook again"."""
    import subprocess
    import sys

    script = ("import warnings, nbhelpers\n"
              "from nbhelpers.gpu.planner import _cpu_time_note\n"
              "from nbhelpers.gpu.device import _no_cuda_message\n"
              "print(_cpu_time_note('lipsync', 25, 25, 'full', 'dlib', (256, 256), '256x256 frames'))\n"
              "print(_no_cuda_message('cuda'))\n"
              "import sys, types; sys.modules['ipykernel'] = types.ModuleType('ipykernel')\n"
              "print(_no_cuda_message('cuda'))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    plan, script_error, kernel_error = out.splitlines()
    for line in (plan, script_error):
        assert "T4 GPU > Save, then run it again" in line and "notebook" not in line, line
    assert "T4 GPU > Save, then run the notebook again from the top" in kernel_error


def test_a_batch_without_ray_leaves_no_empty_folder(tmp_path, make_media, tiny_weights, monkeypatch):
    """The writability check made avatar-cache/ (and the outputs' folder) before Ray was found missing."""
    import sys

    from nbhelpers import batch
    from nbhelpers.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, whether it is installed or not
    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    speech = make_media("sine-0.4s.wav", "-f", "lavfi", "-i", "sine=frequency=300:duration=0.4")
    outputs = tmp_path / "batch" / "out"
    jobs = [{"video": str(video), "audio": str(speech), "output": str(outputs / "a.mp4")}]
    with pytest.raises(MissingDependencyError, match="batch runs need Ray"):
        batch.run(jobs, weights_dir=tiny_weights)
    assert not (tmp_path / "batch").exists()
