"""Live sessions: chunked audio gives the frames of one-clip generation where the context is complete, silence
keeps 25 fps, and a UDP stream carries every frame with its audio. CPU, tiny random weights, a synthetic avatar."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

BOX = (16, 16, 80, 80)


@pytest.fixture(scope="module")
def avatar(tmp_path_factory, lavfi_video, tiny_weights):
    from nbhelpers import InferenceConfig, prepare_avatar

    video = lavfi_video("testsrc", "96x96", frames=8)
    folder = tmp_path_factory.mktemp("live") / "avatar"
    av = prepare_avatar(video, folder, config=InferenceConfig(device="cpu", batch_size=4), boxes=BOX,
                        weights_dir=tiny_weights)
    yield av
    av.close()


def session_of(avatar, *, on_frame=None, clock=None, **fields):
    """A live session of ``avatar`` with the LiveConfig ``fields``."""
    from nbhelpers.live import LiveConfig, LiveSession

    return LiveSession(avatar, LiveConfig(**fields), on_frame=on_frame, **({} if clock is None else {"clock": clock}))


def noise(seconds: float, seed: int = 0, level: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(round(seconds * 16000))) * level).astype(np.float32)


def push_random_chunks(session, audio: np.ndarray, seed: int) -> list[int]:
    """Push in chunks of 1 ms to 2 s (log-uniform, so both ends occur); returns the sizes."""
    rng = np.random.default_rng(seed)
    sizes, pos = [], 0
    while pos < len(audio):
        size = int(np.exp(rng.uniform(np.log(16), np.log(32000))))
        session.push(audio[pos:pos + size], 16000)
        sizes.append(size)
        pos += size
    return sizes


class StubRender:
    """Stands in for engine.render where only features and timing matter: records the tokens of every frame and
    returns the source frame (the real render is exercised in test_frames_equal_one_clip_generation)."""

    def __init__(self):
        self.tokens: dict[int, np.ndarray] = {}

    def __call__(self, source, features, models, batch_size, n_out, *, timings=None, first_frame=0,
                 feature_offset=0, **_):
        from nbhelpers.framestore import cycle_index

        frames = []
        for t in range(first_frame, first_frame + n_out):
            self.tokens[t] = features[t - feature_offset].float().cpu().numpy().copy()
            frames.append(np.array(source.frames[int(cycle_index(t, source.n_frames))]))
        yield first_frame, np.stack(frames)


def collect(frames: dict):
    return lambda n, f: frames.__setitem__(n, np.array(f))


def test_frames_equal_one_clip_generation(avatar):
    """Real render, 8 frames, hop = the batch size (4): frames whose group was made with the whole audio equal
    generate(audio) bit for bit, the first group equals generate(audio prefix), whatever the chunking;
    context='segment' equals generate(audio) everywhere."""
    assert avatar.config.batch_size == 4
    audio = noise(0.32, seed=1)  # 5120 samples, 8 frames
    ref: dict[int, np.ndarray] = {}
    avatar.generate(audio, output=False, frame_callback=collect(ref))
    assert len(ref) == 8
    live: dict[int, np.ndarray] = {}
    session = session_of(avatar, threaded=False, hop=4, silence=None, on_frame=collect(live))
    push_random_chunks(session, audio, seed=2)
    result = session.close()
    assert sorted(live) == list(range(8)) and result.n_frames == 8 and result.kind == "stream"
    # Group 0 (frames 0-3) is final at 640 * 4 + 1280 = 3840 samples; group 1 needs 6400 > 5120: made at close.
    for n in range(4, 8):
        np.testing.assert_array_equal(live[n], ref[n], err_msg=f"frame {n}")
    prefix: dict[int, np.ndarray] = {}
    avatar.generate(audio[:3840], output=False, frame_callback=collect(prefix))
    for n in range(4):
        np.testing.assert_array_equal(live[n], prefix[n], err_msg=f"frame {n} vs the 3840-sample prefix")
    exact: dict[int, np.ndarray] = {}
    session = session_of(avatar, threaded=False, hop=4, silence=None, context="segment", on_frame=collect(exact))
    push_random_chunks(session, audio, seed=3)
    session.close()
    for n in range(8):
        np.testing.assert_array_equal(exact[n], ref[n], err_msg=f"segment context, frame {n}")


def test_tokens_follow_the_prefix_law_for_any_chunking(avatar, monkeypatch):
    """5 s in chunks of 1 ms to 2 s: every frame's tokens are those of one-clip whisper features of the prefix its
    group was made from (bit for bit), the same for two chunkings, and the last groups equal the whole clip's."""
    stub = StubRender()
    monkeypatch.setattr("nbhelpers.engine.render", stub)
    audio = noise(5.0, seed=4)
    hop = 25
    runs = []
    for seed in (5, 6):
        stub.tokens = {}
        session = session_of(avatar, threaded=False, hop=hop, silence=None, on_frame=lambda n, f: None)
        sizes = push_random_chunks(session, audio, seed=seed)
        assert min(sizes) < 32 and max(sizes) > 8000
        res = session.close()
        assert res.n_frames == 125 and res.stats["whisper_passes"] == 5
        runs.append(dict(stub.tokens))
    assert sorted(runs[0]) == list(range(125))
    for n in range(125):
        np.testing.assert_array_equal(runs[0][n], runs[1][n], err_msg=f"frame {n} depends on the chunking")
    pipe = avatar.pipe
    whole = pipe.features(audio).float().numpy()
    for g in range(5):
        e = min(640 * (g * hop + hop) + 1280, len(audio))
        ref = pipe.features(audio[:e]).float().numpy() if e < len(audio) else whole
        for n in range(g * hop, g * hop + hop):
            np.testing.assert_array_equal(runs[0][n], ref[n], err_msg=f"frame {n}, prefix {e}")
    assert not np.array_equal(runs[0][0], whole[0])  # the encoder attends over the whole segment: early frames move


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_silence_gap_keeps_25_fps_and_the_source_cycle(avatar, monkeypatch):
    """Real-time mode on a fake clock: 0.4 s of speech, 1.2 s with no audio at all, 0.4 s of speech, then digital
    silence pushed: a frame every 40 ms throughout, none late, idle frames show the source frame of the cycle."""
    from nbhelpers.framestore import cycle_index

    monkeypatch.setattr("nbhelpers.engine.render", StubRender())
    clock = FakeClock()
    got: dict[int, np.ndarray] = {}
    session = session_of(avatar, realtime=True, threaded=False, clock=clock, hop=5, silence="source",
                          on_frame=collect(got))
    speech = noise(0.4, seed=7)
    ticks = 0

    def run_for(seconds):
        nonlocal ticks
        for _ in range(int(round(seconds * 1000 / 10))):  # poll every 10 ms of fake time
            clock.t += 0.01
            session.poll()
            ticks += 1

    session.push(speech[:3200])
    run_for(0.2)
    session.push(speech[3200:])
    run_for(1.6)  # the feed runs dry for 1.2 s of this
    session.push(speech)
    session.push(np.zeros(6400, np.float32))
    run_for(0.6)
    res = session.close()
    st = session.stats
    n = len(st.emit_t)
    assert n == res.n_frames and sorted(got) == list(range(n))
    assert n >= 50  # 2.4 s of fake time at 25 fps, less the 0.24 s delay
    gaps = np.diff(np.asarray(st.emit_t[:-1]))
    emitted_before_close = [t for t in st.emit_t if t <= clock.t - 1e-9]
    assert len(emitted_before_close) >= 50
    steps = np.diff(np.asarray(emitted_before_close))
    assert np.all(np.abs(steps - 0.04) <= 0.0100001), steps  # polls every 10 ms: within one poll of 40 ms
    assert res.stats["late_frames"] == 0 and res.stats["starved_frames"] >= 25
    assert res.stats["idle_frames"] >= 25
    frames = avatar.frames()
    idle = [k for k in range(n) if k > 15 and k < 35]  # inside the dry spell
    for k in idle:
        np.testing.assert_array_equal(got[k], frames[int(cycle_index(k, avatar.n_frames))])
    del gaps


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_udp_stream_has_every_frame_and_the_audio(avatar, ffmpeg, tmp_path, monkeypatch):
    """An ffmpeg listener on udp://127.0.0.1 (loopback) records the live stream; decoded, it has the session's
    frames and as much audio."""
    monkeypatch.setattr("nbhelpers.engine.render", StubRender())
    port = free_udp_port()
    received = tmp_path / "received.ts"
    listener = subprocess.Popen([ffmpeg, "-v", "error", "-nostdin", "-y", "-i", f"udp://127.0.0.1:{port}?fifo_size=1000000&overrun_nonfatal=1",
                                 "-c", "copy", "-f", "mpegts", str(received)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err: list[bytes] = []
    drain = threading.Thread(target=lambda: err.append(listener.stderr.read()), daemon=True)
    drain.start()
    import time

    time.sleep(1.0)  # let it bind first
    audio = np.concatenate([noise(0.4, seed=8), np.zeros(12800, np.float32)])  # 1.2 s: 30 frames
    session = session_of(avatar, threaded=False, hop=5, silence="source", to=f"udp://127.0.0.1:{port}")
    for start in range(0, len(audio), 1600):
        session.push(audio[start:start + 1600])
        time.sleep(0.02)  # do not flood the loopback socket
    res = session.close()
    assert res.n_frames == 30 and res.output is None
    time.sleep(1.5)  # the last packets
    listener.send_signal(signal.SIGINT)  # ffmpeg finishes its output file on SIGINT (UDP has no end of stream)
    try:
        listener.wait(30)
    except subprocess.TimeoutExpired:
        listener.kill()
        listener.wait()
    drain.join(5)
    assert received.is_file() and received.stat().st_size > 0, b"".join(err).decode("utf-8", "replace")
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(received), "-map", "0:v", "-f", "rawvideo", "-pix_fmt",
                          "gray", "-"], capture_output=True, check=True).stdout
    assert len(out) // (96 * 96) == 30
    pcm = subprocess.run([ffmpeg, "-v", "error", "-i", str(received), "-map", "0:a", "-f", "s16le", "-ac", "1",
                          "-ar", "16000", "-"], capture_output=True, check=True).stdout
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    # AAC adds its encoder delay (one 1024-sample frame, 64 ms at 16 kHz) and pads to whole frames; MPEG-TS keeps both.
    assert 19200 <= len(samples) <= 19200 + 2 * 1024, len(samples)
    rms = [float(np.sqrt(np.mean(samples[a:b] ** 2))) for a, b in ((1024 + 800, 1024 + 5600), (1024 + 9600, 19200))]
    assert rms[0] > 0.05 and rms[1] < 0.01, rms  # the speech first, then the silence, in place


