"""The render engine (nbhelpers.engine) on the CPU with the tiny models: frame order and the ping-pong, frames
without a face, audio shorter than the video, an out-of-memory error in the middle of a batch, the writer hand-off,
and input checks before any batch runs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers import ENGINE_BOX, engine_parts, expected_frame, source_faces

torch = pytest.importorskip("torch")

from nbhelpers import blending  # noqa: E402
from nbhelpers.engine import BackgroundWriter, SourceFaces, render, run  # noqa: E402
from nbhelpers.errors import FFmpegError, InputError  # noqa: E402
from nbhelpers.framestore import cycle_index  # noqa: E402
from nbhelpers.latents import decode, unet_step  # noqa: E402

H, W = 120, 110
BOX = ENGINE_BOX
N = 5
NO_FACE = 2  # source frame 2 has no face


class CountingFrames:
    """(N, H, W, 3) source frames that record which indices were read."""

    def __init__(self, frames):
        self.frames = frames
        self.read: list[int] = []

    def __len__(self):
        return len(self.frames)

    def __getitem__(self, j):
        self.read.append(int(j))
        return self.frames[j]


@pytest.fixture(scope="module")
def source_parts():
    return engine_parts(N, [j for j in range(N) if j != NO_FACE], 13, seed=4, torch_seed=3, hw=(H, W))


class RecordingWriter:
    def __init__(self):
        self.batches: list[np.ndarray] = []

    def write(self, frames):
        self.batches.append(np.array(frames))


def test_frames_follow_the_ping_pong_and_no_face_frames_pass_through(source_parts, tiny_models):
    features = source_parts[4]
    out = list(render(source_faces(source_parts), features, tiny_models, 4, 13))
    assert [t0 for t0, _ in out] == [0, 4, 8, 12]
    frames = np.concatenate([f for _, f in out])
    assert frames.shape == (13, H, W, 3) and frames.dtype == np.uint8
    for t in range(13):
        want = expected_frame(source_parts, tiny_models, t)
        if cycle_index(t, N) == NO_FACE:
            assert np.array_equal(frames[t], want), f"frame {t} (no face) changed"
        else:
            assert np.abs(frames[t].astype(int) - want.astype(int)).max() <= 1, f"frame {t}"
            assert not np.array_equal(frames[t], source_parts[0][cycle_index(t, N)]), f"frame {t} not repainted"


def test_audio_shorter_than_the_video_reads_only_the_first_frames(source_parts, tiny_models):
    counting = CountingFrames(source_parts[0])
    out = np.concatenate([f for _, f in render(source_faces(source_parts, counting), source_parts[4], tiny_models,
                                               8, 3)])
    assert len(out) == 3 and set(counting.read) == {0, 1, 2}
    assert np.array_equal(out[2], source_parts[0][2])  # frame 2 has no face


class OomOnce(torch.nn.Module):
    """Wraps the UNet; the second call with more than ``above`` frames raises CUDA out-of-memory."""

    def __init__(self, unet, above):
        super().__init__()
        self.unet = unet
        self.above = above
        self.sizes: list[int] = []

    def forward(self, sample, timestep, encoder_hidden_states):
        self.sizes.append(int(sample.shape[0]))
        if len(self.sizes) == 2 and sample.shape[0] > self.above:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by test)")
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states)


def test_out_of_memory_in_the_middle_writes_every_frame_once_in_order(source_parts, tiny_models):
    from types import SimpleNamespace

    features = source_parts[4]
    clean = RecordingWriter()
    run(source_faces(source_parts), features, tiny_models, 4, 13, clean)
    oom_unet = OomOnce(tiny_models.unet, above=2)
    models = SimpleNamespace(unet=oom_unet, vae=tiny_models.vae, pe=tiny_models.pe, device=tiny_models.device)
    got = RecordingWriter()
    seen: list[int] = []
    with pytest.warns(RuntimeWarning, match="out of memory"):
        n = run(source_faces(source_parts), features, models, 4, 13, got, frame_callback=lambda t, f: seen.append(t))
    assert n == 13 and seen == list(range(13))
    # batch 1 (t 0-3: sources 0, 1, 2, 3; 3 with a face) ran; batch 2 (t 4-7: sources 4, 4, 3, 2) failed and was
    # retried in halves of 2 for the rest of the clip; t 12 (source 2, no face) needs no UNet call
    assert oom_unet.sizes == [3, 3, 2, 1, 2, 2]
    assert [len(b) for b in got.batches] == [4, 2, 2, 2, 2, 1]
    a, b = np.concatenate(clean.batches), np.concatenate(got.batches)
    assert a.shape == b.shape == (13, H, W, 3)
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_inputs_are_checked_before_any_batch_runs(source_parts, tiny_models):
    from types import SimpleNamespace

    never = OomOnce(torch.nn.Identity(), above=0)
    models = SimpleNamespace(unet=never, vae=tiny_models.vae, pe=tiny_models.pe, device=tiny_models.device)
    src = source_faces(source_parts)
    with pytest.raises(InputError, match="batch_size"):
        render(src, source_parts[4], models, 0, 4)
    with pytest.raises(InputError, match="13 frames"):
        render(src, source_parts[4], models, 4, 14)
    with pytest.raises(InputError, match="features"):
        render(src, source_parts[4][:, :10], models, 4, 4)
    with pytest.raises(InputError, match="latent_row"):
        SourceFaces(frames=source_parts[0], latent_row=np.zeros(N - 1, np.int64), latents=source_parts[2],
                    boxes=[BOX], masks=[None], squares=[BOX])
    assert never.sizes == []
    assert list(render(src, source_parts[4], models, 4, 0)) == []


def test_feature_offset_reads_rows_relative_to_the_first_frame(source_parts, tiny_models):
    """A live session passes only the rows of the frames it renders: row t - offset drives output frame t (same
    frames, same source-frame cycle as the full tensor), and an offset past first_frame is refused."""
    features = source_parts[4]
    src = source_faces(source_parts)
    full = np.concatenate([f for _, f in render(src, features, tiny_models, 3, 3, first_frame=6)])
    part = np.concatenate([f for _, f in render(src, features[6:9].clone(), tiny_models, 3, 3, first_frame=6,
                                                feature_offset=6)])
    np.testing.assert_array_equal(part, full)
    with pytest.raises(InputError, match="feature_offset"):
        render(src, features, tiny_models, 3, 3, first_frame=2, feature_offset=3)


def test_a_writer_error_reaches_the_caller(source_parts, tiny_models):
    class Broken:
        def write(self, frames):
            raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        run(source_faces(source_parts), source_parts[4], tiny_models, 4, 13, Broken())


def test_the_wait_for_a_slow_encoder_is_counted_while_batches_queue():
    """encode_wait counted only the wait for the last batches at the end; a job held back all along by a full queue
    (libx264 on 2 cores) showed that time as seconds outside every stage."""

    class Slow:
        def write(self, frames):
            time.sleep(0.2)

    with BackgroundWriter(Slow(), depth=1) as sink:
        for k in range(6):
            sink.put(k, np.zeros((1, 2, 2, 3), np.uint8))
        queued = sink.wait_s
    # 6 writes of 0.2 s: while the first runs the queue takes one, then each put waits about one write
    assert queued >= 0.6, queued
    assert sink.wait_s >= queued + 0.15  # the last batches at the end are counted on top


def test_a_stalled_writer_is_aborted_and_reported_not_waited_on_forever():
    release = threading.Event()

    class Stalled:
        """A writer whose write blocks (a stalled ffmpeg pipe) until abort() kills it, as VideoWriter does."""

        path = "out.mp4"
        aborted = False
        writes = 0
        unblocked_by_abort = None
        write_ended = threading.Event()

        def write(self, frames):
            self.writes += 1
            self.unblocked_by_abort = release.wait(30)  # False only if nothing ended the stalled write
            self.write_ended.set()

        def abort(self):
            self.aborted = True
            release.set()

    writer = Stalled()
    with pytest.raises(FFmpegError, match="did not take the next batch within 0.3 s"):
        with BackgroundWriter(writer, depth=1, timeout_s=0.3) as sink:
            for k in range(4):
                sink.put(k, np.zeros((1, 2, 2, 3), np.uint8))
    assert writer.aborted and writer.write_ended.wait(30)
    # the abort ended the stalled write (not its own 30 s wait), and nothing was written after it
    assert writer.unblocked_by_abort is True and writer.writes == 1


class RecordingGate:
    """A one-slot render gate that records who took and gave it back, and signals when thread "b" takes it."""

    def __init__(self):
        self.slot = threading.BoundedSemaphore(1)
        self.log: list[tuple[str, str]] = []
        self.b_took = threading.Event()

    def acquire(self):
        self.slot.acquire()
        self.log.append(("take", threading.current_thread().name))
        if threading.current_thread().name == "b":
            self.b_took.set()

    def release(self):
        self.log.append(("give", threading.current_thread().name))
        self.slot.release()


def test_a_render_gate_is_given_back_before_the_encoder_finishes_the_file(source_parts, tiny_models):
    """Clip a's encoder cannot write its last batch until clip b has taken the gate: with the gate held only while
    rendering, b renders during a's encoder tail and both finish; held to the end, a would wait in vain."""
    gate = RecordingGate()
    features = source_parts[4]
    results: dict[str, object] = {}

    class TailWaitsForB(RecordingWriter):
        waited = None

        def write(self, frames):
            if sum(len(b) for b in self.batches) + len(frames) == 13:  # the last batch: a's encoder tail
                self.waited = gate.b_took.wait(20)
            super().write(frames)

    writers = {"a": TailWaitsForB(), "b": RecordingWriter()}

    def clip(name):
        try:
            results[name] = run(source_faces(source_parts), features, tiny_models, 4, 13, writers[name],
                                render_gate=gate)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[name] = exc

    a = threading.Thread(target=clip, args=("a",), name="a")
    a.start()
    deadline = time.monotonic() + 20
    while not gate.log and time.monotonic() < deadline:  # a holds the gate before b asks for it
        time.sleep(0.005)
    b = threading.Thread(target=clip, args=("b",), name="b")
    b.start()
    a.join(60)
    b.join(60)
    assert results == {"a": 13, "b": 13}
    assert writers["a"].waited is True, "b could not take the gate while a's encoder finished"
    assert gate.log == [("take", "a"), ("give", "a"), ("take", "b"), ("give", "b")]
    for name in "ab":
        frames = np.concatenate(writers[name].batches)
        assert frames.shape == (13, H, W, 3)
    assert np.array_equal(np.concatenate(writers["a"].batches), np.concatenate(writers["b"].batches))


