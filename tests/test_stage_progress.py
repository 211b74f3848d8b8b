"""Long stages show their own progress and say how long they will take (issue 37 #4)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

from nbhelpers.faces.base import FaceResult


class StillFace:
    name = "still"

    def detect(self, frames):
        lm = np.tile(np.array([48.0, 55.0], np.float32), (68, 1))
        lm[0], lm[16], lm[8] = (25, 45), (71, 45), (48, 85)
        return [FaceResult(face_box=np.array([20.0, 20, 76, 88]), landmarks=lm.copy()) for _ in frames]

    def close(self):
        pass


@pytest.fixture
def shown_bars():
    """What the progress bars print, with bars on for the test."""
    from nbhelpers import progress

    saved, notes = dict(progress._settings), dict(progress._notes)
    out = io.StringIO()
    progress.configure(disable=False, file=out, mininterval=0, ascii=True)
    yield out
    progress._settings.clear()
    progress._settings.update(saved)
    progress._notes.update(notes)


@pytest.mark.notorch
def test_notes_still_print_where_only_the_bars_are_hidden(capsys):
    from nbhelpers import progress

    saved, notes = dict(progress._settings), dict(progress._notes)
    try:
        progress.configure(disable=True, notes=True)  # the CLI writing to a log
        progress.note("compiling the UNet in the background")
        progress.configure(disable=True)  # NBHELPERS_PROGRESS=0: notes follow the bars
        progress.note("not shown")
    finally:
        progress._settings.clear()
        progress._settings.update(saved)
        progress._notes.update(notes)
    out = capsys.readouterr().out
    assert "nbhelpers: compiling the UNet in the background" in out and "not shown" not in out


@pytest.mark.notorch
def test_bars_in_a_log_print_plain_lines_and_in_a_terminal_redraw():
    """Where the file is not a terminal (a log, a pipe) each redraw of a bar is one plain line, without carriage
    returns or the cursor-up codes of stacked bars, at most every LOG_INTERVAL_S: a quick stage prints its start and
    its end. In a terminal the bars redraw in place."""
    from nbhelpers import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    log, terminal = io.StringIO(), Terminal()
    for out in (log, terminal):
        with progress.bar(40, "faces", file=out, disable=False) as faces, \
                progress.bar(40, "latents", file=out, disable=False) as latents:
            for _ in range(40):
                faces.update(1)
                latents.update(1)
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text, repr(text)
    lines = text.splitlines()
    assert [line.split("|")[0] for line in lines] == ["faces:   0%", "latents:   0%", "latents: 100%", "faces: 100%"]
    assert "| 40/40 [" in lines[-1] and "frame/s]" in lines[-1], lines
    assert "\r" in terminal.getvalue() and "\x1b[A" in terminal.getvalue()


@pytest.mark.notorch
def test_a_bar_in_a_log_prints_its_full_line_once_as_it_closes():
    """tqdm redraws a bar as its count reaches the total, on a refresh, and as it closes: in a log only the
    closing redraw of the full bar is a line, with the count the bar closes at."""
    from nbhelpers import progress

    log = io.StringIO()
    with progress.bar(3, "faces", file=log, disable=False, mininterval=0, ascii=True) as pbar:
        pbar.update(3)
        pbar.refresh()  # as tqdm's monitor thread does to a bar with nothing new for maxinterval
        pbar.total = pbar.n = 2  # the estimate corrected as the stage ends (StreamedJob._end_bar)
    lines = log.getvalue().splitlines()
    assert [line.split("|")[0] for line in lines] == ["faces:   0%", "faces: 100%"], lines
    assert "| 2/2 [" in lines[-1], lines


def test_transformers_loading_bar_is_hidden_where_ours_print_plain_lines(monkeypatch):
    """transformers' own "Loading weights" bar redraws with carriage returns: hidden while a model loads when stderr
    is a log or a pipe (or ours are off), shown again after; kept in a terminal."""
    transformers = pytest.importorskip("transformers")
    from nbhelpers import models, progress

    logging = transformers.utils.logging
    monkeypatch.setitem(progress._settings, "disable", False)
    for tty, shown in ((False, False), (True, True)):
        stderr = io.StringIO()
        stderr.isatty = lambda tty=tty: tty
        monkeypatch.setattr("sys.stderr", stderr)
        assert progress.in_log() is not tty and logging.is_progress_bar_enabled()
        with models._library_bars_follow_ours(transformers):
            assert logging.is_progress_bar_enabled() is shown
        assert logging.is_progress_bar_enabled()


@pytest.mark.notorch
def test_the_faces_bar_ends_full_when_the_duration_promised_one_frame_more(make_media, shown_bars):
    """The score's face bar ended at "99% 187/188": the count from the duration (the sound runs a little longer than
    the pictures) was one frame over."""
    from nbhelpers import media
    from nbhelpers.faces import track

    video = make_media("10f-with-0.45s-sound.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25:duration=0.4",
                       "-f", "lavfi", "-i", "sine=frequency=300:duration=0.45", "-pix_fmt", "yuv420p", "-c:a", "aac")
    assert round(media.probe(video).duration_s * 25) == 11  # the hint the bar starts from
    result = track(video, backend=StillFace())
    assert result.n_frames == 10
    last = shown_bars.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert "10/10" in last and "100%" in last, last


@pytest.mark.notorch
def test_the_score_says_how_long_cpu_face_tracking_takes_before_it_starts(make_media, monkeypatch):
    from nbhelpers.gpu import PlanWarning
    from nbhelpers.quality.lag import announce_cpu_tracking

    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    with pytest.warns(PlanWarning, match=r"^Finding the face in 8 frames with the dwpose landmark backend on the "
                                         r"CPU takes about \d+ s; the dlib backend takes seconds"):
        monkeypatch.setattr("nbhelpers.quality.lag.LONG_TRACKING_S", 0.0)
        assert announce_cpu_tracking(video, "dwpose", "cpu") > 0
    monkeypatch.setattr("nbhelpers.quality.lag.LONG_TRACKING_S", 1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert announce_cpu_tracking(video, "dwpose", "cpu") > 0  # short: no warning
        assert announce_cpu_tracking(video, "dwpose", "cuda") is None
        assert announce_cpu_tracking(np.zeros((8, 96, 96, 3), np.uint8), "dwpose", "cpu") is None


@pytest.mark.slow
def test_each_stage_of_a_lipsync_has_its_own_bar_that_ends_full(make_media, tiny_weights, tmp_path, shown_bars,
                                                                monkeypatch):
    """The lipsync bar sat at "0/187" through finding faces, latents and parsing: each stage now counts its own
    frames, and each bar ends at the frames the stage really had (8 source frames, 10 output frames), closed when
    its stage ends with the stage's own time."""
    import nbhelpers as nbh
    from nbhelpers.offline import StreamedJob

    end_bar = StreamedJob._end_bar

    def after_an_hour(self, name, count):  # the stage's timing says an hour: its bar shows an hour
        self.timings.seconds[name] = 3600.0
        end_bar(self, name, count)

    monkeypatch.setattr(StreamedJob, "_end_bar", after_an_hour)

    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    speech = make_media("sine-0.4s.wav", "-f", "lavfi", "-i", "sine=frequency=300:duration=0.4")
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu", batch_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.lipsync(video, speech, tmp_path / "out.mp4", backend=StillFace())
    lines = shown_bars.getvalue().replace("\r", "\n").splitlines()
    last = {}
    for stage, frames in (("faces", 8), ("latents", 8), ("parsing", 8), ("generate", 10)):
        shown = [line for line in lines if line.lstrip().startswith(f"{stage}:")]
        assert shown, f"no {stage} bar in {lines}"
        assert f"{frames}/{frames}" in shown[-1] and "100%" in shown[-1], shown[-1]
        last[stage] = max(i for i, line in enumerate(lines) if line.lstrip().startswith(f"{stage}:"))
    # each stage's bar is closed when the stage ends (its own time), not redrawn when the whole job ends
    assert max(last["faces"], last["latents"], last["parsing"]) < last["generate"], lines
    assert all("[1:00:00<" in lines[last[stage]] for stage in ("faces", "latents", "parsing")), lines
    assert not [line for line in lines if "face parsing:" in line or "lipsync:" in line]  # no second bar per stage


