"""Batch throughput on the GPU machine: the Ray batch (nbhelpers.batch.run) against a plain loop of nbh.lipsync().

The same jobs, in the same run:
``--jobs`` clips of ``--seconds`` of speech (slices of the shared long speech file) over ``--faces`` face videos of
the same length (the shared 576x768 video, each face a different encoding of it so that its content and avatar
differ), full-size v1.5 architecture with random weights (bench/_common.py; one folder, written once, serves both
arms; ``--weights /tmp/ls/weights`` reuses bench/lipsync.py's), crop boxes given. The batch runs first (it gets no
page-cache or CUDA warm-up from the loop) and loads the models once per worker and prepares each face once. The loop
then makes a pipeline per call (every model loaded, the face prepared again for every clip), as a script of
``nbh.lipsync()`` calls does; each call is independent of the others, so ``--loop-jobs N`` (the first N jobs, faces
alternating) measures the loop's jobs/hour on fewer calls when device time is short. Wall times include everything:
Ray's start, the workers' model loads, the avatars' preparation. GPU busy is the mean of NVML's utilisation samples
(every 0.5 s) over the arm and the GPUs used. The ratio is jobs/hour against the loop's. Steady jobs/hour leaves
the start-up out: the jobs after the first one over the time from its end to the last one's (the loop: its calls
after the first), the figure that scaling over GPUs is also judged on (issue 22). The figures go to
``--out`` as JSON, rewritten after the batch and after every loop call (a run stopped by its time limit keeps them).

    python bench/batch.py --out b.json       # 20 jobs of 10 s over 2 faces, one GPU; markdown table to stdout
    python bench/batch.py --loop-jobs 10     # the same batch; the loop times 10 of the calls (5 per face)
    python bench/batch.py --gpus 4 --jobs 40 --faces 4 --skip-loop   # the multi-GPU run (issue 22)
    python bench/batch.py --smoke            # tiny weights on the CPU, 4 jobs of 0.4 s: checks the script
    python bench/batch.py --workers-per-gpu 2 --batch-size 0,128   # two batch arms (planned, 128), one loop
    python bench/batch.py --workers-per-gpu 0,3,4 --skip-loop       # the batch's choice, then 3 and 4 per GPU
    python bench/batch.py --jobs-per-worker 1,2                     # one job at a time per worker, then two

On the GPU machine: ``bash bench/device_batch.sh`` (Ray and the other missing packages carried as xz tarballs).
Ray must be importable (``pip install "ray>=2.10"``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
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


class CpuBusy:
    """Share of the machine's CPU time that was busy (not idle or waiting on I/O) while the ``with`` block ran, from
    ``/proc/stat``'s first line (NaN where there is none)."""

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    def __enter__(self):
        self._start, self.percent = self._read(), float("nan")
        return self

    def __exit__(self, *exc):
        end = self._read()
        if self._start and end and end[0] > self._start[0]:
            total, idle = end[0] - self._start[0], end[1] - self._start[1]
            self.percent = 100.0 * (total - idle) / total


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


