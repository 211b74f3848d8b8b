"""The offline job end to end, with tiny random weights, the dlib backend and real media from ../shared/data."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import decode_audio, decode_frames, loaded_by, run_cli

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
    store = FrameStore(7, 9)
    passed = list(store.tee(iter(frames)))
    store.finish()
    assert len(store) == 5 and len(passed) == 5
    np.testing.assert_array_equal(store[[4, 0, 2]], frames[[4, 0, 2]])
    with pytest.raises(ValueError, match="same size"):
        FrameStore(7, 9).append(np.zeros((7, 8, 3), np.uint8))
    store.close()
    assert not store.path.exists()


# ----------------------------------------------------------------------------------------------------------------
# End to end


@pytest.fixture(scope="module")
def short_face_clip(face_clip):
    """The first 1.6 s (40 frames) of the real face video."""
    return face_clip(40)


@pytest.fixture(scope="module")
def speech_2s(speech_clip):
    """2.3 s of the real short speech, stereo 48 kHz AAC in .m4a (exercises decode, downmix and resample)."""
    return speech_clip(2.3, 0, "-ac", "2", "-ar", "48000", "-c:a", "aac", "-b:a", "128k", suffix="m4a")


@pytest.mark.slow
def test_lipsync_end_to_end_real_media(tiny_weights, short_face_clip, speech_2s, ffmpeg, tmp_path):
    from nbhelpers import InferenceConfig, lipsync, media

    captured: dict[int, np.ndarray] = {}
    out = tmp_path / "out dir ü" / "result.mp4"
    cfg = InferenceConfig(landmark_backend="dlib", batch_size=8, device="cpu")
    result = lipsync(short_face_clip, speech_2s, out, config=cfg, weights_dir=tiny_weights,
                     frame_callback=lambda t, f: captured.__setitem__(t, f.copy()))

    audio_in = decode_audio(speech_2s, ffmpeg=ffmpeg)
    expected_frames = len(media.load_audio(speech_2s)) * 25 // 16000
    assert result.output == out and out.is_file()
    assert result.n_frames == expected_frames == len(captured)
    assert result.source_frames == 40 and result.no_face_frames == 0
    info = media.probe(out)
    assert (info.width, info.height) == (576, 768)
    assert "frames written as" not in result.summary()  # even sizes: no padding note
    assert info.fps == 25
    decoded = decode_frames(out, ffmpeg=ffmpeg)
    assert len(decoded) == expected_frames
    assert abs(info.duration_s - len(audio_in) / 16000) <= 1 / 25 + 1e-3
    audio_out = decode_audio(out, ffmpeg=ffmpeg)
    n = min(len(audio_in), len(audio_out))
    assert abs(len(audio_out) - len(audio_in)) <= 16000 / 25
    corr = np.corrcoef(audio_in[:n], audio_out[:n])[0, 1]
    assert corr >= 0.99, f"audio correlation {corr:.4f}"

    # Outside the blend region every pixel equals the 25 fps source frame (the frames before encoding).
    source = decode_frames(short_face_clip, ffmpeg=ffmpeg)
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


def test_an_odd_sized_video_is_written_one_pixel_larger_and_the_summary_says_so(tiny_weights, shared_data,
                                                                                make_media, speech_clip, tmp_path):
    """A 577x769 face video (the real one, cropped): the file is 578x770 (yuv420p needs even sizes), the source
    pixels unscaled, and the clip's summary names both sizes (a new user found the size changed silently)."""
    from nbhelpers import InferenceConfig, lipsync, media

    odd = make_media("face-odd.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v", "4",
                     "-vf", "format=yuv444p,pad=577:769", "-an", "-c:v", "libx264", "-pix_fmt", "yuv444p", "-crf", "0")
    audio = speech_clip(0.2)
    result = lipsync(odd, audio, tmp_path / "odd.mp4", config=InferenceConfig(batch_size=4, device="cpu"),
                     boxes=(190, 160, 360, 330), weights_dir=tiny_weights)
    info = media.probe(result.output)
    assert (info.width, info.height) == (578, 770)
    assert "(577x769 frames written as 578x770: one black column/row added" in result.summary()
    assert media.padded_size_note(576, 768) is None and media.padded_size_note(577, 768).startswith(
        "(577x768 frames written as 578x768:")


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
    code = ("import nbhelpers as nbh; nbh.lipsync; nbh.prepare_avatar; nbh.Avatar; nbh.InferenceConfig; nbh.setup; "
            "import nbhelpers.__main__")
    assert loaded_by(code, ("torch", "diffusers", "transformers", "cv2", "onnxruntime", "dlib", "huggingface_hub",
                            "matplotlib", "ipywidgets")) == []


