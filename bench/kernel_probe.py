"""Where the GPU time of the compiled model core and of the face models goes, kernel by kernel, and what inductor's
tuning options change. Meant for the T4-class MPS proxy (bench/t4_run.sh t4-kernels), where the core and the faces
stage are GPU-bound.

Parts (``--parts``, in order):

* ``decoder``, ``unet``: the full-size VAE decoder (upsampling in phase form, as ``models.load_vae`` routes it) and
  the v1.5 UNet (channels-last, as the pipeline holds it), random weights, fp16, batch 20, ``torch.compile`` static;
  frames/s (median of ``--iters`` batches, CUDA events) and the top kernels of one profiled batch.
* ``decoder-cdt``: the decoder compiled with ``coordinate_descent_tuning`` (inductor tunes each Triton kernel's
  launch configuration on this GPU), its frames/s and largest difference from the default compile in 8-bit levels.
* ``faces``: the default landmark backend's S3FD (576x768 frames of the shared video, 16 a call) and DWPose (flip
  test) on the offline job's 32-frame calls: wall ms a batch, GPU busy ms a batch (the sum of its kernels), and
  the top kernels; then each network compiled (``faces-compiled``), the same figures.

    python bench/kernel_probe.py --weights W --parts decoder,unet,decoder-cdt,faces,faces-compiled --out k.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from t4probe import BATCH, build, ceilings, timed  # noqa: E402


def levels(y):
    return ((y.float() / 2 + 0.5).clamp(0, 1) * 255).round()


def kernels(torch, fn, top: int = 18) -> dict:
    """One profiled call of ``fn``: wall ms, the kernels' summed ms (GPU busy) and the ``top`` kernels by time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
    rows, busy = [], 0.0
    for ev in prof.key_averages():
        dev = getattr(ev, "self_device_time_total", None)
        if dev is None:
            dev = getattr(ev, "self_cuda_time_total", 0)
        if dev > 0 and getattr(ev, "device_type", None) is not None and "CUDA" in str(ev.device_type):
            busy += dev / 1e3
            rows.append((round(dev / 1e3, 2), ev.count, ev.key[:110]))
    rows.sort(reverse=True)
    return {"wall_ms": round(wall, 1), "busy_ms": round(busy, 1), "top": rows[:top]}


def show(name: str, rec: dict) -> None:
    print(f"== {name}: " + ", ".join(f"{k}={v}" for k, v in rec.items() if k != "top"), flush=True)
    for row in rec.get("top", []):
        print(f"   {row[0]:9.2f} ms {row[1]:5d}x  {row[2]}", flush=True)


def core(torch, parts: list[str], iters: int, rec: dict) -> None:
    from nbhelpers.upsampling import phase_upsampling

    unet, vae = build(torch)
    dec = vae.decoder
    phase_upsampling(dec)
    torch.manual_seed(1)
    z = torch.randn(BATCH, 4, 32, 32, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        ref = None
        if "decoder" in parts or "decoder-cdt" in parts:
            t = time.perf_counter()
            fn = torch.compile(dec, dynamic=False)
            ref = fn(z)
            torch.cuda.synchronize()
            r = {"compile_s": round(time.perf_counter() - t, 1),
                 "fps": round(BATCH / timed(torch, lambda: fn(z), iters=iters) * 1e3, 2)}
            r.update(kernels(torch, lambda: fn(z)))
            rec["decoder"] = r
            show("decoder compiled", r)
        if "decoder-cdt" in parts:
            import torch._inductor.config as ic

            torch._dynamo.reset()
            d2 = copy.deepcopy(dec)
            t = time.perf_counter()
            with ic.patch(coordinate_descent_tuning=True):
                fn2 = torch.compile(d2, dynamic=False)
                out = fn2(z)
            torch.cuda.synchronize()
            r = {"compile_s": round(time.perf_counter() - t, 1),
                 "fps": round(BATCH / timed(torch, lambda: fn2(z), iters=iters) * 1e3, 2),
                 "max_levels_vs_default": float((levels(out) - levels(ref)).abs().max())}
            r.update(kernels(torch, lambda: fn2(z)))
            rec["decoder-cdt"] = r
            show("decoder compiled, coordinate descent", r)
        if "unet" in parts:
            unet = unet.to(memory_format=torch.channels_last)
            lat = torch.randn(BATCH, 8, 32, 32, device="cuda", dtype=torch.float16)
            cond = torch.randn(BATCH, 50, 384, device="cuda", dtype=torch.float16)
            tt = torch.zeros(BATCH, device="cuda", dtype=torch.long)
            t = time.perf_counter()
            fu = torch.compile(unet, dynamic=False)
            fu(lat, tt, encoder_hidden_states=cond)
            torch.cuda.synchronize()
            r = {"compile_s": round(time.perf_counter() - t, 1),
                 "fps": round(BATCH / timed(torch, lambda: fu(lat, tt, encoder_hidden_states=cond),
                                            iters=iters) * 1e3, 2)}
            r.update(kernels(torch, lambda: fu(lat, tt, encoder_hidden_states=cond)))
            rec["unet"] = r
            show("unet compiled", r)


def faces(torch, weights: Path, parts: list[str], rec: dict) -> None:
    import numpy as np

    from nbhelpers.faces.dwpose_torch import DWPoseBackend
    from nbhelpers.gpu import to_device
    from nbhelpers.media import VideoReader

    video = next(p for p in (Path(".benchdata"), Path("../shared/data")) if p.is_dir())
    clip = sorted(video.glob("*.mp4"))[0]
    with VideoReader(clip) as reader:
        frames = reader.read_batch(32)
    backend = DWPoseBackend(weights, "cuda")
    s3fd, pose = backend.face_detector, backend.pose
    s3fd.batch_size, pose.batch_size = 16, 32  # as offline.fit_face_batches sets them for 32-frame calls
    dev = to_device(np.ascontiguousarray(frames), "cuda")
    rec["faces_frames"] = [int(x) for x in frames.shape]

    def run(tag: str) -> None:
        for name, fn in (("s3fd", lambda: s3fd.detections(dev)), ("dwpose", lambda: pose.keypoints(frames))):
            r = kernels(torch, fn)
            walls = []
            for _ in range(3):
                t = time.perf_counter()
                fn()
                walls.append((time.perf_counter() - t) * 1e3)
            r["wall_ms_median3"] = round(sorted(walls)[1], 1)
            rec[f"{name} {tag}"] = r
            show(f"{name} {tag} (32 frames)", r)

    run("eager")
    if "faces-compiled" in parts:
        for obj in (s3fd, pose):
            t = time.perf_counter()
            obj.net = torch.compile(obj.net, dynamic=False)
            rec[f"{type(obj).__name__} wrap_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        s3fd.detections(dev)
        pose.keypoints(frames)
        torch.cuda.synchronize()
        rec["faces compile_s"] = round(time.perf_counter() - t, 1)
        run("compiled")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--parts", default="decoder,unet,decoder-cdt,faces,faces-compiled")
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--out", default="kernels.json")
    args = ap.parse_args()
    import torch

    parts = args.parts.split(",")
    rec: dict = {"ceilings": ceilings(torch), "device": torch.cuda.get_device_name()}
    print(rec, flush=True)
    order = [p for p in parts]
    try:
        if any(p.startswith("faces") for p in order):
            faces(torch, Path(args.weights), parts, rec)
        if any(p in ("decoder", "unet", "decoder-cdt") for p in order):
            core(torch, parts, args.iters, rec)
    finally:
        Path(args.out).write_text(json.dumps(rec, indent=1, default=str))


if __name__ == "__main__":
    main()