@pytest.mark.slow
def test_a_lipsync_in_a_log_prints_one_full_line_per_stage_in_the_order_they_end(make_media, tiny_weights, tmp_path,
                                                                                  shown_bars, monkeypatch):
    """With every redraw a line of the log (no minimum interval) and the clip in two pieces, each stage prints its
    full line once, as it ends: faces, latents and parsing after the last piece, then generate; no line of a stage
    follows its full one."""
    import nbhelpers as nbh

    monkeypatch.setattr("nbhelpers.offline.STREAM_PIECE", 4)
    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    speech = make_media("sine-0.4s.wav", "-f", "lavfi", "-i", "sine=frequency=300:duration=0.4")
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu", batch_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.lipsync(video, speech, tmp_path / "out.mp4", backend=StillFace())
    text = shown_bars.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "faces:  50%|#####     | 4/8 [" in text, lines  # plain lines, one per piece
    full = [(line.split(":")[0], line.split("| ")[1].split()[0]) for line in lines if "100%|" in line]
    assert full == [("faces", "8/8"), ("latents", "8/8"), ("parsing", "8/8"), ("generate", "10/10")], lines
    last = {line.split(":")[0]: line for line in lines}
    assert all("100%|" in last[stage] for stage in ("faces", "latents", "parsing", "generate")), lines


