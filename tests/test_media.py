"""Tests of nbhelpers.media: probing, 25 fps reading, audio decoding, writing. All need no torch.

Synthetic clips are tiny (64x48, 2 s) and made with ffmpeg's lavfi sources; the real face video and speech come
from ../shared/data through the ``shared_data`` fixture. Known answers come from independent decodes (a direct
ffmpeg command, librosa, numpy), never from the code under test.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from helpers import decode_frames, loaded_by, passthrough

from nbhelpers import media
from nbhelpers.errors import FFmpegError, InputError, MediaError, NoAudioError
from nbhelpers.media import ffmpeg as media_ffmpeg
from nbhelpers.media import probing

pytestmark = pytest.mark.notorch

FRAME = 1 / 25  # seconds per output frame
STEREO = "aevalsrc=0.5*sin(2*PI*440*t)|0.3*sin(2*PI*660*t):s=48000:d=2"  # two different channels, 48 kHz


# ---------------------------------------------------------------------------------------------------------------
# helpers: independent decodes
# ---------------------------------------------------------------------------------------------------------------

def native_mono(ffmpeg: str, path: Path, channels: int) -> np.ndarray:
    """Native-rate float32 samples mean-mixed to mono, decoded by a plain ffmpeg command to raw f32le."""
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(path), "-map", "0:a:0", "-f", "f32le", "-c:a", "pcm_f32le",
                          "-"], stdin=subprocess.DEVNULL, capture_output=True, check=True).stdout
    return np.frombuffer(out, "<f4").reshape(-1, channels).T.mean(axis=0)


def stream_count(ffmpeg: str, path: Path, spec: str) -> int:
    """Packets (= frames) of one stream, counted by demuxing (one framemd5 line per packet)."""
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(path), "-map", spec, "-c", "copy", "-f", "framemd5", "-"],
                         stdin=subprocess.DEVNULL, capture_output=True, check=True).stdout.decode()
    return sum(1 for line in out.splitlines() if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def stereo_m4a(make_media):
    """2 s of STEREO in AAC (.m4a): a format libsndfile cannot read."""
    return make_media("stereo48k.m4a", "-f", "lavfi", "-i", STEREO, "-c:a", "aac")


@pytest.fixture(scope="module")
def clip_with_sound(make_media):
    """2 s of 64x48 testsrc at 30 fps with STEREO in AAC."""
    return make_media("with-sound.mp4", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=30:duration=2", "-f", "lavfi",
                      "-i", STEREO, "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest")


# ---------------------------------------------------------------------------------------------------------------
# ffmpeg binary, import weight
# ---------------------------------------------------------------------------------------------------------------

def test_uses_imageio_ffmpeg_binary(ffmpeg, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert media.ffmpeg_exe() == ffmpeg  # no ffmpeg on PATH -> still works
    assert media.ffmpeg_version(ffmpeg) >= (4, 2)
    assert media_ffmpeg._parse_version("ffmpeg version 4.4.2-0ubuntu0.22.04.1 Copyright") == (4, 4)
    assert media_ffmpeg._parse_version("ffmpeg version n9.0.2-17-g2a571b6068-20260930") == (9, 0)
    assert media_ffmpeg._parse_version("ffmpeg version N-112345-gdeadbeef") == (99, 0)


def test_import_is_light():
    assert loaded_by("import nbhelpers.media", ("torch", "cv2", "librosa", "skimage")) == []


# ---------------------------------------------------------------------------------------------------------------
# probe: parser on what ffmpeg 4.4 / 6 / 9 print
# ---------------------------------------------------------------------------------------------------------------

FFMPEG_44_PHONE = """\
Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'IMG_0001.MOV':
  Metadata:
    major_brand     : qt
    minor_version   : 0
    creation_time   : 2021-05-01T12:00:00.000000Z
    com.apple.quicktime.make: Apple
  Duration: 00:00:05.03, start: 0.000000, bitrate: 8150 kb/s
    Stream #0:0(und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(tv, bt709), 1920x1080, 8000 kb/s, 29.97 fps, 29.97 tbr, 600 tbn, 1200 tbc (default)
    Metadata:
      rotate          : 90
      creation_time   : 2021-05-01T12:00:00.000000Z
      handler_name    : Core Media Video
    Side data:
      displaymatrix: rotation of -90.00 degrees
    Stream #0:1(und): Audio: aac (LC) (mp4a / 0x6134706D), 44100 Hz, stereo, fltp, 128 kb/s (default)
    Metadata:
      handler_name    : Core Media Audio
At least one output file must be specified
"""  # noqa: E501

FFMPEG_44_TAG_ONLY = """\
Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'old phone.mp4':
  Duration: 00:00:02.00, start: 0.000000, bitrate: 20 kb/s
    Stream #0:0(eng): Video: h264 (Constrained Baseline) (avc1 / 0x31637661), yuv420p, 640x480 [SAR 1:1 DAR 4:3], 14 kb/s, 30 fps, 30 tbr, 15360 tbn, 60 tbc (default)
    Metadata:
      rotate          : 270
      handler_name    : VideoHandler
