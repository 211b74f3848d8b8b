"""No wait without a bound (issue 14, item 10): a stalled ffmpeg (an output folder on a network mount that stopped
answering) or a hung pip stops with the package's error instead of hanging the notebook cell.

The stalled ffmpeg is a stand-in program given to ``VideoWriter(ffmpeg=...)``: one that never reads its input, one
that reads it all and then never exits, and one that is slow but keeps reading. Each writer call runs in a thread
that the test joins with a bound, so a regression fails the test instead of hanging the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import fake_program

from nbhelpers import env, media
from nbhelpers.errors import FFmpegError, NbHelpersError

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the stand-in ffmpeg is a script with a #! line")

STALL_S = 0.5  # the writers' stall timeout in these tests
BOUND_S = 30.0  # a call that takes longer than this has hung


def _fake_ffmpeg(tmp_path: Path, name: str, body: str) -> str:
    """An executable that takes ffmpeg's arguments (the output file is the last one) and runs ``body``."""
    return fake_program(tmp_path / name, f"#!{sys.executable}\nimport sys, time\nout = sys.argv[-1]\n{body}\n")


def _bounded(fn):
    """Run ``fn()`` in a thread; return (result, exception); fail the test if it does not return in BOUND_S."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"the call hung for more than {BOUND_S} s"
    return box.get("result"), box.get("error")


FRAMES = np.zeros((4, 240, 320, 3), np.uint8)  # 900 KiB: far more than a pipe buffer holds


def test_a_writer_whose_ffmpeg_takes_no_data_stops_with_a_stall_error(tmp_path):
    exe = _fake_ffmpeg(tmp_path, "ffmpeg-asleep", "time.sleep(3600)")
    writer = media.VideoWriter(tmp_path / "out.mp4", 320, 240, ffmpeg=exe, stall_timeout_s=STALL_S)
    _, error = _bounded(lambda: writer.write(FRAMES))
    assert isinstance(error, FFmpegError) and getattr(error, "stalled", False), repr(error)
    assert "took no frame data for 0.5 s" in str(error) and "network mount" in str(error)
    assert writer._proc.popen.poll() is not None, "the stalled ffmpeg was left running"
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".out.partial-*"))


def test_a_writer_whose_ffmpeg_never_finishes_the_file_stops_with_a_stall_error(tmp_path):
    exe = _fake_ffmpeg(tmp_path, "ffmpeg-hangs-at-end", "sys.stdin.buffer.read()\nopen(out, 'wb').write(b'x')\n"
                                                        "time.sleep(3600)")
    writer = media.VideoWriter(tmp_path / "out.mp4", 320, 240, ffmpeg=exe, stall_timeout_s=STALL_S)
    writer.write(FRAMES)
    _, error = _bounded(writer.close)
    assert isinstance(error, FFmpegError) and getattr(error, "stalled", False), repr(error)
    assert "no progress for 0.5 s while finishing the file" in str(error) and "4 frames written" in str(error)
    assert writer._proc.popen.poll() is not None
    assert not (tmp_path / "out.mp4").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_a_slow_ffmpeg_that_keeps_reading_is_not_stopped(tmp_path):
    # Reads 64 KiB, then pauses 0.05 s, until the end: 900 KiB take 15 reads and so at least 15 pauses, 0.75 s, longer
    # than the stall timeout, with progress throughout. It writes how many reads and bytes it took.
    pause_s = 0.05
    exe = _fake_ffmpeg(tmp_path, "ffmpeg-slow", "reads = size = 0\n"
                                                "while chunk := sys.stdin.buffer.read(65536):\n"
                                                "    reads, size = reads + 1, size + len(chunk)\n"
                                                f"    time.sleep({pause_s})\n"
                                                "open(out, 'w').write(f'{reads} {size}')")
    writer = media.VideoWriter(tmp_path / "out.mp4", 320, 240, ffmpeg=exe, stall_timeout_s=STALL_S)
    _, error = _bounded(lambda: writer.write(FRAMES))
    assert error is None, repr(error)
    path, error = _bounded(writer.close)
    assert error is None and path == tmp_path / "out.mp4"
    reads, size = map(int, path.read_text().split())
    assert size == FRAMES.nbytes  # every frame reached the program: nothing was cut short
    assert reads * pause_s > STALL_S  # its pauses add up to more than the stall bound: there is no total limit


def test_stall_timeout_is_validated(tmp_path):
    from nbhelpers.errors import InputError

    for bad in (0, -1, True):
        with pytest.raises(InputError, match="stall_timeout_s"):
            media.VideoWriter(tmp_path / "v.mp4", 64, 48, stall_timeout_s=bad)


def test_the_background_writer_gives_up_on_a_stuck_writer(tmp_path):
    from nbhelpers.engine import BackgroundWriter

    release = threading.Event()

    class StuckWriter:
        stall_timeout_s = 0.2
        frames_written = 0
        aborted = False

        def write(self, frames):
            release.wait(60)  # a write that never returns until abort()

        def abort(self):
            self.aborted = True
            release.set()

    writer = StuckWriter()

    def job():
        with BackgroundWriter(writer, timeout_s=1.0) as sink:
            for k in range(10):
                sink.put(k, FRAMES[:1])

    _, error = _bounded(job)
    assert isinstance(error, FFmpegError) and "did not" in str(error) and "within 1 s" in str(error), repr(error)
    assert writer.aborted


def test_pip_runs_with_a_timeout_and_a_hung_pip_is_a_clear_error(monkeypatch):
    calls = []

    def fake_run(command, **kwargs):
        calls.append(kwargs)
        assert kwargs.get("timeout") is not None and 0 < kwargs["timeout"] < float("inf"), "pip runs with no timeout"
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output=b"Collecting nbh-never\n",
                                        stderr=b"Retrying (Retry(total=4)) after connection broken\n")

    monkeypatch.setattr("nbhelpers.env.install.subprocess.run", fake_run)
    with pytest.raises(NbHelpersError) as caught:
        env.install_missing(["nbh-never-installed-xyz>=1.0"])
    message = str(caught.value)
    assert len(calls) == 1
    assert "pip did not finish installing nbh-never-installed-xyz>=1.0 within 30 minutes" in message
    assert "Retrying" in message and "Collecting nbh-never" in message
