"""Several faces in one video: tracks over time, the choice of one, and only that one repainted.

Media: the shared face video at 192x256 beside its mirror image (hstack), with a cut half-way that swaps the two
halves; the dlib backend finds the faces, tiny random weights repaint them.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from nbhelpers import InferenceConfig
from nbhelpers.checks import check_inputs
from nbhelpers.cli.terms import cli_terms
from nbhelpers.config import parse_face
from nbhelpers.errors import InputError
from nbhelpers.framestore import cycle_index

pytest.importorskip("dlib")

W, H, N = 384, 256, 16  # the side-by-side clip: two 192x256 halves, 16 frames, a cut before frame 8
SWAP = ("[0:v]trim=end_frame=16,scale=192:256,split=2[a][b];[b]hflip[m];[a]split[a1][a2];[m]split[m1][m2];"
        "[a1][m1]hstack,trim=end_frame=8[p];[m2][a2]hstack,trim=start_frame=8,setpts=PTS-STARTPTS[q];"
        "[p][q]concat=n=2:v=1:a=0")


@pytest.fixture(scope="module")
def two_faces(shared_data, make_media):
    """The face and its mirror image side by side; the halves swap at frame 8 (a cut)."""
    return make_media("two-faces-swap.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"),
                      "-filter_complex", SWAP, "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")


@pytest.fixture(scope="module")
def speech(shared_data, make_media):
    return make_media("speech-0.64s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-t", "0.64")


def _frames(path, ffmpeg):
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "bgr24", "-"],
                         check=True, capture_output=True).stdout
    return np.frombuffer(out, dtype=np.uint8).reshape(-1, H, W, 3)


def test_face_choices_parse_and_bad_ones_are_refused():
    assert parse_face("largest").kind == "largest" and InferenceConfig().face == "largest"
    assert parse_face(2).track == 2 and parse_face("3").track == 3
    point = parse_face("120, 80@7")
    assert (point.kind, point.point, point.frame) == ("point", (120.0, 80.0), 7)
    box = parse_face("10,20,110,140")
    assert (box.kind, box.box, box.frame) == ("box", (10.0, 20.0, 110.0, 140.0), 0)
    for bad in ("left", -1, True, "1,2,3", "50,50,10,10", 1.5):
        with pytest.raises(InputError, match="face must be"):
            InferenceConfig(face=bad)


def test_the_jobs_file_and_the_avatar_cache_take_the_choice(tmp_path):
    from nbhelpers.avatar.cache import CACHED_FIELDS
    from nbhelpers.batch.jobs import job_configs, read_jobs

    jobs_file = tmp_path / "jobs.csv"
    jobs_file.write_text('video,audio,output,face\na.mp4,a.wav,oa.mp4,1\nb.mp4,b.wav,ob.mp4,"120,80@4"\n'
                         "c.mp4,c.wav,oc.mp4,\n", "utf-8")
    configs = job_configs(read_jobs(jobs_file), InferenceConfig())
    assert [c.face for c in configs.values()] == [1, "120,80@4", "largest"]
    jobs_file.write_text("video,audio,face\na.mp4,a.wav,left\n", "utf-8")
    with pytest.raises(InputError, match="line 2, setting face: must be 'largest', 'speaker', a track number"):
        read_jobs(jobs_file)
    assert "face" in CACHED_FIELDS and InferenceConfig(face="Largest").face == "largest"


def test_tracks_keep_their_numbers_over_a_cut_that_swaps_the_faces(two_faces):
    from nbhelpers import faces

    tracks = faces.find_tracks(two_faces, backend="dlib")
    assert len(tracks) == 2 and tracks.cuts == [8], tracks.summary()
    left, right = tracks[0], tracks[1]
    assert list(left.frames) == list(range(N)) == list(right.frames)
    centre = (left.boxes[:, 0] + left.boxes[:, 2]) / 2
    assert (centre[:8] < W / 2).all() and (centre[8:] > W / 2).all(), centre  # the face went right at the cut
    centre = (right.boxes[:, 0] + right.boxes[:, 2]) / 2
    assert (centre[:8] > W / 2).all() and (centre[8:] < W / 2).all(), centre
    assert [n for n, _ in tracks.at(0)] == [0, 1]
    assert left.thumbnail.shape == (64, 64, 3) and left.thumbnail.dtype == np.uint8
    html = tracks._repr_html_()
    assert html.count("<img") == 2 and "track 1: frames 0-15" in html
    assert tracks.select("100,80") == 0 and tracks.select("300,80") == 1 and tracks.select("300,80@8") == 0


def test_a_track_that_does_not_exist_or_a_point_on_no_face_is_a_clear_error(two_faces):
    from nbhelpers import faces

    with pytest.raises(InputError, match=r"no face track 5; the tracks are track 0: frames 0-15.*track 1"):
        faces.track(two_faces, backend="dlib", config=InferenceConfig(face=5))
    with pytest.raises(InputError, match=r"^face: the point 5,5 in frame 0 lies on no face; the nearest is track 0 "
                                         r"at \(\d+, \d+, \d+, \d+\), \d+ px away") as caught:
        faces.track(two_faces, backend="dlib", config=InferenceConfig(face="5,5"))
    assert cli_terms(str(caught.value)).startswith("--face: the point 5,5 in frame 0 lies on no face; the nearest")
    with pytest.raises(InputError, match="with boxes given"):
        faces.track(two_faces, config=InferenceConfig(face=1), boxes=(0, 0, 100, 100))


@pytest.mark.parametrize("face", ["99999,99999", "-1,10", "384,0", "400,0,500,100@3", "-50,-50,-1,20"])
def test_a_point_or_box_off_the_frame_is_refused_by_the_input_checks(face, two_faces, speech, tiny_weights, tmp_path):
    """Refused with the frame size before any face is searched, by lipsync's checks and by prepare_avatar."""
    from nbhelpers import prepare_avatar

    config = InferenceConfig(face=face, landmark_backend="dlib")
    want = f"--face '{face}' lies outside the frame: the video is 384x256 pixels (x from 0 to 383, y from 0 to 255)"
    with pytest.raises(InputError) as caught:
        check_inputs(two_faces, speech, tmp_path / "out.mp4", config=config, weights_dir=tiny_weights)
    assert cli_terms(str(caught.value)).startswith(want)
    with pytest.raises(InputError, match="lies outside the frame"):
        prepare_avatar(two_faces, tmp_path / "avatar", config=config, weights_dir=tiny_weights)
    assert not (tmp_path / "avatar").exists()
    assert check_inputs(two_faces, speech, config=InferenceConfig(face="383,255,999,999"), weights_dir=tiny_weights)