@pytest.mark.notorch
def test_cli_errors_are_one_line_without_traceback(tmp_path):
    bad = tmp_path / "notes.mp4"
    bad.write_text("not a video")
    proc = run_cli("lipsync", bad, bad, "--weights", tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert "notes.mp4" in proc.stderr


def test_cli_verify_checks_the_sets_asked_for(tiny_weights, tmp_path):
    ok = run_cli("verify", "--weights", tiny_weights, "--sets", "core", "parsing")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "face-parse-bisent/79999_iter.pth" in ok.stdout and "dwpose" not in ok.stdout
    empty = run_cli("verify", "--weights", tmp_path, "--sets", "core")
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
        proc = run_cli("lipsync", short_face_clip, speech_2s, "-o", out, "--weights", tiny_weights, "--device", device)
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
def test_cli_verify_of_a_folder_that_is_not_there_or_is_a_file_says_so_with_status_2(tmp_path):
    """Status 1 is a check that ran and failed (a file missing or damaged); a folder that cannot be checked is an
    error, 2, as the main help says. A file given as the folder was said not to exist."""
    proc = run_cli("verify", "--weights", tmp_path / "nope", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: the weights folder '{tmp_path / 'nope'}' does not exist")
    (tmp_path / "afile").write_text("x")
    proc = run_cli("verify", "--weights", tmp_path / "afile", timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr == (f"error: the weights folder '{tmp_path / 'afile'}' is a file, not a folder. Give the "
                           "folder that holds the weight files (--weights DIR or the NBHELPERS_WEIGHTS environment "
                           "variable).\n")
    helped = " ".join(run_cli("--help").stdout.split())
    assert "1 a check that ran and failed (verify: a weight file missing or damaged; batch: a job failed); 2 the " \
           "command could not run as given" in helped
    assert "2 when the folder does not exist or is a file" in " ".join(run_cli("verify", "--help").stdout.split())


@pytest.mark.slow
@pytest.mark.parametrize("device, pieces_on_gpu", [("cpu", True), pytest.param("cuda", True, marks=pytest.mark.gpu),
                                                   pytest.param("cuda", False, marks=pytest.mark.gpu)])
def test_streamed_pieces_give_the_frames_of_one_piece(tiny_weights, face_clip, speech_2s, ffmpeg,
                                                     monkeypatch, device, pieces_on_gpu):
    """The offline job prepares and renders its clip piece by piece while the encoder writes; the pieces must not
    change a frame: 3-frame pieces give the frames of one whole-clip piece, bit for bit, through frames before the
    first face (written unchanged, no model loaded yet), a face appearing inside a piece, and the ping-pong past
    the 10 source frames (the 2.3 s of speech need 57)."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline

    clip = face_clip(10)
    boxes = [None] * 4 + [(190, 160, 360, 330)] * 6  # no face in frames 0-3
    # batch 1: CPU kernels may round differently for different batch sizes, and pieces cut batches short
    if device == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
    if not pieces_on_gpu:  # as under a tight memory cap: each piece's frames stay on the host
        monkeypatch.setattr("nbhelpers.offline.PIECE_ON_GPU_FRACTION", 0.0)
        monkeypatch.setattr("nbhelpers.engine.FRAMES_ON_GPU_FRACTION", 0.0)
    cfg = InferenceConfig(batch_size=1, device=device)
    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, config=cfg)
    runs = {}
    for piece in (3, 1000):
        monkeypatch.setattr("nbhelpers.offline.STREAM_PIECE", piece)
        frames: dict[int, np.ndarray] = {}
        result = pipe.lipsync(clip, speech_2s, Path(pipe.weights_dir).parent / f"piece-{piece}.mp4", boxes=boxes,
                              frame_callback=lambda t, f, frames=frames: frames.__setitem__(t, f.copy()))
        assert sorted(frames) == list(range(result.n_frames)) and result.n_frames == 57
        assert result.source_frames == 10 and result.no_face_frames == 4
        runs[piece] = frames
    for t in range(57):
        assert np.array_equal(runs[3][t], runs[1000][t]), f"frame {t} differs between 3-frame pieces and one piece"
    source = decode_frames(clip, ffmpeg=ffmpeg)
    for t in range(57):
        j = cycle_index(t, 10)
        same = np.array_equal(runs[3][t], source[j])
        assert same == (j < 4), f"frame {t} (source {j}): {'unchanged' if same else 'repainted'}"


@pytest.mark.slow
def test_per_frame_boxes_of_the_whole_video_with_shorter_audio(tiny_weights, face_clip, speech_clip):
    """One box per video frame, audio that reaches only the first 5 of 10 frames: the job decodes 5 frames and
    uses their 5 boxes; the 10 boxes are not measured against the 5 frames decoded."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline

    clip, speech = face_clip(10), speech_clip(0.2)
    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, config=InferenceConfig(device="cpu"))
    boxes = [(190, 160, 360, 330)] * 9 + [None]
    result = pipe.lipsync(clip, speech, Path(pipe.weights_dir).parent / "boxes-short.mp4", boxes=boxes)
    assert (result.n_frames, result.source_frames, result.no_face_frames) == (5, 5, 0)
    with pytest.raises(Exception, match="boxes has 3 entries"):
        pipe.lipsync(clip, speech, Path(pipe.weights_dir).parent / "boxes-few.mp4", boxes=boxes[:3])


@pytest.mark.slow
def test_a_cpu_clip_warns_once_with_its_frame_size_and_takes_one_box_in_a_list(tiny_weights, face_clip,
                                                                              speech_clip, tmp_path):
    """nbh.lipsync on the CPU gives one PlanWarning, from the job's own plan with the clip's 576x768 (W x H) frames
    and length (not a plan at load assuming 1920x1080 frames); the one-box list is that box for every frame;
    per-frame boxes of another length than the video's 10 frames are refused before any model loads, saying both
    counts."""
    import warnings

    import nbhelpers as nbh
    from nbhelpers.errors import InputError
    from nbhelpers.gpu import PlanWarning

    clip, speech = face_clip(10), speech_clip(0.2)
    box = (190, 160, 360, 330)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = nbh.lipsync(clip, speech, tmp_path / "one-box.mp4", config=nbh.InferenceConfig(device="cpu"),
                             boxes=[box], weights_dir=tiny_weights)
    notes = [str(w.message) for w in caught if issubclass(w.category, PlanWarning)]
    assert len(notes) == 1, notes
    assert notes[0].startswith("Running on the CPU") and "576x768 frames," in notes[0] and "1080" not in notes[0]
    assert "5 frames from 5 source frames take about" in notes[0]
    assert (result.n_frames, result.source_frames, result.no_face_frames) == (5, 5, 0)
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu"))
    for n in (3, 11):  # 11 is refused too, though the audio reaches only 5 of the video's 10 frames
        with pytest.raises(InputError, match=rf"boxes has {n} entries but video '[^']*{re.escape(clip.name)}' has 10 "
                                             r"frames at 25 fps\. .*exactly 10 entries"):
            pipe.lipsync(clip, speech, tmp_path / "wrong.mp4", boxes=[box] * n)
    assert pipe.loaded == [] and not (tmp_path / "wrong.mp4").exists()


@pytest.mark.notorch
def test_an_output_that_is_the_jobs_own_video_or_audio_is_refused(tmp_path):
    """Writing the output over an input would replace it (a new user's batch row did, and each rerun dubbed the
    previous output again); a link to the input is the input too."""
    from nbhelpers.checks import output_path_for
    from nbhelpers.errors import InputError

    video, audio = tmp_path / "face.mp4", tmp_path / "speech.mp4"
    video.write_bytes(b"v")
    audio.write_bytes(b"a")
    (tmp_path / "link.mp4").symlink_to(video)
    for output, kind in ((video, "video"), (tmp_path / "sub" / ".." / "face.mp4", "video"), (audio, "audio"),
                         (tmp_path / "link.mp4", "video")):
        with pytest.raises(InputError, match=f"is the job's {kind}: writing it would replace the input"):
            output_path_for(output, video, audio)
    assert output_path_for(tmp_path / "out.mp4", video, audio) == tmp_path / "out.mp4"


@pytest.mark.parametrize("boxes", [(1, 2, 3), [190, 160, 360, 330, 400], np.array([1.0, 2.0, 3.0])])
def test_a_flat_box_of_other_than_four_numbers_is_refused_as_a_box_before_any_work(boxes, tmp_path):
    """boxes=(1, 2, 3) is refused as a box, not counted as three per-frame entries, before the files are looked at;
    so are text, a per-frame entry of three numbers and numbers mixed with boxes, each naming the fault."""
    import nbhelpers as nbh
    from nbhelpers.checks import given_boxes
    from nbhelpers.errors import InputError

    with pytest.raises(InputError, match=r"^boxes must be four numbers \(x1, y1, x2, y2\) in pixels, or a list with "
                                         r"one box \(or None\) per frame; got \d numbers: "):
        nbh.lipsync(tmp_path / "missing.mp4", tmp_path / "missing.wav", boxes=boxes)
    box = (190, 160, 360, 330)
    assert given_boxes(box) == box and given_boxes([box]) == box and given_boxes(iter([box, None])) == [box, None]
    assert given_boxes([None, None]) == [None, None] and given_boxes(np.zeros((3, 4))).shape == (3, 4)
    with pytest.raises(InputError, match=r"^boxes must be numbers, not text: give boxes=\(x1, y1, x2, y2\)"):
        given_boxes("190,160,360,330")
    for per_frame, bad in (([(1, 2, 3)], 0), ([box, None, (1, 2)], 2), ([box, 5], 1), (np.zeros((2, 3)), 0)):
        with pytest.raises(InputError, match=rf"^boxes\[{bad}\] is .*: a box is four numbers \(x1, y1, x2, y2\)"):
            given_boxes(per_frame)


def test_per_frame_boxes_count_an_unchanged_video_once(face_clip, tmp_path, monkeypatch):
    """nbh.lipsync() checks its inputs, then its pipeline's job checks them again: per-frame boxes need the
    video's frame count both times, which the second time comes from the first count (the file is unchanged);
    a changed file is counted again."""
    import os
    import shutil

    from nbhelpers import media
    from nbhelpers.checks import check_boxes
    from nbhelpers.errors import InputError

    clip = tmp_path / "face-10f.mp4"
    shutil.copy(face_clip(10), clip)
    decodes = []
    real = media.load_video
    monkeypatch.setattr(media, "load_video", lambda *a, **k: decodes.append(a[0]) or real(*a, **k))
    boxes = [(190, 160, 360, 330)] * 10
    assert check_boxes(boxes, clip) == boxes and check_boxes(boxes, clip) == boxes
    assert len(decodes) == 1
    with pytest.raises(InputError, match="boxes has 9 entries"):
        check_boxes(boxes[:9], clip)
    assert len(decodes) == 1
    shutil.copy(face_clip(12), clip)
    os.utime(clip, ns=(1, 1))  # another size and time: counted again
    with pytest.raises(InputError, match="boxes has 10 entries but video .* has 12 frames"):
        check_boxes(boxes, clip)
    assert len(decodes) == 2


# ----------------------------------------------------------------------------------------------------------------
# The offline job's pieces: batched frame store writes, decoding one piece ahead, piece windows, face batches


@pytest.mark.notorch
def test_framestore_append_batch_and_append_read_back_bit_exact_in_order(tmp_path):
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, size=(9, 6, 5, 3), dtype=np.uint8)
    store = FrameStore(6, 5)
    assert store.append_batch(frames[:4]) == 0
    assert store.append(frames[4]) == 4
    assert store.append_batch(frames[5:6]) == 5  # a batch of one
    assert store.append_batch(frames[6:][::-1].copy()[::-1]) == 6  # not contiguous in memory
    assert len(store) == 9
    # wrong shapes and dtypes are refused before anything is written
    for bad in (frames[0], frames[:2, :, :4], frames[:2].astype(np.int16), frames[None, :2]):
        with pytest.raises(ValueError, match="same size"):
            store.append_batch(bad)
    assert len(store) == 9
    store.finish()
    assert store.path.stat().st_size == frames.nbytes
    np.testing.assert_array_equal(store[np.arange(9)], frames)
    assert [store[i].tobytes() for i in range(9)] == [f.tobytes() for f in frames]
    store.close()


class FakeReader:
    """``read_batch(n)`` of a clip of ``total`` frames whose pixels are all the frame's index; records the sizes
    asked for. ``fail_at``: the 1-based call that raises; ``block_at``: the call that waits on ``release``."""

    def __init__(self, total, fail_at=None, block_at=None, hw=(4, 3)):
        import threading

        self.total, self.fail_at, self.block_at, self.hw = total, fail_at, block_at, hw
        self.asked: list[int] = []
        self.next = 0
        self.release = threading.Event()

    def read_batch(self, n):
        self.asked.append(n)
        if len(self.asked) == self.fail_at:
            raise OSError("decoder broke at read 3")
        if len(self.asked) == self.block_at:
            self.release.wait(10)
        k = min(n, self.total - self.next)
        out = np.stack([np.full((*self.hw, 3), (self.next + i) % 256, np.uint8) for i in range(k)]) if k else \
            np.zeros((0, *self.hw, 3), np.uint8)
        self.next += k
        return out


@pytest.mark.parametrize(("total", "n", "sizes"), [(23, 17, [5, 5, 5, 2]), (12, 30, [5, 5, 2]), (10, 10, [5, 5])])
def test_decode_ahead_gives_pieces_in_order_capped_at_n_and_stores_them(tmp_path, total, n, sizes):
    from nbhelpers.engine import Timings
    from nbhelpers.offline import DecodeAhead

    class CountingTimings(Timings):
        def add(self, name, seconds):
            waits.append((name, seconds))
            super().add(name, seconds)

    waits: list[tuple[str, float]] = []
    reader, store, timings = FakeReader(total), FrameStore(4, 3), CountingTimings()
    dec = DecodeAhead(reader, n, 5, store, timings)
    pieces = list(dec)
    dec.close()
    assert [len(p) for p in pieces] == sizes
    got = np.concatenate(pieces)
    want = min(n, total)
    assert got.shape == (want, 4, 3, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got[:, 0, 0, 0], np.arange(want))
    assert max(reader.asked) <= 5 and sum(reader.asked[:len(sizes)]) >= want
    assert reader.next == want or total < n  # nothing decoded past the n frames wanted
    store.finish()
    assert len(store) == want
    np.testing.assert_array_equal(store[np.arange(want)], got)
    # the job's wait for each piece, and for the end, is timed as "decode": one wait per piece and one more
    assert [name for name, _ in waits] == ["decode"] * (len(sizes) + 1)
    store.close()


def test_decode_ahead_raises_the_readers_error_at_the_piece_it_would_have_given(tmp_path):
    from nbhelpers.engine import Timings
    from nbhelpers.offline import DecodeAhead

    store = FrameStore(4, 3)
    dec = DecodeAhead(FakeReader(40, fail_at=3), 40, 5, store, Timings())
    got = []
    with pytest.raises(OSError, match="decoder broke at read 3"):
        for piece in dec:
            got.append(piece)
    dec.close()
    assert [len(p) for p in got] == [5, 5]
    np.testing.assert_array_equal(np.concatenate(got)[:, 0, 0, 0], np.arange(10))
    assert len(store) == 10
    store.close()


def test_decode_ahead_close_ends_a_thread_blocked_on_a_full_queue(tmp_path):
    import time

    from nbhelpers.engine import Timings
    from nbhelpers.offline import DecodeAhead

    store = FrameStore(4, 3)
    reader = FakeReader(1000)
    dec = DecodeAhead(reader, 1000, 5, store, Timings())
    deadline = time.monotonic() + 5
    while len(reader.asked) < 2 and time.monotonic() < deadline:  # one piece queued, the next one read: blocked
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(reader.asked) == 2 and dec._thread.is_alive()  # one piece ahead, no further
    dec.close()
    assert not dec._thread.is_alive()  # close returned with the thread ended, not left blocked on the queue
    assert len(reader.asked) == 2  # it read nothing more after close
    store.close()


def test_window_indexes_and_slices_by_clip_index_and_refuses_frames_outside():
    from nbhelpers.offline import Window

    frames = np.arange(6)[:, None, None, None] * np.ones((6, 2, 2, 3), np.uint8)
    w = Window(frames, 10)
    assert len(w) == 16
    assert w[10][0, 0, 0] == 0 and w[np.int64(15)][0, 0, 0] == 5
    np.testing.assert_array_equal(w[11:14][:, 0, 0, 0], [1, 2, 3])
    np.testing.assert_array_equal(w[np.int64(12):np.int64(16)][:, 0, 0, 0], [2, 3, 4, 5])
    np.testing.assert_array_equal(w[:][:, 0, 0, 0], np.arange(6))
    np.testing.assert_array_equal(w[np.array([15, 10, 12])][:, 0, 0, 0], [5, 0, 2])
    for bad in (9, 16, slice(9, 12), slice(14, 17), slice(3, 5)):
        with pytest.raises(IndexError, match="not in this piece"):
            w[bad]
    torch = pytest.importorskip("torch")
    t = Window(torch.from_numpy(frames), 10)
    assert t.device == torch.device("cpu")
    assert t[12:15].data_ptr() == t.frames[2].data_ptr()  # a run of frames: a view, no copy
    assert t[torch.tensor([13, 11])][:, 0, 0, 0].tolist() == [3, 1]


class _ParserOnCuda:
    """Says it is on CUDA so that materials_for_frames takes its GPU path (prepare_materials_torch is faked)."""

    device = "cuda"


def test_materials_of_a_run_and_of_frames_with_gaps_read_the_right_frames(monkeypatch):
    torch = pytest.importorskip("torch")
    from nbhelpers import blending
    from nbhelpers.config import InferenceConfig
    from nbhelpers.offline import Window

    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, (8, 6, 5, 3), dtype=np.uint8)
    offset = 20
    boxes = {offset + i: (i, i, i + 3, i + 3) for i in range(10)}  # boxes beyond the piece too
    seen = []

    def fake_torch_materials(batch, boxes, parser, **options):
        seen.append(batch.clone())
        return [(b, batch[k].clone()) for k, b in enumerate(boxes)]

    monkeypatch.setattr(blending, "prepare_materials_torch", fake_torch_materials)
    device_frames = Window(torch.from_numpy(frames), offset)
    for face_frames in ([21, 22, 23, 24], [20, 22, 23, 27]):
        seen.clear()
        out = blending.materials_for_frames(Window(frames, offset), boxes, face_frames, _ParserOnCuda(),
                                            InferenceConfig(), progress=False, frames_device=device_frames)
        assert [b for b, _ in out] == [boxes[i] for i in face_frames]
        for (_, got), i in zip(out, face_frames, strict=True):
            np.testing.assert_array_equal(got.numpy(), frames[i - offset])
        assert len(seen) == 1
    # a run reaching outside the piece is an error, not another frame
    with pytest.raises(IndexError, match="not in this piece"):
        blending.materials_for_frames(Window(frames, offset), boxes, [27, 28], _ParserOnCuda(), InferenceConfig(),
                                      progress=False, frames_device=device_frames)


