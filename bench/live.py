"""Live-session benchmark: first-frame latency, paced real time, and unpaced fps into Python (issue 17).

Runs on the GPU machine with the full-size v1.5 architecture and random weights, an avatar prepared from the shared
face video (given boxes) and the shared long speech, the whole process limited to 2 CPU cores (taskset), as on
Colab. Three runs of ``avatar.live`` after a warm-up:

1. unpaced, a first 200 ms chunk pushed alone: the time until frame 0 comes out of the iterator (goal <= 300 ms),
   in parts: push, waiting (audio, worker wake-up), whisper (log-mel, encoder, token gather), render (UNet, VAE
   decode, blend, copy to the host), hand-out (to the queue) and the iterator's wake-up;
2. paced (``realtime=True``): the speech pushed in 200 ms chunks at the pace of the audio (``live.play``), frames
   to a callback: first frame after the first push, sustained fps (goal 25) and late frames (goal 0);
3. unpaced: the whole speech pushed at once, frames read from the iterator, no encoder (goal >= 100 fps), with
   the unpaced hop and with the session's default hop.

Before them it times one whisper pass and one render of the first group's frames on the avatar's live model
thread (where sessions run their model work) and on a fresh thread: PyTorch's cuDNN plans are cached per thread,
and the gap is what frame 0 paid when each session rendered on a thread of its own.

The avatar is the one bench/realtime.py prepares in ``--work`` (same video, boxes, weights; batch size is not a
cached setting, so it is loaded, not prepared again: the output says which). Each phase prints its time; the whole
run takes about 40 s on the H200 when the avatar exists.

    python bench/live.py                 # markdown table to stdout
    python bench/live.py --smoke         # tiny random weights on the CPU, a synthetic avatar (checks the script)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def live(avatar, on_frame=None, **options):
    """A live session of ``avatar`` with the LiveConfig ``options``."""
    from nbhelpers.live import LiveConfig, LiveSession

    return LiveSession(avatar, LiveConfig(**options), on_frame=on_frame)

BOX = (190, 160, 360, 330)  # crop box around the face of the shared 576x768 video
SMOKE_BOX = (16, 16, 80, 80)


def first_frame_latency(avatar, speech: np.ndarray, **options) -> tuple[float, dict[str, float]]:
    """Seconds from pushing a first 200 ms chunk (alone) to frame 0 out of the iterator, and its parts (seconds)."""
    session = live(avatar, realtime=False, **options)  # the session's clock is time.monotonic, as here
    it = iter(session)
    t0 = time.monotonic()
    session.push(speech[:3200], 16000)
    next(it)
    t1 = time.monotonic()
    latency = t1 - t0
    st = session.stats
    parts = {"push": st.first_push_t - t0, **st.first_frame_breakdown(), "iterator": t1 - st.first_frame_t}
    drain = threading.Thread(target=lambda: [None for _ in it], daemon=True)
    drain.start()
    session.push(speech[3200:16000], 16000)
    session.close()
    drain.join()
    return latency, parts


def thread_cost(avatar, frames: int) -> dict[str, float]:
    """Seconds of one whisper pass and one render of ``frames`` frames (warm shapes), on the avatar's live model
    thread and on a fresh thread: PyTorch caches cuDNN convolution plans per thread, which is why every session's
    model work runs on that one thread (nbhelpers.live.ModelThread); the gap is what a fresh thread costs."""
    import torch

    from nbhelpers.engine import render
    from nbhelpers.gpu import host_wait
    from nbhelpers.live import model_thread

    st = avatar.device_state()
    pipe = avatar.pipe
    first = next(pipe.whisper.parameters())
    feats = torch.zeros((frames, 50, 384), dtype=first.dtype, device=first.device)

    def once() -> tuple[float, float]:
        t0 = time.perf_counter()
        pipe.features(np.zeros(640, np.float32))
        host_wait(st["models"].device)
        t1 = time.perf_counter()
        for _ in render(st["source"], feats, st["models"], frames, frames):
            pass
        host_wait(st["models"].device)
        return t1 - t0, time.perf_counter() - t1

    worker = model_thread(avatar)
    worker.call(once)  # these exact calls warm on the model thread first
    (w_model, r_model) = worker.call(once)
    out: list = []
    fresh = threading.Thread(target=lambda: out.append(once()))
    fresh.start()
    fresh.join()
    (w_fresh, r_fresh) = out[0]
    return {"whisper_model_thread": w_model, "render_model_thread": r_model, "whisper_fresh_thread": w_fresh,
            "render_fresh_thread": r_fresh}


def paced(avatar, speech: np.ndarray, **options):
    """The speech pushed in 200 ms chunks at real-time pace, frames paced to 25 fps into a callback."""
    from nbhelpers.live import play

    session = live(avatar, realtime=True, on_frame=lambda n, frame: None, **options)
    return play(session, speech, chunk_ms=200.0, realtime=True)


def unpaced(avatar, speech: np.ndarray, **options) -> tuple[float, int, object]:
    """The whole speech pushed at once, frames read from the iterator as fast as they come: (fps, frames, result)."""
    session = live(avatar, realtime=False, **options)
    count = [0]

    def read():
        for _ in session:
            count[0] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t0 = time.perf_counter()
    session.push(speech, 16000)
    result = session.close()
    reader.join()
    wall = time.perf_counter() - t0
    return count[0] / wall, count[0], result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="speech length of the paced and unpaced runs")
    parser.add_argument("--batch", type=int, default=None,
                        help="frames per engine batch (default 20 as bench/realtime.py, 4 with --smoke; 0: planned)")
    parser.add_argument("--hop", type=int, default=None,
                        help="frames per whisper pass of the latency and paced runs (default: the session's, 2)")
    parser.add_argument("--unpaced-hop", type=int, default=5,
                        help="frames per whisper pass of the unpaced run (each pass log-mels 30 s on the CPU)")
    parser.add_argument("--delay", type=float, default=None, help="play-out delay of the paced run, seconds")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--work", default=None)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny random weights on the CPU, a synthetic avatar")
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                        help="InferenceConfig.compile; the compile is waited for before the timed runs")
    args = parser.parse_args()
    from realtime import limit_cpus

    limit_cpus(args.cores)
    import torch

    from nbhelpers.config.live import DEFAULT_DELAY_S, DEFAULT_HOP

    torch.set_num_threads(args.cores)
    from nbhelpers import InferenceConfig, media, prepare_avatar

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-live-"))
    work.mkdir(parents=True, exist_ok=True)
    ffmpeg = media.ffmpeg_exe()
    if args.smoke:
        from nbhelpers.testing import make_tiny_weights

        weights = make_tiny_weights(work / "tiny")
        video = work / "testsrc.mp4"
        subprocess.run([ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v",
                        "8", "-pix_fmt", "yuv420p", str(video)], check=True)
        box, seconds = SMOKE_BOX, min(args.seconds, 0.32)
        rng = np.random.default_rng(0)
        speech = (rng.standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)
        config = InferenceConfig(device="cpu", fp16=False, batch_size=4 if args.batch is None else args.batch or None)
        device = "cpu smoke run"
    else:
        from _common import gpu_ceilings, make_full_weights, media_dir

        data = media_dir()
        weights = make_full_weights(Path(args.weights or work / "weights"))
        video, box, seconds = data / "face-sing-576x768-25fps.mp4", BOX, args.seconds
        speech = media.load_audio(data / "speech-en-long.wav")[: int(16000 * seconds)]
        config = InferenceConfig(device="cuda", fp16=True, batch_size=20 if args.batch is None else args.batch or None,
                                 compile=args.compile)
        device = torch.cuda.get_device_name()
        gpu_ceilings()
    print(f"cores: {sorted(os.sched_getaffinity(0))}, torch {torch.__version__}, {device}", flush=True)
    start = time.perf_counter()
    clock = lambda: f"[{time.perf_counter() - start:5.1f} s]"  # noqa: E731
    avatar = prepare_avatar(video, work / "avatar", config=config, boxes=box, weights_dir=weights)
    how = "loaded from its cache" if avatar.loaded_from_cache else f"PREPARED ({avatar.rebuild_reason})"
    print(f"{clock()} avatar {how}: {avatar}", flush=True)
    avatar.load_models()
    print(f"{clock()} models, latents, masks and frames on the device", flush=True)
    avatar.optimize()
    print(f"{clock()} compiled models: {avatar.pipe.compiler.status}", flush=True)
    options = {} if args.hop is None else {"hop": args.hop}
    paced_options = dict(options, **({} if args.delay is None else {"delay_s": args.delay}))

    t0 = time.perf_counter()
    session = live(avatar, realtime=False, **options)  # its warm-up: the first group's batch shape, whisper
    session.close()
    live(avatar, realtime=False, hop=args.unpaced_hop).close()
    print(f"{clock()} session warm-ups {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"{clock()} the sessions' compiles: {avatar.pipe.compiler.wait()}", flush=True)
    unpaced(avatar, speech[:32000], **options)  # the merged batch shapes, allocator
    print(f"{clock()} warm-up run", flush=True)
    cost = thread_cost(avatar, min(args.hop or DEFAULT_HOP, avatar.config.batch_size or 20))
    cost_line = ", ".join(f"{k} {v * 1000:.1f}" for k, v in cost.items())
    print(f"{clock()} one whisper pass / one render of the first group, model thread vs a fresh thread: {cost_line} "
          "ms", flush=True)
    latency, parts = first_frame_latency(avatar, speech, **options)
    breakdown = ", ".join(f"{k} {v * 1000:.1f}" for k, v in parts.items())
    print(f"{clock()} first frame after a first 200 ms chunk: {latency * 1000:.0f} ms ({breakdown} ms)", flush=True)
    paced_result = paced(avatar, speech, **paced_options)
    print(f"{clock()} paced: {paced_result}", flush=True)
    fps, n, unpaced_result = unpaced(avatar, speech, hop=args.unpaced_hop)
    print(f"{clock()} unpaced, hop {args.unpaced_hop}: {fps:.1f} fps over {n} frames; {unpaced_result}", flush=True)
    default_hop = args.hop or DEFAULT_HOP
    fps2, n2, unpaced2 = unpaced(avatar, speech, hop=default_hop)
    print(f"{clock()} unpaced, hop {default_hop}: {fps2:.1f} fps over {n2} frames", flush=True)

    st = paced_result.stats
    paced_parts = ", ".join(f"{k} {st[f'first_frame_{k}_s'] * 1000:.0f}" for k in ("wait", "whisper", "render",
                                                                                  "handout"))
    rows = [
        ("first frame after a first 200 ms chunk, unpaced", "<= 300 ms", f"{latency * 1000:.0f} ms", latency <= 0.3),
        ("  of which (ms)", "", breakdown, True),
        ("  whisper pass / render of the first group on the model thread vs a fresh thread (ms)", "", cost_line,
         True),
        ("first frame after the first push, paced (includes the play-out delay)", "<= 300 ms",
         f"{st['first_frame_latency_s'] * 1000:.0f} ms", st["first_frame_latency_s"] <= 0.3),
        ("  of which (ms; hand-out = waiting for its time)", "", paced_parts, True),
        ("paced real time: sustained fps", "25", f"{st['sustained_fps']:.2f}", abs(st["sustained_fps"] - 25) < 0.25),
        ("paced real time: late frames (none dropped)", "0", f"{st['late_frames']} of {paced_result.n_frames} "
         f"(max {st['max_late_s'] * 1000:.0f} ms late)", st["late_frames"] == 0),
        ("paced real time: starved frames (silence added)", "0", str(st["starved_frames"]), st["starved_frames"] == 0),
        (f"unpaced fps into Python (no encoder, hop {args.unpaced_hop})", ">= 100", f"{fps:.1f}", fps >= 100),
        (f"unpaced fps into Python (no encoder, hop {default_hop})", ">= 100", f"{fps2:.1f}", fps2 >= 100),
    ]

    print(f"\n### Live session, {device}, {len(os.sched_getaffinity(0))} cores, {seconds:.1f} s of speech, "
          f"{avatar.frame_shape[1]}x{avatar.frame_shape[0]}, batch {avatar.config.batch_size}, hop "
          f"{args.hop or DEFAULT_HOP} (unpaced {args.unpaced_hop}), play-out delay "
          f"{(args.delay if args.delay is not None else DEFAULT_DELAY_S) * 1000:.0f} ms\n")
    print("| measure | goal | result | met |")
    print("|---|---|---|---|")
    for name, goal, value, ok in rows:
        print(f"| {name} | {goal} | {value} | {'yes' if ok else 'no'} |" if goal else f"| {name} | | {value} | |")
    print(f"\nwhisper passes: paced {st['whisper_passes']}, unpaced {unpaced_result.stats['whisper_passes']}; "
          f"unpaced timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in unpaced_result.timings.items()))
    print(f"{clock()} done", flush=True)
    avatar.close()


if __name__ == "__main__":
    main()
