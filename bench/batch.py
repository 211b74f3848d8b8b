"""Batch throughput on the GPU machine: the Ray batch (nbhelpers.batch.run) against a plain loop of nbh.lipsync().

The same jobs, in the same run:
``--jobs`` clips of ``--seconds`` of speech (slices of the shared long speech file) over ``--faces`` face videos of
the same length (the shared 576x768 video, each face a different encoding of it so that its content and avatar
differ), full-size v1.5 architecture with random weights (bench/_common.py; one folder, written once, serves both
arms; ``--weights /tmp/ls/weights`` reuses bench/lipsync.py's), crop boxes given. The batch runs first (it gets no
page-cache or CUDA warm-up from the loop) and loads the models once per worker and prepares each face once. The loop
then makes a pipeline per call (every model loaded, the face prepared again for every clip), as a script of
``nbh.lipsync()`` calls does; each call is independent of the others, so ``--loop-jobs N`` (the first N jobs, faces
alternating) measures the loop's jobs/hour on fewer calls when device time is short. Each arm runs in a fresh Python
process, timed from its launch to its exit, as ``python -m nbhelpers batch jobs.csv`` and a script of lipsync()
calls would be: the batch workers' imports (torch, diffusers, transformers: 17-20 s on the GPU machine) are in the
batch's wall time, and the loop's own imports in the loop's (``--loop in-process`` adds the loop run in this process,
where diffusers and the CUDA context are already loaded: the condition of the sessions before 2026-12-02, whose first
call took 5.9-18 s as the bench's state happened to be; ``--in-process`` runs the batch arms here too). Wall times
include everything: Ray's start, the workers' model loads, the avatars' preparation. GPU busy is the mean of NVML's
utilisation samples (every 0.5 s) over the arm and the GPUs used. The ratio is jobs/hour against the first loop
arm's. Steady jobs/hour leaves the start-up out: the jobs after the first one over the time from its end to the
last one's (the loop: its calls after the first), the figure that scaling over GPUs is also judged on (issue 22).
The figures go to ``--out`` as JSON, rewritten after every arm (and every call of an in-process loop).

    python bench/batch.py --out b.json       # 20 jobs of 10 s over 2 faces, one GPU; markdown table to stdout
    python bench/batch.py --loop-jobs 10     # the same batch; the loop times 10 of the calls (5 per face)
    python bench/batch.py --gpus 4 --jobs 40 --faces 4 --skip-loop   # the multi-GPU run (issue 22)
    python bench/batch.py --smoke            # tiny weights on the CPU, 4 jobs of 0.4 s: checks the script
    python bench/batch.py --workers-per-gpu 2 --batch-size 0,128   # two batch arms (planned, 128), one loop
    python bench/batch.py --workers-per-gpu 0,3,4 --skip-loop       # the batch's choice, then 3 and 4 per GPU
    python bench/batch.py --jobs-per-worker 1,2                     # one job at a time per worker, then two
    python bench/batch.py --loop fresh,in-process                  # the loop in a fresh process and in this one

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
        self.times: list[float] = []  # seconds from the start of the block, one per sample
        self._stop = threading.Event()

    def _loop(self, handles, nvml):
        t0 = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            self.samples.append(sum(nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles) / len(handles))
            self.times.append(time.perf_counter() - t0)

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

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.series: list[float] = []  # busy % of each interval
        self._stop = threading.Event()

    def _loop(self) -> None:
        last = self._start
        while not self._stop.wait(self.interval_s):
            now = self._read()
            if last and now and now[0] > last[0]:
                self.series.append(round(100.0 * (1 - (now[1] - last[1]) / (now[0] - last[0])), 1))
            last = now

    def __enter__(self):
        self._start, self.percent = self._read(), float("nan")
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        end = self._read()
        if self._start and end and end[0] > self._start[0]:
            total, idle = end[0] - self._start[0], end[1] - self._start[1]
            self.percent = 100.0 * (total - idle) / total


def print_series(gpu: GpuBusy, cpu: CpuBusy) -> dict:
    """Print the GPU and CPU busy % of each second of an arm (``t gpu/cpu``) and return both series."""
    per_s = max(1, round(1.0 / gpu.interval_s))
    g = [round(sum(gpu.samples[k:k + per_s]) / len(gpu.samples[k:k + per_s])) for k in range(0, len(gpu.samples),
                                                                                             per_s)]
    c = [round(sum(cpu.series[k:k + per_s]) / len(cpu.series[k:k + per_s])) for k in range(0, len(cpu.series),
                                                                                          per_s)]
    if g or c:
        print("  busy % by second (GPU/CPU): " + " ".join(
            f"{k}:{g[k] if k < len(g) else '-'}/{c[k] if k < len(c) else '-'}" for k in range(max(len(g), len(c)))),
            flush=True)
    return {"gpu_busy_series": gpu.samples, "gpu_busy_times_s": [round(t, 2) for t in gpu.times],
            "cpu_busy_series": cpu.series}


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


def batch_figures(result, run_s: float) -> dict:
    """What the parent reports of a BatchResult, as plain JSON data."""
    return {"text": str(result), "ok": result.ok, "failed": len(result.failed), "frames": result.frames,
            "run_s": round(run_s, 3), "workers": list(result.workers), "avatars": dict(result.avatars),
            "phases": dict(result.phases), "workers_note": result.workers_note,
            "timeline": {w: [list(e) for e in ev] for w, ev in result.timeline.items()},
            "preparations": [dict(p) for p in result.preparations],
            "outcomes": [{"job": o.job, "status": o.status, "seconds": o.seconds, "ended_s": o.ended_s,
                          "attempts": o.attempts, "timings": dict(o.timings)} for o in result.outcomes]}


def batch_in_process(spec: dict) -> dict:
    """One batch arm: ``nbhelpers.batch.run`` over the spec's jobs, in this process."""
    import nbhelpers as nbh
    from nbhelpers import batch
    from nbhelpers.batch import scheduler

    t0 = time.perf_counter()
    if spec.get("waiting") is not None:
        scheduler.WAITING_PER_SLOT = int(spec["waiting"])
    scheduler.EXIT_AT = spec["exit_at"] or {}  # --kill: that job's worker exits mid-clip on its first attempt
    config = batch.BatchConfig(gpus=spec["gpus"], cpu_workers=1, workers_per_gpu=spec["workers_per_gpu"],
                               jobs_per_worker=spec["jobs_per_worker"])
    result = batch.run(spec["jobs"], config, inference=nbh.InferenceConfig(**spec["config"]),
                       weights_dir=spec["weights"])
    return batch_figures(result, time.perf_counter() - t0)