def test_cli_plays_a_file_into_a_live_session(avatar, tiny_weights, tmp_path, ffmpeg):
    """`python -m nbhelpers avatar live DIR --audio FILE --to OUT.mp4` (threaded session, file sink): one frame per
    40 ms of the file, the audio muxed, the file renamed into place."""
    import soundfile as sf

    from nbhelpers.cli.main import main

    wav = tmp_path / "speech.wav"
    sf.write(wav, np.concatenate([noise(0.2, seed=9), np.zeros(6400, np.float32)]), 16000)  # 0.6 s: 15 frames
    out = tmp_path / "live.mp4"
    assert main(["avatar", "live", str(avatar.directory), "--audio", str(wav), "--to", str(out), "--chunk-ms", "70",
                 "--silence", "source", "--weights", str(tiny_weights)]) == 0
    assert out.is_file() and not list(tmp_path.glob(".live.partial*"))
    raw = subprocess.run([ffmpeg, "-v", "error", "-i", str(out), "-map", "0:v", "-f", "rawvideo", "-pix_fmt", "gray",
                          "-"], capture_output=True, check=True).stdout
    assert len(raw) // (96 * 96) == 15
    pcm = subprocess.run([ffmpeg, "-v", "error", "-i", str(out), "-map", "0:a", "-f", "s16le", "-ac", "1", "-ar",
                          "16000", "-"], capture_output=True, check=True).stdout
    assert abs(len(pcm) // 2 - 9600) <= 1024  # MP4 trims the AAC delay; within one AAC frame
    from nbhelpers import media

    assert media.probe(out).comment == media.SYNTHETIC_TAG  # marked synthetic, as every video the package writes


def test_cli_live_without_to_writes_into_the_avatars_vid_output(avatar, tiny_weights, tmp_path, ffmpeg):
    """Without --to, `avatar live` writes <avatar>/vid_output/live-<audio name>.mp4, as `avatar generate` writes
    into vid_output: one frame per 40 ms of the file."""
    import soundfile as sf
    import torch

    from nbhelpers.cli.main import main
    from nbhelpers.gpu import PlanWarning

    wav = tmp_path / "hello.wav"
    sf.write(wav, noise(0.2, seed=3), 16000)  # 0.2 s: 5 frames
    out = avatar.directory / "vid_output" / "live-hello.mp4"
    out.unlink(missing_ok=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["avatar", "live", str(avatar.directory), "--audio", str(wav), "--weights",
                     str(tiny_weights)]) == 0
    # the realtime and the whole-clip plans of the avatar often give the same note (on a CPU always): said once
    notes = [str(w.message) for w in seen if issubclass(w.category, PlanWarning)]
    assert len(notes) == len(set(notes))
    assert notes or torch.cuda.is_available()  # the CPU's "Running on the CPU" note
    raw = subprocess.run([ffmpeg, "-v", "error", "-i", str(out), "-map", "0:v", "-f", "rawvideo", "-pix_fmt", "gray",
                          "-"], capture_output=True, check=True).stdout
    assert len(raw) // (96 * 96) == 5
    out.unlink()


def test_threaded_real_time_hands_out_every_frame_in_order(avatar):
    """The pacer thread: silence played in real time comes out of the iterator in order, one frame per 40 ms of
    audio, each handed out no earlier than its time (no timing claim beyond that: the machine is shared)."""
    from nbhelpers.live import play

    session = session_of(avatar, realtime=True, silence="source", hop=2)
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.extend(n for n, _ in session), daemon=True)
    reader.start()
    res = play(session, np.zeros(6400, np.float32), chunk_ms=100)
    reader.join(30)
    assert got == list(range(10)) and res.n_frames == 10 and res.stats["idle_frames"] == 10
    t0 = session.stats.first_push_t
    for n, t in enumerate(session.stats.emit_t):
        assert t >= t0 + session.config.delay_s + n / 25 - 1e-6


