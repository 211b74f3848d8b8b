"""Preparing an avatar: frames, crop boxes, latents and blend masks of a face video, computed once and cached.

Source: ``scripts/realtime_inference.py:87-210``, without its stdin prompts (quirk Q22) and keeping face-less frames
(quirk Q7).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .. import blending, checks, faces, gpu, latents, media, restore, weights
from ..config import InferenceConfig
from ..engine import Timings, flush_denormals
from ..errors import CacheError, InputError, NoFaceError
from ..faces.boxes import single_box
from ..faces.speaker import choose_face
from ..framestore import FrameStore, check_disk_for_frames, expected_frames
from ..media.ffmpeg import INPUT_TAKES
from ..pipeline import MuseTalkPipeline
from . import cache
from .avatar import Avatar, read_meta, stored_config


def prepare_avatar(video: str | os.PathLike, directory: str | os.PathLike, pipe: MuseTalkPipeline | None = None, *,
                   config: InferenceConfig | None = None, boxes: Any = None,
                   weights_dir: str | os.PathLike | None = None, rebuild: bool = False, backend: Any = None) -> Avatar:
    """Prepare an avatar of a face video or photo once, for fast repeated generation: decode its frames at 25 fps,
    detect the face and its crop box in each, crop and encode the faces to latents, parse them into blend masks, and
    cache all of it in ``directory``; :meth:`Avatar.generate` then makes a clip from any speech without redoing this.

    An avatar in ``directory`` made from the same video content, settings
    (:data:`nbhelpers.avatar.cache.CACHED_FIELDS`), boxes, weights, format and package version, whose files pass
    their size and SHA-256 check, is loaded; else it is rebuilt (``rebuild_reason`` says why): frames decoded to
    local disk, files written in a temporary folder inside ``directory``, then moved in with ``avatar.json`` last.
    A rebuilt avatar serves its frames from the local raw copy.

    Args:
        video: A face video (any frame rate: read at 25 fps) or photo.
        directory: The avatar's folder, created if missing (Google Drive works).
        pipe: The pipeline that prepares the avatar and generates its clips; None makes one over ``weights_dir``
            after the inputs are checked, released on ``close()``.
        config: The avatar's settings; None: the defaults.
        boxes: Crop boxes in full-frame pixels: one ``(x1, y1, x2, y2)`` (bare or in a one-item list), or one entry,
            a box or None, per 25 fps frame; checked before any model loads. None: detect faces.
        weights_dir: The weights folder when ``pipe`` is None; None: :func:`nbhelpers.weights.default_dir`.
        rebuild: Rebuild even a valid cache.
        backend: A landmark backend object; None: the one ``config.landmark_backend`` names.

    Raises:
        InputError: The video is missing or unreadable, an option is invalid, ``boxes`` does not fit the video,
            or both ``pipe`` and another ``weights_dir`` are given.
        WeightsError: Weight files are missing.
        NoFaceError: No frame has a face (pass ``boxes=``).
        DiskSpaceError: The local disk cannot hold the decoded frames.
    """
    config = config or InferenceConfig()
    boxes = checks.given_boxes(boxes)  # a one-box list is that box, with the same cache key
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    directory = Path(directory)
    weights_path = _weights_path(pipe, weights_dir)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"directory {str(directory)!r} is a file; give a folder for the avatar (it is created).")
    checks.check_path_type(video, "video")
    video_path = Path(video)
    if video_path.is_dir():
        raise InputError(f"video {str(video_path)!r} is a folder; give {INPUT_TAKES['video']}.")
    if not video_path.is_file():
        raise InputError(f"video {str(video_path)!r} does not exist; give the path of a face video or photo.")
    key = cache.boxes_key(boxes)
    reason = "rebuild asked" if rebuild else cache.stale_reason(directory, video_path, config, weights_path, key)
    if not reason:
        try:
            return load_avatar(directory, pipe, config=config, weights_dir=weights_path, check=False)
        except CacheError as exc:
            reason = str(exc)

    # 1. checks: the video, the boxes and the weights, before any heavy work
    gpu.check_device(config.device)
    _, video_info = checks.check_video(video_path)
    media.check_writable(directory, "the avatar")
    boxes = checks.check_boxes(boxes, video_path, video_info)
    checks.check_face(config.face, video_info)
    checks.check_weights_dir(weights_path, config.version, config.landmark_backend)
    if config.restore is not None:
        restore.check_available(config.restore, weights_path)
    owns = pipe is None
    pipe = pipe or MuseTalkPipeline.from_pretrained(weights_path, config)
    try:
        avatar = _build(pipe, video_path, video_info, directory, config, boxes, key, backend, owns)
    except BaseException:
        if owns:
            pipe.release()
        raise
    avatar.rebuild_reason = reason
    return avatar


def load_avatar(directory: str | os.PathLike, pipe: MuseTalkPipeline | None = None, *,
                config: InferenceConfig | None = None, weights_dir: str | os.PathLike | None = None,
                check: bool = True) -> Avatar:
    """Load a prepared avatar (:meth:`Avatar.load`, checking every file's size and SHA-256 when ``check``) with
    ``pipe``, or with a pipeline made with its settings over ``weights_dir`` (default: the folder it was prepared
    with), released on ``close()``. ``config`` overrides device, precision, batch size, compile mode, encoder and face
    restorer (:data:`~nbhelpers.avatar.avatar.RUNTIME_FIELDS`).

    Raises:
        CacheError: Not a complete, intact avatar of this format, or ``config`` differs in a cached field.
        InputError: Both ``pipe`` and another ``weights_dir`` are given.
        WeightsError: No ``pipe`` is given and the weights are missing.
    """
    if pipe is not None:
        _weights_path(pipe, weights_dir)
        return Avatar.load(directory, pipe, config=config, check=check)
    meta = read_meta(Path(directory), check=check)
    settings = stored_config(meta, config, Path(directory))
    pipe = MuseTalkPipeline.from_pretrained(weights_dir or meta.get("weights_dir"), settings)  # None: the default
    try:
        avatar = Avatar.load(directory, pipe, config=settings, check=False)
    except BaseException:
        pipe.release()
        raise
    avatar._owns_pipe = True
    return avatar


def _weights_path(pipe: MuseTalkPipeline | None, weights_dir: str | os.PathLike | None) -> Path:
    """The pipeline's weights folder, else ``weights_dir``, else the default; InputError when both disagree."""
    if pipe is None:
        return weights.resolve_dir(weights_dir)
    if weights_dir is not None and Path(weights_dir).expanduser().resolve() != Path(pipe.weights_dir).resolve():
        raise InputError(f"weights_dir {str(weights_dir)!r} is not the pipeline's weights folder "
                         f"{str(pipe.weights_dir)!r}: the avatar uses the pipeline's models; give one of the two.")
    return Path(pipe.weights_dir)


def _build(pipe: MuseTalkPipeline, video: Path, video_info: Any, directory: Path, config: InferenceConfig,
           boxes: Any, key: str | None, backend: Any, owns: bool) -> Avatar:
    """Compute the avatar of ``video`` with ``pipe``, write its cache into ``directory`` and return it."""
    run_config = pipe.job_config(config if owns else config.replace(device=None, fp16=None))
    pipe.check_weights(run_config.landmark_backend)
    reader = media.load_video(video)
    # the frames: one per box given for each, else an upper estimate until decoding ends (the faces bar's total)
    n_src = len(boxes) if boxes is not None and single_box(boxes) is None else expected_frames(video_info, 1)
    check_disk_for_frames(n_src, reader.height, reader.width)
    store = FrameStore(reader.height, reader.width)
    made = media.missing_folders(directory)  # removed again unless an avatar is in
    directory.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=directory))
    writer: cache.BackgroundWrite | None = None
    kept = False  # the frame store becomes the new avatar's frames (no decode of the file just written)
    timings = Timings()
    try:
        with timings.stage("frames"):
            detector = ("auto" if config.landmark_backend == "boxes"
                        else pipe.landmarks(backend or run_config.landmark_backend))
        # 2. gpu: the preparation's batch (on the CPU the time it takes is printed before the faces are tracked)
        run_config = pipe.plan("avatar", run_config, n_src, (reader.height, reader.width),
                               landmark_backend="boxes" if detector == "auto" else getattr(detector, "name", None))
        batch = int(run_config.batch_size or 8)
        # 3. media and faces: every frame decoded to local disk while its face is tracked
        with timings.stage("frames"):
            # a point or box in a later frame: its track number (the manifest keeps the choice as given)
            tracked = config if boxes is not None or detector == "auto" else choose_face(
                config, lambda: pipe.faces(video, config=config, backend=detector))[0]
            try:
                track = faces.track(store.tee(reader, n_src), backend=pipe.detections.wrap(detector, video),
                                    config=tracked, boxes=boxes, weights_dir=pipe.weights_dir)
            except NoFaceError as exc:
                raise checks.no_face_in_rotated_video(exc, video_info) from None
            store.finish()
            reader.close()
        # in the background, eager until ready; a cold compile would outlast the preparation and delay the UNet's
        pipe.compile_for(batch, parts=("encoder", "parser"), cached_only=True)
        face_frames = np.flatnonzero(track.has_face)
        h, w = store.frame_shape[:2]
        # The lossless file is encoded and hashed in a thread meanwhile. Parsing runs before the VAE, so masks are
        # made while another thread (a batch worker's preload) may still be loading the VAE.
        writer = cache.BackgroundWrite(store, work / cache.FRAMES_FILE, w, h)
        with flush_denormals(pipe.device):
            # 4. parsing and blending: the feathered masks and expanded squares
            with timings.stage("parser_wait"):
                parser = pipe.face_parser
            parser.batch_size = batch
            with timings.stage("parse"):
                materials = blending.materials_for_frames(store, track.crop_boxes, face_frames, parser, run_config)
                masks = [np.ascontiguousarray(m.mask.cpu().numpy() if hasattr(m.mask, "cpu") else m.mask)
                         for m in materials]
            # 5. latents
            with timings.stage("vae_wait"):
                vae = pipe.vae
            with timings.stage("encode"):
                latents_np = latents.encode_frames(store, track.crop_boxes, face_frames, vae, seed=config.seed,
                                                   mode=config.latent_mode, batch_size=batch).float().cpu().numpy()
        # 6. the cache: frames (in the thread), arrays, then the manifest last
        with timings.stage("arrays"):
            squares = np.asarray([m.square for m in materials], dtype=np.int32).reshape(-1, 4)
            cache.write_arrays(work / cache.ARRAYS_FILE, np.asarray(track.crop_boxes, dtype=np.int32),
                               track.has_face, latents_np, squares, masks)
        with timings.stage("frames_file"):
            n_written, frames_size, frames_sha = writer.result()
        writer = None
        with timings.stage("finish"):
            if n_written != len(store):
                raise CacheError(f"wrote {n_written} of {len(store)} frames")
            files = {cache.FRAMES_FILE: cache.file_entry(work / cache.FRAMES_FILE, frames_size, frames_sha),
                     cache.ARRAYS_FILE: cache.file_entry(work / cache.ARRAYS_FILE)}
            meta = cache.manifest(config, key, video, pipe.weights_dir, (h, w), len(store), len(face_frames),
                                  track.backend, files)
            cache.write_manifest(work, directory, meta)
            # Arrays read back from the cache, frames from the store; clips plan their own batch.
            clip_config = run_config.replace(batch_size=config.batch_size, reasons={
                k: v for k, v in run_config.reasons.items() if k != "batch_size"})
            avatar = Avatar.load(directory, pipe, config=clip_config, check=False)
            avatar._frames = store
            kept = True
    finally:
        if writer is not None:  # an error before the frames were written: stop the encoder before cleaning up
            writer.cancel()
        reader.close()
        if not kept:
            store.close()
        shutil.rmtree(work, ignore_errors=True)
        media.remove_empty(made)  # a complete avatar, or what another job put there, keeps its folder
    avatar.prepare_timings = {k: round(v, 4) for k, v in timings.seconds.items()}
    avatar._owns_pipe = owns
    avatar.loaded_from_cache = False
    return avatar


__all__ = ["load_avatar", "prepare_avatar"]
