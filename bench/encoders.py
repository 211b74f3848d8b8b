"""Encoder benchmark: frames/s, file size and quality of every ``encoder`` setting on the shared face video.

For the GPU machine (the lead picks "the fastest encoder setting that keeps CRF-18-like quality" for the avatar
path, issue 16). The process is limited to ``--cores`` CPU cores (taskset, as on Colab: 2). Each setting writes
the same frames (the shared 576x768 25 fps video, decoded once into memory) through ``media.VideoWriter(...,
encoder=setting)``, video only, and is timed from the writer's start to its close (ffmpeg start and flush
included). Quality: PSNR against the ``libx264`` (CRF 18, preset medium) output with ffmpeg's ``psnr`` filter
(average over Y, U, V as ffmpeg prints it), and PSNR against the input frames (BGR, decoded back through the
file's own colour tags). NVENC settings show what they resolved to (libx264 after a failed test encode).

    python bench/encoders.py                       # 500 frames, 2 cores, every setting
    python bench/encoders.py --smoke               # 10 frames: checks the script runs (no taskset needed)
    python bench/encoders.py --json out.json       # also write the results as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def psnr_filter(ffmpeg: str, test: Path, reference: Path) -> float:
    """ffmpeg's ``psnr`` filter between two videos: the ``average`` (Y, U, V pooled) in dB (inf when equal)."""
    done = subprocess.run([ffmpeg, "-nostdin", "-hide_banner", "-nostats", "-i", str(test), "-i", str(reference),
                           "-lavfi", "[0:v][1:v]psnr", "-f", "null", "-"],
                          capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    found = re.findall(r"average:(inf|[0-9.]+)", done.stderr)
    if not found:
        raise RuntimeError(f"no PSNR in ffmpeg's output: {done.stderr[-500:]}")
    return float(found[-1])


def psnr_frames(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 frame stacks over all pixels and channels."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def run(frames: np.ndarray, settings: list[str], work: Path) -> list[dict]:
    from nbhelpers import media

    height, width = frames.shape[1:3]
    ffmpeg = media.ffmpeg_exe()
    rows = []
    for setting in settings:
        out = work / f"{setting}.mp4"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            with media.VideoWriter(out, width, height, encoder=setting) as writer:
                for frame in frames:
                    writer.write(frame)
            wall = time.perf_counter() - t0
        choice = writer.encoder
        back = np.stack(list(media.load_video(out)))
        rows.append({"setting": setting, "codec": choice.codec, "preset": choice.preset, "frames": len(frames),
                     "seconds": round(wall, 3), "fps": round(len(frames) / wall, 1),
                     "bytes": out.stat().st_size, "psnr_vs_input_db": round(psnr_frames(back, frames), 2),
                     "reason": choice.reason, "warnings": [str(w.message) for w in caught]})
    reference = work / "libx264.mp4"
    for row in rows:
        row["psnr_vs_medium_db"] = round(psnr_filter(ffmpeg, work / f"{row['setting']}.mp4", reference), 2)
        row["size_vs_medium"] = round(row["bytes"] / rows[0]["bytes"], 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    from nbhelpers.constants import ENCODERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=500, help="frames of the shared video to encode")
    parser.add_argument("--cores", type=int, default=2, help="CPU cores (taskset); 0 = all")
    parser.add_argument("--settings", nargs="*", default=None, help=f"settings to run (default: {list(ENCODERS)})")
    parser.add_argument("--smoke", action="store_true", help="10 frames, to check the script here")
    parser.add_argument("--json", default=None, help="write the rows as JSON to this file")
    args = parser.parse_args(argv)
    if args.cores:
        from realtime import limit_cpus

        limit_cpus(args.cores)
    from _common import media_dir

    from nbhelpers import media

    n = 10 if args.smoke else args.frames
    settings = list(args.settings or ENCODERS)
    if "libx264" in settings:
        settings.remove("libx264")
    settings.insert(0, "libx264")  # the reference comes first
    video = media_dir() / "face-sing-576x768-25fps.mp4"
    frames = media.frames_at(video, list(range(n)))
    print(f"{n} frames {frames.shape[2]}x{frames.shape[1]} from {video.name}, {len(os.sched_getaffinity(0))} "
          f"cores, ffmpeg {'.'.join(map(str, media.ffmpeg_version()))} ({media.ffmpeg_exe()})")
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(frames, settings, Path(tmp))
    print("\n| setting | encoder | fps | MB | size vs medium | PSNR vs medium (dB) | PSNR vs input (dB) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setting']} | {r['codec']} {r['preset']} | {r['fps']} | {r['bytes'] / 1e6:.2f} | "
              f"{r['size_vs_medium']} | {r['psnr_vs_medium_db']} | {r['psnr_vs_input_db']} |")
    for r in rows:
        if r["codec"] != media.ENCODER_SETTINGS[r["setting"]][0]:
            print(f"{r['setting']}: {r['reason']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
