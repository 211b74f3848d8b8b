"""The offline job end to end, with tiny random weights, the dlib backend and real media from ../shared/data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nbhelpers.framestore import FrameStore, cycle_index, output_frame_count

pytestmark = []


# ----------------------------------------------------------------------------------------------------------------
# Pure logic (no torch)


@pytest.mark.notorch
def test_cycle_index_is_the_official_ping_pong():
    # frames + frames[::-1] indexed i mod 2N (inference.py:179-181, 210-212), written out by hand for N = 3.
    assert [cycle_index(t, 3) for t in range(14)] == [0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0, 0, 1]
    assert [cycle_index(t, 1) for t in range(5)] == [0, 0, 0, 0, 0]  # a photo
    np.testing.assert_array_equal(cycle_index(np.arange(6), 2), [0, 1, 1, 0, 0, 1])
    with pytest.raises(ValueError):
        cycle_index(0, 0)


@pytest.mark.notorch
@pytest.mark.parametrize(("samples", "expected"), [(0, 0), (639, 0), (640, 1), (16000, 25), (480000, 750),
                                                   (7.5 * 16000, 187), (44.1 * 16000, 1102)])
def test_output_frame_count_is_exact_floor(samples, expected):
    # floor(seconds x 25) with integer arithmetic: 640 samples = 0.04 s = exactly one frame.
    assert output_frame_count(int(samples)) == expected


@pytest.mark.notorch
def test_framestore_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(5, 7, 9, 3), dtype=np.uint8)
    store = FrameStore(7, 9, directory=tmp_path / "s")
    passed = list(store.tee(iter(frames)))
    store.finish()
    assert len(store) == 5 and len(passed) == 5
    np.testing.assert_array_equal(store[[4, 0, 2]], frames[[4, 0, 2]])
    with pytest.raises(ValueError, match="same size"):
        FrameStore(7, 9, directory=tmp_path / "t").append(np.zeros((7, 8, 3), np.uint8))
    store.close()
    assert not (tmp_path / "s" / "frames.u8").exists()


# ----------------------------------------------------------------------------------------------------------------
# End to end


def _audio_of(path, ffmpeg):
    """Decode the audio of a file to 16 kHz mono float32 with ffmpeg directly (independent of nbhelpers.media)."""
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(path), "-map", "0:a:0", "-ac", "1", "-ar", "16000",
                          "-f", "f32le", "-"], check=True, capture_output=True).stdout
    return np.frombuffer(out, dtype=np.float32)


def _frames_of(path, ffmpeg, width, height):
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "bgr24", "-"],
                         check=True, capture_output=True).stdout
    return np.frombuffer(out, dtype=np.uint8).reshape(-1, height, width, 3)


@pytest.fixture(scope="module")
def short_face_clip(shared_data, make_media):
    """The first 1.6 s (40 frames) of the real face video."""
    return make_media("face-40f.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v", "40",
                      "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")


@pytest.fixture(scope="module")
def speech_2s(shared_data, make_media):
    """2.3 s of the real short speech, stereo 48 kHz AAC in .m4a (exercises decode, downmix and resample)."""
    return make_media("speech-2s.m4a", "-i", str(shared_data / "speech-en-short.wav"), "-t", "2.3", "-ac", "2",
                      "-ar", "48000", "-c:a", "aac", "-b:a", "128k")


@pytest.mark.slow
def test_lipsync_end_to_end_real_media(tiny_weights, short_face_clip, speech_2s, ffmpeg, tmp_path):
    from nbhelpers import InferenceConfig, lipsync, media

    captured: dict[int, np.ndarray] = {}
    out = tmp_path / "out dir ü" / "result.mp4"
    cfg = InferenceConfig(landmark_backend="dlib", batch_size=8, device="cpu")
    result = lipsync(short_face_clip, speech_2s, out, config=cfg, weights_dir=tiny_weights,
                     frame_callback=lambda t, f: captured.__setitem__(t, f.copy()))

    audio_in = _audio_of(speech_2s, ffmpeg)
    expected_frames = len(media.load_audio(speech_2s)) * 25 // 16000
    assert result.output == out and out.is_file()
    assert result.n_frames == expected_frames == len(captured)
    assert result.source_frames == 40 and result.no_face_frames == 0
    info = media.probe(out)
    assert (info.width, info.height) == (576, 768)
    assert info.fps == 25
    decoded = _frames_of(out, ffmpeg, 576, 768)
    assert len(decoded) == expected_frames
    assert abs(info.duration_s - len(audio_in) / 16000) <= 1 / 25 + 1e-3
    audio_out = _audio_of(out, ffmpeg)
    n = min(len(audio_in), len(audio_out))
    assert abs(len(audio_out) - len(audio_in)) <= 16000 / 25
    corr = np.corrcoef(audio_in[:n], audio_out[:n])[0, 1]
    assert corr >= 0.99, f"audio correlation {corr:.4f}"

    # Outside the blend region every pixel equals the 25 fps source frame (the frames before encoding).
    source = _frames_of(short_face_clip, ffmpeg, 576, 768)
    changed_any = False
    for t, frame in captured.items():
        j = cycle_index(t, 40)
        diff = np.any(frame != source[j], axis=2)
        ys, xs = np.nonzero(diff)
        if len(ys):
            changed_any = True
            assert ys.min() >= 160, f"frame {t}: a pixel above the mouth region changed (row {ys.min()})"
            assert xs.min() >= 150 and xs.max() <= 420 and ys.max() <= 420, f"frame {t}: change outside the face"
    assert changed_any, "no frame was repainted"
    assert result.timings and "generate" in result.timings


@pytest.mark.slow
def test_preview_repaints_only_the_lower_crop(tiny_weights, short_face_clip, speech_2s):
    from nbhelpers import InferenceConfig
    from nbhelpers.pipeline import preview

    box = (190, 160, 360, 330)
    p = preview(short_face_clip, InferenceConfig(device="cpu"), weights_dir=tiny_weights, boxes=box,
                audio=speech_2s)
    assert p.crop_box == box and p.face_256.shape == (256, 256, 3)
    changed = np.argwhere(np.any(p.result != p.frame, axis=2))
    assert len(changed), "nothing was repainted"
    k = 21  # feather kernel of the 2s = 254 px square: int(0.05 * 254 // 2 * 2) + 1 = 13, plus margin
    assert changed[:, 0].min() >= (box[1] + box[3]) // 2 - k and changed[:, 0].max() <= box[3] + k
    assert changed[:, 1].min() >= box[0] - k and changed[:, 1].max() <= box[2] + k
    assert p._repr_png_().startswith(b"\x89PNG")
    with pytest.raises(Exception, match="past the last frame"):
        preview(short_face_clip, InferenceConfig(device="cpu"), weights_dir=tiny_weights, boxes=box,
                frame_index=10_000)


@pytest.mark.notorch
def test_package_and_entry_points_import_without_heavy_libraries():
    code = ("import sys, nbhelpers as nbh; nbh.lipsync; nbh.prepare_avatar; nbh.Avatar; nbh.InferenceConfig; "
            "nbh.setup; import nbhelpers.__main__; "
            "bad = [m for m in ('torch', 'diffusers', 'transformers', 'cv2', 'onnxruntime', 'dlib', "
            "'huggingface_hub', 'matplotlib', 'ipywidgets') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.notorch
def test_cli_errors_are_one_line_without_traceback(tmp_path):
    bad = tmp_path / "notes.mp4"
    bad.write_text("not a video")
    proc = subprocess.run([sys.executable, "-m", "nbhelpers", "lipsync", str(bad), str(bad), "--weights",
                           str(tmp_path)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert "notes.mp4" in proc.stderr


def test_cli_verify_checks_the_sets_asked_for(tiny_weights, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "nbhelpers", "verify", "--weights", str(tiny_weights), "--sets",
                         "core", "parsing"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "face-parse-bisent/79999_iter.pth" in ok.stdout and "dwpose" not in ok.stdout
    empty = subprocess.run([sys.executable, "-m", "nbhelpers", "verify", "--weights", str(tmp_path), "--sets",
                            "core"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert empty.returncode == 1 and "missing" in empty.stdout
    assert f"--weights {tmp_path}" in empty.stdout  # the fix names the folder that was checked


@pytest.mark.parametrize("device, message", [
    ("foo", "device must be 'cuda', 'cuda:N' (N = 0, 1, ...), 'cpu' or None (automatic); got 'foo'"),
    ("cuda:x", "got 'cuda:x'"),
])
def test_a_bad_device_is_refused_when_the_config_is_made(device, message):
    from nbhelpers.config import InferenceConfig
    from nbhelpers.errors import InputError

    with pytest.raises(InputError) as caught:
        InferenceConfig(device=device)
    assert message in str(caught.value)
    for good in (None, "cpu", "cuda", "cuda:1"):
        assert InferenceConfig(device=good).device == good


def test_cli_stops_a_missing_gpu_before_any_frame_is_read(tiny_weights, short_face_clip, speech_2s, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this runtime has a CUDA GPU")
    out = tmp_path / "out.mp4"
    for device, says in (("cuda", "no CUDA GPU is usable"), ("foo", "device must be 'cuda', 'cuda:N'")):
        proc = subprocess.run([sys.executable, "-m", "nbhelpers", "lipsync", str(short_face_clip), str(speech_2s),
                               "-o", str(out), "--weights", str(tiny_weights), "--device", device],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        assert proc.returncode != 0 and proc.stderr.startswith("error: "), proc.stderr[-2000:]
        assert says in proc.stderr and "Traceback" not in proc.stderr
        # Stopped before the landmark stage: no backend warnings, no progress, no output.
        assert "Warning" not in proc.stderr and not out.exists()


def test_check_device_counts_the_gpus(monkeypatch):
    import torch

    from nbhelpers import gpu
    from nbhelpers.gpu import NoGpuError

    gpu.check_device(None)
    gpu.check_device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    gpu.check_device("cuda")
    gpu.check_device("cuda:1")
    with pytest.raises(NoGpuError, match=r"has 2 CUDA GPU\(s\) \(cuda:0 to cuda:1\)"):
        gpu.check_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGpuError, match="no CUDA GPU is usable"):
        gpu.check_device("cuda:0")


@pytest.mark.notorch
def test_cli_verify_of_a_folder_that_is_not_there_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nbhelpers", "verify", "--weights", str(tmp_path / "nope")],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: the weights folder '{tmp_path / 'nope'}' does not exist")


@pytest.mark.slow
@pytest.mark.parametrize("device, pieces_on_gpu", [("cpu", True), pytest.param("cuda", True, marks=pytest.mark.gpu),
                                                   pytest.param("cuda", False, marks=pytest.mark.gpu)])
def test_streamed_pieces_give_the_frames_of_one_piece(tiny_weights, shared_data, make_media, speech_2s, ffmpeg,
                                                     monkeypatch, device, pieces_on_gpu):
    """The offline job prepares and renders its clip piece by piece while the encoder writes; the pieces must not
    change a frame: 3-frame pieces give the frames of one whole-clip piece, bit for bit, through frames before the
    first face (written unchanged, no model loaded yet), a face appearing inside a piece, and the ping-pong past
    the 10 source frames (the 2.3 s of speech need 57)."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline
    from nbhelpers import pipeline as pipeline_module

    clip = make_media("face-10f.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v", "10",
                      "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")
    boxes = [None] * 4 + [(190, 160, 360, 330)] * 6  # no face in frames 0-3
    # batch 1: CPU kernels may round differently for different batch sizes, and pieces cut batches short
    if device == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
    if not pieces_on_gpu:  # as under a tight memory cap: each piece's frames stay on the host
        monkeypatch.setattr(pipeline_module, "PIECE_ON_GPU_FRACTION", 0.0)
        monkeypatch.setattr(pipeline_module, "FRAMES_ON_GPU_FRACTION", 0.0)
    cfg = InferenceConfig(batch_size=1, device=device)
    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, config=cfg)
    runs = {}
    for piece in (3, 1000):
        monkeypatch.setattr(pipeline_module, "STREAM_PIECE", piece)
        frames: dict[int, np.ndarray] = {}
        result = pipe.lipsync(clip, speech_2s, Path(pipe.weights_dir).parent / f"piece-{piece}.mp4", boxes=boxes,
                              frame_callback=lambda t, f, frames=frames: frames.__setitem__(t, f.copy()))
        assert sorted(frames) == list(range(result.n_frames)) and result.n_frames == 57
        assert result.source_frames == 10 and result.no_face_frames == 4
        runs[piece] = frames
    for t in range(57):
        assert np.array_equal(runs[3][t], runs[1000][t]), f"frame {t} differs between 3-frame pieces and one piece"
    source = _frames_of(clip, ffmpeg, 576, 768)
    for t in range(57):
        j = cycle_index(t, 10)
        same = np.array_equal(runs[3][t], source[j])
        assert same == (j < 4), f"frame {t} (source {j}): {'unchanged' if same else 'repainted'}"


@pytest.mark.slow
def test_per_frame_boxes_of_the_whole_video_with_shorter_audio(tiny_weights, shared_data, make_media):
    """One box per video frame, audio that reaches only the first 5 of 10 frames: the job decodes 5 frames and
    uses their 5 boxes (it used to refuse the 10 boxes as 'boxes has 10 entries but the clip has 5 frames')."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline

    clip = make_media("face-10f-boxes.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v",
                      "10", "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")
    speech = make_media("speech-0.2s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-t", "0.2")
    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, config=InferenceConfig(device="cpu"))
    boxes = [(190, 160, 360, 330)] * 9 + [None]
    result = pipe.lipsync(clip, speech, Path(pipe.weights_dir).parent / "boxes-short.mp4", boxes=boxes)
    assert (result.n_frames, result.source_frames, result.no_face_frames) == (5, 5, 0)
    with pytest.raises(Exception, match="boxes has 3 entries"):
        pipe.lipsync(clip, speech, Path(pipe.weights_dir).parent / "boxes-few.mp4", boxes=boxes[:3])