At least one output file must be specified
"""  # noqa: E501

FFMPEG_6_HDR = """\
Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'hdr.mov':
  Metadata:
    comment         : hello
  Duration: 00:00:01.50, start: 0.000000, bitrate: 45000 kb/s
  Stream #0:0[0x1](und): Video: hevc (Main 10) (hvc1 / 0x31637668), yuv420p10le(tv, bt2020nc/bt2020/arib-std-b67), 3840x2160, 45000 kb/s, 59.94 fps, 59.94 tbr, 600 tbn (default)
    Metadata:
      handler_name    : Core Media Video
    Side data:
      DOVI configuration record: version: 1.0, profile: 8, level: 10, rpu flag: 1, el flag: 0, bl flag: 1, compatibility id: 4
      displaymatrix: rotation of 180.00 degrees
  Stream #0:1[0x2](und): Audio: ac3 (ac-3 / 0x332D6361), 48000 Hz, 5.1(side), fltp, 448 kb/s (default)
"""  # noqa: E501

FFMPEG_9_MP3_COVER = """\
[aist#0:0/mp3 @ 0x55] Estimating duration from bitrate, this may be inaccurate
Input #0, mp3, from 'song.mp3':
  Metadata:
    title           : Song
  Duration: 00:03:10.52, start: 0.025057, bitrate: 128 kb/s
  Stream #0:0: Audio: mp3 (mp3float), 44100 Hz, stereo, fltp, 128 kb/s
  Stream #0:1: Video: mjpeg (Baseline), yuvj420p(pc, bt470bg/unknown/unknown), 500x500 [SAR 1:1 DAR 1:1], 90k tbr, 90k tbn (attached pic)
    Metadata:
      comment         : Cover (front)
"""  # noqa: E501


def test_parse_ffmpeg44_phone_clip_rotation_tag_and_displaymatrix():
    info = probing._parse_ffmpeg_info(FFMPEG_44_PHONE, Path("IMG_0001.MOV"))
    assert info.rotation == 90  # clockwise, the phone's `rotate` tag convention
    assert (info.width, info.height) == (1080, 1920)  # upright size
    assert (info.video_stream.width, info.video_stream.height) == (1920, 1080)  # stored size
    assert info.fps == Fraction(30000, 1001)
    assert info.duration_s == pytest.approx(5.03)
    assert info.pix_fmt == "yuv420p" and info.video_codec == "h264"
    assert info.has_audio and info.sample_rate == 44100 and info.channels == 2 and info.audio_codec == "aac"
    assert not info.is_image


def test_parse_rotate_tag_only_and_ffmpeg6_side_data():
    info = probing._parse_ffmpeg_info(FFMPEG_44_TAG_ONLY, Path("x.mp4"))
    assert info.rotation == 270 and (info.width, info.height) == (480, 640)
    assert info.video_stream.language == "eng"
    hdr = probing._parse_ffmpeg_info(FFMPEG_6_HDR, Path("hdr.mov"))
    assert hdr.rotation == 180 and (hdr.width, hdr.height) == (3840, 2160)
    assert hdr.pix_fmt == "yuv420p10le" and hdr.fps == Fraction(60000, 1001)
    assert hdr.channels == 6 and hdr.sample_rate == 48000 and hdr.comment == "hello"


def test_parse_cover_art_is_not_video():
    info = probing._parse_ffmpeg_info(FFMPEG_9_MP3_COVER, Path("song.mp3"))
    assert info.has_audio and not info.has_video and info.width is None
    assert info.start_s == pytest.approx(0.025057)
    assert [s.kind for s in info.streams] == ["audio", "video"] and info.streams[1].attached_pic


def test_parse_rates():
    assert probing._parse_rate("29.97") == Fraction(30000, 1001)
    assert probing._parse_rate("23.98") == Fraction(24000, 1001)
    assert probing._parse_rate("25") == 25 and probing._parse_rate("1k") == 1000
    assert probing._parse_rate("12.5") == Fraction(25, 2)


# ---------------------------------------------------------------------------------------------------------------
# probe on real files
# ---------------------------------------------------------------------------------------------------------------

def test_probe_real_video_and_audio(shared_data):
    info = media.probe(shared_data / "face-sing-576x768-25fps.mp4")
    assert (info.width, info.height, info.fps, info.rotation) == (576, 768, 25, 0)
    assert info.duration_s == pytest.approx(22.0) and info.frame_count == 550
    assert info.has_video and not info.has_audio and not info.is_image
    html = info._repr_html_()
    assert "576x768" in html and "<table>" in html and "576x768" in repr(info)
    wav = media.probe(shared_data / "sing-44k1-mono.wav")
    assert (wav.sample_rate, wav.channels, wav.has_video) == (44100, 1, False)
    photo = media.probe(shared_data / "face-photo-man.png")
    assert photo.is_image and photo.frame_count == 1 and (photo.width, photo.height) == (1024, 1536)


def test_image_detected_by_content_not_extension(shared_data, tmp_path):
    disguised = tmp_path / "still.bin"
    shutil.copyfile(shared_data / "face-photo-man.png", disguised)
    assert media.probe(disguised).is_image
    with media.load_video(disguised) as reader:
        frames = list(reader)
    assert len(frames) == 1 and frames[0].shape == (1536, 1024, 3)


# ---------------------------------------------------------------------------------------------------------------
# load_video: 25 fps CFR from any rate
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rate", ["30", "30000/1001", "60", "18"])
def test_any_rate_comes_out_at_25fps(lavfi_video, rate):
    clip = lavfi_video(seconds=2, rate=rate)
    with media.load_video(clip) as reader:
        count = reader.frame_count
        frames = list(reader)
    duration = media.probe(clip).duration_s
    assert len(frames) == count  # the count is exactly what iteration yields
    assert count == round(duration * 25)  # documented rule
    assert abs(count * FRAME - duration) <= FRAME
    assert all(f.shape == (48, 64, 3) and f.dtype == np.uint8 and f.flags.c_contiguous for f in frames)


def test_retiming_picks_frames_by_timestamp(make_media):
    # lossless RGB clip at 30 fps whose red channel is the source frame number
    clip = make_media("index30.mkv", "-f", "lavfi", "-i",
                      "color=c=black:s=64x48:r=30:d=2,format=gbrp,geq=r='N':g='128':b='255-N'",
                      "-c:v", "ffv1", "-pix_fmt", "gbrp")
    with media.load_video(clip) as reader:
        shown = [int(f[0, 0, 2]) for f in reader]
    assert len(shown) == 50
    for j, i in enumerate(shown):  # source frame i (time i/30) is the one on screen at t = j/25
        assert i / 30 <= j / 25 + 1 / 50 and (i + 1) / 30 > j / 25 - 1 / 50, (j, i)
    assert shown == sorted(shown)


def packet_times(ffmpeg: str, path: Path) -> tuple[list[float], float]:
    """Presentation times (seconds, sorted) of the video packets and the end of the last one (its pts + duration),
    read by demuxing (framemd5). The end is the clip's true length; an mp4's container Duration can be shorter
    (it is computed from decode times when there are B-frames)."""
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(path), "-map", "0:v:0", "-c", "copy", "-f", "framemd5",
                          "-"], stdin=subprocess.DEVNULL, capture_output=True, check=True).stdout.decode()
    tb = Fraction(next(line for line in out.splitlines() if line.startswith("#tb 0:")).split(":")[1].strip())
    rows = [[int(v) for v in line.split(",")[1:4]] for line in out.splitlines() if line and line[0] != "#"]
    end = max(float((pts + dur) * tb) for _, pts, dur in rows)
    return sorted(float(pts * tb) for _, pts, _ in rows), end


def test_variable_frame_rate_clip(make_media, ffmpeg):
    # 20 frames at 20 fps, then 20 frames at 10 fps (lossless, red channel = source frame number)
    clip = make_media("vfr.mkv", "-f", "lavfi", "-i",
                      "color=c=black:s=64x48:r=20:d=2,format=gbrp,geq=r='N':g='128':b='255-N',"
                      "setpts='if(lt(N\\,20)\\,N*0.05\\,1+(N-20)*0.1)/TB'",
                      "-c:v", "ffv1", "-pix_fmt", "gbrp", *passthrough(ffmpeg))
    pts, end = packet_times(ffmpeg, clip)
    assert len(pts) == 40 and pts[19] == pytest.approx(0.95) and pts[20] == pytest.approx(1.0)
    assert pts[21] - pts[20] == pytest.approx(0.1)  # really variable
    with media.load_video(clip) as reader:
        shown = [int(f[0, 0, 2]) for f in reader]
        assert reader.frame_count == len(shown)
    assert abs(len(shown) * FRAME - end) <= FRAME  # duration kept within one frame
    for j, i in enumerate(shown):  # source frame i is the one on screen at t = j/25 (to half an output frame)
        assert pts[i] <= j / 25 + 1 / 50 and (i == 39 or pts[i + 1] > j / 25 - 1 / 50), (j, i)
    assert shown == sorted(shown) and shown[-1] == 39
    # an H.264 VFR mp4 too
    vfr_mp4 = make_media("vfr.mp4", "-f", "lavfi", "-i",
                         "testsrc=size=64x48:rate=30:duration=2,setpts='if(lt(N\\,30)\\,N/30\\,1+(N-30)/15)/TB'",
                         "-c:v", "libx264", "-pix_fmt", "yuv420p", *passthrough(ffmpeg))
    with media.load_video(vfr_mp4) as reader:
        n = sum(len(b) for b in reader.iter_batches(7))
        assert n == reader.frame_count
    _, end = packet_times(ffmpeg, vfr_mp4)
    assert abs(n * FRAME - end) <= FRAME


def test_real_video_is_frame_exact(shared_data, ffmpeg):
    video = shared_data / "face-sing-576x768-25fps.mp4"
    picks = [0, 137, 549]
    expected = decode_frames(video, (576, 768), indices=picks, ffmpeg=ffmpeg)
    with media.load_video(video) as reader:
        assert (reader.width, reader.height, reader.frame_count) == (576, 768, 550)
        first = reader.read_batch(138)
        assert first.shape == (138, 768, 576, 3)
        rest = reader.read_batch(1000)
        assert len(rest) == 412 and len(reader.read_batch(5)) == 0
    np.testing.assert_array_equal(first[0], expected[0])
    np.testing.assert_array_equal(first[137], expected[1])
    np.testing.assert_array_equal(rest[-1], expected[2])
    np.testing.assert_array_equal(media.frames_at(video, [549, 0, 137, 0]), expected[[2, 0, 1, 0]])
    np.testing.assert_array_equal(media.read_frame(video, 137), expected[1])


def test_frames_at_past_the_end(lavfi_video):
    clip = lavfi_video(seconds=2, rate="30")
    with pytest.raises(InputError, match=r"past the last frame.*50 frames"):
        media.frames_at(clip, [3, 50])
    with pytest.raises(InputError, match="integers >= 0"):
        media.frames_at(clip, [-1])


def _red_corner(make_media) -> Path:
    return make_media("corner.mp4", "-f", "lavfi", "-i",
                      "color=c=black:s=64x48:r=25:d=1,drawbox=x=0:y=0:w=12:h=12:color=red:t=fill",
                      "-c:v", "libx264", "-pix_fmt", "yuv444p")


def _rotated(ffmpeg: str, src: Path, out: Path, ccw_degrees: int) -> Path:
    """A copy with a display matrix (ffmpeg >= 6: -display_rotation, counter-clockwise) or an old `rotate` tag."""
    done = subprocess.run([ffmpeg, "-v", "error", "-y", "-display_rotation", str(ccw_degrees), "-i", str(src),
                           "-c", "copy", str(out)], stdin=subprocess.DEVNULL, capture_output=True)
    if done.returncode != 0:  # ffmpeg < 6: the rotate tag, which these muxers store as a counter-clockwise matrix
        subprocess.run([ffmpeg, "-v", "error", "-y", "-i", str(src), "-c", "copy", "-metadata:s:v",
                        f"rotate={ccw_degrees % 360}", str(out)], stdin=subprocess.DEVNULL, check=True)
    return out


@pytest.mark.parametrize("ccw, cw, corner", [(-90, 90, (0, -1)), (90, 270, (-1, 0)), (180, 180, (-1, -1))])
def test_phone_rotation_comes_out_upright(make_media, ffmpeg, tmp_path, ccw, cw, corner):
    clip = _rotated(ffmpeg, _red_corner(make_media), tmp_path / f"phone{ccw}.mp4", ccw)
    info = media.probe(clip)
    assert info.rotation == cw
    with media.load_video(clip) as reader:
        frame = next(iter(reader))
        expected_hw = (48, 64) if cw == 180 else (64, 48)
        assert (reader.height, reader.width) == expected_hw == frame.shape[:2]
    # the red square of the stored top-left corner is where a player shows it
    y = 3 if corner[0] == 0 else frame.shape[0] - 4
    x = 3 if corner[1] == 0 else frame.shape[1] - 4
    b, g, r = (int(v) for v in frame[y, x])
    assert r > 200 and g < 60 and b < 60, frame[y, x]
    assert frame[3, 3].tolist() == [0, 0, 0] or (y, x) == (3, 3)


def test_odd_size_and_10bit(lavfi_video, make_media, ffmpeg):
    odd = make_media("odd.mkv", "-f", "lavfi", "-i", "testsrc=size=67x51:rate=30:duration=2", "-c:v", "ffv1")
    with media.load_video(odd) as reader:
        frames = np.stack(list(reader))
    assert frames.shape == (50, 51, 67, 3)
    np.testing.assert_array_equal(frames[0], decode_frames(odd, (67, 51), indices=[0], ffmpeg=ffmpeg)[0])
    ten = make_media("ten.mp4", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=25:duration=2", "-c:v", "libx264",
                     "-pix_fmt", "yuv420p10le")
    info = media.probe(ten)
    assert info.pix_fmt == "yuv420p10le"
    with media.load_video(ten) as reader:
        frames = np.stack(list(reader))
    assert frames.shape == (50, 48, 64, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames[[0, 49]], decode_frames(ten, (64, 48), indices=[0, 49], ffmpeg=ffmpeg))
    # the same picture as the 8-bit source, up to coding noise
    eight = lavfi_video(seconds=2, rate="25")
    ref = media.read_frame(eight, 0).astype(int)
    assert np.abs(frames[0].astype(int) - ref).mean() < 6


def test_png_alpha_is_flattened(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(20, 30, 4), dtype=np.uint8)
    rgba[0, 0, 3], rgba[0, 1, 3] = 0, 255
    path = tmp_path / "alpha.png"
    Image.fromarray(rgba).save(path)  # (H, W, 4) uint8 is RGBA; Pillow 13 removed the mode argument
    alpha = rgba[..., 3:].astype(float) / 255
    for bg in [(0, 0, 0), (255, 255, 255), (10, 200, 30)]:
        expected = np.floor(rgba[..., :3][..., ::-1] * alpha + np.array(bg, float) * (1 - alpha) + 0.5)
        with media.load_video(path, background=bg) as reader:
            assert reader.has_alpha and reader.frame_count == 1
            frames = list(reader)
        assert len(frames) == 1
        np.testing.assert_array_equal(frames[0], expected.astype(np.uint8))
    assert frames[0][0, 0].tolist() == [10, 200, 30]  # fully transparent pixel = background
    # a palette PNG with a transparent entry
    pal = Image.new("P", (8, 6), 1)
    pal.putpalette([0, 0, 0, 255, 0, 0])  # entry 1 = red
    pal.putpixel((0, 0), 0)
    pal.info["transparency"] = 0
    pal.save(tmp_path / "pal.png", transparency=0)
    frame = media.read_frame(tmp_path / "pal.png", background=(255, 255, 255))
    assert frame[0, 0].tolist() == [255, 255, 255] and frame[1, 1].tolist() == [0, 0, 255]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_photo_exif_orientation_like_pillow(tmp_path, orientation):
    from PIL import Image, ImageOps

    rgb = np.random.default_rng(orientation).integers(0, 256, size=(6, 10, 3), dtype=np.uint8)
    image = Image.fromarray(rgb)
    exif = image.getexif()
    exif[0x0112] = orientation
    path = tmp_path / f"phone-photo-{orientation}.png"
    image.save(path, exif=exif.tobytes())
    with Image.open(path) as opened:
        expected = np.asarray(ImageOps.exif_transpose(opened))[..., ::-1]  # upright, BGR
    info = media.probe(path)
    assert (info.height, info.width) == expected.shape[:2] and info.exif_orientation == orientation
    with media.load_video(path) as reader:
        frames = list(reader)
    assert len(frames) == 1 and (reader.height, reader.width) == expected.shape[:2]
    np.testing.assert_array_equal(frames[0], expected)


def test_jpeg_exif_rotation_is_applied_once(tmp_path):
    from PIL import Image

    rgb = np.zeros((48, 64, 3), np.uint8)
    rgb[:12, :12] = (255, 0, 0)  # red square at the stored top left
    image = Image.fromarray(rgb)
    exif = image.getexif()
    exif[0x0112] = 6  # "turn 90 degrees clockwise to view"
    path = tmp_path / "phone.jpg"
    image.save(path, exif=exif.tobytes(), quality=95)
    info = media.probe(path)
    assert (info.width, info.height, info.rotation) == (48, 64, 90)
    frame = media.read_frame(path)
    assert frame.shape == (64, 48, 3)
    assert frame[4, -5, 2] > 200 and frame[4, -5, :2].max() < 60  # now at the top right
    assert frame[4, 4].max() < 40 and frame[-5, 4].max() < 40


def test_photo_is_one_frame(shared_data):
    with media.load_video(shared_data / "face-photo-man.png") as reader:
        assert reader.frame_count == 1 and len(reader) == 1
        batch = reader.read_batch(10)
    assert batch.shape == (1, 1536, 1024, 3)
    with pytest.raises(InputError, match="past the last frame"):
        media.read_frame(shared_data / "face-photo-man.png", 1)


def test_reader_can_be_iterated_twice_and_closed(lavfi_video):
    clip = lavfi_video(seconds=2, rate="30")
    reader = media.load_video(clip)
    a = np.stack(list(reader))
    b = next(reader.iter_batches(50))
    np.testing.assert_array_equal(a, b)
    reader.read_batch(3)
    procs = [s.proc.popen for s in reader._streams]
    assert procs and all(p.poll() is None for p in procs)
    reader.close()
    assert all(p.poll() is not None for p in procs)


def test_a_loop_over_frames_stopped_early_leaves_no_pipe_open(lavfi_video):
    """Breaking out of ``for frame in reader`` and closing the reader closes every pipe of its ffmpeg (its stderr
    pipe was left to the garbage collector, a ResourceWarning: unclosed file)."""
    import gc

    clip = lavfi_video(seconds=2, rate="30")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with media.load_video(clip) as reader:
            for k, _ in enumerate(reader):
                if k == 2:
                    pipes = [(s.proc.popen.stdout, s.proc.popen.stderr) for s in reader._streams]
                    break
        assert pipes and all(out.closed and err.closed for out, err in pipes)
        del reader, pipes
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


# ---------------------------------------------------------------------------------------------------------------
# load_audio
# ---------------------------------------------------------------------------------------------------------------

def _librosa_reference(path: Path, ffmpeg: str) -> np.ndarray:
    """librosa.load(path, sr=16000) where libsndfile reads the format; otherwise librosa's soxr_hq resampling of
    the native-rate samples that the bundled ffmpeg decodes, mean-mixed.

    librosa reads other formats (m4a) through its deprecated audioread fallback, which runs whatever ``ffmpeg`` is
    on PATH: Debian's ffmpeg 5.1 keeps the AAC padding that a newer ffmpeg's m4a marks as such (256 extra samples
    at 48 kHz), so that reference would measure the machine's ffmpeg, not this package.
    """
    librosa = pytest.importorskip("librosa")
    soundfile = pytest.importorskip("soundfile")
    try:
        soundfile.info(str(path))
    except Exception:
        native = native_mono(ffmpeg, path, channels=2)
        return librosa.resample(native, orig_sr=48000, target_sr=16000, res_type="soxr_hq")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y, _ = librosa.load(path, sr=16000)
    return y


@pytest.mark.parametrize("suffix, codec", [("mp3", "libmp3lame"), ("m4a", "aac"), ("ogg", "libvorbis"),
                                           ("flac", "flac")])
def test_stereo_48k_decodes_like_librosa(make_media, ffmpeg, suffix, codec):
    path = make_media(f"stereo48k.{suffix}", "-f", "lavfi", "-i", STEREO, "-c:a", codec)
    info = media.probe(path)
    assert (info.sample_rate, info.channels) == (48000, 2)
    y = media.load_audio(path)
    assert y.dtype == np.float32 and y.ndim == 1
    ref = _librosa_reference(path, ffmpeg)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=0)
    assert abs(len(y) / 16000 - 2.0) < 0.1
    # both channels are in the mix: 440 Hz and 660 Hz peaks
    spectrum = np.abs(np.fft.rfft(y[4000:20000]))
    freqs = np.fft.rfftfreq(16000, 1 / 16000)
    top = set(np.round(freqs[np.argsort(spectrum)[-2:]]).astype(int))
    assert top == {440, 660}


def test_ffmpeg_path_matches_independent_decode(stereo_m4a, ffmpeg):
    # m4a is never readable by libsndfile: check the ffmpeg path against soxr on a plain ffmpeg decode
    soxr = pytest.importorskip("soxr")
    path = stereo_m4a
    native = native_mono(ffmpeg, path, channels=2)
    expected = soxr.resample(native, 48000, 16000, quality="soxr_hq")
    n = math.ceil(len(native) / 3)
    expected = np.pad(expected, (0, max(0, n - len(expected))))[:n]
    np.testing.assert_array_equal(media.load_audio(path), expected)
    assert media.audio_duration(path) == pytest.approx(len(native) / 48000)


def test_real_wav_matches_librosa(shared_data, ffmpeg):
    path = shared_data / "sing-44k1-mono.wav"
    y = media.load_audio(path)
    ref = _librosa_reference(path, ffmpeg)
    n_native = media.probe(path).duration_s  # about 22.49 s
    assert y.shape == ref.shape and abs(len(y) - n_native * 16000) < 16000 * 0.01
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=0)
    assert media.audio_duration(path) == pytest.approx(22.489, abs=1e-3)


def test_audio_from_a_video_with_sound(clip_with_sound):
    clip = clip_with_sound
    y = media.load_audio(clip)
    assert abs(len(y) / 16000 - 2.0) < 0.05 and np.abs(y).max() > 0.3


# ---------------------------------------------------------------------------------------------------------------
# paths and errors
# ---------------------------------------------------------------------------------------------------------------

def test_paths_with_spaces_and_non_ascii(lavfi_video, stereo_m4a, tmp_path):
    folder = tmp_path / "my clips é 語"
    folder.mkdir()
    video = folder / "vidéo ünï 01.mp4"
    shutil.copyfile(lavfi_video(seconds=2, rate="30"), video)
    audio = folder / "sprache ö 'quote'.m4a"
    shutil.copyfile(stereo_m4a, audio)
    assert media.probe(video).frame_count == 60
    with media.load_video(video) as reader:
        frames = np.stack(list(reader))
    assert len(frames) == 50
    assert abs(len(media.load_audio(audio)) - 32000) <= 160  # 2 s (ffmpeg < 5 keeps the AAC end padding)
    out = folder / "résultat final.mp4"
    with media.VideoWriter(out, 64, 48, audio=audio) as writer:
        writer.write(frames)
    assert media.probe(out).frame_count == 50


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found.*nope.mp4"):
        media.load_video(tmp_path / "nope.mp4")
    with pytest.raises(InputError, match="not found"):
        media.load_audio(tmp_path / "nope.wav")
    with pytest.raises(InputError, match="is a folder"):
        media.probe(tmp_path)
    empty = tmp_path / "speech.wav"
    empty.write_bytes(b"")
    for read in (media.probe, media.load_audio, media.load_video, media.audio_duration):
        with pytest.raises(InputError, match=r"speech.wav' is empty \(0 bytes\).*again"):
            read(empty)


def test_text_file_named_mp4(tmp_path):
    fake = tmp_path / "fake.mp4"
    fake.write_text("<html>this is a web page, not a video</html>\n")
    with pytest.raises(FFmpegError, match="cannot read") as caught:
        media.load_video(fake)
    assert isinstance(caught.value, MediaError) and "Invalid data" in caught.value.stderr_tail
    with pytest.raises(MediaError, match="cannot read"):
        media.load_audio(fake)


def test_video_without_audio_given_as_audio(lavfi_video):
    clip = lavfi_video(seconds=2, rate="30")
    with pytest.raises(NoAudioError, match="no audio stream.*video without sound") as caught:
        media.load_audio(clip)
    assert (caught.value.param, caught.value.path, caught.value.info.has_video) == ("audio", str(clip), True)
    container = caught.value.info.container
    assert str(caught.value).endswith(f"(it is a video without sound; container {container!r}). Give a speech file "
                                      "(wav, mp3, m4a, ogg, flac) or a video that has sound.")
    with pytest.raises(NoAudioError, match="no audio stream.*video without sound.*audio=None for a silent video"):
        media.VideoWriter(clip.with_name("x.mp4"), 64, 48, audio=clip)


def test_audio_given_as_video(shared_data):
    with pytest.raises(InputError, match="audio file.*no video"):
        media.load_video(shared_data / "speech-en-short.wav")


def test_the_up_front_checks_say_what_the_readers_say(shared_data, lavfi_video):
    """check_video and check_audio run before any model loads; their words for a file without the stream were
    their own ("has no video stream; give a face video or photo"), unlike the readers' for the same file."""
    from nbhelpers.checks import check_audio, check_video

    speech, silent = shared_data / "speech-en-short.wav", lavfi_video(seconds=1, rate="25")
    for check, read, path in ((check_video, media.load_video, speech), (check_audio, media.load_audio, silent)):
        with pytest.raises(InputError) as by_check:
            check(path)
        with pytest.raises(InputError) as by_reader:
            read(path)
        assert type(by_check.value) is type(by_reader.value) and str(by_check.value) == str(by_reader.value)


def test_zero_length_audio(tmp_path, make_media):
    import soundfile as sf

    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros((0, 1), np.float32), 16000, subtype="PCM_16")
    with pytest.raises(InputError, match="no samples"):
        media.load_audio(empty)
    empty_m4a = make_media("empty.m4a", "-f", "lavfi", "-i", "anullsrc=r=48000:cl=stereo", "-t", "0", "-c:a", "aac")
    with pytest.raises((InputError, MediaError), match="no samples|no audio|cannot read"):
        media.load_audio(empty_m4a)


