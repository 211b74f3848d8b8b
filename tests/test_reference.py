"""nbhelpers.reference is the oracle of the engine: the plain loop, one frame at a time, gives the frames of the
offline job, of an avatar clip, of a live session with context="segment" and of frames without a face, within 1
level (the engine batches frames, and a batch's float rounding can move a pixel by one). A loop with its blend or
its audio window shifted by one is caught. CPU and tiny random weights here; full-size random weights on CUDA in
the ``gpu`` tests at the end."""

from __future__ import annotations

import ast
import contextlib
import itertools
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nbhelpers import reference  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BOX = (190, 160, 360, 330)  # the mouth region of the real face video, pixels
TOLERANCE = 1  # grey levels


def max_difference(reference_frames, engine_frames) -> int:
    """The largest difference of any pixel of any frame, in grey levels (the frame counts must agree)."""
    assert len(reference_frames) == len(engine_frames), (len(reference_frames), len(engine_frames))
    return max(int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())
               for a, b in zip(reference_frames, engine_frames, strict=True))


def run_reference(pipe, frames, waveform, config, **source):
    """The reference loop's frames, with the CPU's denormals flushed as the engine does (same values, faster)."""
    from nbhelpers.engine import flush_denormals

    with flush_denormals(pipe.device):
        return list(reference.lipsync(frames, waveform, pipe.models, pipe.face_parser, config, **source))


def collector():
    frames: dict[int, np.ndarray] = {}
    return frames, lambda t, frame: frames.__setitem__(t, np.array(frame))


def in_order(frames: dict[int, np.ndarray]) -> list[np.ndarray]:
    assert sorted(frames) == list(range(len(frames)))
    return [frames[t] for t in range(len(frames))]


def test_the_reference_is_short_and_imports_no_job_or_engine():
    """A loop to read in one sitting (150 lines with its docstrings) that stands apart from what it checks."""
    path = ROOT / "nbhelpers" / "reference.py"
    assert len(path.read_text().splitlines()) <= 150
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            imported.update([node.module or ""] + [f"{node.module or ''}.{a.name}".lstrip(".") for a in node.names])
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    banned = ("engine", "pipeline", "offline", "batch", "avatar", "live")
    assert not [m for m in imported for b in banned if m == b or m.startswith(b + ".") or m.endswith("." + b)]


def test_windows_and_the_ping_pong_are_the_official_ones():
    """Frame t hears encoder frames 2t-4 .. 2t+5 (audio_processor.py at 25 fps); the source frames run
    0..N-1, N-1..0 (inference.py:179-181)."""
    from nbhelpers.audio import frame_windows
    from nbhelpers.framestore import cycle_index

    windows = frame_windows(16000 * 3, 25)
    for t in (0, 1, 2, 37, 74):
        assert reference.window_frames(t).tolist() == list(range(2 * t - 4, 2 * t + 6))
        assert reference.window_frames(t)[0] == windows.starts[t]
    assert [reference.source_index(t, 3) for t in range(8)] == [0, 1, 2, 2, 1, 0, 0, 1]
    assert [reference.source_index(t, 7) for t in range(40)] == [int(cycle_index(t, 7)) for t in range(40)]
    assert reference.source_index(5, 1) == 0


@pytest.fixture(scope="module")
def clip(shared_data, make_media):
    """The first 4 frames of the real face video (the speech below runs 7 frames: the ping-pong turns)."""
    return make_media("face-4f.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v", "4",
                      "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")


@pytest.fixture(scope="module")
def clip_with_gaps(shared_data, make_media):
    """4 frames of the real face video, frames 1 and 2 painted black: no face there."""
    return make_media("face-4f-gaps.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v", "4",
                      "-vf", "drawbox=x=0:y=0:w=iw:h=ih:color=black:t=fill:enable='between(n,1,2)'", "-an",
                      "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")


@pytest.fixture(scope="module")
def speech(shared_data, make_media):
    """0.28 s of real speech: 7 output frames."""
    return make_media("speech-0.28s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-ss", "1", "-t", "0.28")


@pytest.fixture(scope="module")
def config():
    from nbhelpers import InferenceConfig

    return InferenceConfig(device="cpu", batch_size=4, landmark_backend="dlib")


@pytest.fixture(scope="module")
def pipe(tiny_weights, config):
    from nbhelpers import MuseTalkPipeline

    return MuseTalkPipeline.from_pretrained(tiny_weights, config)


def lipsync_both(pipe, video, audio, config, tmp_path, **source):
    """(reference frames, offline job frames) of one clip; ``source`` is the job's ``boxes`` or nothing (dlib)."""
    from nbhelpers import media

    got, keep = collector()
    result = pipe.lipsync(video, audio, tmp_path / "job.mp4", config=config, frame_callback=keep, **source)
    frames, waveform = list(media.load_video(video)), media.load_audio(audio)
    boxes = source.get("boxes")
    found = {"boxes": boxes} if boxes is not None else {"detector": pipe.landmarks(config.landmark_backend)}
    return result, frames, run_reference(pipe, frames, waveform, config, **found), in_order(got)


