"""Face-parsing material benchmark: the CPU path (PIL/OpenCV per frame) against the batched torch path on the GPU.

For the GPU machine: full-size BiSeNet with random weights, the shared 576x768 video with a fixed crop box (the
boxes jitter by a few pixels per frame so every frame has its own square), ``--cores`` CPU cores (taskset). Times
``blending.prepare_materials`` (BiSeNet on the GPU, everything else on the host, as today) and
``blending.prepare_materials_torch`` (all on the GPU, frames already resident) with CUDA synchronised only at the
ends, and compares the masks: the maximum level difference, and where labels agree (random weights: BiSeNet's
argmax on the GPU may flip some pixels; with the same labels the masks are equal bit for bit).

    python bench/parsing.py                  # 500 frames, 2 cores, fp16 and fp32
    python bench/parsing.py --smoke          # 8 frames on the CPU device, to check the script here
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BOX = (190, 160, 360, 330)  # around the face of the shared video (as bench/realtime.py)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=500)
    parser.add_argument("--cpu-frames", type=int, default=100, help="frames timed on the CPU path")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.cores and not args.smoke:
        from realtime import limit_cpus

        limit_cpus(args.cores)
    import torch
    from _common import media_dir

    from nbhelpers import blending as B
    from nbhelpers import media
    from nbhelpers.parsing import BISENET_FILE, FaceParser
    from nbhelpers.testing import write_random_bisenet

    torch.set_num_threads(max(1, args.cores or torch.get_num_threads()))
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    n = 8 if args.smoke else args.frames
    n_cpu = min(n, 4 if args.smoke else args.cpu_frames)
    frames = media.frames_at(media_dir() / "face-sing-576x768-25fps.mp4", list(range(n)))
    rng = np.random.default_rng(0)
    boxes = [tuple(int(v) for v in np.asarray(BOX) + rng.integers(-4, 5, 4)) for _ in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        write_random_bisenet(Path(tmp) / BISENET_FILE, seed=1)
        parsers = {"fp32": FaceParser(tmp, device=device, batch_size=args.batch)}
        if device == "cuda":
            parsers["fp16"] = FaceParser(tmp, device=device, dtype=torch.float16, batch_size=args.batch)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    print(f"{n} frames, device {device}, {args.cores or 'all'} cores, batch {args.batch}")
    print("| path | precision | frames | s | frames/s |")
    print("|---|---|---:|---:|---:|")
    reference = {}
    for name, fp in parsers.items():
        B.prepare_materials(frames[:2], boxes[:2], fp)  # warm-up
        sync()
        t0 = time.perf_counter()
        reference[name] = B.prepare_materials(frames[:n_cpu], boxes[:n_cpu], fp)
        sync()
        dt = time.perf_counter() - t0
        print(f"| CPU image ops (prepare_materials) | {name} | {n_cpu} | {dt:.2f} | {n_cpu / dt:.1f} |")
    resident = torch.from_numpy(frames).to(device)
    got = {}
    for name, fp in parsers.items():
        B.prepare_materials_torch(resident[:args.batch], boxes[:args.batch], fp)  # warm-up
        sync()
        t0 = time.perf_counter()
        got[name] = B.prepare_materials_torch(resident, boxes, fp)
        sync()
        dt = time.perf_counter() - t0
        print(f"| torch on {device} (prepare_materials_torch) | {name} | {n} | {dt:.2f} | {n / dt:.1f} |")
    print()
    for name in parsers:
        diffs = [np.abs(g.mask.cpu().numpy().astype(int) - r.mask.astype(int))
                 for g, r in zip(got[name][:n_cpu], reference[name], strict=True)]
        print(f"{name}: torch path vs CPU path, same network on {device}: max level difference "
              f"{max(int(d.max()) for d in diffs)}, pixels differing {sum(int((d > 0).sum()) for d in diffs)} of "
              f"{sum(d.size for d in diffs)}; mask pixels > 0: "
              f"{np.mean([(r.mask > 0).mean() for r in reference[name]]):.3f}")
    if device == "cuda":  # against the whole computation on the CPU (BiSeNet fp32 there too), a few frames
        k = 8
        with tempfile.TemporaryDirectory() as tmp:
            write_random_bisenet(Path(tmp) / BISENET_FILE, seed=1)
            on_cpu = B.prepare_materials(frames[:k], boxes[:k], FaceParser(tmp, device="cpu"))
        for name in parsers:
            diffs = [np.abs(g.mask.cpu().numpy().astype(int) - r.mask.astype(int))
                     for g, r in zip(got[name][:k], on_cpu, strict=True)]
            print(f"{name} on cuda vs all-CPU fp32 ({k} frames; random BiSeNet, so argmax flips count): max level "
                  f"difference {max(int(d.max()) for d in diffs)}, pixels differing "
                  f"{sum(int((d > 0).sum()) for d in diffs)} of {sum(d.size for d in diffs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