def test_materials_on_the_cpu_are_the_same_for_a_run_and_for_frames_with_gaps(tiny_weights):
    pytest.importorskip("torch")
    from nbhelpers import blending
    from nbhelpers.config import InferenceConfig
    from nbhelpers.offline import Window
    from nbhelpers.parsing import FaceParser

    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (4, 96, 80, 3), dtype=np.uint8)
    offset = 7
    crop = {offset + i: (10 + i, 12, 60 + i, 80) for i in range(4)}
    parser = FaceParser(tiny_weights, device="cpu")
    cfg = InferenceConfig()
    run = blending.materials_for_frames(Window(frames, offset), crop, [7, 8, 9, 10], parser, cfg, progress=False)
    gaps = blending.materials_for_frames(Window(frames, offset), crop, [7, 9, 10], parser, cfg, progress=False)
    for a, b in zip([run[0], run[2], run[3]], gaps, strict=True):
        assert tuple(a.box) == tuple(b.box) and tuple(a.square) == tuple(b.square)
        np.testing.assert_array_equal(a.mask, b.mask)
    assert not np.array_equal(run[0].mask, run[1].mask) or tuple(run[0].box) != tuple(run[1].box)


def _fake_detector():
    from types import SimpleNamespace

    return SimpleNamespace(face_detector=SimpleNamespace(batch_size=99), pose=SimpleNamespace(batch_size=99))