def test_the_offline_job_gives_the_reference_frames(pipe, clip, speech, config, tmp_path):
    result, frames, ref, engine = lipsync_both(pipe, clip, speech, config, tmp_path)
    assert result.n_frames == len(ref) == 7 and result.no_face_frames == 0
    assert max_difference(ref, engine) <= TOLERANCE
    assert all((ref[t] != frames[reference.source_index(t, 4)]).any() for t in range(7)), "a frame not repainted"


def test_frames_without_a_face_are_the_reference_frames(pipe, clip_with_gaps, speech, config, tmp_path):
    """dlib finds no face in the black frames: both the loop and the job keep them as they are."""
    result, frames, ref, engine = lipsync_both(pipe, clip_with_gaps, speech, config, tmp_path)
    assert result.no_face_frames == 2
    assert max_difference(ref, engine) <= TOLERANCE
    for t in range(len(ref)):
        j = reference.source_index(t, 4)
        assert np.array_equal(ref[t], frames[j]) == (j in (1, 2)), f"frame {t} (source {j})"


@pytest.fixture(scope="module")
def avatar(pipe, clip, tmp_path_factory):
    from nbhelpers import prepare_avatar

    av = prepare_avatar(clip, tmp_path_factory.mktemp("reference") / "avatar", pipe,
                        config=pipe.config.replace(landmark_backend="boxes"), boxes=BOX)
    yield av
    av.close()


@pytest.fixture(scope="module")
def avatar_frames(avatar, clip, speech):
    """(waveform, the source frames, the avatar clip's frames, the reference loop's frames) of the speech."""
    from nbhelpers import media

    waveform = media.load_audio(speech)
    got, keep = collector()
    avatar.generate(waveform, output=False, frame_callback=keep)
    frames = list(media.load_video(clip))
    ref = run_reference(avatar.pipe, frames, waveform, avatar.config, boxes=[BOX] * len(frames))
    return waveform, frames, in_order(got), ref


def test_an_avatar_clip_gives_the_reference_frames(avatar_frames):
    _, _, engine, ref = avatar_frames
    assert len(ref) == 7
    assert max_difference(ref, engine) <= TOLERANCE


def test_a_live_session_with_segment_context_gives_the_reference_frames(avatar, avatar_frames):
    """Speech pushed in uneven chunks; with context="segment" every group waits for its whole 30 s segment, so the
    tokens are those of the whole clip."""
    from nbhelpers.live import LiveConfig, LiveSession

    waveform, _, _, ref = avatar_frames
    got, keep = collector()
    session = LiveSession(avatar, LiveConfig(context="segment", threaded=False, silence=None, hop=3, warm_up=False),
                          on_frame=keep)
    for start, stop in itertools.pairwise([0, 700, 701, 2500, 3100, len(waveform)]):
        session.push(waveform[start:stop], 16000)
    session.close()
    assert max_difference(ref, in_order(got)) <= TOLERANCE


@pytest.mark.parametrize("broken", ["window", "blend"])
def test_a_loop_shifted_by_one_is_caught(avatar, avatar_frames, monkeypatch, broken):
    """The oracle can fail: its audio window one encoder frame (20 ms) late, or its paste-back one pixel to the
    right, gives frames more than 1 level away from the engine's."""
    waveform, frames, engine, _ = avatar_frames
    if broken == "window":
        window = reference.window_frames
        monkeypatch.setattr(reference, "window_frames", lambda t: window(t) + 1)
    else:
        paste = reference.paste_back
        monkeypatch.setattr(reference, "paste_back",
                            lambda frame, face, box, mask: paste(frame, face, (box[0] + 1, box[1], box[2] + 1, box[3]),
                                                                 mask))
    short = waveform[:3 * 640]  # 3 frames are enough to see it
    shifted = run_reference(avatar.pipe, frames, short, avatar.config, boxes=[BOX] * len(frames))
    assert max_difference(shifted, engine[:3]) > TOLERANCE


def full_weights() -> str:
    """The folder of full-size random weights (bench/_common.py writes it); skips without CUDA or the folder."""
    import os

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    folder = os.environ.get("NBHELPERS_FULL_WEIGHTS")
    if not folder:
        pytest.skip("set NBHELPERS_FULL_WEIGHTS to a folder of full-size random weights (bench/_common.py)")
    return folder


