"""Silent speech gets a warning up front, and the job goes on (issue 37 #6)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from nbhelpers.errors import SilentAudioWarning


@pytest.mark.notorch
def test_silence_is_told_from_quiet_speech():
    from nbhelpers.checks import warn_if_silent

    with pytest.warns(SilentAudioWarning, match=r"^audio is silent: digital silence \(every sample is 0\)\. The job "
                                                r"goes on"):
        assert warn_if_silent(np.zeros(16000, np.float32))
    with pytest.warns(SilentAudioWarning, match=r"its loudest sample is -80 dBFS"):
        warn_if_silent(np.full(1600, 1e-4, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet_speech = (np.sin(np.arange(16000) / 5.0) * 0.01).astype(np.float32)  # -40 dBFS peak
        assert not warn_if_silent(quiet_speech)


@pytest.mark.slow
def test_a_job_on_silence_warns_before_the_work_and_finishes(make_media, tiny_weights, tmp_path):
    import nbhelpers as nbh

    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    silence = make_media("silence-0.4s.wav", "-f", "lavfi", "-i", "anullsrc=r=16000:cl=mono", "-t", "0.4")
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu", batch_size=4))
    seen, warned_at_first_frame = [], []
    with warnings.catch_warnings(record=True) as caught:

        def on_frame(t, frame):
            if not seen:
                warned_at_first_frame.append(any(issubclass(w.category, SilentAudioWarning) for w in caught))
            seen.append(t)

        warnings.simplefilter("always")
        result = pipe.lipsync(video, silence, tmp_path / "out.mp4", boxes=(16, 16, 80, 80), frame_callback=on_frame)
        silent = [w for w in caught if issubclass(w.category, SilentAudioWarning)]
    assert len(silent) == 1 and "silence-0.4s.wav' is silent" in str(silent[0].message)
    assert warned_at_first_frame == [True]  # said before the work, not after
    assert result.n_frames == 10 and result.output.is_file() and seen == list(range(10))


def test_a_batch_warns_of_a_silent_audio_at_its_checks(make_media, lavfi_tone, tmp_path):
    """A batch job on silence finished with no warning anywhere: the worker's warning reached no console. The
    batch's checks (one probe per distinct file) now warn, once per file; a speech file passes quietly."""
    from nbhelpers.batch.inputs import probe_inputs
    from nbhelpers.batch.jobs import check_jobs

    video = make_media("testsrc-64-4f.mp4", "-f", "lavfi", "-i", "testsrc=size=64x64:rate=25", "-frames:v", "4",
                       "-pix_fmt", "yuv420p")
    silence = make_media("silence-0.4s.wav", "-f", "lavfi", "-i", "anullsrc=r=16000:cl=mono", "-t", "0.4")
    tone = lavfi_tone(0.4)
    jobs = check_jobs([{"video": str(video), "audio": str(a), "output": str(tmp_path / f"o{k}.mp4")}
                       for k, a in enumerate((silence, tone, silence))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probed = probe_inputs(jobs, lambda path: None)
    silent = [str(w.message) for w in caught if issubclass(w.category, SilentAudioWarning)]
    assert silent == [f"audio {str(silence)!r} is silent: digital silence (every sample is 0). The job goes on, but "
                      "the mouth will barely move; check that it is the right file and track (a muted recording, or "
                      "the wrong channel)."]
    assert all(error == "" for _, error in probed.audios.values())