def _face_batches(monkeypatch, usable_gib, loaded_gib, hw=(576, 768)):
    from nbhelpers.offline import fit_face_batches

    monkeypatch.setattr("nbhelpers.gpu.usable_bytes", lambda device=None: int(usable_gib * 2**30))
    det = _fake_detector()
    fit_face_batches(det, hw, "cuda", loaded_gib=loaded_gib)
    return det.face_detector.batch_size, det.pose.batch_size


def test_face_batches_of_a_later_job_equal_the_first_jobs(monkeypatch):
    pytest.importorskip("torch")
    # first job: 4 GiB usable, nothing loaded yet; a later one: 1.5 GiB of its models loaded, 2.5 GiB left
    first = _face_batches(monkeypatch, 4.0, 0.0)
    later = _face_batches(monkeypatch, 2.5, 1.5)
    assert first == later
    # without the add-back the later job would get smaller batches (the test can tell them apart)
    without = _face_batches(monkeypatch, 2.5, 0.0)
    assert without[0] < first[0] and without[1] < first[1]
    assert _face_batches(monkeypatch, 2.5, -1.0) == without  # a negative add-back counts as none


def test_face_batches_on_a_4_gib_card_follow_the_memory_model(monkeypatch):
    pytest.importorskip("torch")
    from nbhelpers.faces.dwpose_torch import DEFAULT_BATCH, S3FD_GPU_BATCH
    from nbhelpers.gpu import MEMORY_MODEL as mm
    from nbhelpers.offline import DWPOSE_GIB_PER_FRAME, FACE_BATCH_GPU, FACES_SHARE

    usable = 3.3
    budget = (usable - mm.workspace_gib) * (1 - mm.safety_fraction)
    models = mm.core_fixed_gib + mm.bisenet_weights_gib + mm.s3fd_weights_gib + mm.dwpose_gib
    share = FACES_SHARE * max(0.0, budget - models)
    per_frame = mm.s3fd_bytes_per_pixel * 576 * 768 / 2**30
    want_s3fd = min(S3FD_GPU_BATCH, max(1, int(np.floor(share / per_frame))))
    want_pose = min(DEFAULT_BATCH["cuda"], FACE_BATCH_GPU, max(1, int(np.floor(share / DWPOSE_GIB_PER_FRAME))))
    got = _face_batches(monkeypatch, usable, 0.0)
    assert got == (want_s3fd, want_pose)
    # a frame a quarter the size fits 4 times as many frames (capped at S3FD's batch)
    quarter = _face_batches(monkeypatch, usable, 0.0, hw=(288, 384))[0]
    assert quarter == min(S3FD_GPU_BATCH, max(1, int(np.floor(share / (per_frame / 4)))))
    assert quarter > got[0] or got[0] == S3FD_GPU_BATCH
    # a large card: DWPose at the tracker's batch, not more (it pads a shorter call to its batch size)
    assert _face_batches(monkeypatch, 70.0, 0.0) == (S3FD_GPU_BATCH, FACE_BATCH_GPU)