@contextlib.contextmanager
def exact_fp32():
    """Full float32 maths in cuDNN's convolutions and cuBLAS's matmuls (torch lets cuDNN use TF32, 10 mantissa bits,
    by default on Ampere and newer); the previous settings restored after."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def engine_against_loop(pipe, config, clip, clip_with_gaps, speech, tmp_path):
    """({job: largest difference from the loop, levels}, {job: the loop's frames}) for the offline job (two source
    frames without a face), an avatar clip and a live session with context="segment", eager."""
    from nbhelpers import media, prepare_avatar
    from nbhelpers.live import LiveConfig, LiveSession

    waveform, worst, loop = media.load_audio(speech), {}, {}
    gaps = [None if j in (1, 2) else BOX for j in range(4)]
    got, keep = collector()
    result = pipe.lipsync(clip_with_gaps, speech, tmp_path / "job.mp4", config=config, frame_callback=keep, boxes=gaps)
    loop["offline"] = run_reference(pipe, list(media.load_video(clip_with_gaps)), waveform, config, boxes=gaps)
    assert result.no_face_frames == 2 and len(loop["offline"]) == 7
    worst["offline"] = max_difference(loop["offline"], in_order(got))

    loop["avatar"] = loop["live"] = run_reference(pipe, list(media.load_video(clip)), waveform, config,
                                                  boxes=[BOX] * 4)
    avatar = prepare_avatar(clip, tmp_path / f"avatar-{config.fp16}", pipe, config=config, boxes=BOX)
    try:
        got, keep = collector()
        avatar.generate(waveform, output=False, frame_callback=keep)
        worst["avatar"] = max_difference(loop["avatar"], in_order(got))
        got, keep = collector()
        session = LiveSession(avatar, LiveConfig(context="segment", threaded=False, silence=None,
                                                 hop=min(config.batch_size, 3), warm_up=False), on_frame=keep)
        for start, stop in itertools.pairwise([0, 700, 2500, len(waveform)]):
            session.push(waveform[start:stop], 16000)
        session.close()
        worst["live"] = max_difference(loop["live"], in_order(got))
    finally:
        avatar.close()
    return worst, loop


@pytest.mark.gpu
def test_full_size_weights_in_fp32_on_cuda_give_the_reference_frames(clip, clip_with_gaps, speech, tmp_path):
    """The offline job, an avatar clip and a live session on full-size random weights on CUDA, batches of 8, in full
    float32 (TF32 off), each within 1 level of the loop's frames."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline

    config = InferenceConfig(device="cuda", fp16=False, batch_size=8, landmark_backend="boxes", compile="off")
    pipe = MuseTalkPipeline.from_pretrained(full_weights(), config)
    with exact_fp32():
        worst, _ = engine_against_loop(pipe, config, clip, clip_with_gaps, speech, tmp_path)
    print(f"largest difference from the loop, levels: {worst}")
    assert max(worst.values()) <= TOLERANCE, worst


@pytest.mark.gpu
def test_full_size_weights_in_fp16_on_cuda_are_as_close_to_the_loop_as_fp16_is_to_fp32(clip, clip_with_gaps, speech,
                                                                                         tmp_path):
    """In fp16 (batches of 8, as users run) the engine and the loop reach the same values through different kernels
    (batched, channels-last), and fp16 rounds each one: so each job's largest difference from the fp16 loop is at
    most the fp16 loop's own from the fp32 loop, and at least 1 level is allowed."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline, media

    config = InferenceConfig(device="cuda", fp16=True, batch_size=8, landmark_backend="boxes", compile="off")
    pipe = MuseTalkPipeline.from_pretrained(full_weights(), config)
    with exact_fp32():
        worst, loop = engine_against_loop(pipe, config, clip, clip_with_gaps, speech, tmp_path)
        del pipe
        exact = config.replace(fp16=False)
        pipe32 = MuseTalkPipeline.from_pretrained(full_weights(), exact)
        waveform = media.load_audio(speech)
        gaps = [None if j in (1, 2) else BOX for j in range(4)]
        loop32 = {"offline": run_reference(pipe32, list(media.load_video(clip_with_gaps)), waveform, exact,
                                           boxes=gaps)}
        loop32["avatar"] = loop32["live"] = run_reference(pipe32, list(media.load_video(clip)), waveform, exact,
                                                          boxes=[BOX] * 4)
    fp16_error = {job: max_difference(loop32[job], loop[job]) for job in worst}
    print(f"largest difference from the fp16 loop, levels: {worst}; the fp16 loop's from the fp32 loop: {fp16_error}")
    assert all(worst[job] <= max(TOLERANCE, fp16_error[job]) for job in worst), (worst, fp16_error)


def test_the_notebook_helpers_cut_the_speech_and_compare_frames(speech, tmp_path):
    """06_inside_musetalk's helpers: the cut speech is what the engine reads back from its file, and the comparison
    reports the largest difference of any frame."""
    from nbhelpers import media, ui

    waveform, path = ui.cut_speech(speech, 0.2, tmp_path / "cut.wav")
    assert len(waveform) == 3200 and np.array_equal(waveform, media.load_audio(path))
    assert np.abs(waveform - media.load_audio(speech)[:3200]).max() < 1e-4
    frames = [np.full((4, 4, 3), v, np.uint8) for v in (10, 20, 30)]
    engine = {0: frames[0], 1: frames[1] + 1, 2: frames[2] + 3}
    comparison = ui.compare_frames(frames, engine, reference_s=3.0, engine_s=0.5)
    assert (comparison.frames, comparison.max_levels) == (3, 3)
    assert "DIFFERENT" in repr(comparison) and "6.0x" in repr(comparison)
    chart = ui.plot_stage_ms({"unet": 0.3, "decode": 0.15}, 3)
    assert [t.get_text() for t in chart.figure.axes[0].texts] == [" 100", " 50"]
