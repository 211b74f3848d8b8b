"""Landmark frames per second of the ``dwpose`` backend (torch) on the GPU and the CPU, beside ``dwpose-onnx``.

    python bench/landmarks.py                 # on the GPU machine: the full table (about 2-4 minutes)
    python bench/landmarks.py --smoke         # anywhere: 2 frames per row, CPU rows only, to check the script runs

Self-contained, no hub: writes DWPose (RTMPose-l whole-body 384x288, 33.6 M parameters) with random weights at full size
in the official ``.pth`` layout (``nbhelpers.testing.write_random_dwpose_checkpoint``), loads it through the ``dwpose``
backend's own loader, and exports the same weights to ONNX for ``dwpose-onnx``. Timed on real 576x768 frames of the
shared test video (``$NBHELPERS_SHARED_DATA``, ``../shared/data`` or ``.benchdata/``; random frames otherwise), flip
test on (the official setting), DWPose only (the face box is a stub):

* ``dwpose`` on the GPU in float16 at batch 1, 8 and 32, and float32 at batch 32, plus batch 32 without the flip test
  and batch 32 without the backend's speed-ups (BatchNorm folded into the convs, NHWC layout);
* ``dwpose`` on the CPU, float32, 2 threads, batch 8 (NCHW, the default there, and NHWC);
* ``dwpose-onnx`` on the CPU (onnxruntime, 2 threads), batch 8, and on the GPU when onnxruntime has CUDA.

Random weights give the real shapes and FLOPs. S3FD, which every DWPose backend adds for the face box, is timed
by bench/s3fd_speed.py (with random weights its candidate count, hence its decoding time, is not representative).
Prints a markdown table with the GPU rows' peak allocated memory (``torch.cuda.max_memory_allocated``), and
writes it as JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class _Stub:
    """A face detector that finds a face in every frame (DWPose is what is timed)."""

    def detect(self, frames):
        return [(100, 100, 400, 500, 0.99)] * len(frames)


def _frames(n: int) -> tuple[np.ndarray, str]:
    import cv2

    for folder in (os.environ.get("NBHELPERS_SHARED_DATA"), ROOT.parent / "shared" / "data", ROOT / ".benchdata"):
        path = Path(folder or "") / "face-sing-576x768-25fps.mp4"
        if folder and path.is_file():
            cap = cv2.VideoCapture(str(path))
            out = []
            while len(out) < n:
                ok, frame = cap.read()
                if not ok:
                    cap.set(cv2.CAP_PROP_POS_FRAMES, 0)  # loop a short clip
                    if not out:
                        break
                    continue
                out.append(frame)
            cap.release()
            if len(out) == n:
                return np.stack(out), f"{path.name} (576x768)"
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 768, 576, 3), dtype=np.uint8), "random 576x768 frames"


def _time(fn, frames: np.ndarray, repeat: int, sync=None) -> float:
    fn(frames[: max(1, min(len(frames), 2))])  # warm-up: allocations, cuDNN autotuning, onnxruntime arena
    best = float("inf")
    for _ in range(repeat):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn(frames)
        if sync:
            sync()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="2 frames per row, CPU rows only (checks the script)")
    parser.add_argument("--gpu-frames", type=int, default=128, help="frames per timed GPU run (default 128)")
    parser.add_argument("--cpu-frames", type=int, default=8, help="frames per timed CPU run (default 8)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch and onnxruntime (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per row, best kept (default 3)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpu_frames, args.cpu_frames, args.repeat = 2, 2, 1
    warnings.simplefilter("ignore")

    import torch

    from nbhelpers.faces import dwpose_onnx
    from nbhelpers.faces import dwpose_torch as dt
    from nbhelpers.testing import write_random_dwpose_checkpoint

    gpu = torch.cuda.is_available() and not args.smoke
    frames, source = _frames(max(args.gpu_frames if gpu else 0, args.cpu_frames))
    tmp = Path(tempfile.mkdtemp(prefix="landmarks-bench-"))
    t0 = time.perf_counter()
    ckpt = write_random_dwpose_checkpoint(tmp, seed=0)
    net = dt.load_model(ckpt)
    print(f"random DWPose checkpoint written and loaded in {time.perf_counter() - t0:.1f} s "
          f"({sum(p.numel() for p in net.parameters()) / 1e6:.1f} M parameters, {ckpt.stat().st_size / 1e6:.0f} MB)",
          flush=True)
    onnx_path = None
    try:
        t0 = time.perf_counter()
        onnx_path = dt.export_onnx(dt.load_model(ckpt), tmp / "dw-ll_ucoco_384.onnx")
        print(f"the same weights exported to ONNX in {time.perf_counter() - t0:.1f} s", flush=True)
    except Exception as exc:  # noqa: BLE001 - the onnx rows are optional
        print(f"dwpose-onnx rows skipped (export: {type(exc).__name__}: {exc})")

    rows: list[dict] = []

    def add(backend, device, dtype, flip, batch, n, seconds, peak_gib=None):
        rows.append(dict(backend=backend, device=device, dtype=dtype, flip=flip, batch=batch, frames=n,
                         seconds=round(seconds, 4), fps=round(n / seconds, 2), ms_per_frame=round(1e3 * seconds / n, 2),
                         peak_gib=None if peak_gib is None else round(peak_gib, 3)))
        print(f"  {backend} {device} {dtype} flip={flip} batch={batch}: {n / seconds:.1f} frames/s", flush=True)

    if gpu:
        name = torch.cuda.get_device_name(0)
        sync = torch.cuda.synchronize
        gf = frames[: args.gpu_frames]
        torch.backends.cudnn.benchmark = True
        for dtype, batch, flip, tuned in (("float16", 1, True, True), ("float16", 8, True, True),
                                          ("float16", 32, True, True), ("float32", 32, True, True),
                                          ("float16", 32, False, True), ("float16", 32, True, False)):
            # tuned = the backend's defaults (BatchNorm folded, NHWC); untuned = the plain module, NCHW
            pose = dt.DWPoseTorch(model=copy.deepcopy(net), device="cuda", dtype=dtype, batch_size=batch,
                                  flip_test=flip, fuse=tuned, channels_last=tuned)
            label = dtype if tuned else f"{dtype} (BN not folded, NCHW)"
            torch.cuda.reset_peak_memory_stats()
            seconds = _time(pose.keypoints, gf, args.repeat, sync)
            add("dwpose", f"cuda ({name})", label, "on" if flip else "off", batch, len(gf), seconds,
                torch.cuda.max_memory_allocated() / 2**30)
            pose.close()
            del pose
            torch.cuda.empty_cache()
        if onnx_path is not None:
            import onnxruntime as ort

            if "CUDAExecutionProvider" in ort.get_available_providers():
                pose = dwpose_onnx.DWPoseOnnx(onnx_path, "cuda", batch_size=32)
                if pose.device.startswith("cuda"):
                    add("dwpose-onnx", f"cuda ({name})", "float32", "on", 32, len(gf),
                        _time(pose.keypoints, gf, args.repeat))
            else:
                print(f"  dwpose-onnx on the GPU skipped: onnxruntime {ort.__version__} has no CUDA provider")

    torch.set_num_threads(args.threads)
    cf = frames[: args.cpu_frames]
    for layout in (False, True):
        pose = dt.DWPoseTorch(model=net, device="cpu", batch_size=8, channels_last=layout)
        add("dwpose", f"cpu, {args.threads} threads", "float32" + (" (NHWC)" if layout else ""), "on", 8, len(cf),
            _time(pose.keypoints, cf, args.repeat))
    ort_version = None
    if onnx_path is not None:
        import onnxruntime as ort

        ort_version = ort.__version__
        pose = dwpose_onnx.DWPoseOnnx(onnx_path, "cpu", batch_size=8)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        pose.session = ort.InferenceSession(str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"])
        add("dwpose-onnx", f"cpu, {args.threads} threads", "float32", "on", 8, len(cf),
            _time(pose.keypoints, cf, args.repeat))

    head = (f"Landmarks (DWPose only, face box stubbed): {source}, random weights at full size, best of "
            f"{args.repeat}; torch {torch.__version__}"
            + (f", onnxruntime {ort_version}" if ort_version else "") + (", --smoke" if args.smoke else ""))
    print("\n" + head + "\n")
    print("| backend | device | dtype | flip test | batch | frames | seconds | frames/s | ms/frame | peak GiB |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        print(f"| {r['backend']} | {r['device']} | {r['dtype']} | {r['flip']} | {r['batch']} | {r['frames']} | "
              f"{r['seconds']:.2f} | {r['fps']:.1f} | {r['ms_per_frame']:.1f} | {peak} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"title": head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