def test_chunks_at_another_rate_are_resampled_as_one_file(avatar, monkeypatch):
    """24 kHz int16 stereo chunks of random sizes reach the timeline exactly as load_audio's one-shot soxr_hq
    resampling of the whole signal (the streaming resampler keeps its state across chunks)."""
    import soxr

    from nbhelpers.live import LiveSession

    monkeypatch.setattr(LiveSession, "_step", lambda self, now, final=False: None)  # look at the input side only
    rng = np.random.default_rng(10)
    stereo = (rng.standard_normal((24000, 2)) * 3000).astype(np.int16)
    session = session_of(avatar, threaded=False, silence=None, on_frame=lambda n, f: None)
    pos = 0
    while pos < len(stereo):
        size = int(rng.integers(1, 5000))
        session.push(stereo[pos:pos + size], 24000)
        pos += size
    session.close()
    got = np.concatenate(session._inbox)
    mono = (stereo.astype(np.float32) / 32768).mean(axis=1)
    want = soxr.resample(mono, 24000, 16000, quality="soxr_hq")
    assert got.shape == want.shape == (16000,)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


class CallLog(StubRender):
    """StubRender that also records each call's (first_frame, n_out)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[int, int]] = []

    def __call__(self, source, features, models, batch_size, n_out, **kw):
        self.calls.append((kw.get("first_frame", 0), n_out))
        yield from super().__call__(source, features, models, batch_size, n_out, **kw)


def fresh_models_thread(avatar):
    """Give the avatar a new model thread (nothing warmed yet); the old one ends."""
    old = avatar._state.pop("live_models_thread", None)
    if old is not None:
        old.close()


def test_warm_up_runs_at_construction_once_per_avatar_and_shape(avatar, monkeypatch):
    """Making a session runs one log-mel + encoder pass and one render of each batch size of its schedule (hop 3,
    batch 4, as fast as the audio comes: the group pieces 3, 1, 2 cut at batch multiples, and the whole batch 4),
    not counted as whisper passes; the first push then renders one of those shapes and runs no warm-up; a second
    session of the avatar, or warm_up=False, warms nothing."""
    import nbhelpers.audio as audio_mod

    log = CallLog()
    monkeypatch.setattr("nbhelpers.engine.render", log)
    mels = []
    real_log_mel = audio_mod._log_mel
    monkeypatch.setattr(audio_mod, "_log_mel", lambda *a, **k: mels.append(len(a[1])) or real_log_mel(*a, **k))
    fresh_models_thread(avatar)
    session = session_of(avatar, threaded=False, hop=3, silence=None, on_frame=lambda n, f: None)
    assert session.warm_shapes() == [3, 1, 2, 4]
    assert log.calls == [(0, 3), (0, 1), (0, 2), (0, 4)] and len(mels) == 1
    warm = session._models_thread.warm
    assert session.stats.whisper_passes == 0 and {"whisper", ("render", 3), ("render", 4)} <= warm
    session.push(noise(0.2, seed=12))  # 3200 samples: frames 0-2 are final (3 * 640 + 1280)
    assert log.calls[4:] == [(0, 3)] and len(mels) == 2 and session.stats.whisper_passes == 1
    session.close()
    log.calls.clear()
    mels.clear()
    session_of(avatar, threaded=False, hop=3, silence=None, on_frame=lambda n, f: None).close()
    warm.discard(("render", 5))
    session_of(avatar, threaded=False, hop=5, silence=None, on_frame=lambda n, f: None, warm_up=False).close()
    assert log.calls == [] and mels == []


def test_warm_shapes_are_the_batch_sizes_the_schedule_renders(avatar, monkeypatch):
    """The sizes follow the aligned cuts (hop 6, batch 4: groups [0, 6) -> 4 + 2, [6, 12) -> 2 + 4); in real time
    on a fake clock with 200 ms chunks (hop 3, batch 4), every render before close has a warmed size."""
    from nbhelpers.live import LiveSession

    monkeypatch.setattr(LiveSession, "_warm_up", lambda self: None)
    shapes = {(hop, rt): session_of(avatar, threaded=False, hop=hop, realtime=rt, silence=None,
                                     on_frame=lambda n, f: None).warm_shapes()
              for hop in (2, 3, 4, 6) for rt in (False, True)}
    assert shapes == {(2, False): [2, 4], (2, True): [2], (3, False): [3, 1, 2, 4], (3, True): [3, 1, 2],
                      (4, False): [4], (4, True): [4], (6, False): [4, 2], (6, True): [4, 2]}
    monkeypatch.undo()
    log = CallLog()
    monkeypatch.setattr("nbhelpers.engine.render", log)
    fresh_models_thread(avatar)
    clock = FakeClock()
    session = session_of(avatar, realtime=True, threaded=False, clock=clock, hop=3, silence=None,
                          on_frame=lambda n, f: None)
    warmed = [n for _, n in log.calls]
    assert warmed == [3, 1, 2]
    speech = noise(1.0, seed=19)
    for k in range(5):  # 200 ms chunks at their time, polled every 10 ms of fake time
        session.push(speech[3200 * k:3200 * (k + 1)])
        for _ in range(20):
            clock.t += 0.01
            session.poll()
    rendered = [n for _, n in log.calls[3:]]
    assert len(rendered) >= 6 and set(rendered) == {1, 2, 3}
    session.close()


def test_warm_up_asks_for_the_steady_size_decoder_then_one_code_for_every_batch(avatar, monkeypatch):
    """The warm-up asks the compiler for the VAE decoder at the schedule's first size on its own (the dynamic-batch
    decoder ran at two thirds of a one-size decoder's speed on a T4-class GPU, bench/RESULTS.md), then for every
    size through the dynamic-batch code, in that order."""
    asked = []
    monkeypatch.setattr(avatar.pipe, "compile_for", lambda size, parts, dynamic_batch=False: asked.append(
        (size, parts, dynamic_batch)))
    fresh_models_thread(avatar)
    session_of(avatar, threaded=False, hop=3, realtime=True, silence=None, on_frame=lambda n, f: None).close()
    assert asked == [(3, ("decoder",), False)] + [(n, ("unet", "decoder"), True) for n in (3, 1, 2)]


def test_all_model_work_runs_on_the_avatars_model_thread(avatar, monkeypatch):
    """The warm-up, every whisper log-mel and every render of a threaded session and of a non-threaded one run on
    one thread, the avatar's model thread, which outlives the sessions: not on the caller's thread nor on a
    session's own worker thread (PyTorch caches cuDNN plans per thread: the warm-up must warm the thread that
    renders)."""
    import nbhelpers.audio as audio_mod
    from nbhelpers.live import model_thread

    threads: list[tuple[str, int]] = []
    stub = StubRender()

    def render(*args, **kw):
        threads.append(("render", threading.get_ident()))
        return stub(*args, **kw)

    real_log_mel = audio_mod._log_mel

    def log_mel(*a, **k):
        threads.append(("mel", threading.get_ident()))
        return real_log_mel(*a, **k)

    monkeypatch.setattr("nbhelpers.engine.render", render)
    monkeypatch.setattr(audio_mod, "_log_mel", log_mel)
    fresh_models_thread(avatar)
    audio = noise(0.32, seed=20)
    threaded = session_of(avatar, hop=2, silence=None, on_frame=lambda n, f: None)
    warm_up = list(threads)
    threaded.push(audio)
    res = threaded.close()
    worker = threaded._thread.ident
    plain = session_of(avatar, threaded=False, hop=2, silence=None, on_frame=lambda n, f: None)
    plain.push(audio)
    plain.close()
    kinds = {k for k, _ in threads}
    assert res.n_frames == 8 and kinds == {"render", "mel"} and {k for k, _ in warm_up} == {"render", "mel"}
    assert len(threads) > len(warm_up) + 4  # the sessions' own passes and renders were seen too
    ident = model_thread(avatar).ident
    assert {t for _, t in threads} == {ident}
    assert ident not in (threading.get_ident(), worker)


def test_audio_pushed_at_once_is_rendered_in_aligned_batches_with_each_groups_own_tokens(avatar, monkeypatch):
    """hop 2, batch 4, 8 frames in one push: the groups final at once are rendered together up to the aligned
    batch end ([0, 4) then [4, 6)), the last group at close ([6, 8)); each frame's tokens are still those of its own
    group's prefix (2560, 3840, 5120 samples)."""
    log = CallLog()
    monkeypatch.setattr("nbhelpers.engine.render", log)
    audio = noise(0.32, seed=13)
    session = session_of(avatar, threaded=False, hop=2, silence=None, on_frame=lambda n, f: None, warm_up=False)
    session.push(audio)
    assert log.calls == [(0, 4), (4, 2)] and session.stats.whisper_passes == 3
    res = session.close()
    assert log.calls == [(0, 4), (4, 2), (6, 2)] and res.n_frames == 8
    pipe = avatar.pipe
    for group, e in enumerate((2560, 3840, 5120, 5120)):
        ref = pipe.features(audio[:e]).float().numpy()
        for n in (2 * group, 2 * group + 1):
            np.testing.assert_array_equal(log.tokens[n], ref[n], err_msg=f"frame {n}, prefix {e}")


