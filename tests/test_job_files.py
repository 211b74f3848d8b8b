"""A broken weight file stops a job in its input check, before any frame is decoded (issue 14, item 7).

An HTML page or a git-lfs pointer saved under a weight name is found before face tracking (28 s on a 6 s clip on
2 cores) and model building. These tests go through the public entry points (``lipsync``,
``prepare_avatar``) with tiny weights of which one file is broken, and make decoding, face tracking and model
building fail the test if they are reached.
"""

from __future__ import annotations

import pytest
from helpers import linked_copy

import nbhelpers as nbh
from nbhelpers import weights
from nbhelpers.errors import WeightsError

HTML = b"<!DOCTYPE html><html><head><title>Google Drive - Quota exceeded</title></head><body>...</body></html>"
LFS = (b"version https://git-lfs.github.com/spec/v1\n"
       b"oid sha256:7ebf6c98c181e20838e4c0054e96e944ac60d5d692cc01db42839fe11b787007\nsize 3399791376\n")


def _break(root, rel: str, content: bytes) -> None:
    (root / rel).unlink()
    (root / rel).write_bytes(content)


@pytest.fixture()
def no_heavy_work(monkeypatch):
    """Fail the test if a frame is decoded, a face tracked or a model built."""
    from nbhelpers import faces, media

    def forbidden(what):
        def _fail(*args, **kwargs):
            raise AssertionError(f"{what} ran before the broken weight file was reported")
        return _fail

    monkeypatch.setattr(media, "load_video", forbidden("media.load_video (frame decoding)"))
    monkeypatch.setattr(media, "frames_at", forbidden("media.frames_at (frame decoding)"))
    monkeypatch.setattr(faces, "track", forbidden("faces.track"))
    models = pytest.importorskip("nbhelpers.models")
    for name in ("load_models", "load_unet", "load_vae", "load_whisper"):
        monkeypatch.setattr(models, name, forbidden(f"models.{name}"))


def test_lipsync_names_every_broken_file_before_any_frame_is_decoded(tiny_weights, tmp_path, grey_clip, tone_1s,
                                                                     no_heavy_work):
    root = linked_copy(tiny_weights, tmp_path / "my weights")
    _break(root, "musetalkV15/unet.pth", HTML)
    _break(root, "sd-vae/diffusion_pytorch_model.safetensors", LFS)
    (root / "whisper" / "preprocessor_config.json").unlink()
    with pytest.raises(WeightsError) as caught:
        nbh.lipsync(grey_clip, tone_1s, tmp_path / "out.mp4", weights_dir=root,
                    config=nbh.InferenceConfig(device="cpu", landmark_backend="dlib"))
    message = str(caught.value)
    assert "3 weight file(s)" in message and str(root) in message
    assert "musetalkV15/unet.pth: HTML page" in message and "Quota exceeded" in message
    assert "sd-vae/diffusion_pytorch_model.safetensors: git-lfs pointer" in message and "git lfs pull" in message
    assert "whisper/preprocessor_config.json: missing" in message
    # The fix downloads into this folder, not into the default cache.
    assert f"python -m nbhelpers download --weights '{root}' --sets core" in message
    assert not (tmp_path / "out.mp4").exists()


def test_prepare_avatar_checks_the_landmark_and_parsing_files_too(tiny_weights, tmp_path, grey_clip, no_heavy_work):
    root = linked_copy(tiny_weights, tmp_path / "models")
    cut = (tiny_weights / "face-parse-bisent/79999_iter.pth").read_bytes()[:100_000]
    _break(root, "face-parse-bisent/79999_iter.pth", cut)
    _break(root, "dwpose/dw-ll_ucoco_384.onnx", LFS)
    with pytest.raises(WeightsError) as caught:
        nbh.prepare_avatar(grey_clip, tmp_path / "avatar", weights_dir=root,
                           config=nbh.InferenceConfig(device="cpu", landmark_backend="dwpose-onnx"))
    message = str(caught.value)
    assert "face-parse-bisent/79999_iter.pth: truncated" in message
    assert "dwpose/dw-ll_ucoco_384.onnx: git-lfs pointer" in message
    assert f"--weights {root} --sets faces-onnx parsing" in message


def test_a_weights_folder_that_does_not_exist_is_said_so(tmp_path, grey_clip, tone_1s, no_heavy_work):
    with pytest.raises(WeightsError) as caught:
        nbh.lipsync(grey_clip, tone_1s, tmp_path / "out.mp4", weights_dir=tmp_path / "nope",
                    config=nbh.InferenceConfig(device="cpu", landmark_backend="dlib"))
    message = str(caught.value)
    assert f"the weights folder '{tmp_path / 'nope'}' does not exist" in message
    assert "missing" not in message


def test_which_files_are_checked_and_the_default_folder_fix(tiny_weights, tmp_path, monkeypatch):
    root = linked_copy(tiny_weights, tmp_path / "models")
    _break(root, "s3fd/s3fd-619a316812.pth", LFS)
    # dlib and boxes open no landmark file: the broken S3FD file does not stop them
    assert weights.check_job_files(root, "v15", "dlib").ok
    assert {c.path for c in weights.check_job_files(root, "v15", "boxes").checks} == \
        set(weights.required_files("v15", parsing=True))
    with pytest.raises(WeightsError, match="s3fd/s3fd-619a316812.pth: git-lfs pointer"):
        weights.check_job_files(root, "v15", "dwpose-onnx")
    # In the default folder the fix needs no --weights.
    monkeypatch.setenv(weights.ENV_VAR, str(root))
    (root / "dwpose" / "dw-ll_ucoco_384.pth").unlink()  # the tiny tree has it (issue 15): take it away
    with pytest.raises(WeightsError) as caught:
        weights.check_job_files(None, "v15", "mmpose")
    # the .pth is in the default set "faces" (the dwpose and mmpose backends both read it)
    assert "`python -m nbhelpers download --sets faces s3fd`" in str(caught.value)
    assert "dwpose/dw-ll_ucoco_384.pth: missing" in str(caught.value)


def test_a_version_the_tiny_weights_lack_is_not_fixed_by_downloading_into_them(tiny_weights, tmp_path):
    """Tiny weights hold the files of the versions they were made for (tiny.json); a job on another version gets
    no download command into the tiny folder, which would mix real and random weights. A file the tiny folder
    should hold still gets the download fix."""
    root = linked_copy(tiny_weights, tmp_path / "tiny")
    with pytest.raises(WeightsError) as caught:
        weights.check_job_files(root, "v1", "dlib")
    text = str(caught.value)
    assert "musetalk/pytorch_model.bin: missing" in text
    assert f"{root} holds tiny random test weights made for v15 only" in text
    assert "`python -m nbhelpers download --weights DIR --sets v1`" in text  # a folder of their own, not this one
    assert str(root) not in text.split("download", 1)[1]
    (root / "musetalkV15" / "unet.pth").unlink()
    with pytest.raises(WeightsError) as caught:
        weights.check_job_files(root, "v15", "dlib")
    assert f"`python -m nbhelpers download --weights {root} --sets core`" in str(caught.value)
    assert "tiny random test weights made for" not in str(caught.value)