@pytest.mark.gpu
def test_warm_up_on_cuda_runs_the_models_a_batch_worker_loads(tiny_weights, shared_data, face_clip, tmp_path):
    """A batch worker loads and warms its models in a thread while it prepares its first avatar: on CUDA the two at
    once must give the avatar and clip of a worker that did them one after the other."""
    import threading

    import numpy as np
    import torch

    from nbhelpers import InferenceConfig, MuseTalkPipeline, prepare_avatar

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run with -m gpu on the GPU machine)")
    clip = face_clip(6)
    speech = str(shared_data / "speech-en-short.wav")
    box = (190, 160, 360, 330)
    frames = {}
    for mode in ("serial", "threaded"):
        pipe = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cuda"))
        if mode == "threaded":
            loader = threading.Thread(target=lambda p=pipe: (p.preload("avatar"), p.warm_up(8)))
            loader.start()
        avatar = prepare_avatar(clip, tmp_path / mode, pipe, boxes=box)
        if mode == "threaded":
            loader.join()
            assert {"unet", "whisper", "vae", "face_parser"} <= set(pipe.loaded)
        got = []
        result = avatar.generate(speech, output=False, frame_callback=lambda t, f, out=got: out.append(f.copy()))
        assert result.config.batch_size >= avatar.config.batch_size  # a clip's plan (kind "clip") is not smaller
        frames[mode] = np.stack(got)
        avatar.close()
        pipe.release()
    np.testing.assert_array_equal(frames["threaded"], frames["serial"])


