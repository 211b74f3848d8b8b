"""The offline job on the GPU: full-size v1.5 architecture, random weights, given boxes, real media.

    python bench/lipsync.py --seconds 20            # all cores
    python bench/lipsync.py --seconds 20 --cores 2  # as on Colab

Prints the result summary, the planner's choices and reasons, per-stage seconds and peak GPU memory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BOX = (190, 160, 360, 330)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--cores", type=int, default=0, help="limit to this many cores (0 = all)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--work", default=None)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--tiny", action="store_true", help="smoke run: tiny random weights on the CPU")
    parser.add_argument("--cap", type=float, default=0.0,
                        help="hold the process to this many GiB (context included), as on a card of that size, "
                             "and plan for it")
    parser.add_argument("--s3fd-frames", type=int, default=0,
                        help="first run the S3FD face detector (random weights, full size) on this many frames "
                             "under the same cap, to include the face stage's memory")
    args = parser.parse_args()
    if args.cores:
        from realtime import limit_cpus

        limit_cpus(args.cores)

    import soundfile as sf
    import torch

    if args.cores:
        torch.set_num_threads(args.cores)
    from _common import make_full_weights, media_dir

    from nbhelpers import InferenceConfig, lipsync, media

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-ls-"))
    work.mkdir(parents=True, exist_ok=True)
    data = media_dir()
    if args.tiny:
        from nbhelpers.testing import make_tiny_weights

        weights = make_tiny_weights(work / "tiny")
    else:
        weights = make_full_weights(Path(args.weights or work / "weights"))
    cuda = torch.cuda.is_available() and not args.tiny
    speech, sr = sf.read(data / "speech-en-long.wav", dtype="float32")
    audio = work / f"speech-{args.seconds:g}s.wav"
    sf.write(audio, speech[: int(args.seconds * sr)], sr)

    config = InferenceConfig(batch_size=args.batch, fp16=False if args.fp32 else None,
                             device=None if cuda else "cpu")
    context = 0.0
    if cuda and args.cap:
        import dataclasses

        from nbhelpers import gpu

        torch.cuda.init()
        free0, total = torch.cuda.mem_get_info()
        context = (total - free0) / 2**30
        torch.cuda.set_per_process_memory_fraction((args.cap - context) * 2**30 / total)
        real_report = gpu.report

        def capped_report(*a, **k):
            rep = real_report(*a, **k)
            return dataclasses.replace(rep, total_gib=float(args.cap), free_gib=args.cap - context)

        gpu.report = gpu._read_report = capped_report
        print(f"cap {args.cap} GiB: context {context:.2f} GiB, allocator limited to {args.cap - context:.2f} GiB")
    if cuda and args.s3fd_frames:
        from nbhelpers.faces.s3fd import S3FD, write_tiny_s3fd
        from nbhelpers.gpu import release

        torch.cuda.reset_peak_memory_stats()
        path = write_tiny_s3fd(work / "s3fd")
        det = S3FD(path, device="cuda", dtype=torch.float16)
        frames = media.frames_at(data / "face-sing-576x768-25fps.mp4", list(range(args.s3fd_frames)))
        t1 = time.perf_counter()
        for i in range(0, len(frames), 8):
            det.detect(frames[i:i + 8])
        torch.cuda.synchronize()
        print(f"S3FD (full size, random weights, fp16) on {len(frames)} frames: "
              f"{len(frames) / (time.perf_counter() - t1):.1f} fps, peak reserved "
              f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB (+ context {context:.2f})")
        release(det)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = lipsync(data / "face-sing-576x768-25fps.mp4", audio, work / "out.mp4", config=config, boxes=BOX,
                     weights_dir=weights)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan")
    info = media.probe(result.output)
    print(result.summary())
    print("plan:", {k: v for k, v in result.config.reasons.items()})
    print("| stage | seconds |\n|---|---|")
    for k, v in result.timings.items():
        print(f"| {k} | {v:.2f} |")
    print(f"| wall | {wall:.2f} |")
    print(f"end to end: {result.n_frames / wall:.1f} fps ({result.n_frames} frames); peak reserved {peak:.2f} GiB "
          f"+ context {context:.2f} = {peak + context:.2f} GiB{f' (cap {args.cap} GiB)' if args.cap else ''}; "
          f"output {info.width}x{info.height}, {info.frame_count} frames, {info.duration_s:.2f} s")


if __name__ == "__main__":
    main()
