"""Batch throughput on the GPU machine: the Ray batch (nbhelpers.batch.run) against a plain loop of nbh.lipsync().

The same jobs, in the same run: ``--jobs`` clips of ``--seconds`` of speech (slices of the shared long speech file)
over ``--faces`` face videos of the same length (the shared 576x768 video, each face a different encoding of it so
that its content and avatar differ), full-size v1.5 architecture with random weights (bench/_common.py), crop boxes
given. The loop makes a pipeline per call (every model loaded, the face prepared again for every clip), as a script
of ``nbh.lipsync()`` calls does; the batch loads the models once per worker and prepares each face once. Wall
times include everything: Ray's start, the workers' model loads, the avatars' preparation. GPU busy is the mean
of NVML's utilisation samples (every 0.5 s) over the phase and the GPUs used.

    python bench/batch.py                    # 20 jobs of 10 s over 2 faces, one GPU; markdown table to stdout
    python bench/batch.py --gpus 4 --jobs 40 --faces 4 --skip-loop   # the multi-GPU run (issue 22)
    python bench/batch.py --smoke            # tiny weights on the CPU, 4 jobs of 0.4 s: checks the script

Ray must be importable (``pip install "ray>=2.10"``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BOX = (190, 160, 360, 330)  # crop box around the face of the shared 576x768 video


class GpuBusy:
    """Mean NVML utilisation of some GPUs, sampled in a thread while the ``with`` block runs (NaN without NVML)."""

    def __init__(self, n_gpus: int, interval_s: float = 0.5):
        self.n_gpus, self.interval_s = n_gpus, interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()

    def _loop(self, handles, nvml):
        while not self._stop.wait(self.interval_s):
            self.samples.append(sum(nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles) / len(handles))

    def __enter__(self):
        try:
            import pynvml as nvml

            nvml.nvmlInit()
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.n_gpus)]
        except Exception:  # noqa: BLE001 - no NVML (CPU smoke run): no figure
            self._thread = None
            return self
        self._thread = threading.Thread(target=self._loop, args=(handles, nvml), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def percent(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def make_media(work: Path, data: Path, n_faces: int, n_jobs: int, seconds: float, ffmpeg: str, smoke: bool):
    """Face videos of ``seconds`` (or 10 frames in a smoke run) and ``n_jobs`` speech slices of ``seconds``."""
    import soundfile as sf

    faces = []
    video_s = 0.4 if smoke else seconds
    for k in range(n_faces):
        out = work / f"face-{k}.mp4"
        if not out.is_file():
            subprocess.run([ffmpeg, "-v", "error", "-y", "-i", str(data / "face-sing-576x768-25fps.mp4"), "-t",
                            f"{video_s}", "-an", "-c:v", "libx264", "-crf", str(12 + k), "-pix_fmt", "yuv420p",
                            str(out)], check=True, stdin=subprocess.DEVNULL)
        faces.append(out)
    speech, sr = sf.read(data / "speech-en-long.wav", dtype="float32")
    span = len(speech) / sr - seconds
    audios = []
    for k in range(n_jobs):
        out = work / f"speech-{k:02d}.wav"
        start = (k * 1.7) % max(span, 1e-3)
        sf.write(out, speech[int(start * sr): int((start + seconds) * sr)], sr)
        audios.append(out)
    return faces, audios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0, help="speech per job (and face video length)")
    parser.add_argument("--faces", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the batch uses (the loop uses one)")
    parser.add_argument("--workers-per-gpu", type=int, default=1)
    parser.add_argument("--skip-loop", action="store_true", help="run the batch only")
    parser.add_argument("--kill", default=None, help="job name whose worker exits at frame 50 (first attempt)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny weights on the CPU, 4 jobs of 0.4 s")
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.seconds, args.faces, args.gpus = min(args.jobs, 4), 0.4, 2, 0

    from _common import make_full_weights, media_dir

    import nbhelpers as nbh
    from nbhelpers import batch, media

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        from nbhelpers.testing import make_tiny_weights

        weights = make_tiny_weights(work / "tiny")
    else:
        weights = make_full_weights(Path(args.weights or work / "weights"))
    faces, audios = make_media(work, media_dir(), args.faces, args.jobs, args.seconds, media.ffmpeg_exe(), args.smoke)
    config = nbh.InferenceConfig(device="cpu") if args.smoke else nbh.InferenceConfig()
    jobs = [{"name": f"job{k:02d}", "video": str(faces[k % len(faces)]), "audio": str(audios[k]), "box": BOX}
            for k in range(args.jobs)]
    n_frames = sum(len(media.load_audio(a)) * 25 // 16000 for a in audios)
    rows = []

    if not args.skip_loop:
        out = work / "loop"
        out.mkdir(exist_ok=True)
        with GpuBusy(1) as busy:
            t0 = time.perf_counter()
            for job in jobs:
                nbh.lipsync(job["video"], job["audio"], out / f"{job['name']}.mp4", config=config, boxes=BOX,
                            weights_dir=weights)
            loop_s = time.perf_counter() - t0
        rows.append(("loop of nbh.lipsync()", 0 if args.smoke else 1, loop_s, busy.percent))
        print(f"loop: {loop_s:.1f} s", flush=True)

    out = work / f"batch-{args.gpus}gpu"
    shutil_rm(out)
    out.mkdir()
    for job in jobs:
        job["output"] = str(out / f"{job['name']}.mp4")
    exit_at = {args.kill: 50} if args.kill else None
    with GpuBusy(max(args.gpus, 1)) as busy:
        t0 = time.perf_counter()
        result = batch.run(jobs, weights_dir=weights, config=config, gpus=args.gpus, cpu_workers=1,
                           workers_per_gpu=args.workers_per_gpu, _exit_at=exit_at)
        batch_s = time.perf_counter() - t0
    print(result, flush=True)
    if not result.ok:
        raise SystemExit(f"{len(result.failed)} job(s) failed")
    made = sorted(p.name for p in out.glob("*.mp4"))
    assert made == sorted(f"{j['name']}.mp4" for j in jobs), made
    rows.append((f"Ray batch ({len(result.workers)} worker(s))", max(args.gpus, 0), batch_s, busy.percent))

    print(f"\n{args.jobs} jobs of {args.seconds:g} s over {args.faces} faces, {n_frames} frames, "
          f"{'tiny weights, CPU' if args.smoke else 'full-size random weights'}\n")
    print("| run | GPUs | wall s | jobs/hour | frames/s | GPU busy % | vs loop |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = rows[0][2] if not args.skip_loop else None
    for name, g, wall, pct in rows:
        ratio = f"{base / wall:.2f}x" if base else ""
        print(f"| {name} | {g} | {wall:.1f} | {args.jobs / wall * 3600:.0f} | {n_frames / wall:.1f} | {pct:.0f} | "
              f"{ratio} |")
    retried = [o.job for o in result.outcomes if o.attempts > 1]
    if retried:
        print(f"\nretried after a worker died: {', '.join(retried)}; every output present once")
    (work / "bench-batch.json").write_text(json.dumps({"rows": rows, "jobs": args.jobs, "frames": n_frames}))


def shutil_rm(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