def test_bad_arguments(lavfi_video):
    clip = lavfi_video(seconds=2, rate="30")
    with pytest.raises(InputError, match="fps must be a positive"):
        media.load_video(clip, fps=0)
    with pytest.raises(InputError, match="background"):
        media.load_video(clip, background=(0, 0))
    with pytest.raises(InputError, match="sample_rate"):
        media.load_audio(clip, sample_rate=-1)


# ---------------------------------------------------------------------------------------------------------------
# VideoWriter
# ---------------------------------------------------------------------------------------------------------------

def _colour_frames(n: int, h: int = 48, w: int = 64) -> np.ndarray:
    frames = np.zeros((n, h, w, 3), np.uint8)
    frames[:, :, : w // 2] = (40, 160, 220)  # BGR flat blocks (chroma subsampling keeps them)
    frames[:, :, w // 2:] = (200, 60, 30)
    frames[:, : h // 2, :, 1] += np.arange(n, dtype=np.uint8)[:, None, None] % 50
    return frames


def test_writer_duration_equals_audio(tmp_path, ffmpeg):
    _, speech = media.demo_inputs(tmp_path / "demo")
    seconds = media.audio_duration(speech)
    n = math.floor(seconds * 25)  # what the pipeline writes
    out = tmp_path / "out" / "result.mp4"
    frames = _colour_frames(n)
    with media.VideoWriter(out, 64, 48, audio=speech) as writer:
        writer.write(frames[:10])
        for frame in frames[10:]:
            writer.write(frame)
        assert writer.frames_written == n
    assert writer.close() == out and out.is_file()
    info = media.probe(out)
    assert info.frame_count == n == stream_count(ffmpeg, out, "0:v:0")
    assert info.fps == 25 and info.has_audio and info.audio_codec == "aac"
    assert abs(info.duration_s - seconds) <= FRAME
    assert info.comment == media.SYNTHETIC_TAG
    assert sorted(p.name for p in out.parent.iterdir()) == ["result.mp4"]  # no temp file left
    # colours survive the encode (BT.709 matrix, tagged)
    diff = np.abs(media.frames_at(out, [0, n - 1]).astype(int) - frames[[0, n - 1]].astype(int))
    assert diff.mean() < 3 and diff.max() <= 12


def test_writer_copies_aac_and_muxes_audio_of_a_video(stereo_m4a, clip_with_sound, tmp_path):
    m4a = stereo_m4a
    writer = media.VideoWriter(tmp_path / "copy.mp4", 64, 48, audio=m4a)
    assert writer.args[writer.args.index("-c:a") + 1] == "copy"
    writer.write(_colour_frames(50))
    info = media.probe(writer.close())
    assert info.frame_count == 50 and abs(info.duration_s - 2.0) <= FRAME
    clip = clip_with_sound
    with media.VideoWriter(tmp_path / "from-video.mp4", 64, 48, audio=clip) as writer:
        assert "1:1" in writer.args  # the audio stream of the second input, mapped explicitly
        writer.write(_colour_frames(25))
    info = media.probe(writer.path)
    assert info.frame_count == 25 and info.has_audio and abs(info.duration_s - 2.0) <= FRAME


def test_writer_video_only_and_odd_size(tmp_path):
    out = tmp_path / "odd.mp4"
    with media.VideoWriter(out, 67, 51) as writer:
        writer.write(_colour_frames(7, 51, 67))
    info = media.probe(out)
    assert (info.width, info.height, info.frame_count, info.has_audio) == (68, 52, 7, False)  # padded by 1 px
    frame = media.read_frame(out, 0).astype(int)
    # the picture is unscaled at the top left (the last row/column share chroma with the padding: skip them)
    assert np.abs(frame[:50, :66] - _colour_frames(1, 51, 67)[0, :50, :66]).mean() < 4
    luma = frame @ np.array([0.114, 0.587, 0.299])  # BGR -> Y'
    assert luma[51:, :].mean() < 20 and luma[:, 67:].mean() < 20  # the added row/column is black (chroma bleeds)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("frames_first", [0, 5])
def test_an_encoder_stopped_by_a_signal_is_said_to_be_so_not_blamed_on_the_files(shared_data, tmp_path,
                                                                                   frames_first):
    """A SIGINT to the process group that this process ignores (a script's background job) stops only ffmpeg: a new
    user got an error blaming the audio file it was opening. The error now says it was stopped from outside: by
    the signal's name when ffmpeg died of it, by ffmpeg's exit status 255 when it caught it, or by an exit 0 in
    the middle of the frames; and no file is left."""
    import signal
    import time

    # A process started with SIGINT ignored (CI's pytest can be a background job) passes SIG_IGN on to ffmpeg, which
    # then ignores a SIGINT that comes before it installs its own handler. A handler here makes the child start
    # with the default action, as it does under a terminal; the signal goes to ffmpeg only.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        writer = media.VideoWriter(tmp_path / "out.mp4", 64, 48, audio=shared_data / "speech-en-short.wav")
    finally:
        signal.signal(signal.SIGINT, previous)
    with pytest.raises(FFmpegError) as caught:
        with writer:
            if frames_first:
                writer.write(_colour_frames(frames_first, 48, 64))
                time.sleep(0.5)  # ffmpeg has opened its inputs and installed its own signal handlers
            writer._proc.popen.send_signal(signal.SIGINT)
            for _ in range(200):  # until the broken pipe
                writer.write(_colour_frames(5, 48, 64))
                time.sleep(0.01)
    rc = caught.value.returncode
    # ffmpeg dies of it before its handler is in place (-2), exits 255 after catching it, or, in some builds when
    # caught as it starts, exits 0 (the Colab-stack CI job's)
    assert rc in (-signal.SIGINT, 255, 0), rc
    said = {-signal.SIGINT: "ffmpeg was stopped by SIGINT, not by a problem with the files",
            255: "ffmpeg was stopped by a signal (exit status 255), not by a problem with the files",
            0: "It ended with exit status 0 before it had every frame: it was stopped from outside"}[rc]
    assert said in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_writer_abort_on_exception_leaves_nothing(tmp_path):
    out = tmp_path / "never.mp4"
    with pytest.raises(RuntimeError, match="boom"):
        with media.VideoWriter(out, 64, 48) as writer:
            writer.write(_colour_frames(5))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    assert writer._proc.popen.poll() is not None


def test_writer_surfaces_ffmpeg_death(tmp_path):
    out = tmp_path / "dead.mp4"
    with pytest.raises(FFmpegError) as caught:
        with media.VideoWriter(out, 640, 480, codec="no_such_encoder") as writer:
            for _ in range(5):
                writer.write(np.zeros((4, 480, 640, 3), np.uint8))  # 3.7 MB per call: more than a pipe holds
    assert "no_such_encoder" in caught.value.stderr_tail
    assert list(tmp_path.iterdir()) == []


def test_writer_broken_pipe_becomes_ffmpeg_error(tmp_path):
    writer = media.VideoWriter(tmp_path / "killed.mp4", 320, 240)
    writer.write(np.zeros((2, 240, 320, 3), np.uint8))
    writer._proc.popen.kill()  # ffmpeg dies (out of memory, killed...) while we are still writing
    writer._proc.popen.wait()
    with pytest.raises(FFmpegError, match=r"stopped while frames were being written.*2 frames written"):
        writer.write(np.zeros((8, 240, 320, 3), np.uint8))  # 1.8 MB: cannot fit in the pipe
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(MediaError, match="closed"):
        writer.write(np.zeros((240, 320, 3), np.uint8))


def test_writer_validates_frames(tmp_path):
    writer = media.VideoWriter(tmp_path / "v.mp4", 64, 48)
    with pytest.raises(InputError, match="uint8"):
        writer.write(np.zeros((48, 64, 3), np.float32))
    with pytest.raises(InputError, match=r"H=48, W=64.*\(48, 64, 4\)"):
        writer.write(np.zeros((48, 64, 4), np.uint8))
    writer.write(np.zeros((64, 48, 3), np.uint8).transpose(1, 0, 2))  # non-contiguous view: copied
    assert writer.frames_written == 1
    writer.close()
    with pytest.raises(MediaError, match="closed"):
        writer.write(np.zeros((48, 64, 3), np.uint8))
    empty = media.VideoWriter(tmp_path / "empty.mp4", 64, 48)
    with pytest.raises(InputError, match="No frames"):
        empty.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]
    with pytest.raises(InputError, match=".mp4"):
        media.VideoWriter(tmp_path / "v.avi", 64, 48)
    with pytest.raises(InputError, match="crf"):
        media.VideoWriter(tmp_path / "v.mp4", 64, 48, crf=80)


def test_convert_to_25fps(clip_with_sound, tmp_path):
    clip = clip_with_sound
    info = media.convert_to_25fps(clip, tmp_path / "25 fps.mp4")
    assert info.fps == 25 and info.frame_count == 50 and info.has_audio and info.pix_fmt == "yuv420p"
    assert abs(info.duration_s - 2.0) <= FRAME
    assert sorted(p.name for p in tmp_path.iterdir()) == ["25 fps.mp4"]


# ---------------------------------------------------------------------------------------------------------------
# demo inputs
# ---------------------------------------------------------------------------------------------------------------

def test_demo_inputs(tmp_path):
    skdata = pytest.importorskip("skimage.data")
    photo, speech = media.demo_inputs(tmp_path / "demo inputs")
    assert photo.parent == tmp_path / "demo inputs" and photo.suffix == ".png"
    info = media.probe(photo)
    assert info.is_image and (info.width, info.height) == (512, 512)
    np.testing.assert_array_equal(media.read_frame(photo)[..., ::-1], skdata.astronaut())  # RGB saved, BGR read
    assert speech.name == "demo-speech.wav" and speech.stat().st_size < 200_000
    audio = media.probe(speech)
    assert (audio.sample_rate, audio.channels, audio.has_video) == (16000, 1, False)
    assert 3.0 <= media.audio_duration(speech) <= 6.0
    y = media.load_audio(speech)
    assert np.abs(y).max() > 0.1  # speech, not silence


def test_cut_audio_keeps_the_first_seconds_sample_for_sample(tmp_path):
    import wave

    _, speech = media.demo_inputs(tmp_path / "demo")
    cut = media.cut_audio(speech, 0.5, tmp_path / "cut" / "half.wav")
    assert cut == tmp_path / "cut" / "half.wav" and sorted(p.name for p in cut.parent.iterdir()) == ["half.wav"]
    with wave.open(str(speech)) as src, wave.open(str(cut)) as got:
        assert got.getparams()[:3] == (1, 2, 16000) and got.getnframes() == 8000
        assert got.readframes(8000) == src.readframes(8000)  # a 16 kHz mono 16-bit source is copied exactly


@pytest.mark.parametrize("stream, wanted", [("video", "give a video or photo of a face."),
                                            ("audio", "give an audio file, or a video with sound.")])
def test_a_folder_given_as_an_input_is_answered_with_what_that_input_takes(stream, wanted, tmp_path):
    """A folder as the video is not told to give an audio file, which the video check then refuses."""
    with pytest.raises(InputError) as caught:
        media.check_input(tmp_path, stream)
    assert str(caught.value) == f"{stream} {str(tmp_path)!r} is a folder; {wanted}"


@pytest.mark.parametrize("param, wanted", [("video", "a video or photo of a face"),
                                           ("audio", "an audio file, or a video with sound"),
                                           ("media", "one video, photo or audio file")])
def test_the_readers_answer_a_folder_with_what_the_parameter_takes(param, wanted, tmp_path):
    """The readers' own check (``avatar live --audio DIR`` reaches it) words a folder as the job checks do."""
    with pytest.raises(InputError) as caught:
        media_ffmpeg._existing_file(tmp_path, param)
    assert str(caught.value) == f"{param} path {str(tmp_path)!r} is a folder. Give the path of {wanted}."