def test_merged_batches_at_close_equal_one_clip_generation_bit_for_bit(avatar):
    """Real render, hop 2 (not a multiple of the batch size 4), context='segment': every group is made at close
    with the whole audio and rendered in generate's own batches ([0, 4), [4, 8)): every frame equals generate."""
    audio = noise(0.32, seed=14)
    ref: dict[int, np.ndarray] = {}
    avatar.generate(audio, output=False, frame_callback=collect(ref))
    live: dict[int, np.ndarray] = {}
    session = session_of(avatar, threaded=False, hop=2, silence=None, context="segment", on_frame=collect(live))
    push_random_chunks(session, audio, seed=15)
    session.close()
    assert sorted(live) == list(range(8))
    for n in range(8):
        np.testing.assert_array_equal(live[n], ref[n], err_msg=f"frame {n}")


def test_first_frame_latency_is_reported_in_parts(avatar):
    """The stats split frame 0's latency into wait, whisper, render and hand-out, which add up to it."""
    session = session_of(avatar, threaded=False, hop=2, silence=None, on_frame=lambda n, f: None)
    session.push(noise(0.2, seed=16))
    st = session.close().stats
    parts = [st[f"first_frame_{k}_s"] for k in ("wait", "whisper", "render", "handout")]
    assert all(p >= 0 for p in parts) and parts[1] > 0 and parts[2] > 0
    assert abs(sum(parts) - st["first_frame_latency_s"]) < 1e-9