def loop_in_process(spec: dict, report: dict | None = None, save=None) -> dict:
    """One loop arm: an nbh.lipsync() call per job, each making its own pipeline; the seconds of every call and the
    frames each made (saved into ``report["loop_partial"]`` after each call when given)."""
    import nbhelpers as nbh

    config = nbh.InferenceConfig(**spec["config"])
    calls, made = [], {}
    t0 = time.perf_counter()
    for job in spec["jobs"]:
        t1 = time.perf_counter()
        res = nbh.lipsync(job["video"], job["audio"], job["output"], config=config, boxes=tuple(spec["box"]),
                          weights_dir=spec["weights"])
        calls.append(round(time.perf_counter() - t1, 2))
        made[job["name"]] = int(res.n_frames)
        print(f"loop {job['name']}: {calls[-1]:.1f} s", flush=True)
        if report is not None:
            report["loop_partial"] = {"calls_s": calls, "wall_s": time.perf_counter() - t0}
            save()
    return {"calls_s": calls, "frames": made}


def run_child(spec: dict, work: Path) -> dict:
    """Run one arm in a fresh Python process (this script with ``--child``) and return its figures; the caller
    times the call, so the wall time runs from the launch to the exit. Its output goes to this one's."""
    spec_path = Path(tempfile.mkstemp(prefix="arm-", suffix=".json", dir=work)[1])
    result_path = spec_path.with_suffix(".result.json")
    spec_path.write_text(json.dumps(dict(spec, result=str(result_path))))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
                          stdin=subprocess.DEVNULL)
    if proc.returncode:
        raise SystemExit(f"the {spec['kind']} arm's process failed (exit {proc.returncode})")
    return json.loads(result_path.read_text())


