"""Realtime benchmark: our Avatar.generate against a step-by-step transcription of the official realtime loop.

Runs on the GPU machine with the full-size v1.5 architecture and random weights, an avatar prepared from the shared
face video (given boxes) and 20 s of speech. The whole process is limited to 2 CPU cores (taskset), as on Colab.

Reference loop (official ``scripts/realtime_inference.py:212-308``, official-behaviour.md §9.3, transcribed in our
words): main thread: whisper features, then per batch of 20: PE, UNet (fp16), VAE decode with the result copied to the
host and rounded in numpy (``vae.py:96-108``), each 256x256 frame put on a queue; worker thread: per frame, OpenCV
bilinear resize to the box, PIL paste-blend with the cached mask into a copy of the cached full frame, PNG written; then
ffmpeg PNGs -> H.264 (CRF 18) and a second ffmpeg that muxes the audio (re-encoding the video).

    python bench/realtime.py                 # table to stdout
    python bench/realtime.py --compile off   # ours eager too
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BOX = (190, 160, 360, 330)  # crop box around the face of the shared 576x768 video (mouth at ~(275, 273))
UNET_DECODE_GFLOP = 790.0  # UNet 170 + VAE decode 620 GFLOP per frame (DESIGN.md, measured on this GPU)


def limit_cpus(n: int) -> None:
    """Re-run this script under ``taskset`` with ``n`` cores unless already limited."""
    if len(os.sched_getaffinity(0)) > n and shutil.which("taskset") and not os.environ.get("_BENCH_TASKSET"):
        env = dict(os.environ, _BENCH_TASKSET="1")
        cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:n])
        os.execvpe("taskset", ["taskset", "-c", cores, sys.executable, *sys.argv], env)
    if len(os.sched_getaffinity(0)) > n:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:n]))


def psnr(path, reference, ffmpeg) -> str:
    """ffmpeg's psnr filter of ``path`` against ``reference`` (average over frames), as text."""
    out = subprocess.run([ffmpeg, "-nostdin", "-i", str(path), "-i", str(reference), "-lavfi", "psnr", "-f", "null",
                          "-"], capture_output=True, text=True).stderr
    found = [line for line in out.splitlines() if "PSNR" in line and "average:" in line]
    return found[-1].split("average:")[1].split()[0] + " dB" if found else "n/a"


def official_decode_to_host(vae, latents):
    """Official ``decode_latents``: decode, clamp, copy to host, numpy round, uint8, RGB->BGR (vae.py:96-108)."""

    latents = (1 / vae.config.scaling_factor) * latents
    image = vae.decode(latents.to(vae.dtype)).sample
    image = (image / 2 + 0.5).clamp(0, 1)
    image = image.detach().cpu().permute(0, 2, 3, 1).float().numpy()
    image = (image * 255).round().astype("uint8")
    return [img[..., ::-1] for img in image]


def pil_blend(frame, face, box, mask, square):
    """Official ``get_image_blending`` (blending.py:96-109): PIL crop, paste face, paste back with the mask."""
    from PIL import Image

    body = Image.fromarray(frame[:, :, ::-1])
    face_img = Image.fromarray(face[:, :, ::-1])
    x, y, x1, y1 = box
    xs, ys, xe, ye = square
    face_large = body.crop(square)
    face_large.paste(face_img, (x - xs, y - ys))
    body.paste(face_large, square[:2], Image.fromarray(mask).convert("L"))
    return np.array(body)[:, :, ::-1]