def test_a_failing_clip_gives_its_render_gate_back(source_parts, tiny_models):
    gate = threading.BoundedSemaphore(1)

    class Broken:
        def write(self, frames):
            raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        run(source_faces(source_parts), source_parts[4], tiny_models, 4, 13, Broken(), render_gate=gate)
    assert gate.acquire(timeout=0.1), "the gate was kept by a clip that failed"


@pytest.mark.gpu
def test_cuda_engine_matches_the_cpu_engine_with_events_and_deferred_copies(source_parts, tiny_weights):
    """On CUDA: the overlapped loop (pinned ring, deferred copies, event timings) gives the CPU engine's frames
    within the GPU blend's 2 levels, in order, every frame once, with an out-of-memory retry in the middle."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs on the project's GPU machine)")
    from types import SimpleNamespace

    from nbhelpers import models as models_mod
    from nbhelpers.engine import Timings

    cpu_models = models_mod.load_models(tiny_weights)
    gpu_models = models_mod.load_models(tiny_weights, device="cuda")
    frames, face_frames, latents, materials, features = source_parts
    cpu_src = source_faces(source_parts)
    want = np.concatenate([f for _, f in render(cpu_src, features, cpu_models, 4, 13)])
    gpu_src = SourceFaces.from_materials(frames, face_frames, latents.cuda(), materials).to_device("cuda")
    assert gpu_src.frames_device is not None and all(m.is_cuda for m in gpu_src.masks)
    oom = OomOnce(gpu_models.unet, above=2)
    models = SimpleNamespace(unet=oom, vae=gpu_models.vae, pe=gpu_models.pe, device=gpu_models.device)
    got, timings = RecordingWriter(), Timings()
    with pytest.warns(RuntimeWarning, match="out of memory"):
        run(gpu_src, features.cuda(), models, 4, 13, got, timings=timings)
    out = np.concatenate(got.batches)
    assert out.shape == want.shape
    assert np.abs(out.astype(int) - want.astype(int)).max() <= 2
    assert timings.seconds["generate"] > 0 and timings.seconds["blend"] > 0


@pytest.mark.parametrize("ts", [np.arange(0, 4), np.arange(1, 3), np.arange(2, 3), np.arange(9, 13)])
def test_repaint_pad_to_runs_the_padded_batch_and_keeps_only_the_real_faces(source_parts, tiny_models, ts):
    """pad_to runs the UNet + decode on the faces' rows with the last one repeated and keeps the first F outputs:
    faces_256 equal that padded batch computed here by hand (bit-exact), each pasted on its own frame; against
    the unpadded call they differ only by the CPU's batch-size-dependent float rounding (<= 1 level). A batch
    without a face runs no model."""
    from nbhelpers.engine import repaint

    frames, face_frames, latents, materials, features = source_parts
    src = source_faces(source_parts)
    plain, plain_faces = repaint(src, features, tiny_models, ts)
    padded, padded_faces = repaint(src, features, tiny_models, ts, pad_to=8)
    with_face = [t for t in ts if cycle_index(t, N) != NO_FACE]
    if not with_face:  # frame 2 only: no model runs, the frame passes through
        assert plain_faces is None and padded_faces is None
        np.testing.assert_array_equal(padded, plain)
        np.testing.assert_array_equal(padded[0], frames[NO_FACE])
        return
    rows = [face_frames.index(int(cycle_index(t, N))) for t in with_face]
    rows_8, ts_8 = rows + [rows[-1]] * (8 - len(rows)), with_face + [with_face[-1]] * (8 - len(rows))
    with torch.inference_mode():
        by_hand = decode(unet_step(tiny_models.unet, tiny_models.pe, latents[rows_8], features[ts_8]),
                         tiny_models.vae)[:len(rows)]
    assert tuple(padded_faces.shape) == tuple(plain_faces.shape) == (len(rows), 256, 256, 3)
    assert torch.equal(padded_faces, by_hand)
    assert (padded_faces.int() - plain_faces.int()).abs().max().item() <= 1
    k = 0
    for p, t in enumerate(ts):
        j = int(cycle_index(t, N))
        if j == NO_FACE:
            np.testing.assert_array_equal(padded[p], frames[j])
            continue
        m = materials[rows[k]]
        np.testing.assert_array_equal(padded[p], blending.blend_cpu(frames[j], by_hand[k].numpy(), m.box, m.mask,
                                                                     m.square))
        k += 1
    assert np.abs(padded.astype(int) - plain.astype(int)).max() <= 1
    # pad_to at or below the face count pads nothing: the unpadded call exactly
    same, same_faces = repaint(src, features, tiny_models, ts, pad_to=len(rows))
    np.testing.assert_array_equal(same, plain)
    assert torch.equal(same_faces, plain_faces)


@pytest.mark.gpu
def test_cuda_repaint_with_pad_to_equals_repaint_without(source_parts, tiny_weights):
    """On CUDA the padded UNet + decode (another batch shape, other cuDNN kernels) gives the same frames within one
    level, and faces_256 of the real faces only."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs on the project's GPU machine)")
    from nbhelpers import models as models_mod
    from nbhelpers.engine import repaint

    gpu_models = models_mod.load_models(tiny_weights, device="cuda")
    frames, face_frames, latents, materials, features = source_parts
    src = SourceFaces.from_materials(frames, face_frames, latents.cuda(), materials).to_device("cuda")
    feats = features.cuda()
    for ts in (np.arange(0, 4), np.arange(9, 13), np.arange(1, 3)):
        plain, plain_faces = repaint(src, feats, gpu_models, ts)
        padded, padded_faces = repaint(src, feats, gpu_models, ts, pad_to=8)
        n_face = int(sum(cycle_index(t, N) != NO_FACE for t in ts))
        assert tuple(padded_faces.shape) == tuple(plain_faces.shape) == (n_face, 256, 256, 3)
        assert (padded_faces.int() - plain_faces.int()).abs().max().item() <= 1
        assert np.abs(padded.astype(int) - plain.astype(int)).max() <= 1
