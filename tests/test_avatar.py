"""Avatar cache: reload without recomputation, rebuild on change or corruption, frames equal to the offline job."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from helpers import decode_frames

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clip(face_clip):
    """12 frames of the real face video."""
    return face_clip(12)


@pytest.fixture(scope="module")
def speech(speech_clip):
    """0.72 s of real speech (18 frames: longer than the 12-frame clip, so the ping-pong turns around)."""
    return speech_clip(0.72, 1)


BOX = (190, 160, 360, 330)


@pytest.fixture(scope="module")
def config():
    from nbhelpers import InferenceConfig

    return InferenceConfig(device="cpu", batch_size=6)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, clip, tiny_weights, config):
    from nbhelpers import prepare_avatar

    folder = tmp_path_factory.mktemp("avatars") / "face"
    avatar = prepare_avatar(clip, folder, config=config, boxes=BOX, weights_dir=tiny_weights)
    return folder, avatar


def test_help_opens_with_what_prepare_avatar_does():
    import inspect

    from nbhelpers import prepare_avatar

    opening = inspect.getdoc(prepare_avatar).split("\n\n")[0]
    assert opening.startswith("Prepare an avatar of a face video or photo once, for fast repeated generation")
    for step in ("detect the face", "latents", "blend masks", "cache", "Avatar.generate"):
        assert step in opening, step
    assert "SHA-256" not in opening  # the cache's checks come after


def test_prepare_writes_a_complete_versioned_cache(prepared):
    from nbhelpers import __version__
    from nbhelpers.avatar import AVATAR_FORMAT

    folder, avatar = prepared
    assert not avatar.loaded_from_cache and str(avatar).endswith("with a face; prepared (new avatar)")
    meta = json.loads((folder / "avatar.json").read_text())
    assert meta["format"] == AVATAR_FORMAT and meta["package_version"] == __version__
    assert meta["n_frames"] == 12 and meta["n_faces"] == 12
    assert set(meta["files"]) == {"frames.mkv", "avatar.npz"}
    assert sorted(p.name for p in folder.iterdir()) == ["avatar.json", "avatar.npz", "frames.mkv"]
    assert avatar.latents_np.shape == (12, 8, 32, 32)
    np.testing.assert_array_equal(avatar.crop_boxes, np.tile(BOX, (12, 1)))


def test_frames_are_stored_losslessly(prepared, clip, ffmpeg):
    folder, avatar = prepared
    source = decode_frames(clip, ffmpeg=ffmpeg)
    from nbhelpers.avatar import Avatar, LosslessFrames

    stored = Avatar.load(folder, avatar.pipe).frames()  # decoded from frames.mkv
    assert isinstance(stored, LosslessFrames)
    assert len(stored) == len(avatar.frames()) == len(source) == 12
    np.testing.assert_array_equal(stored[:], source)
    np.testing.assert_array_equal(avatar.frames()[:], source)


def test_prepared_avatar_equals_a_fresh_load_of_its_cache(prepared):
    """The avatar prepare_avatar returns reuses the frames it decoded (no decode of the file it just wrote): its
    frames and arrays equal, value and dtype, those of Avatar.load over the cache with every hash checked."""
    from nbhelpers.avatar import Avatar
    from nbhelpers.framestore import FrameStore

    folder, avatar = prepared
    assert isinstance(avatar.frames(), FrameStore)
    fresh = Avatar.load(folder, avatar.pipe, check=True)
    assert fresh.frame_shape == avatar.frame_shape == (768, 576) and fresh.n_frames == avatar.n_frames
    for name in ("crop_boxes", "has_face", "latents_np", "squares"):
        a, b = getattr(avatar, name), getattr(fresh, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert len(avatar.masks) == len(fresh.masks) == 12
    for a, b in zip(avatar.masks, fresh.masks, strict=True):
        assert a.dtype == b.dtype == np.uint8
        np.testing.assert_array_equal(a, b)
    mine, theirs = avatar.frames(), fresh.frames()
    for j in (0, 5, 11, -1):
        np.testing.assert_array_equal(mine[j], theirs[j], err_msg=f"frame {j}")
    np.testing.assert_array_equal(mine[[3, 2, 10]], theirs[[3, 2, 10]])
    np.testing.assert_array_equal(np.asarray(mine[:]), theirs[:])


@pytest.mark.parametrize("stage, error", [("nbhelpers.blending.materials_for_frames", RuntimeError),
                                          ("nbhelpers.faces.track", KeyboardInterrupt)])
def test_a_failed_prepare_stops_the_frame_writer_and_leaves_nothing(stage, error, clip, tiny_weights, config,
                                                                    tmp_path, monkeypatch):
    """An error or Ctrl-C part way left an empty avatar folder: nothing the preparation made is left."""
    import threading

    from nbhelpers import framestore as fs_mod
    from nbhelpers import prepare_avatar

    stores = []
    real_store = fs_mod.FrameStore

    class Recording(real_store):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            stores.append(self)

    def broken(*a, **k):
        raise error("failed on purpose")

    monkeypatch.setattr("nbhelpers.avatar.prepare.FrameStore", Recording)
    monkeypatch.setattr(stage, broken)
    (tmp_path / "kept").mkdir()
    for folder in (tmp_path / "new" / "face", tmp_path / "kept"):
        with pytest.raises(error, match="on purpose"):
            prepare_avatar(clip, folder, config=config, boxes=BOX, weights_dir=tiny_weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # no avatar folder, nor the folder made for it
    assert list((tmp_path / "kept").iterdir()) == []  # a folder given is kept, without a .building- folder
    assert not any(t.name.startswith("avatar-ffv1") for t in threading.enumerate())
    assert len(stores) == 2 and not any(s.path.exists() or s.directory.exists() for s in stores)


def test_reload_without_recomputation(prepared, clip, tiny_weights, config, monkeypatch):
    from nbhelpers import prepare_avatar

    folder, _ = prepared

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr("nbhelpers.avatar.cache.write_lossless", boom)
    monkeypatch.setattr("nbhelpers.faces.track", boom)
    again = prepare_avatar(clip, folder, config=config.replace(batch_size=3), boxes=BOX, weights_dir=tiny_weights)
    assert again.loaded_from_cache and again.rebuild_reason == ""


def test_one_box_in_a_list_is_that_box_and_a_wrong_count_gives_the_videos(prepared, clip, tiny_weights, config,
                                                                           tmp_path, monkeypatch):
    """A one-box list is that box for every frame (the same avatar as the bare box: its cache is reused). Per-frame
    boxes of another length are refused before a pipeline is made, and the refusal counts the video's 12 frames (an
    avatar keeps every frame of its video), not the 8 of the first preparation batch."""
    from nbhelpers import latents, prepare_avatar
    from nbhelpers.errors import InputError
    from nbhelpers.pipeline import MuseTalkPipeline

    folder, _ = prepared
    again = prepare_avatar(clip, folder, config=config, boxes=[BOX], weights_dir=tiny_weights)
    assert again.loaded_from_cache and again.crop_boxes.tolist() == [list(BOX)] * 12
    seen = {}

    def stop(frames, crop_boxes, *args, **kwargs):  # past tracking, the path is the bare box's (tested above)
        seen["crop"] = np.asarray(crop_boxes).tolist()
        raise RuntimeError("stopped after tracking")

    monkeypatch.setattr(latents, "encode_frames", stop)
    with pytest.raises(RuntimeError, match="stopped after tracking"):
        prepare_avatar(clip, tmp_path / "one", config=config, boxes=[BOX], weights_dir=tiny_weights)
    assert seen["crop"] == [list(BOX)] * 12

    def no_pipeline(*args, **kwargs):
        raise AssertionError("a pipeline was made before the boxes were checked")

    monkeypatch.setattr(MuseTalkPipeline, "from_pretrained", no_pipeline)
    for n in (5, 8, 13):
        with pytest.raises(InputError, match=rf"boxes has {n} entries but video '[^']*{re.escape(clip.name)}' "
                                             r"has 12 frames at 25 fps\. .*exactly 12 entries, a box or None"):
            prepare_avatar(clip, tmp_path / f"n{n}", config=config, boxes=[BOX] * n, weights_dir=tiny_weights)
        assert not (tmp_path / f"n{n}").exists()


@pytest.mark.parametrize("change", ["parameter", "source", "truncate", "corrupt", "manifest"])
def test_changes_and_damage_rebuild(change, prepared, clip, tiny_weights, config, tmp_path, face_clip):
    from nbhelpers import prepare_avatar

    folder, _ = prepared
    work = tmp_path / "copy"
    shutil.copytree(folder, work)
    video, cfg = clip, config
    if change == "parameter":
        cfg = config.replace(extra_margin=12)
    elif change == "source":
        video = face_clip(12, start_s=2)
    elif change == "truncate":
        p = work / "avatar.npz"
        p.write_bytes(p.read_bytes()[:-100])
    elif change == "corrupt":
        p = work / "frames.mkv"
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    elif change == "manifest":
        (work / "avatar.json").write_text("{not json")
    rebuilt = prepare_avatar(video, work, config=cfg, boxes=BOX, weights_dir=tiny_weights)
    assert not rebuilt.loaded_from_cache and rebuilt.rebuild_reason
    assert prepare_avatar(video, work, config=cfg, boxes=BOX, weights_dir=tiny_weights).loaded_from_cache


def test_generate_matches_offline_job(prepared, clip, speech, tiny_weights, config, tmp_path, ffmpeg):
    from nbhelpers import lipsync, media

    folder, avatar = prepared
    got: dict[int, np.ndarray] = {}
    result = avatar.generate(speech, tmp_path / "rt.mp4", frame_callback=lambda t, f: got.__setitem__(t, f.copy()))
    n = len(media.load_audio(speech)) * 25 // 16000
    assert result.n_frames == n == len(got) == 18  # every frame, the last included (Q9)
    assert result.generation_fps > 0 and result.end_to_end_fps > 0
    assert media.probe(result.output).frame_count == n

    ref: dict[int, np.ndarray] = {}
    lipsync(clip, speech, tmp_path / "off.mp4", config=config, boxes=BOX, weights_dir=tiny_weights,
            frame_callback=lambda t, f: ref.__setitem__(t, f.copy()))
    assert sorted(ref) == sorted(got)
    for t in ref:
        np.testing.assert_array_equal(got[t], ref[t], err_msg=f"frame {t}")

    streamed = list(avatar.stream(speech))
    assert len(streamed) == n
    np.testing.assert_array_equal(streamed[-1], ref[n - 1])
    measured = avatar.generate(speech, output=False)
    assert measured.output is None and measured.n_frames == n


def test_close_removes_the_local_frames_and_the_file_serves_them(prepared):
    from nbhelpers.avatar import LosslessFrames

    folder, avatar = prepared
    raw = avatar.frames().path
    first = np.array(avatar.frames()[0])
    assert raw.is_file()
    avatar.close()
    assert not raw.exists()
    assert isinstance(avatar.frames(), LosslessFrames)
    np.testing.assert_array_equal(avatar.frames()[0], first)


@pytest.mark.parametrize("state, reason", [
    ("empty", "no avatar in {d} yet (the folder is empty)"),
    ("absent", "no avatar in {d} yet (the folder is not there)"),
    ("no manifest", "{d} holds no complete avatar (avatar.json is missing)"),
    ("bad manifest", "{d}/avatar.json is unreadable (Expecting value"),
])
def test_loading_what_is_not_an_avatar_says_how_to_make_one(tmp_path, state, reason):
    from nbhelpers.avatar import load_avatar
    from nbhelpers.errors import CacheError

    d = tmp_path / "avatar"
    if state != "absent":
        d.mkdir()
    if state == "no manifest":
        (d / "frames.mkv").write_bytes(b"x")
    if state == "bad manifest":
        (d / "avatar.json").write_text("")
    with pytest.raises(CacheError) as caught:
        load_avatar(d)
    text = str(caught.value)
    assert text.startswith(reason.format(d=d))
    assert f"python -m nbhelpers avatar prepare VIDEO {d}" in text and "preparing it again" in text


def test_a_whole_clip_plans_its_own_batch_and_gives_the_same_frames(prepared, clip, speech, tiny_weights,
                                                                   tmp_path):
    """Avatar.generate plans kind "clip" (a larger cap: nothing waits for its first frame) while live sessions and
    stream() keep the realtime batch; the frames do not depend on the batch."""
    from nbhelpers import InferenceConfig
    from nbhelpers.avatar import Avatar
    from nbhelpers.pipeline import MuseTalkPipeline

    folder, _ = prepared
    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu"))
    real, kinds = pipe.plan, []

    def plan(kind, config, *args, **kwargs):  # distinct batches per kind (on the CPU all would be 4)
        kinds.append(kind)
        planned = real(kind, config, *args, **kwargs)
        return planned if config.batch_size else planned.replace(batch_size={"clip": 5, "realtime": 3,
                                                                              "avatar": 7}[kind])

    pipe.plan = plan
    avatar = Avatar.load(folder, pipe, config=InferenceConfig(device="cpu"))
    got: dict[int, np.ndarray] = {}
    result = avatar.generate(speech, tmp_path / "clip.mp4", frame_callback=lambda t, f: got.__setitem__(t, f.copy()))
    assert result.config.batch_size == 5 and avatar.config.batch_size == 3 and set(kinds) == {"clip", "realtime"}
    streamed = list(avatar.stream(speech))
    assert len(streamed) == len(got) == result.n_frames == 18
    for t, frame in enumerate(streamed):
        diff = np.abs(frame.astype(np.int16) - got[t].astype(np.int16)).max()
        assert diff <= 1, f"frame {t}: batch 5 and batch 3 differ by {diff} levels"
    avatar.close()
    # A freshly prepared avatar plans its clips the same way: the preparation's batch (7) is not one asked for.
    from nbhelpers import prepare_avatar

    fresh = prepare_avatar(clip, tmp_path / "fresh", pipe, config=InferenceConfig(device="cpu"), boxes=BOX)
    assert "avatar" in kinds
    again = fresh.generate(speech, output=False)
    assert (again.config.batch_size, fresh.config.batch_size) == (5, 3)
    fresh.close()


def test_generate_refuses_an_audio_or_output_that_is_not_a_path(prepared):
    """An int or a list as audio/output is an InputError naming the argument, before any model runs."""
    from nbhelpers.errors import InputError

    _, avatar = prepared
    with pytest.raises(InputError, match=r"^audio must be a file path .*; got int 5\."):
        avatar.generate(5)
    with pytest.raises(InputError, match=r"^output must be a file path .*; got list \['o.mp4'\]"):
        avatar.generate(np.zeros(16000, np.float32), ["o.mp4"])


def test_audio_under_one_frame_is_refused_before_the_models_plan_or_load(prepared, lavfi_tone, tone_1s, tiny_weights,
                                                                        tmp_path, monkeypatch, capsys):
    """Audio shorter than one frame (0.04 s) is an InputError before the models plan or load: in generate and stream
    (a file or a waveform) by its samples, in `avatar generate` for every file by a probe, before the avatar loads."""
    from nbhelpers.avatar import Avatar
    from nbhelpers.cli.main import main
    from nbhelpers.errors import InputError

    folder, avatar = prepared
    blip = lavfi_tone(0.01)
    fresh = Avatar.load(folder, avatar.pipe)  # no device state yet: generating would plan and load first

    def no_models(*args, **kwargs):
        raise AssertionError("models planned or loaded before the audio's length was checked")

    monkeypatch.setattr(avatar.pipe, "plan", no_models)
    monkeypatch.setattr(avatar.pipe, "models_for", no_models)
    monkeypatch.setattr(avatar.pipe, "features", no_models)
    for audio in (blip, np.zeros(160, np.float32)):
        with pytest.raises(InputError, match=r"lasts 0\.010 s, shorter than one frame \(1/25 s\)"):
            fresh.generate(audio, output=tmp_path / "o.mp4")
        with pytest.raises(InputError, match="shorter than one frame"):
            next(fresh.stream(audio))
    monkeypatch.setattr("nbhelpers.cli.avatar.load_avatar", no_models)
    assert main(["avatar", "generate", str(folder), str(tone_1s), str(blip), "--weights", str(tiny_weights)]) == 2
    assert f"error: audio {str(blip)!r} lasts 0.010 s, shorter than one frame" in capsys.readouterr().err
    assert not (tmp_path / "o.mp4").exists()


def test_the_weights_fingerprint_covers_the_vae_parsing_and_landmark_files(tmp_path):
    """The crop boxes come from the landmark models, so their files are in the fingerprint beside the VAE and
    BiSeNet; the UNet and whisper, which run at generate time, are not."""
    import os

    from nbhelpers.avatar.cache import weights_fingerprint

    files = ["sd-vae/config.json", "sd-vae/diffusion_pytorch_model.bin", "face-parse-bisent/79999_iter.pth",
             "s3fd/s3fd-619a316812.pth", "dwpose/dw-ll_ucoco_384.pth", "musetalkV15/unet.pth", "whisper/config.json"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * 10)
    before = weights_fingerprint(tmp_path)
    assert sorted(before) == sorted(files[:5])
    os.utime(tmp_path / "s3fd/s3fd-619a316812.pth", (1e9, 1e9))
    assert weights_fingerprint(tmp_path) != before


def test_a_folder_given_as_the_video_is_named_a_folder(tiny_weights, tmp_path):
    """``avatar prepare DIR OUT`` with an existing folder as the video said it 'does not exist'."""
    from nbhelpers import prepare_avatar
    from nbhelpers.errors import InputError

    (tmp_path / "clips").mkdir()
    with pytest.raises(InputError, match=r"^video '.*clips' is a folder; give a video or photo of a face\.$"):
        prepare_avatar(tmp_path / "clips", tmp_path / "avatar", weights_dir=tiny_weights)
    with pytest.raises(InputError, match="does not exist"):
        prepare_avatar(tmp_path / "missing.mp4", tmp_path / "avatar", weights_dir=tiny_weights)
