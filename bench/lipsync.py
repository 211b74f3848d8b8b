"""The offline job on the GPU, and in the same process a step-by-step transcription of the official offline loop.

Full-size v1.5 architecture with random weights written in the official layout by the bench (``bench/_common.py``:
UNet, VAE, whisper, BiSeNet, S3FD and, when the torch DWPose backend exists, DWPose), the shared 576x768 25 fps
face video and the first ``--seconds`` of the shared speech. Both runs use the same loaded UNet, VAE, whisper and
positional encoding, the same inputs, the same crop box.

Ours: ``MuseTalkPipeline.from_pretrained(...).lipsync(...)``. Faces come from the pipeline's default landmark
backend unless ``--boxes``. Random-weight S3FD and DWPose find no face, so the bench injects a stand-in around the
default backend: on every frame it runs that backend's own S3FD (``face_detector.detect``) and DWPose
(``pose.keypoints``, on every frame, as for a clip with a face in each) at full cost, then returns landmarks that
give the known crop box. The output says which was done. (S3FD's confidence heads are silenced in the weight file
so that no cell is a candidate: the convolutions cost what real ones do, and the NMS of random candidates, which
real weights never produce, does not swamp the figure.)

Official (``scripts/inference.py``, official-behaviour.md §2-§8), transcribed step by step from the reference's facts:
ffmpeg writes every video frame as PNG, ``cv2.imread`` reads them all; per frame DWPose (flip test) then S3FD at batch
1 in float32, as ``get_landmark_and_bbox``; per frame crop, Lanczos resize and two VAE encodes at batch 1; UNet
batches of 8 in fp16 with each decode copied to the host and rounded in numpy; per output frame bilinear resize and
``get_image`` (face parsing at batch 1 in float32, PIL crop/resize/paste, OpenCV blur) and a PNG file; then ffmpeg
PNG -> H.264 CRF 18 and a second ffmpeg for the audio mux (which re-encodes). Its face models (S3FD, DWPose, BiSeNet)
are float32 instances loaded from the same weight files, as the official runs them; the generation models are the
pipeline's objects. Where S3FD (random weights) finds no face, the known box stands in for the landmark box, so no
frame is skipped; the detectors still run on every frame.

    taskset -c 0,1 python bench/lipsync.py --seconds 20 --cores 2 --cap-gib 4 --out lipsync.json   # GPU machine
    python bench/lipsync.py --smoke          # CPU: tiny weights, 2 frames, checks that every step runs

Order: weights, then our pipeline and its default backend are built, an untimed 2 s warm-up job of ours runs (models
load, kernels; ``--warmup-seconds``): 50 frames, more than the batch of 32, so the job's batch shapes and their cuDNN
plans (built once per shape, per process) are made there, as a pipeline's first clip makes them for its later ones;
then our timed job, then the official loop (uncapped, on the now warm models). ``--profile`` runs ours once more
under a stack sampler (a later clip on the same pipeline).
Prints both stage tables, the end-to-end ratio (ours fps / official fps) and peak GPU memory (max reserved + CUDA
context) of our job, as markdown; writes the figures as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BOX = (190, 160, 360, 330)  # crop box of the shared 576x768 video, extra_margin included (mouth at ~(275, 273))
VIDEO = "face-sing-576x768-25fps.mp4"
SPEECH = "speech-en-long.wav"
OFFICIAL_BATCH = 8  # scripts/inference.py:266 (--batch_size default)
TARGET_GIB, TARGET_CAP = 3.5, 4.0  # issue 16: the whole job <= 3.5 GiB with the context under a 4 GiB cap
GIB = 2**30


# ------------------------------------------------------------------------------------------------------------------
# Inputs


def cut_wav(src: Path, dst: Path, seconds: float) -> Path:
    """The first ``seconds`` of a PCM WAV file, samples copied unchanged (stdlib ``wave``; no soundfile needed)."""
    with wave.open(str(src)) as r:
        params = r.getparams()
        frames = r.readframes(min(params.nframes, int(round(seconds * params.framerate))))
    with wave.open(str(dst), "wb") as w:
        w.setparams(params)
        w.writeframes(frames)
    return dst


def cut_video(ffmpeg: str, src: Path, dst: Path, n_frames: int) -> Path:
    subprocess.run([ffmpeg, "-v", "error", "-y", "-i", str(src), "-frames:v", str(n_frames), "-an", "-c:v", "libx264",
                    "-crf", "12", "-pix_fmt", "yuv420p", str(dst)], check=True)
    return dst


# ------------------------------------------------------------------------------------------------------------------
# Faces: the default backend at full cost, the known box as its answer


def known_landmarks(box: tuple[int, int, int, int], extra_margin: int) -> tuple[np.ndarray, np.ndarray]:
    """68 landmarks whose official crop box (official-behaviour.md §3.3, then v15's extra_margin) is ``box``; and the
    face box.

    x spans x1..x2; the chin (max y) is y2 - extra_margin; lm[29] sits at the midline, so that
    ``y1 = lm29.y - (max_y - lm29.y)``.
    """
    x1, y1, x2, y2 = box
    chin = y2 - extra_margin
    nose = (y1 + chin) // 2
    lm = np.empty((68, 2), np.float32)
    lm[:, 0] = np.linspace(x1, x2, 68)
    lm[:, 1] = np.linspace(nose, chin, 68)
    lm[29] = ((x1 + x2) / 2, nose)
    return lm, np.array([x1, y1, x2, chin], np.float64)


class FullCostFaces:
    """Stand-in backend: the default backend's S3FD and DWPose run on every frame; the answer is the known box.

    With random weights neither network finds the face, so their results are counted and dropped. Backends
    without a ``face_detector`` and a ``pose`` (dlib) are called as they are; a frame where they find nothing gets
    the known box.
    """

    def __init__(self, inner, box, extra_margin: int):
        from nbhelpers.faces import FaceResult

        self.inner = inner
        self.name = f"{getattr(inner, 'name', type(inner).__name__)} (run at full cost, known box returned)"
        self.reason = str(getattr(inner, "reason", ""))
        lm, face_box = known_landmarks(box, extra_margin)
        self.result = FaceResult(face_box=face_box, landmarks=lm, score=float("nan"))
        self.split = getattr(inner, "face_detector", None) is not None and callable(
            getattr(getattr(inner, "pose", None), "keypoints", None))
        if self.split:  # the pipeline sizes these batches to the memory the job leaves them (fit_face_batches)
            self.face_detector, self.pose = inner.face_detector, inner.pose
        # as the backend: S3FD reads the piece the job uploaded (nbhelpers.faces.base.LandmarkBackend)
        self.accepts_frames_device = self.split and bool(getattr(inner, "accepts_frames_device", False))
        self.reset()

    def reset(self) -> None:
        self.frames = self.s3fd_frames = self.s3fd_found = self.pose_frames = self.backend_found = 0

    def detect(self, frames, frames_device=None):
        frames = np.asarray(frames)
        n = len(frames)
        self.frames += n
        if self.split:  # S3FD at the backend's own batch size and precision
            found = self.inner.face_detector.detect(frames if frames_device is None else frames_device)
            self.s3fd_frames += n
            self.s3fd_found += sum(f is not None for f in found)
            self.inner.pose.keypoints(frames)  # DWPose on every frame, as on a clip with a face in each
            self.pose_frames += n
            return [self.result] * n
        found = self.inner.detect(frames)
        self.backend_found += sum(f is not None for f in found)
        return [f if f is not None else self.result for f in found]

    def describe(self) -> str:
        inner = getattr(self.inner, "name", type(self.inner).__name__)
        if self.split:
            return (f"detected: default backend {inner!r} ({self.reason}) ran on all {self.frames} frames: S3FD on "
                    f"{self.s3fd_frames} (random weights found a face in {self.s3fd_found}), DWPose on "
                    f"{self.pose_frames}; the known crop box {BOX} was returned as the landmarks' box")
        return (f"detected: default backend {inner!r} ({self.reason}) on {self.frames} frames, a face in "
                f"{self.backend_found}; the known box {BOX} stood in for the others")

    def close(self) -> None:
        self.inner.close()


# ------------------------------------------------------------------------------------------------------------------
# The official offline loop, transcribed (scripts/inference.py; official-behaviour.md §2-§8)


def official_crop_box(box):
    """get_crop_box (blending.py:7-13): the expanded square of side 2s around the box centre."""
    x, y, x1, y1 = box
    x_c, y_c = (x + x1) // 2, (y + y1) // 2
    s = int(max(x1 - x, y1 - y) // 2 * 1.5)
    return [x_c - s, y_c - s, x_c + s, y_c + s], s


def official_face_parse(parser, image_pil, mode, left_cheek_width, right_cheek_width):
    """FaceParsing.__call__ (face_parsing/__init__.py:77-111): one image, 512x512 PIL bilinear, BiSeNet main head,
    argmax, mode masks; returns the 512x512 'L' image of 0/255. ``parser.labels`` does the resize, ImageNet
    normalisation, network and argmax at batch 1; ``parsing.face_mask`` the raw/jaw/neck OpenCV steps."""
    from PIL import Image

    from nbhelpers.parsing import face_mask

    labels = parser.labels([np.asarray(image_pil)], batch_size=1)[0]
    return Image.fromarray(face_mask(labels, mode, left_cheek_width, right_cheek_width))


def official_get_image(image, face, face_box, parser, mode, cheeks, upper_boundary_ratio=0.5, expand=1.5,
                       timer=None):
    """get_image (blending.py:35-93), official-behaviour.md §7.2 steps 1-9, in PIL as the official does.
    ``timer["parsing"]`` (when given) accumulates the seconds of the face-parsing call."""
    import cv2
    from PIL import Image

    body = Image.fromarray(image[:, :, ::-1])  # :51 frame as RGB
    face = Image.fromarray(face[:, :, ::-1])  # :52 the resized generated crop as RGB
    x, y, x1, y1 = face_box
    crop_box, s = official_crop_box(face_box)  # :7-13
    x_s, y_s, x_e, y_e = crop_box
    face_large = body.crop(crop_box)  # :60 original pixels, black outside the frame
    ori_shape = face_large.size
    tp = time.perf_counter()
    mask_image = official_face_parse(parser, face_large, mode, *cheeks)  # :26,31
    if timer is not None:
        timer["parsing"] = timer.get("parsing", 0.0) + time.perf_counter() - tp
    mask_image = mask_image.resize(ori_shape)  # :65 PIL's default filter (bicubic for 'L')
    mask_small = mask_image.crop((x - x_s, y - y_s, x1 - x_s, y1 - y_s))  # :67-70 only inside the face box
    mask_image = Image.new("L", ori_shape, 0)
    mask_image.paste(mask_small, (x - x_s, y - y_s, x1 - x_s, y1 - y_s))
    width, height = mask_image.size  # :74-77 keep rows >= int(2s * ratio): the lower half of the square
    top = int(height * upper_boundary_ratio)
    modified = Image.new("L", ori_shape, 0)
    modified.paste(mask_image.crop((0, top, width, height)), (0, top))
    k = int(0.05 * ori_shape[0] // 2 * 2) + 1  # :81-82 offline feather kernel
    mask_image = Image.fromarray(cv2.GaussianBlur(np.array(modified), (k, k), 0))
    face_large.paste(face, (x - x_s, y - y_s))  # :87-89
    body.paste(face_large, crop_box[:2], mask_image)
    return np.array(body)[:, :, ::-1]  # :91-93 back to BGR


def official_latents_for_unet(vae, crop_bgr, mask_rows):
    """VAE.get_latents_for_unet (vae.py:51-122): masked then reference encode, each at batch 1, posterior sampled
    from the global RNG (unseeded, Q1), x scaling factor, concatenated to (1, 8, 32, 32)."""
    import cv2
    import torch

    def preprocess(masked: bool):  # vae.py:51-82
        x = cv2.cvtColor(crop_bgr, cv2.COLOR_BGR2RGB)  # :69
        x = (x / 255.0).transpose(2, 0, 1).astype(np.float32)  # :72-74 float64 divide, CHW, float32
        t = torch.from_numpy(x)
        if masked:
            t = t * mask_rows  # :40-49,75-76 rows 128..255 zeroed
        t = (t - 0.5) / 0.5  # :77 Normalize: masked rows become -1
        return t[None].to(vae.device)  # :79-80

    def encode(t):  # vae.py:84-94
        return vae.config.scaling_factor * vae.encode(t.to(vae.dtype)).latent_dist.sample()

    return torch.cat([encode(preprocess(True)), encode(preprocess(False))], dim=1)  # vae.py:110-122


class _Stages:
    """Wall seconds per stage of the official run; each stage ends with a device sync so work is not carried over."""

    def __init__(self, sync):
        self.seconds: dict[str, float] = {}
        self.sync = sync

    @contextlib.contextmanager
    def stage(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


def official_face_models(pipe, backend, device):
    """float32 S3FD at batch 1 and DWPose at batch 1 from the same weight files, as the official builds them
    (FaceAlignment's SFD, mmpose's RTMPose; preprocessing.py:15-23). Returns (s3fd, keypoints_fn, note)."""
    import torch

    from nbhelpers.faces.s3fd import S3FD, S3FD_FILE

    s3fd = S3FD(pipe.weights_dir / S3FD_FILE, device=device, dtype=torch.float32, batch_size=1)
    pose = getattr(backend, "pose", None)
    try:
        from nbhelpers.faces import dwpose_torch
    except ImportError:
        dwpose_torch = None
    if dwpose_torch is not None and (pipe.weights_dir / dwpose_torch.CHECKPOINT_FILE).is_file():
        net = dwpose_torch.DWPoseTorch(pipe.weights_dir / dwpose_torch.CHECKPOINT_FILE, device, "float32",
                                       batch_size=1, weights_dir=pipe.weights_dir, fuse=False, channels_last=False)
        return s3fd, net.keypoints, "DWPose torch float32, unfused NCHW, batch 1 (mmpose's setting)", net
    if pose is not None and callable(getattr(pose, "keypoints", None)):
        return s3fd, pose.keypoints, f"DWPose of the default backend ({type(pose).__name__}), batch 1", None
    return s3fd, None, "no DWPose model available: landmarks NOT run (S3FD only)", None


def official_run(pipe, backend, video: Path, audio: Path, work: Path, ffmpeg: str, box, config) -> dict:
    """The official offline loop, step by step, on the pipeline's generation models and the given inputs.

    Follows scripts/inference.py:85-249 in order (official-behaviour.md §2-§8); the comments cite the official lines.
    """
    import cv2
    import torch
    from realtime import official_decode_to_host

    from nbhelpers import media
    from nbhelpers.audio import whisper_features
    from nbhelpers.parsing import FaceParser

    device = pipe.device
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    extra_margin = int(config.extra_margin)
    mode = config.effective_parsing_mode
    cheeks = (int(config.left_cheek_width), int(config.right_cheek_width))
    coord_placeholder = (0.0, 0.0, 0.0, 0.0)  # preprocessing.py:26
    known = (box[0], box[1], box[2], box[3] - extra_margin)  # the un-extended box, as coords_list holds it
    unet, vae, pe = pipe.unet, pipe.vae, pipe.pe
    whisper, extractor = pipe.whisper, pipe.feature_extractor
    # Models the official builds on its own (float32), from the same weight files; not timed (loaded at import).
    s3fd, keypoints, pose_note, pose_obj = official_face_models(pipe, backend, device)
    parser = FaceParser(pipe.weights_dir, device=device, dtype=torch.float32, batch_size=1)  # inference.py:76-77
    mask_rows = torch.ones(3, 256, 256)
    mask_rows[:, 128:, :] = 0.0  # vae.py:40-49
    timesteps = torch.tensor([0], device=device)  # inference.py:50
    old_benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = cuda  # api.py:56-57, detect.py:62-63: set by S3FD on CUDA, for the whole run
    base = work / "official"
    frames_dir, out_dir = base / "frames", base / "result"
    for d in (frames_dir, out_dir):
        d.mkdir(parents=True, exist_ok=True)
        for f in d.glob("*.png"):
            f.unlink()
    st = _Stages(sync)
    counts = {"s3fd_found": 0, "frames": 0}
    first = None
    sync()
    t0 = time.perf_counter()
    try:
        with torch.no_grad():  # inference.py:30
            # §2.1: every decoded frame as PNG (inference.py:120-126), fps from OpenCV (utils.py:43-47)
            with st.stage("frames: ffmpeg -> PNG, imread"):
                subprocess.run([ffmpeg, "-v", "fatal", "-i", str(video), "-start_number", "0",
                                str(frames_dir / "%08d.png")], check=True)
                input_img_list = sorted(glob.glob(str(frames_dir / "*.[jpJP][pnPN]*[gG]")))
                cap = cv2.VideoCapture(str(video))
                fps = cap.get(cv2.CAP_PROP_FPS)
                cap.release()
                frame_list = [cv2.imread(p) for p in input_img_list]  # preprocessing.py:35-41, all held in RAM
            # §5: audio features (audio_processor.py:18-93): librosa's samples, whisper per 30 s, 50x384 windows
            with st.stage("audio: whisper features"):
                waveform = media.load_audio(audio)
                whisper_chunks = whisper_features(waveform, whisper, fps=int(fps), feature_extractor=extractor)
            # §3: per frame (batch 1) DWPose on the whole frame, then S3FD (preprocessing.py:84-137)
            with st.stage("landmarks: DWPose + S3FD per frame"):
                coord_list = []
                for frame in frame_list:
                    if keypoints is not None:
                        keypoints(frame[None])  # inference_topdown, no bbox (preprocessing.py:97-101)
                    det = s3fd.detect(frame[None])[0]  # get_detections_for_batch (preprocessing.py:104)
                    counts["frames"] += 1
                    counts["s3fd_found"] += det is not None
                    # Random weights find no face, which would append coord_placeholder (preprocessing.py:109-111)
                    # and skip the frame later (Q7); the known box stands in for the landmark box (§3.3 steps 2-6).
                    coord_list.append(known)
            # §4: per frame with a face: crop, y2 += extra_margin, Lanczos-4 to 256, two VAE encodes
            with st.stage("latents: VAE encode per frame"):
                input_latent_list = []
                for bbox, frame in zip(coord_list, frame_list, strict=True):  # inference.py:166-178
                    if bbox == coord_placeholder:
                        continue
                    x1, y1, x2, y2 = bbox
                    y2 = min(y2 + extra_margin, frame.shape[0])  # v15 (inference.py:170-172)
                    crop = cv2.resize(frame[y1:y2, x1:x2], (256, 256), interpolation=cv2.INTER_LANCZOS4)
                    input_latent_list.append(official_latents_for_unet(vae, crop, mask_rows))
            # §4.5: ping-pong cycles (inference.py:179-181)
            frame_list_cycle = frame_list + frame_list[::-1]
            coord_list_cycle = coord_list + coord_list[::-1]
            input_latent_list_cycle = input_latent_list + input_latent_list[::-1]
            # §6: datagen batches of 8 (utils.py:49-74), PE, UNet at t=0, decode to host (inference.py:185-206)
            with st.stage("generate: UNet + decode to host"):
                video_num = len(whisper_chunks)  # inference.py:185
                res_frame_list = []
                whisper_batch, latent_batch = [], []
                for i in range(video_num):
                    whisper_batch.append(whisper_chunks[i])
                    latent_batch.append(input_latent_list_cycle[i % len(input_latent_list_cycle)])
                    if len(latent_batch) == OFFICIAL_BATCH or i == video_num - 1:
                        wb = torch.stack(whisper_batch)
                        lb = torch.cat(latent_batch, dim=0)
                        audio_feature_batch = pe(wb.to(device))  # inference.py:200
                        lb = lb.to(device=device, dtype=unet.dtype)  # :201
                        pred = unet(lb, timesteps, encoder_hidden_states=audio_feature_batch).sample  # :202-203
                        res_frame_list.extend(official_decode_to_host(vae, pred))  # vae.py:96-108
                        whisper_batch, latent_batch = [], []
            # §7: per output frame: bilinear resize, get_image with face parsing, PNG (inference.py:209-227)
            split = {"parsing": 0.0}
            resize_s = get_image_s = png_s = 0.0
            with st.stage("blend: resize + get_image (parsing) + PNG"):
                for i, res_frame in enumerate(res_frame_list):
                    bbox = coord_list_cycle[i % len(coord_list_cycle)]
                    ori_frame = copy.deepcopy(frame_list_cycle[i % len(frame_list_cycle)])
                    x1, y1, x2, y2 = bbox
                    y2 = min(y2 + extra_margin, frame_list[-1].shape[0])  # :214-216 (Q5: the last frame's height)
                    tb = time.perf_counter()
                    res_frame = cv2.resize(res_frame.astype(np.uint8), (x2 - x1, y2 - y1))  # :218
                    tp = time.perf_counter()
                    combine = official_get_image(ori_frame, res_frame, [x1, y1, x2, y2], parser, mode, cheeks,
                                                 timer=split)
                    tw = time.perf_counter()
                    cv2.imwrite(str(out_dir / f"{i:08d}.png"), combine)  # :227
                    png_s += time.perf_counter() - tw
                    resize_s += tp - tb
                    get_image_s += tw - tp
                    if first is None:
                        first = (ori_frame, res_frame, (x1, y1, x2, y2), combine)
            # §8: PNGs -> H.264 CRF 18 (inference.py:230-233), then the audio mux re-encoding it (:235-237)
            temp_mp4, out = base / "temp.mp4", base / "out.mp4"
            with st.stage("encode: ffmpeg PNG -> H.264"):
                subprocess.run([ffmpeg, "-y", "-v", "warning", "-r", str(fps), "-f", "image2", "-i",
                                str(out_dir / "%08d.png"), "-vcodec", "libx264", "-vf", "format=yuv420p", "-crf",
                                "18", str(temp_mp4)], check=True)
            with st.stage("mux: ffmpeg audio + re-encode"):
                subprocess.run([ffmpeg, "-y", "-v", "warning", "-i", str(audio), "-i", str(temp_mp4), str(out)],
                               check=True)
        wall = time.perf_counter() - t0
    finally:
        torch.backends.cudnn.benchmark = old_benchmark
    n_out = len(res_frame_list)
    check = transcription_check(first, parser, mode, cheeks)
    for obj in (s3fd, pose_obj, parser):
        with contextlib.suppress(Exception):
            (obj.close if hasattr(obj, "close") else (lambda: None))()
    return {"n_frames": n_out, "source_frames": len(frame_list), "wall_s": wall, "fps": n_out / wall,
            "timings": st.seconds, "blend_split_s": {"cv2.resize": resize_s,
                                                     "get_image without parsing": get_image_s - split["parsing"],
                                                     "face parsing (BiSeNet + masks)": split["parsing"],
                                                     "PNG write": png_s},
            "output": str(out), "faces": (f"{pose_note}; S3FD float32 batch 1 on {counts['frames']} frames "
                                          f"(random weights found a face in {counts['s3fd_found']}); the known box "
                                          f"{known} (+ extra_margin {extra_margin}) stood in for the landmark box"),
            "transcription_check": check}


def transcription_check(first, parser, mode, cheeks) -> str:
    """Compare the transcribed get_image with nbhelpers' CPU blend (face_mask -> prepare_mask -> blend_cpu) on the
    first output frame: both reproduce the official PIL sequence, so they must agree exactly."""
    if first is None:
        return "not run (no frame)"
    from nbhelpers.blending import blend_cpu, crop_padded, expanded_square, prepare_mask
    from nbhelpers.parsing import face_mask

    ori, face, box, combined = first
    square = expanded_square(box)
    labels = parser.labels([np.ascontiguousarray(crop_padded(ori, square)[:, :, ::-1])], batch_size=1)[0]
    mask = prepare_mask(face_mask(labels, mode, *cheeks), box, square)
    ours = blend_cpu(ori, face, box, mask, square)
    diff = int(np.abs(ours.astype(np.int16) - combined.astype(np.int16)).max())
    return ("get_image transcription == nbhelpers CPU blend on frame 0 (bit-exact)" if diff == 0 else
            f"MISMATCH: get_image transcription differs from nbhelpers CPU blend by up to {diff} levels on frame 0")


# ------------------------------------------------------------------------------------------------------------------
# Memory cap


def apply_cap(cap_gib: float) -> float:
    """Hold the allocator to ``cap - context`` and make the planner see a ``cap`` GiB card; returns the context.

    The report is what a real ``cap`` GiB card would give at the time it is read: ``free = cap - context -
    reserved``, where ``reserved`` is this process's caching-allocator pool now (``torch.cuda.memory_reserved``,
    the report's ``reserved_gib``) and ``context`` the larger of the context at start and what the real report
    finds outside torch's pool now (``total - free - reserved``: the context grows as cuBLAS/cuDNN load). The real
    report's free memory leaves out this process's pool, which the planner then adds back as far as it is cached;
    a fixed ``cap - context`` after the warm-up job had filled the pool counted the pool twice (batch 4, 3.58 GiB
    with the context under the 4 GiB cap).
    """
    import torch

    from nbhelpers import gpu

    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    context = (total - free0) / GIB
    fraction = (cap_gib - context) * GIB / total
    if not 0 < fraction <= 1:
        raise SystemExit(f"--cap-gib {cap_gib} does not fit this GPU ({total / GIB:.1f} GiB, context {context:.2f})")
    torch.cuda.set_per_process_memory_fraction(fraction)
    real = gpu.device.read_report

    def capped_report(*a, **k):
        return capped(real(*a, **k), cap_gib, context)

    gpu.planner.read_report = capped_report  # what gpu.plan() and gpu.report() read
    return context


def capped(rep, cap_gib: float, context_gib: float):
    """The report ``rep`` (real, read through torch) as a ``cap_gib`` GiB card would give it: ``total = cap``,
    ``free = cap - context - reserved`` (at least 0), ``context`` the larger of ``context_gib`` and what ``rep``
    finds outside torch's pool; reserved and allocated memory are ``rep``'s own."""
    outside = rep.outside_torch_gib
    context = max(float(context_gib), outside if outside is not None else 0.0)
    free = max(0.0, float(cap_gib) - context - rep.reserved_gib)
    return dataclasses.replace(rep, total_gib=float(cap_gib), free_gib=free)


# ------------------------------------------------------------------------------------------------------------------
# Output


def stage_table(title: str, timings: dict[str, float], wall: float, n: int) -> str:
    lines = [f"**{title}**", "", "| stage | seconds | share of wall |", "|---|---:|---:|"]
    for k, v in timings.items():
        lines.append(f"| {k} | {v:.2f} | {100 * v / wall:.0f} % |")
    rest = wall - sum(timings.values())
    lines.append(f"| (outside the stages) | {rest:.2f} | {100 * rest / wall:.0f} % |")
    lines.append(f"| **wall** | **{wall:.2f}** | {n} frames, **{n / wall:.1f} fps** |")
    return "\n".join(lines)


def main() -> None:
    os.environ.setdefault("NBHELPERS_STAGE_MEMORY", "1")  # ClipResult.stats: peak allocated per stage
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of speech (output frames = x 25)")
    parser.add_argument("--cores", type=int, default=0, help="limit the process to this many cores (0 = all)")
    parser.add_argument("--encoder", default="libx264",
                        help="our job's encoder setting (InferenceConfig.encoder; "
                             "the official loop keeps libx264 medium)")
    parser.add_argument("--batch", type=int, default=None, help="our batch size (default: the planner's)")
    parser.add_argument("--fp32", action="store_true", help="generation models in fp32 (both runs: they share them)")
    parser.add_argument("--boxes", action="store_true", help="give ours the crop box: no face detection in our run "
                                                             "(the official loop always detects)")
    parser.add_argument("--cap-gib", "--cap", dest="cap", type=float, default=0.0,
                        help="hold our job to this many GiB with the CUDA context (per-process memory fraction) and "
                             "plan for a card of that size; the official loop runs uncapped afterwards")
    parser.add_argument("--frames", type=int, default=0, help="use only the first N frames of the video")
    parser.add_argument("--warmup-seconds", type=float, default=None,
                        help="a short job of ours first (models load, kernels, batch shapes), not timed; default 2 s "
                             "(0 in smoke)")
    parser.add_argument("--skip-official", action="store_true", help="run ours only")
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                        help="InferenceConfig.compile of ours; after the warm-up job the compile is waited for (the "
                             "official loop always runs eager)")
    parser.add_argument("--profile", default=None,
                        help="after the timed run, run ours once more under bench/stacks.py's sampler and write its "
                             "per-thread report to this path")
    parser.add_argument("--out", default=None, help="write the figures as JSON to this path")
    parser.add_argument("--work", default=None, help="working folder (weights, cut media, outputs)")
    parser.add_argument("--weights", default=None, help="folder of the full-size random weights (reused)")
    parser.add_argument("--smoke", "--tiny", dest="smoke", action="store_true",
                        help="CPU smoke run: tiny weights, 2 frames, 0.12 s of speech (3 output frames)")
    args = parser.parse_args()
    if args.smoke:
        args.frames = args.frames or 2
        args.seconds = min(args.seconds, 0.12)
        args.cores = args.cores or 2
    if args.cores:
        from realtime import limit_cpus

        limit_cpus(args.cores)

    import torch

    if args.cores:
        torch.set_num_threads(args.cores)
    from _common import ensure_silenced, gpu_ceilings, make_face_weights, make_full_weights, media_dir
    from realtime import as_official

    from nbhelpers import InferenceConfig, MuseTalkPipeline, media
    from nbhelpers.gpu import peak_memory, reset_peak

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-ls-"))
    work.mkdir(parents=True, exist_ok=True)
    data = media_dir()
    cuda = torch.cuda.is_available() and not args.smoke
    face_notes: dict[str, str] = {}
    if args.smoke:
        from nbhelpers.faces.s3fd import S3FD_FILE
        from nbhelpers.testing import make_tiny_weights

        weights = make_tiny_weights(work / "tiny")
        if (weights / S3FD_FILE).is_file():
            ensure_silenced(weights / S3FD_FILE)  # make_tiny_weights rewrites it on every call
        face_notes["weights"] = "tiny random weights (nbhelpers.testing.make_tiny_weights), S3FD full size silenced"
    else:
        weights = make_full_weights(Path(args.weights or work / "weights"))
        face_notes = make_face_weights(weights)
    ffmpeg = media.ffmpeg_exe()
    video = data / VIDEO
    if args.frames:
        video = cut_video(ffmpeg, video, work / f"face-{args.frames}f.mp4", args.frames)
    audio = cut_wav(data / SPEECH, work / f"speech-{args.seconds:g}s.wav", args.seconds)
    warm_s = args.warmup_seconds if args.warmup_seconds is not None else (0.0 if args.smoke else 2.0)
    warm_audio = cut_wav(data / SPEECH, work / f"speech-{warm_s:g}s.wav", warm_s) if warm_s > 0 else None
    print(f"cores: {sorted(os.sched_getaffinity(0))}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name() if cuda else 'CPU smoke run'}; work {work}", flush=True)

    context0 = 0.0
    if cuda and args.cap:
        context0 = apply_cap(args.cap)
        print(f"cap {args.cap} GiB: context {context0:.2f} GiB at start, allocator limited to "
              f"{args.cap - context0:.2f} GiB", flush=True)
    ceilings = gpu_ceilings() if cuda else None
    config = InferenceConfig(batch_size=args.batch, fp16=False if args.fp32 else None,
                             device="cuda" if cuda else "cpu", encoder=args.encoder, compile=args.compile)
    t = time.perf_counter()
    pipe = MuseTalkPipeline.from_pretrained(weights, config=config)
    backend = None
    if not args.boxes:
        try:
            inner = pipe.landmarks()
        except Exception as exc:  # noqa: BLE001 - say what to do instead of a traceback
            raise SystemExit(f"the default landmark backend could not be built ({type(exc).__name__}: {exc}). "
                             f"Face notes: {face_notes}. Run with --boxes, or provide its weights.") from exc
        backend = FullCostFaces(inner, BOX, config.extra_margin)
    setup_s = time.perf_counter() - t
    boxes = BOX if args.boxes else None

    cold = None
    if warm_audio is not None:
        t = time.perf_counter()
        cold = pipe.lipsync(video, warm_audio, work / "warmup.mp4", boxes=boxes, backend=backend)
        cold_wall = time.perf_counter() - t
        print(f"warm-up job (not timed below): {cold.n_frames} frames in {cold_wall:.2f} s, models "
              f"{cold.timings.get('models', 0.0):.2f} s", flush=True)
        if backend is not None:
            backend.reset()
    t = time.perf_counter()
    status = pipe.compiler.wait()
    compile_fig = {"state": status.state, "warm": status.warm, "seconds": status.seconds,
                   "parts": dict(status.parts), "part_seconds": dict(status.part_seconds),
                   "reason": status.reason,
                   "waited_after_warmup_s": time.perf_counter() - t}
    print(f"compile: {compile_fig}", flush=True)

    if cuda:
        torch.cuda.synchronize()
        reset_peak()
    t = time.perf_counter()
    ours = pipe.lipsync(video, audio, work / "ours.mp4", boxes=boxes, backend=backend)
    if cuda:
        torch.cuda.synchronize()
    ours_wall = time.perf_counter() - t
    mem = peak_memory(others_gib=0.0) if cuda else None  # the GPU is this process's alone
    faces_text = "boxes given (--boxes): no detector ran in our job" if args.boxes else backend.describe()
    if args.profile:
        from stacks import StackSampler

        if backend is not None:
            backend.reset()
        with StackSampler() as sampler:
            again = pipe.lipsync(video, audio, work / "ours-profiled.mp4", boxes=boxes, backend=backend)
        Path(args.profile).write_text(f"profiled run: {again.n_frames} frames in {sampler.seconds:.2f} s\n"
                                      + sampler.report() + "\n")
        print(f"profile of a second run of ours ({sampler.seconds:.2f} s) written to {args.profile}", flush=True)
        print(stage_table("ours, the same job again on the same pipeline (a later clip; under the sampler)",
                          again.timings, sampler.seconds, again.n_frames), flush=True)
    info = media.probe(ours.output)
    print(ours.summary(), flush=True)
    if ours.stats:
        print("peak GPU memory allocated per stage (GiB, context not included): " + ", ".join(
            f"{k.removeprefix('peak_gib_')} {v:.2f}" for k, v in ours.stats.items()), flush=True)
    ours_fig = {"n_frames": ours.n_frames, "source_frames": ours.source_frames, "wall_s": ours_wall,
                "fps": ours.n_frames / ours_wall, "timings": dict(ours.timings), "clip_wall_s": ours.wall_s,
                "stage_peaks_gib": dict(ours.stats),
                "batch": ours.config.batch_size, "precision": "fp16" if ours.config.fp16 else "fp32",
                "device": str(ours.config.device), "faces": faces_text, "plan": dict(ours.config.reasons),
                "output": {"path": str(ours.output), "frames": info.frame_count, "duration_s": info.duration_s,
                           "size": f"{info.width}x{info.height}"}}
    if mem is not None:
        context = max(context0, mem.context_gib or 0.0)
        total = mem.reserved_gib + context
        ours_fig["memory"] = {"peak_reserved_gib": mem.reserved_gib, "peak_allocated_gib": mem.allocated_gib,
                              "context_gib": context, "context_start_gib": context0,
                              "context_end_gib": mem.context_gib, "peak_with_context_gib": total,
                              "cap_gib": args.cap or None,
                              "target": (f"<= {TARGET_GIB} GiB with context under a {TARGET_CAP:g} GiB cap: "
                                         + ("PASS" if total <= TARGET_GIB else "FAIL")) if args.cap == TARGET_CAP
                              else "n/a (run with --cap-gib 4)"}

    official = None
    if not args.skip_official:
        if cuda and args.cap:
            torch.cuda.set_per_process_memory_fraction(1.0)  # the official loop is not held to the cap
        if cuda:
            torch.cuda.empty_cache()
            reset_peak()
        inner = backend.inner if backend is not None else None
        if inner is None:
            with contextlib.suppress(Exception):  # only its DWPose is borrowed when no torch DWPose exists
                inner = pipe.landmarks()
        with as_official(pipe) if cuda else contextlib.nullcontext():
            official = official_run(pipe, inner, video, audio, work, ffmpeg, BOX, pipe.config)
        if cuda:
            official["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB

    # ---- report
    conditions = (f"{'tiny random weights, CPU' if args.smoke else 'full-size v1.5, random weights'}; "
                  f"{ours.n_frames} output frames ({args.seconds:g} s of speech) over {ours_fig['source_frames']} "
                  f"source frames of {VIDEO}{f' (first {args.frames})' if args.frames else ''}; cores "
                  f"{len(os.sched_getaffinity(0))}; ours {ours_fig['precision']} batch {ours_fig['batch']}, encoder "
                  f"{args.encoder}{f', cap {args.cap:g} GiB' if args.cap else ''}; official "
                  f"{'fp16' if pipe.dtype == torch.float16 else 'fp32'} batch {OFFICIAL_BATCH}, face models fp32")
    print()
    print(f"### bench/lipsync.py: {conditions}")
    print()
    print(f"faces, ours: {faces_text}")
    print(f"setup (weights check, default backend built): {setup_s:.2f} s; warm-up job: "
          f"{'none' if cold is None else f'{cold.n_frames} frames'}")
    print()
    print(stage_table("ours: MuseTalkPipeline.lipsync (ClipResult timings)", ours_fig["timings"], ours_wall,
                      ours.n_frames))
    if "memory" in ours_fig:
        m = ours_fig["memory"]
        print()
        print(f"peak GPU memory of our job: {m['peak_reserved_gib']:.2f} GiB reserved (max_memory_reserved) + "
              f"{m['context_gib']:.2f} GiB CUDA context = **{m['peak_with_context_gib']:.2f} GiB**"
              f"{f' under a {args.cap:g} GiB cap' if args.cap else ''}; {m['target']}")
    if official is not None:
        print()
        print(f"faces, official: {official['faces']}")
        print()
        print(stage_table("official offline loop, transcribed (scripts/inference.py)", official["timings"],
                          official["wall_s"], official["n_frames"]))
        split = official["blend_split_s"]
        print("(blend loop split: " + ", ".join(f"{k} {v:.2f} s" for k, v in split.items()) + ")")
        if "peak_reserved_gib" in official:
            print(f"official peak reserved: {official['peak_reserved_gib']:.2f} GiB (uncapped)")
        print(f"check: {official['transcription_check']}")
        ratio = ours_fig["fps"] / official["fps"]
        print()
        print("| run | frames | wall s | end-to-end fps |")
        print("|---|---:|---:|---:|")
        print(f"| ours | {ours.n_frames} | {ours_wall:.2f} | {ours_fig['fps']:.1f} |")
        print(f"| official (transcribed) | {official['n_frames']} | {official['wall_s']:.2f} | {official['fps']:.1f} |")
        print()
        print(f"**ratio (ours fps / official fps): {ratio:.2f}x**")
    print(f"output: {info.width}x{info.height}, {info.frame_count} frames, {info.duration_s:.2f} s")
    if args.out:
        doc = {"conditions": conditions, "weights": face_notes, "cores": sorted(os.sched_getaffinity(0)),
               "torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu",
               "setup_s": setup_s, "ours": ours_fig, "official": official, "compile": compile_fig,
               "ceilings": ceilings,
               "ratio": (ours_fig["fps"] / official["fps"]) if official else None}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
        print(f"figures written to {args.out}")
    pipe.release()


if __name__ == "__main__":
    main()