def reference_run(avatar, audio_path: Path, work: Path, batch: int, ffmpeg: str) -> dict:
    """The official realtime loop, step by step, on our models and the avatar's cached material."""
    import cv2
    import torch

    from nbhelpers import media
    from nbhelpers.audio import whisper_features
    from nbhelpers.latents import unet_step

    st = avatar.device_state()
    bundle = st["models"]
    frames = avatar.frames()
    n_src = len(frames)
    face_idx = np.flatnonzero(avatar.has_face)
    latents = [st["source"].latents[k:k + 1] for k in range(len(face_idx))]
    latent_cycle = latents + latents[::-1]
    frame_cycle = [np.array(frames[i]) for i in range(n_src)]
    frame_cycle = frame_cycle + frame_cycle[::-1]
    boxes = [tuple(int(v) for v in avatar.crop_boxes[i]) for i in face_idx]
    box_cycle = boxes + boxes[::-1]
    mask_cycle = avatar.masks + avatar.masks[::-1]
    square_cycle = [tuple(int(v) for v in s) for s in avatar.squares]
    square_cycle = square_cycle + square_cycle[::-1]
    tmp = work / "ref_tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    waveform = media.load_audio(audio_path)
    chunks = whisper_features(waveform, bundle.whisper, feature_extractor=bundle.feature_extractor)
    n_out = chunks.shape[0]
    t_feat = time.perf_counter()
    q: queue.Queue = queue.Queue()

    def worker():
        idx = 0
        while idx < n_out:  # the official stops at n_out - 1 (Q9); all frames here, for a fair count
            try:
                res = q.get(timeout=1)
            except queue.Empty:
                continue
            j = idx % len(frame_cycle)
            x1, y1, x2, y2 = box_cycle[idx % len(box_cycle)]
            ori = frame_cycle[j].copy()
            res = cv2.resize(res.astype(np.uint8), (x2 - x1, y2 - y1))
            combined = pil_blend(ori, res, (x1, y1, x2, y2), mask_cycle[idx % len(mask_cycle)],
                                 square_cycle[idx % len(square_cycle)])
            cv2.imwrite(str(tmp / f"{idx:08d}.png"), combined)
            idx += 1

    th = threading.Thread(target=worker)
    th.start()
    core_s = 0.0
    with torch.inference_mode():
        for start in range(0, n_out, batch):
            stop = min(start + batch, n_out)
            c0 = time.perf_counter()
            lat = torch.cat([latent_cycle[i % len(latent_cycle)] for i in range(start, stop)])
            pred = unet_step(bundle.unet, bundle.pe, lat, chunks[start:stop])
            for img in official_decode_to_host(bundle.vae, pred):
                q.put(img)
            core_s += time.perf_counter() - c0
    th.join()
    t_loop = time.perf_counter()
    temp_mp4 = work / "ref_temp.mp4"
    out = work / "ref_out.mp4"
    subprocess.run([ffmpeg, "-y", "-v", "warning", "-r", "25", "-f", "image2", "-i", str(tmp / "%08d.png"),
                    "-vcodec", "libx264", "-vf", "format=yuv420p", "-crf", "18", str(temp_mp4)], check=True)
    subprocess.run([ffmpeg, "-y", "-v", "warning", "-i", str(audio_path), "-i", str(temp_mp4), str(out)],
                   check=True)
    t_end = time.perf_counter()
    return {"n": n_out, "features_s": t_feat - t0, "loop_s": t_loop - t_feat, "core_s": core_s,
            "encode_s": t_end - t_loop, "wall_s": t_end - t0}


def core_rate(bundle, latents, features, batch: int, n: int, ours: bool) -> float:
    """Frames per second of UNet + decode alone: ours to uint8 on the GPU, or the official host decode."""
    import torch

    from nbhelpers.latents import decode, unet_step

    idx = torch.arange(n, device=latents.device) % latents.shape[0]
    with torch.inference_mode():
        for _ in range(2):  # warm-up
            out = unet_step(bundle.unet, bundle.pe, latents[idx[:batch]], features[:batch])
            decode(out, bundle.vae) if ours else official_decode_to_host(bundle.vae, out)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            stop = min(start + batch, n)
            out = unet_step(bundle.unet, bundle.pe, latents[idx[start:stop]], features[start:stop])
            if ours:
                decode(out, bundle.vae)
            else:
                official_decode_to_host(bundle.vae, out)
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def matmul_tflops() -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192 ** 3 / (time.perf_counter() - t0) / 1e12


def _cpu_stubs() -> None:
    """Let the smoke run (--tiny) go through the CUDA-only calls on a CPU machine."""
    import torch

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.reset_peak_memory_stats = lambda *a, **k: None
    torch.cuda.max_memory_reserved = lambda *a, **k: 0
    globals()["matmul_tflops"] = lambda: float("nan")


