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
    print(f"end to end: {result.n_frames / wall:.1f} fps ({result.n_frames} frames); peak reserved {peak:.2f} GiB; "
          f"output {info.width}x{info.height}, {info.frame_count} frames, {info.duration_s:.2f} s")


if __name__ == "__main__":
    main()
