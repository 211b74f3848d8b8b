"""Landmark frames per second of the DWPose backends on the CPU. Run with the mmpose overlay (``ci/mmpose-env.sh``):

    PYTHONPATH=/tmp/overlay-mmpose .venv/bin/python bench/landmarks_cpu.py [--frames 8] [--threads 2] [--onnx PATH]

Self-contained, random weights at full size: builds the official RTMPose-l whole-body 384x288 model through mmpose
(33.6 M parameters, He-normal random weights), exports it to ONNX with the published file's signature, and times
on real 576x768 frames of the shared test video (synthetic frames when the media are absent):

* ``dwpose-onnx``: ``DWPoseOnnx.keypoints`` (our pre/post-processing + onnxruntime), flip test on (official) and
  off, batch 1 and 8;
* ``mmpose``: ``inference_topdown(model, frame)`` per frame, flip test on (official) and off;
* ``s3fd``: the face box both backends add (full network, random weights, full-resolution frame, batch 1), when
  torch and ``nbhelpers.faces.s3fd`` are there.

Without mmpose, pass ``--onnx`` with a DWPose ONNX file (the mmpose rows are then skipped). Prints one table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


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
                    break
                out.append(frame)
            cap.release()
            if len(out) == n:
                return np.stack(out), f"{path.name} (576x768)"
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 768, 576, 3), dtype=np.uint8), "random 576x768 frames"


REPEAT = 2  # timed runs per row; the best is kept (the machine may be shared)


def _time(fn, frames: np.ndarray) -> float:
    fn(frames[:1])  # warm-up (first-call allocations, onnxruntime arena, mmpose pipeline build)
    best = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn(frames)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=8, help="frames per timed run (default 8)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch/onnxruntime (default 2)")
    parser.add_argument("--onnx", default=None, help="DWPose ONNX file to use instead of an mmpose export")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per row, best kept (default 2)")
    args = parser.parse_args(argv)
    global REPEAT
    REPEAT = max(1, args.repeat)
    warnings.simplefilter("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import torch

    torch.set_num_threads(args.threads)
    from nbhelpers.faces import dwpose_onnx

    frames, source = _frames(args.frames)
    rows: list[tuple[str, str, str, int, float]] = []
    model = None
    tmp = Path(tempfile.mkdtemp(prefix="landmarks-bench-"))
    onnx_path = Path(args.onnx) if args.onnx else None
    try:
        from nbhelpers.faces import mmpose_backend as mb

        if mb.mmpose_available():
            t0 = time.perf_counter()
            model = mb.build_pose_model(None, "cpu", seed=0)
            print(f"mmpose model built in {time.perf_counter() - t0:.1f} s "
                  f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")
            if onnx_path is None:
                t0 = time.perf_counter()
                onnx_path = mb.export_onnx(model, tmp / "dw-random.onnx")
                print(f"exported to ONNX in {time.perf_counter() - t0:.1f} s")
    except ImportError:
        pass
    if onnx_path is None:
        raise SystemExit("no mmpose here to build the model: run with the mmpose overlay (bash ci/mmpose-env.sh, then PYTHONPATH=/tmp/overlay-mmpose) or "
                         "pass --onnx PATH")

    import onnxruntime as ort

    for flip in (True, False):
        for batch in (1, 8):
            pose = dwpose_onnx.DWPoseOnnx(onnx_path, "cpu", flip_test=flip, batch_size=batch)
            opts = pose.session.get_session_options()
            opts.intra_op_num_threads = args.threads
            pose.session = ort.InferenceSession(str(onnx_path), sess_options=opts,
                                                providers=["CPUExecutionProvider"])
            seconds = _time(pose.keypoints, frames)
            rows.append(("dwpose-onnx", "on" if flip else "off", str(batch), len(frames), seconds))

    if model is not None:
        from nbhelpers.faces import mmpose_backend as mb

        for flip in (True, False):
            model.test_cfg = dict(flip_test=flip)
            backend = mb.MMPoseBackend(model=model, face_detector=object(), device="cpu")
            seconds = _time(backend.keypoints, frames)
            rows.append(("mmpose", "on" if flip else "off", "1", len(frames), seconds))

    try:
        from nbhelpers.faces import s3fd

        path = s3fd.write_tiny_s3fd(tmp)
        detector = s3fd.S3FD(path, "cpu")
        n = min(len(frames), 4)
        rows.append(("s3fd (face box)", "-", "1", n, _time(detector.detect, frames[:n])))
    except Exception as exc:  # noqa: BLE001 - the S3FD row is optional
        print(f"s3fd row skipped: {type(exc).__name__}: {exc}")

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nLandmarks on the CPU: {source}, {args.threads} threads, random weights at full size, "
          f"onnxruntime {ort.__version__}, torch {torch.__version__}, best of {REPEAT}, load average {load:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"{'backend':<17}{'flip':>5}{'batch':>6}{'frames':>7}{'seconds':>9}{'frames/s':>10}{'ms/frame':>10}")
    for name, flip, batch, n, seconds in rows:
        print(f"{name:<17}{flip:>5}{batch:>6}{n:>7}{seconds:>9.2f}{n / seconds:>10.2f}{1000 * seconds / n:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