def table(rows: list[dict], base_rate: float | None) -> str:
    """The markdown table: arm, jobs, frames, wall s, jobs/hour, frames/s, GPU busy, ratio (jobs/hour vs the loop)."""
    lines = ["| arm | jobs | frames | wall s | jobs/hour | steady jobs/hour | frames/s | GPU busy % | vs loop |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['jobs_per_hour'] / base_rate:.2f}x" if base_rate else ""
        busy = "n/a" if r["gpu_busy_pct"] is None else f"{r['gpu_busy_pct']:.0f}"
        steady = "n/a" if r.get("steady_jobs_per_hour") is None else f"{r['steady_jobs_per_hour']:.0f}"
        lines.append(f"| {r['arm']} | {r['jobs']} | {r['frames']} | {r['wall_s']:.1f} | {r['jobs_per_hour']:.0f} | "
                     f"{steady} | {r['frames_per_s']:.1f} | {busy} | {ratio} |")
    return "\n".join(lines)


def steady_rate(ends_s: list[float]) -> float | None:
    """Jobs/hour once the first job is out: the jobs after the first over the time from its end to the last's
    (the start-up, Ray, imports, first preparations, left out; what scaling over GPUs is judged on beside the
    wall time). ``ends_s``: when each job ended, seconds from the arm's start. None for fewer than 3 jobs."""
    ends = sorted(ends_s)
    return (len(ends) - 1) / (ends[-1] - ends[0]) * 3600 if len(ends) > 2 and ends[-1] > ends[0] else None


def row(arm: str, gpus: int, jobs: list[dict], wall_s: float, busy: float, **extra) -> dict:
    """One arm's figures (frames: 25 fps output frames of its jobs, ``floor(audio s x 25)`` as the engine makes)."""
    frames = sum(j["frames"] for j in jobs)
    return dict(arm=arm, gpus=gpus, jobs=len(jobs), frames=frames, wall_s=wall_s,
                jobs_per_hour=len(jobs) / wall_s * 3600, frames_per_s=frames / wall_s,
                gpu_busy_pct=None if busy != busy else busy, **extra)  # NaN (no NVML) is null in the JSON


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0, help="speech per job (and face video length)")
    parser.add_argument("--faces", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the batch uses (the loop uses one)")
    parser.add_argument("--workers-per-gpu", type=lambda text: [int(v) for v in text.split(",")], default=[0],
                        help="comma-separated: workers sharing each GPU, one set of batch arms per value; 0: the "
                             "batch's own choice from the free memory (default)")
    parser.add_argument("--jobs-per-worker", type=lambda text: [int(v) for v in text.split(",")], default=[0],
                        help="comma-separated: jobs each worker runs at once, one set of batch arms per value; 0: "
                             "the batch's own choice (default)")
    parser.add_argument("--skip-loop", action="store_true", help="run the batch only")
    parser.add_argument("--batch-size", type=lambda text: [int(v) for v in text.split(",")], default=[0],
                        help="comma-separated: one batch arm per value, run one after the other before the loop, "
                             "each with that batch_size (as `--batch-size` of `python -m nbhelpers batch`; it sets "
                             "the avatars' preparation batch too); 0: each worker's plan (clip cap 64). Default 0")
    parser.add_argument("--loop-jobs", type=int, default=None,
                        help="the loop times the first N of the jobs (faces alternate, so N even covers them "
                             "equally) and its jobs/hour is compared; default: all of them")
    parser.add_argument("--kill", default=None, help="job name whose worker exits at frame 50 (first attempt)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--weights", default=None,
                        help="full-size random weights folder (written there if absent; bench/lipsync.py's "
                             "/tmp/ls/weights is reused)")
    parser.add_argument("--out", default=None, help="JSON of the figures (rewritten after each arm and loop call)")
    parser.add_argument("--smoke", action="store_true", help="tiny weights on the CPU, 4 jobs of 0.4 s")
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.seconds, args.faces, args.gpus = min(args.jobs, 4), 0.4, 2, 0

    from _common import make_full_weights, media_dir

    import nbhelpers as nbh
    from nbhelpers import batch, media

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    out_json = Path(args.out) if args.out else work / "bench-batch.json"
    t_weights = time.perf_counter()
    if args.smoke:
        from nbhelpers.testing import make_tiny_weights

        weights = make_tiny_weights(work / "tiny")
    else:
        weights = make_full_weights(Path(args.weights or work / "weights"))
    t_weights = time.perf_counter() - t_weights
    faces, audios = make_media(work, media_dir(), args.faces, args.jobs, args.seconds, media.ffmpeg_exe(), args.smoke)
    config = nbh.InferenceConfig(device="cpu") if args.smoke else nbh.InferenceConfig()
    jobs = [{"name": f"job{k:02d}", "video": str(faces[k % len(faces)]), "audio": str(audios[k]), "box": BOX}
            for k in range(args.jobs)]
    frames = {j["name"]: len(media.load_audio(j["audio"])) * 25 // 16000 for j in jobs}
    rows: list[dict] = []
    report = {"jobs": args.jobs, "seconds": args.seconds, "faces": args.faces, "smoke": args.smoke,
              "batch_sizes": args.batch_size, "workers_per_gpu": args.workers_per_gpu,
              "weights_s": round(t_weights, 1), "rows": rows}

    def save() -> None:
        out_json.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_json.with_name(out_json.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(out_json)

    # The batch first: it gets no page cache or CUDA warm-up from the loop, and its figures are saved before the
    # loop starts (a run cut short by its time limit still has them). One batch arm per --batch-size value, each
    # into a fresh folder (its own avatar cache, nothing skipped).
    exit_at = {args.kill: 50} if args.kill else None
    for per_gpu, slots, size in itertools.product(args.workers_per_gpu, args.jobs_per_worker, args.batch_size):
        out = work / f"batch-{args.gpus}gpu-w{per_gpu or 'auto'}-j{slots or 'auto'}-b{size or 'plan'}"
        shutil_rm(out)
        out.mkdir()
        batch_jobs = [dict(j, output=str(out / f"{j['name']}.mp4")) for j in jobs]
        with GpuBusy(max(args.gpus, 1)) as busy, CpuBusy() as cpu:
            t0 = time.perf_counter()
            result = batch.run(batch_jobs, weights_dir=weights, config=config.replace(batch_size=size or None),
                               gpus=args.gpus, cpu_workers=1, workers_per_gpu=per_gpu or None,
                               jobs_per_worker=slots or None, _exit_at=exit_at)
            batch_s = time.perf_counter() - t0
        print(result, flush=True)
        if not result.ok:
            raise SystemExit(f"{len(result.failed)} job(s) failed")
        made = sorted(p.name for p in out.glob("*.mp4"))
        assert made == sorted(f"{j['name']}.mp4" for j in jobs), made
        if result.frames != sum(frames.values()):
            print(f"WARNING: the batch made {result.frames} frames, the audios give {sum(frames.values())}",
                  flush=True)
        label = f"batch {size}" if size else "planned batch"
        if len(args.jobs_per_worker) > 1:
            label = f"{slots or 'auto'} jobs each, {label}"
        if len(args.workers_per_gpu) > 1:
            label = f"{per_gpu or 'auto'} per GPU, {label}"
        rows.append(row(f"Ray batch ({len(result.workers)} worker(s), {label})", max(args.gpus, 0),
                        [dict(j, frames=frames[j["name"]]) for j in jobs], batch_s, busy.percent,
                        retried=[o.job for o in result.outcomes if o.attempts > 1], avatars=dict(result.avatars),
                        cpu_busy_pct=round(cpu.percent, 1), batch_size=size or None,
                        workers_per_gpu=per_gpu or None, jobs_per_worker=slots or None,
                        phases=dict(result.phases),
                        steady_jobs_per_hour=steady_rate([o.ended_s for o in result.outcomes if o.status == "done"]),
                        workers_note=result.workers_note))
        save()
        print(f"batch ({label}): {batch_s:.1f} s; CPU busy {cpu.percent:.0f}% of {os.cpu_count()} cores; phases "
              "(s from the start): " + ", ".join(f"{k} {v:.1f}" for k, v in result.phases.items())
              + "; job seconds on the workers: " + ", ".join(f"{o.seconds:.2f}" for o in result.outcomes),
              flush=True)
        for worker, events in result.timeline.items():
            print(f"  {worker}: " + ", ".join(f"{e} {t:.1f}" for e, t in events), flush=True)
        for o in result.outcomes:
            print(f"  {o.job} {o.seconds:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in o.timings.items()), flush=True)
        rows[-1]["timeline"] = {w: list(map(list, ev)) for w, ev in result.timeline.items()}
        rows[-1]["job_timings"] = {o.job: dict(o.timings) for o in result.outcomes}
        save()
        report["phases"] = dict(result.phases)
        exit_at = None  # the kill is for the first arm only

    if not args.skip_loop:
        # A pipeline per call (every model loaded, the face prepared again), as a script of nbh.lipsync() calls does.
        loop_jobs = jobs[: args.loop_jobs] if args.loop_jobs else jobs
        out = work / "loop"
        shutil_rm(out)
        out.mkdir()
        calls: list[float] = []
        with GpuBusy(1) as busy, CpuBusy() as cpu:
            t0 = time.perf_counter()
            for job in loop_jobs:
                t1 = time.perf_counter()
                res = nbh.lipsync(job["video"], job["audio"], out / f"{job['name']}.mp4", config=config, boxes=BOX,
                                  weights_dir=weights)
                calls.append(round(time.perf_counter() - t1, 2))
                if res.n_frames != frames[job["name"]]:
                    print(f"WARNING: {job['name']} made {res.n_frames} frames, its audio gives {frames[job['name']]}")
                print(f"loop {job['name']}: {calls[-1]:.1f} s", flush=True)
                report["loop_partial"] = {"calls_s": calls, "wall_s": time.perf_counter() - t0}
                save()
            loop_s = time.perf_counter() - t0
        rows.insert(0, row("loop of nbh.lipsync()", 0 if args.smoke else 1,
                           [dict(j, frames=frames[j["name"]]) for j in loop_jobs], loop_s, busy.percent,
                           calls_s=calls, cpu_busy_pct=round(cpu.percent, 1),
                           steady_jobs_per_hour=steady_rate(list(itertools.accumulate(calls)))))
        report.pop("loop_partial", None)
        print(f"loop: {loop_s:.1f} s for {len(loop_jobs)} calls; CPU busy {cpu.percent:.0f}%", flush=True)

    base = rows[0]["jobs_per_hour"] if not args.skip_loop else None
    batch_rows = rows[1:] if not args.skip_loop else rows
    report["ratio_jobs_per_hour"] = batch_rows[0]["jobs_per_hour"] / base if base else None  # the first batch arm
    report["ratios_jobs_per_hour"] = [r["jobs_per_hour"] / base for r in batch_rows] if base else None
    report["table"] = table(rows, base)
    save()
    subset = "" if args.skip_loop or len(loop_jobs) == len(jobs) else f"; the loop timed the first {len(loop_jobs)}"
    print(f"\n{args.jobs} jobs of {args.seconds:g} s over {args.faces} faces, {sum(frames.values())} frames, "
          f"{'tiny weights, CPU' if args.smoke else 'full-size random weights'}{subset}\n")
    print(report["table"])
    if batch_rows[0]["retried"]:
        print(f"\nretried after a worker died: {', '.join(batch_rows[0]['retried'])}; every output present once")
    print(f"\nJSON: {out_json}")


def shutil_rm(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
