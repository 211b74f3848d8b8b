"""S3FD speed and peak GPU memory per frame size, precision and max_side (random weights, full-size network).

Run: ``python bench/s3fd_speed.py`` (GPU; add ``--cpu`` for a small smoke run on the CPU).

The official pipeline runs S3FD on the full-resolution frame at batch 1 (official-behaviour.md §3.2, quirk Q18); this
measures what that costs for 480p..4K and what ``detect(max_side=...)`` saves. The confidence heads are set so that no
cell is a candidate (real weights give a handful), so the times are the network's, not a random-weight NMS.
Prints one table: size, dtype, max_side, batch, ms/frame, frames/s, peak GiB.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="small smoke run on the CPU")
    parser.add_argument("--frames", type=int, default=20, help="frames timed per row")
    args = parser.parse_args()

    import torch

    from nbhelpers.faces.s3fd import S3FD
    from nbhelpers.testing import write_tiny_s3fd

    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    sizes = [(480, 640), (720, 1280)] if device == "cpu" else [(480, 640), (768, 576), (720, 1280), (1080, 1920),
                                                               (2160, 3840)]
    dtypes = [torch.float32] if device == "cpu" else [torch.float32, torch.float16]
    n = 2 if device == "cpu" else args.frames
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_s3fd(tmp)
        rows = []
        for dtype in dtypes:
            det = S3FD(path, device=device, dtype=dtype)
            with torch.no_grad():
                for name in ("conv3_3_norm", "conv4_3_norm", "conv5_3_norm", "fc7", "conv6_2", "conv7_2"):
                    conf = getattr(det.net, f"{name}_mbox_conf")
                    conf.weight.zero_()
                    conf.bias.zero_()
                    conf.bias[-1] = -10.0  # face logit: p(face) ~ 5e-5, below the 0.05 candidate threshold
            for h, w in sizes:
                frames = np.random.default_rng(0).integers(0, 256, (n, h, w, 3), dtype=np.uint8)
                for max_side in (None, 1280, 640):
                    if max_side is not None and max(h, w) <= max_side:
                        continue
                    for batch in (1, 4):
                        det.batch_size = batch
                        det.detect(frames[:batch], max_side=max_side)  # warm-up (cuDNN algorithm choice)
                        if device == "cuda":
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                        start = time.perf_counter()
                        det.detect(frames, max_side=max_side)
                        if device == "cuda":
                            torch.cuda.synchronize()
                        seconds = time.perf_counter() - start
                        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
                        rows.append((f"{w}x{h}", str(dtype).replace("torch.", ""), str(max_side), batch,
                                     1000 * seconds / n, n / seconds, peak))
            det.close()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"S3FD on {device} ({name}), torch {torch.__version__}")
    print(f"{'frame':>10} {'dtype':>8} {'max_side':>8} {'batch':>5} {'ms/frame':>9} {'fps':>7} {'peak GiB':>8}")
    for size, dt, side, batch, ms, fps, peak in rows:
        print(f"{size:>10} {dt:>8} {side:>8} {batch:>5} {ms:9.1f} {fps:7.1f} {peak:8.2f}")


if __name__ == "__main__":
    main()