@pytest.mark.parametrize("face", ["100,80@16", "10,20,110,140@999"])
def test_a_frame_past_the_end_of_the_video_is_refused_by_the_input_checks(face, two_faces, speech, tiny_weights,
                                                                          tmp_path):
    """The frame after '@' is checked against the video's 16 frames before any face is searched."""
    from nbhelpers import prepare_avatar

    config = InferenceConfig(face=face, landmark_backend="dlib")
    frame = face.split("@")[1]
    want = f"--face '{face}' names frame {frame}, but the video has {N} frames at 25 fps (0 to {N - 1})"
    with pytest.raises(InputError) as caught:
        check_inputs(two_faces, speech, tmp_path / "out.mp4", config=config, weights_dir=tiny_weights)
    assert cli_terms(str(caught.value)).startswith(want)
    with pytest.raises(InputError, match=f"names frame {frame}, but the video has {N} frames"):
        prepare_avatar(two_faces, tmp_path / "avatar", config=config, weights_dir=tiny_weights)
    assert not (tmp_path / "avatar").exists()
    assert check_inputs(two_faces, speech, config=InferenceConfig(face=f"100,80@{N - 1}"), weights_dir=tiny_weights)


@pytest.mark.slow
@pytest.mark.parametrize(("face", "chosen"), [(1, 1), ("300,80@8", 0)])
def test_only_the_chosen_face_is_repainted(face, chosen, tiny_weights, two_faces, speech, ffmpeg, tmp_path):
    """Track 0 starts on the left and is on the right after the cut; the other half of every frame is untouched.
    A point in a later frame names the track there (track 0 is on the right after the cut)."""
    from nbhelpers import lipsync

    captured: dict[int, np.ndarray] = {}
    cfg = InferenceConfig(landmark_backend="dlib", batch_size=8, device="cpu", face=face)
    result = lipsync(two_faces, speech, tmp_path / "out.mp4", config=cfg, weights_dir=tiny_weights,
                     frame_callback=lambda t, f: captured.__setitem__(t, f.copy()))
    assert result.n_frames == N == len(captured) and result.no_face_frames == 0
    assert result.config.face == chosen
    source = _frames(two_faces, ffmpeg)
    for t, frame in captured.items():
        on_left = (t < 8) == (chosen == 0)
        mine, other = (slice(0, W // 2), slice(W // 2, W)) if on_left else (slice(W // 2, W), slice(0, W // 2))
        assert np.array_equal(frame[:, other], source[t][:, other]), f"frame {t}: the other face changed"
        assert not np.array_equal(frame[:, mine], source[t][:, mine]), f"frame {t}: the chosen face was not repainted"


@pytest.mark.slow
def test_an_avatar_repaints_the_chosen_face_and_caches_each_choice(tiny_weights, shared_data, make_media, ffmpeg,
                                                                   tmp_path):
    """One avatar folder prepared with face=0, then face=1: each clip repaints that face only, and the second choice
    rebuilds the cache (the key includes the choice) where the same choice again loads it."""
    from nbhelpers import prepare_avatar

    clip = make_media("two-faces-6.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-filter_complex",
                      "[0:v]trim=end_frame=6,scale=192:256,split=2[a][b];[b]hflip[m];[a][m]hstack", "-an",
                      "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")
    speech = make_media("speech-0.24s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-t", "0.24")
    source, halves = _frames(clip, ffmpeg), (slice(0, W // 2), slice(W // 2, W))
    for face, cached in ((0, False), (1, False), (1, True)):
        cfg = InferenceConfig(landmark_backend="dlib", device="cpu", face=face)
        avatar = prepare_avatar(clip, tmp_path / "avatar", config=cfg, weights_dir=tiny_weights)
        assert avatar.loaded_from_cache == cached, avatar.rebuild_reason
        assert cached or face == 0 or avatar.rebuild_reason == "settings changed: face 0 -> 1"
        captured: list[tuple[int, np.ndarray]] = []
        avatar.generate(speech, False, frame_callback=lambda t, f, into=captured: into.append((t, f.copy())))
        avatar.close()
        mine, other = halves[face], halves[1 - face]
        assert len(captured) == 6
        for t, frame in captured:
            assert np.array_equal(frame[:, other], source[t][:, other]), f"face={face}, frame {t}: the other changed"
            assert not np.array_equal(frame[:, mine], source[t][:, mine]), f"face={face}, frame {t}: not repainted"


def _warp_mouth(frames: np.ndarray, env: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """Stretch the rows of ``box`` about its middle by 1 + 0.8 x the normalised envelope: a mouth opening and
    shutting with the speech."""
    out = frames.copy()
    x1, y1, x2, y2 = box
    rows = np.arange(y2 - y1) - (y2 - y1) / 2
    for t, level in enumerate(env / env.max()):
        src = np.clip(np.round(y1 + (y2 - y1) / 2 + rows / (1 + 0.8 * level)).astype(int), 0, frames.shape[1] - 1)
        out[t, y1:y2, x1:x2] = frames[t, src, x1:x2]
    return out


def _warped_clip(warped, shared_data, make_media, ffmpeg, folder):
    """Two copies of the face side by side (50 frames); the mouth region of copy ``warped`` (0: left) opens and shuts
    with the envelope of 2 s of speech. Returns (clip, speech, envelope)."""
    from nbhelpers import media
    from nbhelpers.faces.speaker import envelope

    n = 50
    pair = make_media("two-faces-50.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-filter_complex",
                      "[0:v]trim=end_frame=50,scale=192:256,split=2[a][b];[b]hflip[m];[a][m]hstack", "-an",
                      "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")
    audio = make_media("speech-2s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-t", "2", "-ac", "1",
                       "-ar", "16000")
    env = envelope(media.load_audio(audio), n)
    box = (80, 84, 102, 100) if warped == 0 else (282, 84, 304, 100)  # the mouth of the left or the right copy
    frames = _warp_mouth(_frames(pair, ffmpeg)[:n], env, box)
    clip = folder / f"warped-{warped}.mp4"
    subprocess.run([ffmpeg, "-v", "error", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{W}x{H}", "-r", "25",
                    "-i", "-", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p", str(clip)],
                   input=frames.tobytes(), check=True)
    return clip, audio, env


@pytest.mark.parametrize("warped", [0, 1])
def test_the_speaker_is_the_face_whose_mouth_moves_with_the_audio(warped, shared_data, make_media, ffmpeg, tmp_path):
    from nbhelpers import faces
    from nbhelpers.faces.speaker import speaker_schedule

    n = 50
    clip, _, env = _warped_clip(warped, shared_data, make_media, ffmpeg, tmp_path)
    tracks = faces.find_tracks(clip, backend="dlib")
    assert len(tracks) == 2
    schedule, turns = speaker_schedule(tracks, env, np.arange(n))
    speech = [(t, turn.track) for turn in turns for t in range(turn.first, turn.last + 1)]
    assert len(speech) >= n // 2
    assert sum(track == warped for _, track in speech) >= 0.95 * len(speech), [str(t) for t in turns]
    assert (schedule[[t for t, _ in speech]] == warped).mean() >= 0.95


def test_syncnet_decides_the_speaker_when_its_weights_are_there(shared_data, make_media, ffmpeg, tmp_path):
    """A scorer that favours track 1 overrides the correlation (which picks the warped track 0); without the SyncNet
    weights there is no scorer, with them (random, official format) each turn is SyncNet's most confident track."""
    from nbhelpers import faces, media, quality
    from nbhelpers.faces.speaker import choose_face, speaker_schedule, syncnet_scorer

    clip, audio, env = _warped_clip(0, shared_data, make_media, ffmpeg, tmp_path)
    tracks = faces.find_tracks(clip, backend="dlib")
    _, plain = speaker_schedule(tracks, env, np.arange(50))
    _, stubbed = speaker_schedule(tracks, env, np.arange(50), lambda asks: [[t.number for t in c] for c, _, _ in asks])
    assert [t.track for t in stubbed] == [1] * len(plain) != [t.track for t in plain]
    assert {t.measure for t in stubbed} == {"LSE-C"} and {t.measure for t in plain} == {"r"}
    wave = media.load_audio(audio)[:16 * 640]  # 16 output frames
    assert syncnet_scorer(clip, wave, tmp_path) is None
    quality.write_tiny_syncnet(tmp_path, seed=1)
    scorer = syncnet_scorer(clip, wave, tmp_path, "cpu")
    config, _, turns = choose_face(InferenceConfig(face="speaker"), lambda: tracks, wave, 16, scorer)
    assert turns and "LSE-C=" in config.reasons["face"]
    for turn in turns:
        (confidence,) = scorer([(list(tracks), turn.first, np.arange(turn.first, turn.last + 1))])
        assert turn.measure == "LSE-C" and turn.track == int(np.argmax(confidence))
        assert turn.score == pytest.approx(max(confidence))


class _MeanEmbedder:
    """A SyncEmbedder whose embeddings follow the crops and MFCCs: the mean of each colour, the first 3 MFCCs."""

    def embed_video(self, stacks):
        return stacks.reshape(len(stacks), 3, -1).mean(axis=2) / 255

    def embed_audio(self, windows):
        return windows.reshape(len(windows), -1)[:, :3] / 50


def test_syncnet_scores_every_stretch_from_one_read_of_the_video(shared_data, make_media, ffmpeg, tmp_path,
                                                                   monkeypatch):
    """Three stretches of speech over 80 output frames (the last one in the ping-pong's reversed frames): the video
    is opened once, and each turn's confidences equal those of its own frames read and cut on their own."""
    from nbhelpers import faces, media
    from nbhelpers.faces import speaker
    from nbhelpers.quality import protocol_crops, smooth_face_boxes
    from nbhelpers.quality.mfcc import mfcc
    from nbhelpers.quality.sync import score_crops

    clip, _, _ = _warped_clip(0, shared_data, make_media, ffmpeg, tmp_path)
    tracks = faces.find_tracks(clip, backend="dlib")
    (tmp_path / "syncnet").mkdir()
    (tmp_path / "syncnet" / "syncnet_v2.model").touch()
    monkeypatch.setattr(speaker, "load_syncnet", lambda *a: _MeanEmbedder())
    t = np.arange(80 * 640) / 16000
    wave = (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    for quiet in ((12, 17), (40, 46)):  # silences of 5 and 6 frames end the stretches
        wave[quiet[0] * 640:quiet[1] * 640] = 0
    scorer = speaker.syncnet_scorer(clip, wave, tmp_path, "cpu")
    opened, init = [], media.video.VideoReader.__init__  # every read of a video opens a VideoReader
    monkeypatch.setattr(media.video.VideoReader, "__init__",
                        lambda self, *a, **k: opened.append(a) or init(self, *a, **k))
    _, _, turns = speaker.choose_face(InferenceConfig(face="speaker"), lambda: tracks, wave, 80, scorer)
    assert [(turn.first, turn.measure) for turn in turns] == [(0, "LSE-C"), (17, "LSE-C"), (46, "LSE-C")]
    assert len(opened) == 1
    cc = mfcc(wave, 16000)
    for turn in turns:
        sources = np.asarray(cycle_index(np.arange(turn.first, turn.last + 1), 50))[:50]
        frames, confidences = media.frames_at(clip, sources.tolist()), []
        for track in tracks:
            boxes = np.array([track.boxes[list(track.frames).index(s)] for s in sources], dtype=np.float64)
            crops = protocol_crops(frames, smooth_face_boxes(boxes))
            confidences.append(score_crops(crops, cc[:, 4 * turn.first:], _MeanEmbedder()).lse_c)
        assert len(set(confidences)) == 2 and turn.track == int(np.argmax(confidences))
        assert turn.score == max(confidences)


def test_speaker_needs_the_audio():
    from nbhelpers.faces.tracks import FaceChooser

    assert InferenceConfig(face="Speaker").face == "speaker"
    with pytest.raises(InputError, match="needs the audio"):
        FaceChooser("speaker")


@pytest.mark.slow
def test_lipsync_repaints_the_speaker_only(tiny_weights, shared_data, make_media, ffmpeg, tmp_path):
    """The job's face='speaker' path: the warped (left) copy speaks in the first 0.64 s; the right half is untouched
    and the clip's reasons say who spoke when."""
    from nbhelpers import lipsync

    clip, _, _ = _warped_clip(0, shared_data, make_media, ffmpeg, tmp_path)
    speech = make_media("speech-0.64s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-t", "0.64")
    source = _frames(clip, ffmpeg)
    captured: dict[int, np.ndarray] = {}
    cfg = InferenceConfig(landmark_backend="dlib", batch_size=8, device="cpu", face="speaker")
    result = lipsync(clip, speech, tmp_path / "speaker.mp4", config=cfg, weights_dir=tiny_weights,
                     frame_callback=lambda t, f: captured.__setitem__(t, f.copy()))
    assert result.config.face == "speaker" and result.config.reasons["face"].startswith("speaker: track 0 in frames")
    assert result.turns and result.turns[0].track == 0 and str(result.turns[0]) in result.config.reasons["face"]
    assert len(captured) == N
    for t, frame in captured.items():
        assert np.array_equal(frame[:, W // 2:], source[t][:, W // 2:]), f"frame {t}: the silent face changed"
    assert any(not np.array_equal(f[:, :W // 2], source[t][:, :W // 2]) for t, f in captured.items())


def test_a_batch_run_again_after_a_rewind_links_as_the_first_time():
    """An out-of-memory halving runs a batch again: TrackLinker.mark cuts the history back to the batch start."""
    from nbhelpers.faces.tracks import TrackLinker

    rng = np.random.default_rng(0)
    faces_ = [rng.integers(0, 255, (60, 60, 3), dtype=np.uint8) for _ in range(2)]
    frames, dets = [], []
    for i in range(12):
        frame = np.full((100, 200, 3), 90, np.uint8)
        left, right = (0, 1) if i < 6 else (1, 0)  # a cut swaps the two faces at frame 6
        frame[20:80, 20:80], frame[20:80, 120:180] = faces_[left], faces_[right]
        frames.append(frame)
        dets.append(np.array([[20 + i % 2, 20, 80, 80, 0.9], [120, 20, 180, 80, 0.8]]))

    def run(rewind: bool):
        linker = TrackLinker()
        for i in range(12):
            if i % 4 == 0:
                linker.mark(i)
            linker.add(frames[i], dets[i])
            if rewind and i == 6:
                linker.mark(4)
                for j in (4, 5, 6):
                    linker.add(frames[j], dets[j])
                rewind = False
        return linker.result()

    straight, again = run(False), run(True)
    assert straight.cuts == [6] == again.cuts
    for a, b in zip(straight, again, strict=True):
        assert np.array_equal(a.frames, b.frames) and np.array_equal(a.boxes, b.boxes)
    left_of = [straight.at(i)[0][0] if straight.at(i)[0][1][0] < 100 else straight.at(i)[1][0] for i in range(12)]
    assert left_of == [0] * 6 + [1] * 6  # the face that was on the left moved right at the cut


def test_the_command_line_takes_the_face_as_given():
    from nbhelpers.cli.flags import inference_config
    from nbhelpers.cli.parser import build_parser

    parser = build_parser()
    for given, face in (("120,80@3", "120,80@3"), ("1", 1), ("speaker", "speaker")):
        assert inference_config(parser.parse_args(["lipsync", "v.mp4", "a.wav", "--face", given])).face == face
    assert inference_config(parser.parse_args(["avatar", "prepare", "v.mp4", "dir", "--face", "0"])).face == 0