@contextlib.contextmanager
def as_official(pipe):
    """The official loop's models: eager (the compiled code paused), the UNet's weights in NCHW and the VAE decoder's
    upsampling as diffusers does it, as the official code keeps them; put back afterwards."""
    import torch

    from nbhelpers.upsampling import phase_upsampling

    unet = pipe.unet
    unet.to(memory_format=torch.contiguous_format)
    phase_upsampling(pipe.vae.decoder, on=False)
    try:
        with pipe.compiler.paused():
            yield
    finally:
        phase_upsampling(pipe.vae.decoder)
        if unet.device.type == "cuda":
            unet.to(memory_format=torch.channels_last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                        help="InferenceConfig.compile of our runs (the official loop always runs eager)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--tiny", action="store_true", help="smoke run: tiny random weights on the CPU")
    parser.add_argument("--frames", type=int, default=0, help="use only the first N frames of the video")
    parser.add_argument("--encoders", default="libx264",
                        help="encoder settings of further runs, comma-separated (our first runs use the default, "
                             "InferenceConfig.encoder; libx264 is medium, as the official loop encodes)")
    parser.add_argument("--skip-reference", action="store_true", help="our runs only (no official loop, no table)")
    parser.add_argument("--out", default=None, help="write the figures as JSON to this path")
    args = parser.parse_args()
    limit_cpus(args.cores)

    import soundfile as sf
    import torch

    torch.set_num_threads(args.cores)
    from _common import gpu_ceilings, make_full_weights, media_dir

    from nbhelpers import InferenceConfig, media, prepare_avatar

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-rt-"))
    work.mkdir(parents=True, exist_ok=True)
    data = media_dir()
    doc: dict = {"cores": sorted(os.sched_getaffinity(0)), "torch": torch.__version__, "compile": args.compile}
    if args.tiny:
        from nbhelpers.testing import make_tiny_weights

        weights = make_tiny_weights(work / "tiny")
        _cpu_stubs()
    else:
        weights = make_full_weights(Path(args.weights or work / "weights"))
        doc["ceilings"] = gpu_ceilings()
    speech, sr = sf.read(data / "speech-en-long.wav", dtype="float32")
    audio = work / f"speech-{args.seconds:g}s.wav"
    sf.write(audio, speech[: int(args.seconds * sr)], sr)
    ffmpeg = media.ffmpeg_exe()
    print(f"cores: {doc['cores']}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if not args.tiny else 'cpu smoke run'}", flush=True)

    video = data / "face-sing-576x768-25fps.mp4"
    if args.frames:
        cut = work / f"face-{args.frames}f.mp4"
        subprocess.run([ffmpeg, "-v", "error", "-y", "-i", str(video), "-frames:v", str(args.frames), "-an",
                        "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p", str(cut)], check=True)
        video = cut
    config = InferenceConfig(batch_size=args.batch, fp16=not args.tiny, device="cpu" if args.tiny else "cuda",
                             compile=args.compile)  # the default encoder
    t0 = time.perf_counter()
    avatar = prepare_avatar(video, work / "avatar", config=config, boxes=BOX, weights_dir=weights)
    prep_s = time.perf_counter() - t0
    print(f"avatar: {avatar} in {prep_s:.1f} s", flush=True)
    pipe = avatar.pipe
    t_models = time.perf_counter()
    avatar.load_models()
    loaded = time.perf_counter()
    st = avatar.device_state()
    clip_batch = int(st["clip_config"].batch_size or args.batch)
    pipe.compile_for(clip_batch, ("unet", "decoder"))
    ready_at: dict = {}
    threading.Thread(target=lambda: ready_at.setdefault("t", (pipe.compiler.wait(), time.perf_counter())[1]),
                     daemon=True).start()
    doc["models_load_s"] = loaded - t_models

    # ours first (a run cut short by a time limit still reports them), then the reference loop
    torch.cuda.reset_peak_memory_stats()
    first = avatar.generate(audio, work / "ours-first.mp4")
    doc["first_clip"] = {"e2e_fps": first.end_to_end_fps, "timings": dict(first.timings),
                         "calls": pipe.compiler.calls()}
    print(f"first clip (compile in the background): {first.summary()} {first.timings} {pipe.compiler.calls()}",
          flush=True)
    status = pipe.compiler.wait()
    time.sleep(0.05)
    doc["compile_status"] = {"state": status.state, "warm": status.warm, "seconds": status.seconds,
                             "parts": dict(status.parts), "part_seconds": dict(status.part_seconds),
                             "reason": status.reason,
                             "ready_after_models_loaded_s": (ready_at["t"] - loaded) if "t" in ready_at else None}
    print(f"compile: {doc['compile_status']}", flush=True)
    with contextlib.suppress(Exception):  # where the compile's time went (dynamo, AOTAutograd, inductor phases)
        doc["compile_times"] = torch._dynamo.utils.compile_times(repr="str")
        print(doc["compile_times"], flush=True)
    ours = avatar.generate(audio, work / "ours.mp4")
    ours_peak = torch.cuda.max_memory_reserved() / 2**30
    print(f"ours: {ours.summary()} {ours.timings}", flush=True)
    doc["ours"] = {"e2e_fps": ours.end_to_end_fps, "generation_fps": ours.generation_fps,
                   "timings": dict(ours.timings), "peak_gib": ours_peak, "batch": clip_batch}
    by_encoder = []
    for setting in [e for e in args.encoders.split(",") if e and e != config.encoder]:
        run = avatar.generate(audio, work / f"ours-{setting}.mp4", encoder=setting)
        size = run.output.stat().st_size / 2**20
        by_encoder.append((setting, run.end_to_end_fps, size, psnr(run.output, ours.output, ffmpeg)))
        print(f"ours with {setting}: {run.summary()} {run.timings}", flush=True)
    doc["encoders"] = [{"encoder": e, "e2e_fps": f, "mib": m, "psnr_vs_default": d} for e, f, m, d in by_encoder]
    doc["encoder"] = config.encoder

    torch.cuda.reset_peak_memory_stats()
    if args.skip_reference:
        return write(doc, args.out)
    with as_official(pipe):
        ref = reference_run(avatar, audio, work, args.batch, ffmpeg)
    ref_peak = torch.cuda.max_memory_reserved() / 2**30
    print(f"reference: {ref}", flush=True)
    info = media.probe(ours.output)
    from nbhelpers.audio import whisper_features

    feats = whisper_features(media.load_audio(audio), st["models"].whisper,
                             feature_extractor=st["models"].feature_extractor)
    n = min(200, feats.shape[0])
    with as_official(pipe):
        ref_core = core_rate(st["models"], st["source"].latents, feats, args.batch, n, ours=False)
    our_core = core_rate(st["models"], st["source"].latents, feats, args.batch, n, ours=True)
    with pipe.compiler.paused():
        eager_core = core_rate(st["models"], st["source"].latents, feats, args.batch, n, ours=True)
    peak_tflops = matmul_tflops()

    ref_e2e = ref["n"] / ref["wall_s"]
    doc["reference"] = {**ref, "e2e_fps": ref_e2e, "peak_gib": ref_peak}
    doc["core"] = {"reference_fps": ref_core, "ours_fps": our_core, "ours_eager_fps": eager_core,
                   "ratio": our_core / ref_core, "eager_ratio": eager_core / ref_core, "batch": args.batch}
    doc["ratio_e2e"] = ours.end_to_end_fps / ref_e2e
    rows = [
        ("reference loop (official realtime, transcribed)", ref_e2e, ref["n"] / ref["core_s"], ref_peak),
        (f"ours: Avatar.generate, first clip (compiling meanwhile), {config.encoder}", first.end_to_end_fps,
         first.generation_fps, 0),
        (f"ours: Avatar.generate, {config.encoder}", ours.end_to_end_fps, ours.generation_fps, ours_peak),
    ]
    print()
    print("| run | end-to-end fps | generation fps (in loop) | peak GPU GiB |")
    print("|---|---|---|---|")
    for name, e2e, gen, peak in rows:
        print(f"| {name} | {e2e:.1f} | {gen:.1f} | {peak:.2f} |")
    for setting, e2e, _size, _db in by_encoder:
        print(f"| ours: Avatar.generate, encoder {setting} | {e2e:.1f} | - | - |")
    print()
    print(f"end-to-end ratio ours/reference: {ours.end_to_end_fps / ref_e2e:.2f}x")
    base_size = ours.output.stat().st_size / 2**20
    for setting, e2e, size, db in by_encoder:
        print(f"encoder {setting}: {e2e:.1f} fps end to end ({e2e / ref_e2e:.2f}x the reference), {size:.1f} MiB "
              f"vs {base_size:.1f} MiB ({config.encoder}), PSNR vs {config.encoder} {db}")
    print(f"core (UNet + decode, {n} frames, batch {args.batch}): reference {ref_core:.1f} fps (eager, NCHW, host "
          f"decode), ours {our_core:.1f} fps ({our_core / ref_core:.2f}x; eager {eager_core:.1f}, "
          f"{eager_core / ref_core:.2f}x)")
    print(f"measured fp16 matmul peak: {peak_tflops:.0f} TFLOP/s; UNet + decode at {our_core:.1f} fps = "
          f"{our_core * UNET_DECODE_GFLOP / 1e3:.1f} TFLOP/s = "
          f"{100 * our_core * UNET_DECODE_GFLOP / 1e3 / peak_tflops:.1f}% "
          "of it")
    print(f"compile: {doc['compile_status']}")
    print("stages ours (s): " + ", ".join(f"{k} {v:.2f}" for k, v in ours.timings.items()))
    print(f"stages reference (s): features {ref['features_s']:.2f}, loop (UNet+decode+blend+PNG) {ref['loop_s']:.2f} "
          f"(core {ref['core_s']:.2f}), encode+mux {ref['encode_s']:.2f}")
    print(f"output: {info.frame_count if hasattr(info, 'frame_count') else '?'} frames, "
          f"{info.duration_s} s; avatar prepared in {prep_s:.1f} s")
    write(doc, args.out)


def write(doc: dict, out: str | None) -> None:
    if out:
        import json

        Path(out).write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
