"""Where a fresh batch worker's first seconds go: one process doing what a Ray batch worker does, each step timed.

A batch worker is a new process: it imports torch and nbhelpers, touches CUDA, loads the pipeline, prepares a
face (its first CUDA work) and generates clips. In a loop of ``nbh.lipsync()`` calls only the first call pays the
process's cold start; in a batch every worker does, before its first job. This runs those steps in order in this
process and prints their seconds (GPU work synchronised), with a stack sample of the first preparation and the
first clip, so that the cold part can be named and moved out of the batch's critical path.

    python bench/coldstart.py --weights /tmp/ls/weights --work /tmp/bench-batch [--warm] [--profile]

``--warm`` runs the worker's warm-up (:meth:`nbhelpers.pipeline.MuseTalkPipeline.warm_up`, when it exists) after
the load and times it as its own step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

T_START = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--faces", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-output", action="store_true", help="generate without writing (no encoder)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (as a batch worker sets)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", default=None)
    parser.add_argument("--batch-sizes", default="",
                        help="after the jobs: generate 2 clips per batch size (comma-separated) from a loaded avatar")
    args = parser.parse_args()
    steps: dict[str, float] = {}
    t = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        now = time.perf_counter()
        steps[name] = round(now - t, 3)
        print(f"[{args.tag}] {name}: {now - t:.2f} s", flush=True)
        t = now

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    mark("import torch")
    import nbhelpers as nbh
    from nbhelpers import media
    from nbhelpers.pipeline import MuseTalkPipeline

    mark("import nbhelpers")
    torch.empty(1, device="cuda")
    mark("cuda context")
    from _common import media_dir
    from batch import BOX, make_media

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    faces, audios = make_media(work, media_dir(), args.faces, max(args.jobs, 1), args.seconds, media.ffmpeg_exe(),
                               False)
    mark("media")
    pipe = MuseTalkPipeline.from_pretrained(args.weights, device="cuda", config=nbh.InferenceConfig())
    mark("from_pretrained")
    if args.warm and hasattr(pipe, "warm_up"):
        pipe.warm_up()
        mark("warm_up")
    profiles = {}
    avatars = []
    for k, face in enumerate(faces):
        directory = work / f"cold-avatar-{args.tag}-{k}"
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
        if args.profile and k == 0:
            from stacks import StackSampler

            with StackSampler() as sampler:
                avatars.append(pipe.prepare_avatar(face, directory, boxes=BOX))
            profiles["prepare0"] = sampler.report(top=20)
        else:
            avatars.append(pipe.prepare_avatar(face, directory, boxes=BOX))
        mark(f"prepare face {k}")
    timings = []
    for j in range(args.jobs):
        out = False if args.no_output else work / f"cold-{args.tag}-{j}.mp4"
        if args.profile and j == 0:
            from stacks import StackSampler

            with StackSampler() as sampler:
                res = avatars[j % len(avatars)].generate(audios[j], output=out)
            profiles["generate0"] = sampler.report(top=20)
        else:
            res = avatars[j % len(avatars)].generate(audios[j], output=out)
        timings.append(dict({k: round(v, 3) for k, v in res.timings.items()}, batch=res.config.batch_size,
                            wall=round(res.wall_s, 3)))
        mark(f"generate {j}")
    steps["total"] = round(time.perf_counter() - T_START, 3)
    by_batch = {}
    for b in [int(v) for v in args.batch_sizes.split(",") if v.strip()]:
        avatar = pipe.load_avatar(work / f"cold-avatar-{args.tag}-0", config=nbh.InferenceConfig(batch_size=b))
        runs = []
        for j in range(3):
            t1 = time.perf_counter()
            res = avatar.generate(audios[j % len(audios)], output=work / f"bs-{args.tag}-{b}.mp4")
            torch.cuda.synchronize()
            runs.append({"wall": round(time.perf_counter() - t1, 3), "generate": round(res.timings["generate"], 3),
                         "batch": res.config.batch_size if hasattr(res, "config") else None})
        by_batch[b] = runs
        print(f"[{args.tag}] batch {b}: {runs}", flush=True)
    report = {"tag": args.tag, "steps": steps, "generate_timings": timings, "by_batch": by_batch,
              "env": {k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "NBHELPERS_WARM")}}
    for name, text in profiles.items():
        print(f"\n### {args.tag} {name}\n{text}", flush=True)
    print(json.dumps(report), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(report, profiles=profiles), indent=1))


if __name__ == "__main__":
    main()
