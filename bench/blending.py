"""Benchmark of the paste-back (blending) and face-parsing stages. Run: ``python bench/blending.py``.

Self-contained: synthetic 576x768 frames (the size of the shared test video), random 256x256 "generated" faces,
masks from a synthetic label map, and a BiSeNet with random weights in the official format (written to a temp
dir). Prints one table:

* blend_torch on the GPU (the pipeline's path) at several batch sizes, frames per second and max difference
  to blend_cpu;
* blend_cpu on the host (one core), frames per second;
* material preparation (crop + parse + mask) with FaceParser on the GPU in fp16 and on the CPU in fp32.

Needs torch; uses CUDA when available (GPU rows are skipped otherwise).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nbhelpers import blending as B  # noqa: E402
from nbhelpers.parsing import BISENET_FILE, FaceParser, face_mask, write_random_bisenet  # noqa: E402

HEIGHT, WIDTH = 768, 576


def synthetic_inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (n, HEIGHT, WIDTH, 3), dtype=np.uint8)
    faces = rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:512, 0:512]
    lab = np.zeros((512, 512), np.uint8)
    lab[((xx - 256) / 170.0) ** 2 + ((yy - 260) / 200.0) ** 2 <= 1] = 1
    lab[350:390, 200:312] = 12
    mask_512 = face_mask(lab, "jaw")
    boxes, squares, masks = [], [], []
    for _ in range(n):  # boxes that wander a little and change size, as a tracked face does
        dx, dy, dw = (int(v) for v in rng.integers(-8, 9, 3))
        box = (220 + dx, 180 + dy, 340 + dx + dw, 330 + dy + dw)
        square = B.expanded_square(box)
        boxes.append(box)
        squares.append(square)
        masks.append(B.prepare_mask(mask_512, box, square, B.REALTIME_BLUR_RATIO))
    return frames, faces, boxes, masks, squares


def timed(fn, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    import torch

    rows = []
    cuda = torch.cuda.is_available()
    frames, faces, boxes, masks, squares = synthetic_inputs(64)
    if cuda:
        dev = torch.device("cuda")
        tf_all = torch.from_numpy(frames).to(dev)
        tg_all = torch.from_numpy(faces).to(dev)
        masks_dev = [torch.from_numpy(m).to(dev) for m in masks]
        for batch in (8, 20, 32, 64):
            for label, mk in (("numpy masks", masks), ("device masks", masks_dev)):
                def run(batch=batch, mk=mk):
                    B.blend_torch(tf_all[:batch], tg_all[:batch], boxes[:batch], mk[:batch], squares[:batch],
                                  inplace=False)
                    torch.cuda.synchronize()

                sec = timed(run)
                rows.append((f"blend_torch cuda, {label}", batch, sec * 1e3, batch / sec))
        got = B.blend_torch(tf_all[:8], tg_all[:8], boxes[:8], masks[:8], squares[:8]).cpu().numpy()
        diff = max(int(np.abs(got[i].astype(int) - B.blend_cpu(frames[i], faces[i], boxes[i], masks[i],
                                                                 squares[i]).astype(int)).max()) for i in range(8))
        rows.append(("max |cuda - cpu| (levels)", 8, float("nan"), float(diff)))

    def run_cpu():
        for i in range(8):
            B.blend_cpu(frames[i], faces[i], boxes[i], masks[i], squares[i])

    sec = timed(run_cpu, 3)
    rows.append(("blend_cpu (numpy/OpenCV)", 8, sec * 1e3, 8 / sec))

    with tempfile.TemporaryDirectory() as tmp:
        write_random_bisenet(Path(tmp) / BISENET_FILE)
        setups = [("cpu", torch.float32, 4)]
        if cuda:
            setups = [("cuda", torch.float16, 32), ("cuda", torch.float32, 32)] + setups
        for device, dtype, n in setups:
            parser = FaceParser(tmp, device=device, dtype=dtype, batch_size=min(n, 32))

            def prep(parser=parser, n=n):
                B.prepare_materials(list(frames[:n]), boxes[:n], parser, mode="jaw", blur_ratio=0.1)

            sec = timed(prep, 2)
            rows.append((f"prepare_materials {device} {str(dtype).replace('torch.', '')}", n, sec * 1e3, n / sec))
            del parser
            if cuda:
                torch.cuda.empty_cache()

    print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu only'}; torch {torch.__version__}; "
          f"frames {WIDTH}x{HEIGHT}")
    print(f"{'stage':44s} {'batch':>5s} {'ms/batch':>10s} {'frames/s':>10s}")
    for name, batch, ms, fps in rows:
        print(f"{name:44s} {batch:5d} {ms:10.2f} {fps:10.1f}")


if __name__ == "__main__":
    main()
