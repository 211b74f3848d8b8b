"""The planner's CPU time estimate against measured CPU jobs (issue 16): one offline job per call, on the CPU.

Cuts the shared 576x768 face video to ``--src`` frames and the shared speech to ``--out`` output frames, runs
``MuseTalkPipeline.lipsync`` on the CPU through the public API (tiny test weights by default, ``--weights full``
for the full-size random set of ``bench/_common.py``), and prints one JSON line: every stage's wall seconds from
``ClipResult.timings``, the job's wall (pipeline load + lipsync), the planner's estimate as the job's
:class:`~nbhelpers.gpu.PlanWarning` says it, and :func:`nbhelpers.gpu.cpu_seconds` stage by stage.

    python bench/cpu_estimate.py --backend dwpose --src 20 --out 30
    python bench/cpu_estimate.py --backend dlib --src 40 --out 60
    python bench/cpu_estimate.py --backend boxes --src 40 --out 60
    python bench/cpu_estimate.py --weights full --backend boxes --src 2 --out 3
    python bench/cpu_estimate.py --table runs.jsonl   # the JSON lines above against today's constants

Timings are noisy where other work shares the cores: repeat and take the minimum. ``--table`` reads the load
average from lines ``=== ... load X`` that a runner script writes before each run (``cut -d' ' -f1 /proc/loadavg``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import make_face_weights, make_full_weights, media_dir  # noqa: E402

# A crop box around the singer's face in face-sing-576x768-25fps.mp4 (mouth near (275, 273): mouth-points.json).
FACE_BOX = (170, 90, 380, 340)
FRAME_SIZE = (768, 576)  # (H, W) of the shared video


def _ffmpeg() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def _cut(folder: Path, src: int, out: int) -> tuple[Path, Path]:
    data = media_dir()
    video, audio = folder / f"face-{src}.mp4", folder / f"speech-{out}.wav"
    subprocess.run([_ffmpeg(), "-v", "error", "-y", "-i", str(data / "face-sing-576x768-25fps.mp4"), "-frames:v",
                    str(src), "-an", "-c:v", "libx264", "-crf", "18", str(video)], check=True)
    # a few ms over out/25 s so that floor(seconds x 25) is exactly `out`
    subprocess.run([_ffmpeg(), "-v", "error", "-y", "-i", str(data / "speech-en-short.wav"), "-t",
                    f"{out / 25 + 0.01:.3f}", "-ac", "1", "-ar", "16000", str(audio)], check=True)
    return video, audio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--weights-dir", type=Path, default=None, help="reuse a weights folder (else a temp one)")
    parser.add_argument("--backend", default="dwpose", help="landmark backend, or 'boxes' (a fixed crop box)")
    parser.add_argument("--src", type=int, default=20, help="source frames of the cut video")
    parser.add_argument("--out", type=int, default=30, help="output frames (audio seconds x 25)")
    parser.add_argument("--batch", type=int, default=None, help="user batch size (default: planned)")
    parser.add_argument("--table", type=Path, default=None,
                        help="print a markdown table of the JSON lines in this file (estimated again) and stop")
    args = parser.parse_args(argv)
    if args.table is not None:
        return _table(args.table)

    import torch

    from nbhelpers import InferenceConfig, MuseTalkPipeline, gpu
    from nbhelpers.testing import make_tiny_weights

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wd = args.weights_dir or tmp / "weights"
        if args.weights == "tiny":
            if not (wd / "tiny.json").is_file():
                make_tiny_weights(wd)
        else:
            make_full_weights(wd)
            make_face_weights(wd)
        video, audio = _cut(tmp, args.src, args.out)
        backend = "dwpose" if args.backend == "boxes" else args.backend
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            pipe = MuseTalkPipeline.from_pretrained(wd, InferenceConfig(device="cpu", landmark_backend=backend))
            load_s = time.perf_counter() - t0
            config = InferenceConfig(batch_size=args.batch) if args.batch else None
            result = pipe.lipsync(video, audio, tmp / "out.mp4", config=config,
                                  boxes=FACE_BOX if args.backend == "boxes" else None)
            wall = time.perf_counter() - t0
        plan_warnings = [str(w.message) for w in caught if issubclass(w.category, gpu.PlanWarning)]
        est = gpu.cpu_seconds("lipsync", result.n_frames, result.source_frames, args.weights,
                              landmark_backend=args.backend, frame_size=FRAME_SIZE)
        row = {"weights": args.weights, "backend": args.backend, "src": result.source_frames,
               "out": result.n_frames, "no_face": result.no_face_frames, "batch": result.config.batch_size,
               "threads": torch.get_num_threads(),
               "load_s": round(load_s, 2), "wall_s": round(wall, 2),
               "timings": {k: round(v, 2) for k, v in result.timings.items()},
               "estimate": {k: round(v, 1) for k, v in est.items()}, "estimate_s": round(sum(est.values()), 1),
               "ratio": round(sum(est.values()) / wall, 3), "plan_warnings": plan_warnings}
        print(json.dumps(row), flush=True)
    return 0


def _table(path: Path) -> int:
    """Measured stage seconds of each JSON line against :func:`nbhelpers.gpu.cpu_seconds` with today's constants."""
    from nbhelpers import gpu

    print("| weights | backend | source / output frames | load before | measured wall s (faces, latents, parsing, "
          "generate, rest) | estimated s (faces, latents, parsing, generate, models) | estimate / wall |")
    print("|---|---|---|---:|---|---|---:|")
    load = "?"
    for line in path.read_text().splitlines():
        if line.startswith("===") and " load " in line:  # the runner's header: "=== ... load 2.01"
            load = line.rsplit(" load ", 1)[1].strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        t = row["timings"]
        est = gpu.cpu_seconds("lipsync", row["out"], row["src"], row["weights"], landmark_backend=row["backend"],
                              frame_size=FRAME_SIZE)
        staged = {k: t.get(k, 0.0) for k in ("faces", "latents", "parsing", "generate")}
        rest = row["wall_s"] - sum(staged.values())
        total = sum(est.values())
        print(f"| {row['weights']} | {row['backend']} | {row['src']} / {row['out']} | {load} "
              f"| **{row['wall_s']:.0f}** ("
              + ", ".join(f"{v:.0f}" for v in staged.values()) + f", {rest:.0f}) | **{total:.0f}** ("
              + ", ".join(f"{est.get(k, 0.0):.0f}" for k in ("faces", "latents", "parsing", "generate", "models"))
              + f") | {total / row['wall_s']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