def test_no_face_in_a_video_tagged_as_rotated_says_its_frames_were_turned(tiny_weights, face_clip, speech_clip,
                                                                           make_media, tmp_path):
    """A new user's video tagged to be shown turned 90 degrees failed with the plain no-face message; the frames
    are turned upright as a player shows them, which is what to check. Both the offline job and an avatar's
    preparation say so (no face here: every per-frame box is None), an untagged video keeps the plain message."""
    from nbhelpers import InferenceConfig, lipsync, media, prepare_avatar
    from nbhelpers.errors import NoFaceError

    plain = face_clip(3)
    rotated = make_media("face-3f-rot90.mp4", "-display_rotation", "90", "-i", str(plain), "-c", "copy")
    assert media.probe(rotated).rotation in (90, 270) and media.probe(plain).rotation == 0
    audio = speech_clip(0.12)
    cfg = InferenceConfig(batch_size=4, device="cpu")
    for video, tagged in ((rotated, True), (plain, False)):
        n = 3
        with pytest.raises(NoFaceError) as offline:
            lipsync(video, audio, tmp_path / "o.mp4", config=cfg, boxes=[None] * n, weights_dir=tiny_weights)
        with pytest.raises(NoFaceError) as avatar:
            prepare_avatar(video, tmp_path / "avatar", config=cfg, boxes=[None] * n, weights_dir=tiny_weights)
        for caught in (offline, avatar):
            text = str(caught.value)
            assert text.startswith("no face found in the 3 frames")
            assert ("The video is tagged to be shown turned" in text) == tagged, text
    assert not (tmp_path / "o.mp4").exists()


def test_a_path_that_is_not_a_str_or_pathlike_is_refused_naming_the_argument_and_type(tmp_path):
    """``lipsync(123, ...)`` gives an InputError, not the TypeError of ``os.fspath``; the output path and
    prepare_avatar's video are checked the same way."""
    from nbhelpers.avatar import prepare_avatar
    from nbhelpers.checks import check_audio, check_video, output_path_for
    from nbhelpers.errors import InputError

    with pytest.raises(InputError, match=r"^video must be a file path \(a str or pathlib.Path\); got int 123\. "
                                         r"Pass the path in quotes"):
        check_video(123)
    with pytest.raises(InputError, match=r"^audio must be a file path .*; got list \['a.wav'\]"):
        check_audio(["a.wav"])
    with pytest.raises(InputError, match=r"^output must be a file path .*; got int 7"):
        output_path_for(7, tmp_path / "v.mp4", tmp_path / "a.wav")
    with pytest.raises(InputError, match=r"^video must be a file path .*; got int 123"):
        prepare_avatar(123, tmp_path / "avatar")