def child_main(spec_path: Path) -> None:
    """The body of a ``--child`` process: the arm of the spec file, its figures written next to it."""
    spec = json.loads(spec_path.read_text())
    figures = loop_in_process(spec) if spec["kind"] == "loop" else batch_in_process(spec)
    Path(spec["result"]).write_text(json.dumps(figures))


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
    parser.add_argument("--waiting", type=lambda text: [int(v) for v in text.split(",")], default=[-1],
                        help="comma-separated: jobs a GPU worker holds per render slot beyond the rendering one "
                             "(nbhelpers.batch.scheduler.WAITING_PER_SLOT), one set of batch arms per value; -1: the "
                             "package's value (default); 0: a worker holds only the jobs it renders")
    parser.add_argument("--skip-loop", action="store_true", help="run the batch only")
    parser.add_argument("--loop", type=lambda text: text.split(","), default=["fresh"],
                        help="comma-separated loop arms: fresh (a new Python process, timed from its launch to its "
                             "exit; the ratio's reference) and in-process (in this process, with diffusers and the "
                             "CUDA context already here). Default fresh")
    parser.add_argument("--in-process", action="store_true",
                        help="run the batch arms in this process (timed around batch.run()) instead of each in a "
                             "fresh one")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: run one arm's spec file
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
    if args.child:
        child_main(Path(args.child))
        return
    bad = [m for m in args.loop if m not in ("fresh", "in-process")]
    if bad:
        parser.error(f"--loop takes fresh and in-process; got {', '.join(bad)}")
    if args.smoke:
        args.jobs, args.seconds, args.faces, args.gpus = min(args.jobs, 4), 0.4, 2, 0

    from _common import make_full_weights, media_dir

    from nbhelpers import media

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
    # loop starts (a run cut short by its time limit still has them). One batch arm per combination of the
    # options, each into a fresh folder (its own avatar cache, nothing skipped), each (unless --in-process) in a
    # fresh Python process timed from its launch to its exit, as `python -m nbhelpers batch` would be: the
    # workers' imports are in the batch's wall time, so the driver's and the loop's are in theirs too.
    exit_at = {args.kill: 50} if args.kill else None
    config_fields = {"device": "cpu"} if args.smoke else {}
    for per_gpu, slots, size, waiting in itertools.product(args.workers_per_gpu, args.jobs_per_worker,
                                                           args.batch_size, args.waiting):
        out = work / (f"batch-{args.gpus}gpu-w{per_gpu or 'auto'}-j{slots or 'auto'}-b{size or 'plan'}"
                      f"-q{waiting if waiting >= 0 else 'auto'}")
        shutil_rm(out)
        out.mkdir()
        batch_jobs = [dict(j, output=str(out / f"{j['name']}.mp4")) for j in jobs]
        spec = {"kind": "batch", "jobs": batch_jobs, "weights": str(weights),
                "config": dict(config_fields, batch_size=size or None), "gpus": args.gpus,
                "workers_per_gpu": per_gpu or None, "jobs_per_worker": slots or None, "exit_at": exit_at,
                "waiting": waiting if waiting >= 0 else None}
        with GpuBusy(max(args.gpus, 1)) as busy, CpuBusy() as cpu:
            t0 = time.perf_counter()
            res = run_child(spec, work) if not args.in_process else batch_in_process(spec)
            batch_s = time.perf_counter() - t0
        print(res["text"], flush=True)
        if not res["ok"]:
            raise SystemExit(f"{res['failed']} job(s) failed")
        made = sorted(p.name for p in out.glob("*.mp4"))
        assert made == sorted(f"{j['name']}.mp4" for j in jobs), made
        if res["frames"] != sum(frames.values()):
            print(f"WARNING: the batch made {res['frames']} frames, the audios give {sum(frames.values())}",
                  flush=True)
        label = f"batch {size}" if size else "planned batch"
        if len(args.jobs_per_worker) > 1:
            label = f"{slots or 'auto'} jobs each, {label}"
        if len(args.workers_per_gpu) > 1:
            label = f"{per_gpu or 'auto'} per GPU, {label}"
        if len(args.waiting) > 1:
            label = f"{waiting if waiting >= 0 else 'auto'} waiting per slot, {label}"
        label += ", in the bench process" if args.in_process else ""
        outcomes = res["outcomes"]
        rows.append(row(f"Ray batch ({len(res['workers'])} worker(s), {label})", max(args.gpus, 0),
                        [dict(j, frames=frames[j["name"]]) for j in jobs], batch_s, busy.percent,
                        retried=[o["job"] for o in outcomes if o["attempts"] > 1], avatars=res["avatars"],
                        cpu_busy_pct=round(cpu.percent, 1), batch_size=size or None,
                        workers_per_gpu=per_gpu or None, jobs_per_worker=slots or None,
                        phases=res["phases"], run_s=res["run_s"], before_run_s=round(batch_s - res["run_s"], 2),
                        steady_jobs_per_hour=steady_rate([o["ended_s"] for o in outcomes if o["status"] == "done"]),
                        workers_note=res["workers_note"]))
        rows[-1].update(print_series(busy, cpu))
        save()
        print(f"batch ({label}): {batch_s:.1f} s ({res['run_s']:.1f} in batch.run(), the rest the process's start, "
              f"imports and exit); CPU busy {cpu.percent:.0f}% of {os.cpu_count()} cores; phases (s from the "
              "start of run()): " + ", ".join(f"{k} {v:.1f}" for k, v in res["phases"].items())
              + "; job seconds on the workers: " + ", ".join(f"{o['seconds']:.2f}" for o in outcomes), flush=True)
        for worker, events in res["timeline"].items():
            print(f"  {worker}: " + ", ".join(f"{e} {t:.1f}" for e, t in events), flush=True)
        for o in outcomes:
            print(f"  {o['job']} {o['seconds']:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in o["timings"].items()),
                  flush=True)
        for prep in res["preparations"]:
            print(f"  {prep['status']} {Path(prep['video']).name} on {prep['worker']}: {prep['seconds']:.2f} s, "
                  f"ended at {prep['ended_s']:.1f}: " + ", ".join(f"{k} {v:.2f}" for k, v in prep["timings"].items()),
                  flush=True)
        rows[-1]["preparations"] = res["preparations"]
        rows[-1]["timeline"] = res["timeline"]
        rows[-1]["job_timings"] = {o["job"]: o["timings"] for o in outcomes}
        save()
        report["phases"] = res["phases"]
        exit_at = None  # the kill is for the first arm only

    loop_jobs = jobs[: args.loop_jobs] if args.loop_jobs else jobs
    n_loops = 0
    for mode in ([] if args.skip_loop else args.loop):
        # A pipeline per call (every model loaded, the face prepared again), as a script of nbh.lipsync() calls
        # does: in a fresh process timed from its launch to its exit (its imports included, as the batch's are),
        # or in this process ("in-process": diffusers and the CUDA context are here already, the condition of the
        # sessions before 2026-12-02).
        out = work / f"loop-{mode}"
        shutil_rm(out)
        out.mkdir()
        spec = {"kind": "loop", "jobs": [dict(j, output=str(out / f"{j['name']}.mp4")) for j in loop_jobs],
                "weights": str(weights), "config": config_fields, "box": list(BOX)}
        with GpuBusy(1) as busy, CpuBusy() as cpu:
            t0 = time.perf_counter()
            res = run_child(spec, work) if mode == "fresh" else loop_in_process(spec, report, save)
            loop_s = time.perf_counter() - t0
        calls = res["calls_s"]
        for job in loop_jobs:
            if res["frames"][job["name"]] != frames[job["name"]]:
                print(f"WARNING: {job['name']} made {res['frames'][job['name']]} frames, its audio gives "
                      f"{frames[job['name']]}")
        name = "loop of nbh.lipsync()" + ("" if mode == "fresh" else ", in the bench process")
        rows.insert(n_loops, row(name, 0 if args.smoke else 1, [dict(j, frames=frames[j["name"]]) for j in loop_jobs],
                                 loop_s, busy.percent, calls_s=calls, cpu_busy_pct=round(cpu.percent, 1),
                                 before_calls_s=round(loop_s - sum(calls), 2),
                                 steady_jobs_per_hour=steady_rate(list(itertools.accumulate(calls)))))
        rows[n_loops].update(print_series(busy, cpu))
        n_loops += 1
        report.pop("loop_partial", None)
        save()
        print(f"loop ({mode}): {loop_s:.1f} s for {len(loop_jobs)} calls ({loop_s - sum(calls):.1f} s outside them: "
              f"the process's start, imports and exit); calls: " + ", ".join(f"{c:.1f}" for c in calls)
              + f"; CPU busy {cpu.percent:.0f}%", flush=True)

    base = rows[0]["jobs_per_hour"] if n_loops else None  # the first loop mode given (default: fresh)
    batch_rows = rows[n_loops:]
    report["ratio_jobs_per_hour"] = batch_rows[0]["jobs_per_hour"] / base if base else None  # the first batch arm
    report["ratios_jobs_per_hour"] = [r["jobs_per_hour"] / base for r in batch_rows] if base else None
    report["table"] = table(rows, base)
    save()
    subset = "" if not n_loops or len(loop_jobs) == len(jobs) else f"; the loop timed the first {len(loop_jobs)}"
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