def test_the_generate_bar_counts_its_time_from_the_first_piece(shown_bars, monkeypatch):
    """An hour of faces, latents and parsing before the first piece is not generation: the bar's clock (a fake one)
    starts with the first piece, so 5 frames over 4 s read 00:04, not 1:00:04."""
    import tqdm.std

    from nbhelpers import engine

    clock = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])
    frames = np.zeros((5, 8, 8, 3), np.uint8)

    def pieces():
        clock[0] += 3600.0
        yield engine.Piece(0, 2, frames=frames[:2])
        clock[0] += 4.0
        yield engine.Piece(2, 3, frames=frames[2:])

    assert engine.run(pieces(), None, None, 1, 5, None) == 5
    last = [line for line in shown_bars.getvalue().replace("\r", "\n").splitlines() if "generate:" in line][-1]
    assert "5/5 [00:04<00:00" in last, last


@pytest.mark.slow
def test_avatar_prepare_prints_its_estimate_then_counts_faces_to_the_frame_count(make_media, tiny_weights, tmp_path,
                                                                                shown_bars, monkeypatch):
    """The faces bar of avatar prepare had no total, and nothing said how long the preparation would take."""
    import nbhelpers as nbh

    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu", batch_size=4))
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: shown_bars.write(f"WARNING {message}\n"))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        nbh.prepare_avatar(video, tmp_path / "avatar", pipe, backend=StillFace())
    lines = shown_bars.getvalue().replace("\r", "\n").splitlines()
    estimate = next(i for i, line in enumerate(lines) if line.startswith("WARNING Running on the CPU"))
    assert "8 frames take about" in lines[estimate] and "faces" in lines[estimate], lines[estimate]
    shown = [(i, line) for i, line in enumerate(lines) if line.lstrip().startswith("faces:")]
    assert shown and estimate < shown[0][0], lines
    assert all("/8 " in line for _, line in shown) and "8/8" in shown[-1][1] and "100%" in shown[-1][1], shown