@pytest.mark.gpu
def test_cuda_live_frames_equal_generate_with_the_device_log_mel(tiny_weights, lavfi_video, tmp_path):
    """On CUDA (log-mel on the device, pinned copies, warm-up): the last group and every context='segment' frame
    equal generate's bit for bit (both compute the log-mel the same way)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs on the project's GPU machine)")
    from nbhelpers import InferenceConfig, prepare_avatar

    video = lavfi_video("testsrc", "96x96", frames=8)
    av = prepare_avatar(video, tmp_path / "avatar", config=InferenceConfig(device="cuda", batch_size=4), boxes=BOX,
                        weights_dir=tiny_weights)
    try:
        audio = noise(0.32, seed=17)
        ref: dict[int, np.ndarray] = {}
        av.generate(audio, output=False, frame_callback=collect(ref))
        for context, frames in (("sliding", range(4, 8)), ("segment", range(8))):
            live: dict[int, np.ndarray] = {}
            session = session_of(av, threaded=False, hop=4, silence=None, context=context, on_frame=collect(live))
            push_random_chunks(session, audio, seed=18)
            session.close()
            for n in frames:
                np.testing.assert_array_equal(live[n], ref[n], err_msg=f"{context}, frame {n}")
    finally:
        av.close()


@pytest.mark.notorch
def test_live_config_refuses_out_of_range_settings_and_documents_each_field():
    """Every setting of a live session is one field of LiveConfig, with its help for a command line, and a value out
    of range is refused when the config is made, naming the field and the value."""
    import dataclasses

    from nbhelpers.errors import InputError
    from nbhelpers.live import LiveConfig

    assert all(f.metadata.get("help") for f in dataclasses.fields(LiveConfig))
    for bad, says in (({"hop": 0}, "hop must be a whole number of frames >= 1; got 0"),
                      ({"context": "all"}, "context must be one of"), ({"silence": "quiet"}, "silence must be"),
                      ({"delay_s": -1.0}, "delay_s must be a finite number of seconds >= 0; got -1.0"),
                      ({"ahead_s": float("inf")}, "ahead_s must be a finite number"),
                      ({"batch_size": 0}, "batch_size must be a whole number of frames >= 1 or None .*; got 0"),
                      ({"encoder": "x265"}, "encoder must be one of .* or None")):
        with pytest.raises(InputError, match=says):
            LiveConfig(**bad)
    assert LiveConfig(to=Path("out.mp4")).to == "out.mp4"
    assert LiveConfig().replace(hop=4).hop == 4
