#!/usr/bin/env python
"""Peak GPU memory of the MuseTalk v1.5 core at the batch size nbhelpers.gpu.plan() chooses, under memory caps.

What it does, for each cap (default 4 GiB and 15 GiB, each in its own fresh subprocess so that caching-allocator
state, CUDA context and the per-process limit never leak from one cap to the next):

1. Measures the CUDA context: ``total - free`` from ``torch.cuda.mem_get_info`` right after CUDA starts, before
   any allocation (and again at the end, when cuBLAS/cuDNN kernels have loaded lazily).
2. Holds the process to the cap with ``torch.cuda.set_per_process_memory_fraction((cap - context) / total)``, so
   the caching allocator plus the context fit in ``cap`` GiB, as on a card of that size.
3. Asks ``nbhelpers.gpu.plan("lipsync", ...)`` for precision and batch size, from a report of a ``cap`` GiB card
   with ``cap - context`` GiB free.
4. Builds the full-size architectures with random weights - UNet from ``musetalkV15-unet.json``, VAE from
   ``sd-vae-ft-mse.json``, whisper-tiny from ``whisper-tiny.json`` through ``transformers.WhisperConfig`` - in
   fp32 on the CPU and moves them with ``nbhelpers.gpu.cast_and_move`` (cast on the CPU, then move).
5. Runs the core v1.5 work through the package's own code: whisper features of 20 s of audio
   (``nbhelpers.audio.whisper_features``), VAE encode of the source crops (``nbhelpers.latents.encode``), UNet +
   decode + GPU paste-back into full 576x768 frames (``nbhelpers.pipeline.render`` -> ``latents.unet_step``,
   ``latents.decode``, ``blending.blend_torch``), each stage inside ``nbhelpers.gpu.memory_scope``.
6. Provokes a real out-of-memory: the same render at batch 256, which ``nbhelpers.gpu.batched`` halves until it
   fits, finishing every frame.

Then prints a table: cap, planned batch, precision, peak reserved GiB, peak including the context, frames ok, OOM
events; a table of each stage's measured peak next to the memory model's prediction; and the line through the
measured generate peaks of the caps (to update ``MemoryModel`` in ``nbhelpers/gpu.py``).

Where a package module is missing (``nbhelpers.models`` for the positional encoding, for example) a small
stand-in is used and the output says ``STAND-IN`` next to it.

Usage (GPU machine; needs torch, diffusers, transformers)::

    python bench/memory.py                      # caps 4 and 15 GiB
    python bench/memory.py --caps 4 8 15 24     # more caps
    python bench/memory.py --json out.json      # also write the raw results

Smoke test on a CPU machine (tiny models, short clip, a *simulated* OOM; checks the code paths, not memory)::

    python bench/memory.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
CONFIGS_CANDIDATES = (ROOT / "shared" / "reference" / "configs", ROOT.parent / "shared" / "reference" / "configs")
HALVED = re.compile(r"retrying from item \d+ at batch size (\d+)")  # nbhelpers.gpu.batched's warning
TARGET_4GIB = 3.5  # GiB: reserved + context must stay under this at the 4 GiB cap (issue 8)


# ------------------------------------------------------------------------------------------------------------------
# Models (random weights, full-size or tiny architectures)


def configs_dir(given: str | None) -> Path:
    for folder in ([Path(given)] if given else []) + list(CONFIGS_CANDIDATES):
        if (folder / "musetalkV15-unet.json").is_file():
            return folder
    raise SystemExit("reference configs not found: pass --configs /path/to/shared/reference/configs")


def load_json(path: Path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


class StandInPositionalEncoding:  # STAND-IN for nbhelpers.models.PositionalEncoding (x + pe[:, :seq_len])
    """Sinusoidal positional encoding added to the (B, 50, 384) whisper tokens (STAND-IN)."""

    def __new__(cls, d_model: int = 384, max_len: int = 5000):
        import torch

        class _PE(torch.nn.Module):
            def __init__(self):
                super().__init__()
                position = torch.arange(max_len, dtype=torch.float32)[:, None]
                div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
                pe = torch.zeros(1, max_len, d_model)
                pe[0, :, 0::2] = torch.sin(position * div)
                pe[0, :, 1::2] = torch.cos(position * div)
                self.register_buffer("pe", pe)

            def forward(self, x):
                return x + self.pe[:, : x.shape[1]].to(x.dtype)

        return _PE()


def build_models(folder: Path, tiny: bool, device: Any, dtype: Any, sources: dict[str, str]):
    """UNet, VAE, whisper and PE with random weights, built on the CPU in fp32, then cast and moved."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import WhisperConfig, WhisperModel

    from nbhelpers import gpu

    unet_cfg = load_json(folder / "musetalkV15-unet.json")
    vae_cfg = load_json(folder / "sd-vae-ft-mse.json")
    if tiny:  # same block types, small widths (as nbhelpers.testing's tiny models)
        unet_cfg["block_out_channels"] = [32, 64, 64, 64]
        vae_cfg["block_out_channels"] = [32, 32, 64, 64]
    torch.manual_seed(0)
    try:
        from nbhelpers.models import build_unet  # the package's builder (SDPA attention, as load_unet uses)

        unet = build_unet(unet_cfg, device="cpu")
        sources["unet"] = "nbhelpers.models.build_unet (random weights)"
    except ImportError:
        unet = UNet2DConditionModel.from_config(unet_cfg).eval()
        sources["unet"] = "diffusers UNet2DConditionModel.from_config (nbhelpers.models missing)"
    vae = AutoencoderKL.from_config(vae_cfg).eval()
    whisper = WhisperModel(WhisperConfig(**load_json(folder / "whisper-tiny.json"))).eval()
    try:
        from nbhelpers.models import PositionalEncoding

        pe = PositionalEncoding(d_model=384).eval()
        sources["pe"] = "nbhelpers.models.PositionalEncoding"
    except ImportError:
        pe = StandInPositionalEncoding(384).eval()
        sources["pe"] = "STAND-IN sinusoidal PE (nbhelpers.models missing)"
    for m in (unet, vae, whisper, pe):
        m.requires_grad_(False)
        gpu.cast_and_move(m, device, dtype)
    sources["models"] = "diffusers/transformers from the reference configs, random weights, gpu.cast_and_move"
    return unet, vae, whisper, pe


class SimulatedOom:
    """Wraps the UNet to raise torch.cuda.OutOfMemoryError above a batch size (CPU smoke mode only)."""

    def __new__(cls, unet, limit: int):
        import torch

        class _Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = unet
                self.config = unet.config

            def forward(self, sample, *args, **kwargs):
                if sample.shape[0] > limit:
                    raise torch.cuda.OutOfMemoryError(
                        f"CUDA out of memory (SIMULATED above batch {limit}). Tried to allocate 1.00 GiB")
                return self.inner(sample, *args, **kwargs)

        return _Wrap()


# ------------------------------------------------------------------------------------------------------------------
# Inputs


def synthetic_audio(seconds: float):
    """(L,) float32 16 kHz: a vowel-like harmonic tone with a 4 Hz syllable envelope and a little noise."""
    import numpy as np

    t = np.arange(int(seconds * 16000)) / 16000
    tone = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 700, 1200, 2500), start=1))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 4 * t))
    noise = np.random.default_rng(0).normal(0, 0.01, t.shape)
    return (0.2 * tone * envelope + noise).astype(np.float32)


def synthetic_sources(n: int, height: int, width: int):
    """n source frames (H, W, 3) uint8 BGR, their crop boxes, squares and feathered masks."""
    import numpy as np

    from nbhelpers import blending

    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(n)]
    side = min(height, width) // 2
    x1, y1 = (width - side) // 2, (height - side) // 2
    boxes = [(x1 + (i % 5), y1, x1 + side + (i % 5), y1 + side) for i in range(n)]
    yy, xx = np.mgrid[:512, :512]
    mask_512 = ((((yy - 330) / 150.0) ** 2 + ((xx - 256) / 170.0) ** 2) <= 1).astype(np.uint8) * 255
    squares = [blending.expanded_square(b) for b in boxes]
    masks = [blending.prepare_mask(mask_512, b, s) for b, s in zip(boxes, squares, strict=True)]
    crops = rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8)
    return frames, boxes, squares, masks, crops


# ------------------------------------------------------------------------------------------------------------------
# Generation (the package's render loop when present, else a marked stand-in)


def render_frames(frames, boxes, squares, masks, latents, features, unet, vae, pe, batch: int, n_out: int, device,
                  sources: dict[str, str]):
    """Yield (B, H, W, 3) uint8 frames for output frames 0..n_out-1: UNet, decode, blend, copy to the host."""
    import numpy as np
    import torch

    try:
        from nbhelpers.engine import SourceFaces, render
    except ImportError:
        render = None
    if render is not None:
        blend = "blend_torch" if torch.device(device).type == "cuda" else "blend_cpu"
        sources["generate"] = f"nbhelpers.engine.render (latents.unet_step/decode, blending.{blend}, gpu.batched)"
        inputs = SourceFaces(frames=frames, latent_row=np.arange(len(frames), dtype=np.int64), latents=latents,
                             boxes=boxes, masks=masks, squares=squares)
        bundle = argparse.Namespace(unet=unet, vae=vae, pe=pe, device=torch.device(device))
        for _, out in render(inputs, features, bundle, batch, n_out):
            yield out
        return
    # STAND-IN (nbhelpers.engine.render missing): the same steps with the package's pieces.
    from nbhelpers import blending
    from nbhelpers.gpu import batched
    from nbhelpers.latents import decode, unet_step

    sources["generate"] = "STAND-IN loop over latents.unet_step/decode + blending.blend_torch in gpu.batched"
    n_src = len(frames)

    def step(sl):
        js = [t % n_src for t in range(sl.start, sl.stop)]
        with torch.inference_mode():
            faces = decode(unet_step(unet, pe, latents[js], features[sl]), vae)
            full = torch.from_numpy(np.stack([frames[j] for j in js])).to(device)
            if torch.device(device).type == "cuda":
                full = blending.blend_torch(full, faces, [boxes[j] for j in js], [masks[j] for j in js],
                                            [squares[j] for j in js], inplace=True)
            return full.cpu().numpy()

    for _, out in batched(n_out, batch, step, stage="generate"):
        yield out


# ------------------------------------------------------------------------------------------------------------------
# One cap (runs in its own process)


@contextlib.contextmanager
def count_ooms(counter: list[str]):
    """Collect the OOM-fallback warnings of nbhelpers.gpu.batched (one per halving) into ``counter``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        text = str(w.message)
        if "out of memory at batch size" in text:
            counter.append(text)
        else:
            print(f"warning: {text}", file=sys.stderr)


def worker(args) -> dict:
    import numpy as np
    import torch

    from nbhelpers import gpu
    from nbhelpers.audio import whisper_features
    from nbhelpers.latents import encode

    cuda = args.device.startswith("cuda")
    height, width = args.frame_size
    result: dict[str, Any] = {"cap_gib": args.cap if cuda else None, "device": args.device, "tiny": args.tiny}
    sources: dict[str, str] = {}
    timings: dict[str, float] = {}

    # 1-2. context, cap
    if cuda:
        torch.cuda.init()
        free0, total = torch.cuda.mem_get_info()
        context0 = (total - free0) / GIB
        fraction = (args.cap - context0) * GIB / total
        if not 0 < fraction <= 1:
            raise SystemExit(f"cap {args.cap} GiB does not fit this GPU ({total / GIB:.1f} GiB, context "
                             f"{context0:.2f} GiB)")
        torch.cuda.set_per_process_memory_fraction(fraction)
        gpu.reset_peak()
        real = gpu.report()
        rep = dataclasses.replace(real, total_gib=float(args.cap), free_gib=args.cap - context0)
        result.update(gpu=real.name, context_start_gib=context0, fraction=fraction, total_real_gib=total / GIB)
    else:
        torch.set_flush_denormal(True)  # random-weight nets hit denormals on the CPU: 4x slower without this
        rep = gpu.report()
        result.update(gpu="cpu", context_start_gib=None)

    # 3. plan
    n_out = int(round(args.seconds * 25))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpu.PlanWarning)
        plan = gpu.plan("lipsync", report=rep, n_frames=n_out, frame_size=(height, width),
                        weights="tiny" if args.tiny else "full")
    device = torch.device(args.device if cuda else "cpu")
    dtype = torch.float16 if plan.fp16 else torch.float32
    batch = plan.batch_size
    result.update(verdict=plan.verdict, batch=batch, precision=plan.precision, budget_gib=plan.budget_gib,
                  predicted_gib=plan.stage_peaks_gib, reasons=plan.reasons)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpu.PlanWarning)
        result["other_plans"] = {kind: gpu.plan(kind, report=rep, n_frames=args.source_frames if kind == "avatar"
                                                else n_out, frame_size=(height, width),
                                                weights="tiny" if args.tiny else "full").batch_size
                                 for kind in ("avatar", "realtime")}

    # 4. models
    stages: dict[str, dict] = {}
    t = time.perf_counter()
    with gpu.memory_scope("load") as scope:
        unet, vae, whisper, pe = build_models(configs_dir(args.configs), args.tiny, device, dtype, sources)
    timings["load"] = time.perf_counter() - t
    stages["load"] = dataclasses.asdict(scope)
    weights = sum(p.numel() * p.element_size() for m in (unet, vae, whisper, pe)
                  for p in list(m.parameters()) + list(m.buffers()))
    result["weights_gib"] = weights / GIB
    if not cuda and args.simulate_oom:
        unet = SimulatedOom(unet, limit=4)

    frames, boxes, squares, masks, crops = synthetic_sources(args.source_frames, height, width)
    oom_main: list[str] = []
    with count_ooms(oom_main):
        # 5a. whisper features
        t = time.perf_counter()
        with gpu.memory_scope("whisper") as scope:
            features = whisper_features(synthetic_audio(args.seconds), whisper, fps=25)
        sources["whisper"] = "nbhelpers.audio.whisper_features"
        timings["whisper"] = time.perf_counter() - t
        stages["whisper"] = dataclasses.asdict(scope)
        # 5b. VAE encode of the source crops (masked + reference)
        t = time.perf_counter()
        with gpu.memory_scope("encode") as scope:
            latents = encode(crops, vae, generator=0, batch_size=batch)
        sources["encode"] = "nbhelpers.latents.encode"
        timings["encode"] = time.perf_counter() - t
        stages["encode"] = dataclasses.asdict(scope)
        # 5c. UNet + decode + blend of full frames
        t = time.perf_counter()
        done = 0
        with gpu.memory_scope("generate") as scope:
            for out in render_frames(frames, boxes, squares, masks, latents, features, unet, vae, pe, batch, n_out,
                                     device, sources):
                assert out.shape[1:] == (height, width, 3) and out.dtype == np.uint8
                done += out.shape[0]
        timings["generate"] = time.perf_counter() - t
        stages["generate"] = dataclasses.asdict(scope)
    peak = gpu.peak_memory(others_gib=0.0)
    result.update(frames_ok=done, frames_total=n_out, oom_events=len(oom_main), peak_reserved_gib=peak.reserved_gib,
                  context_end_gib=peak.context_gib)
    context = max(c for c in (result.get("context_start_gib"), peak.context_gib) if c is not None) if cuda else 0.0
    result["context_gib"] = context
    result["peak_incl_context_gib"] = peak.reserved_gib + context if cuda else None

    # 6. a real out-of-memory (simulated on the CPU): batch 256 must halve until it fits and finish every frame
    oom_test: list[str] = []
    n_oom = min(args.oom_frames, n_out)
    sizes: list[int] = []
    error = None
    t = time.perf_counter()
    with count_ooms(oom_test), gpu.memory_scope("oom-test") as scope:
        try:
            for out in render_frames(frames, boxes, squares, masks, latents, features, unet, vae, pe,
                                     args.oom_batch, n_oom, device, sources):
                sizes.append(out.shape[0])
        except Exception as exc:  # noqa: BLE001 - keep the planned run's results; show what broke
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(f"OOM test failed: {error}", file=sys.stderr)
    timings["oom-test"] = time.perf_counter() - t
    result["oom_test"] = {"start_batch": args.oom_batch, "frames_ok": sum(sizes), "frames_total": n_oom,
                          "events": len(oom_test), "batch_sizes": sorted(set(sizes), reverse=True),
                          "halvings": [int(m.group(1)) for m in map(HALVED.search, oom_test) if m],
                          "simulated": not cuda, "peak_reserved_gib": scope.peak_reserved_gib,
                          "first_warning": oom_test[0] if oom_test else None, "error": error}
    result.update(stages=stages, sources=sources, timings_s=timings)
    return result


# ------------------------------------------------------------------------------------------------------------------
# Driver


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, sep] + body)


def fmt(x: Any, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def report_results(results: list[dict]) -> None:
    rows = []
    for r in results:
        cap = "-" if r["cap_gib"] is None else f"{r['cap_gib']:g} GiB"
        rows.append([cap, "planned", r["batch"], r["precision"], fmt(r["peak_reserved_gib"]),
                     fmt(r["peak_incl_context_gib"]), f"{r['frames_ok']}/{r['frames_total']}", r["oom_events"]])
        o = r["oom_test"]
        sizes = "->".join(str(s) for s in [o["start_batch"]] + o["halvings"])
        rows.append([cap, "oom test" + (" (simulated)" if o["simulated"] else ""), sizes, r["precision"],
                     fmt(o["peak_reserved_gib"]), "-", f"{o['frames_ok']}/{o['frames_total']}", o["events"]])
    print(table(rows, ["cap", "run", "batch", "precision", "peak reserved GiB", "peak incl. context GiB",
                       "frames ok", "OOM events"]))
    print()
    srows = []
    for r in results:
        cap = "-" if r["cap_gib"] is None else f"{r['cap_gib']:g} GiB"
        pred = r["predicted_gib"]
        for stage in ("load", "whisper", "encode", "generate"):
            s = r["stages"][stage]
            model = {"load": None, "whisper": None, "encode": pred.get("encode"), "generate": pred.get("generate")}
            srows.append([cap, stage, r["batch"], fmt(s["peak_reserved_gib"]), fmt(s["peak_allocated_gib"]),
                          fmt(model[stage]), fmt(r["timings_s"].get(stage), 1)])
    print(table(srows, ["cap", "stage", "batch", "peak reserved GiB", "peak allocated GiB", "model predicts GiB",
                        "seconds"]))
    print()
    for r in results:
        cap = "cpu" if r["cap_gib"] is None else f"{r['cap_gib']:g} GiB"
        others = ", ".join(f"{k} batch {v}" for k, v in r["other_plans"].items())
        print(f"[{cap}] plan: {r['verdict']} (also {others}); budget {fmt(r['budget_gib'])} GiB; CUDA context "
              f"{fmt(r.get('context_start_gib'))} GiB at start, {fmt(r.get('context_end_gib'))} GiB at the end")
        load = r["stages"]["load"]["peak_reserved_gib"]
        print(f"[{cap}] load: weights {r['weights_gib']:.2f} GiB on the device, peak reserved while loading "
              f"{load:.2f} GiB (an fp32 copy on the GPU would show about twice the fp16 weights)")
        if r["oom_test"]["first_warning"]:
            print(f"[{cap}] first OOM warning: {r['oom_test']['first_warning']}")
        if r["oom_test"]["error"]:
            print(f"[{cap}] OOM test stopped by an error that is not an out-of-memory: {r['oom_test']['error']}")
    print("sources: " + "; ".join(f"{k}: {v}" for k, v in results[0]["sources"].items()))
    gpu_runs = sorted((r for r in results if r["cap_gib"] is not None), key=lambda r: r["batch"])
    if len(gpu_runs) >= 2 and gpu_runs[-1]["batch"] != gpu_runs[0]["batch"]:
        a, b = gpu_runs[0], gpu_runs[-1]
        for stage in ("encode", "generate"):
            pa, pb = a["stages"][stage]["peak_reserved_gib"], b["stages"][stage]["peak_reserved_gib"]
            slope = (pb - pa) / (b["batch"] - a["batch"])
            print(f"measured {stage} line: {pa - slope * a['batch']:.3f} GiB + {slope:.4f} GiB/frame "
                  f"(batches {a['batch']} and {b['batch']}) -> compare MemoryModel in nbhelpers/gpu.py")
    four = [r for r in results if r["cap_gib"] == 4]
    for r in four:
        ok = r["peak_incl_context_gib"] is not None and r["peak_incl_context_gib"] < TARGET_4GIB
        print(f"4 GiB target (reserved + context < {TARGET_4GIB} GiB): {'PASS' if ok else 'FAIL'} "
              f"({fmt(r['peak_incl_context_gib'])} GiB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke mode)")
    parser.add_argument("--tiny", action="store_true", help="tiny UNet/VAE widths (smoke mode)")
    parser.add_argument("--caps", type=float, nargs="+", default=[4.0, 15.0], help="GiB caps, one process each")
    parser.add_argument("--seconds", type=float, default=None, help="audio seconds (default 20; 1 with --tiny)")
    parser.add_argument("--source-frames", type=int, default=None, help="source frames (default 50; 4 with --tiny)")
    parser.add_argument("--frame-size", default="768x576", help="HxW of the full frames (default 768x576)")
    parser.add_argument("--oom-batch", type=int, default=256, help="batch of the provoked out-of-memory")
    parser.add_argument("--oom-frames", type=int, default=None, help="frames of the OOM test (default 256; 8 tiny)")
    parser.add_argument("--configs", default=None, help="folder of the reference configs")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per cap")
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cap", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-simulate-oom", dest="simulate_oom", action="store_false", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.seconds = args.seconds if args.seconds is not None else (1.0 if args.tiny else 20.0)
    args.source_frames = args.source_frames or (4 if args.tiny else 50)
    args.oom_frames = args.oom_frames or (8 if args.tiny else 256)
    h, _, w = args.frame_size.partition("x")
    args.frame_size = (int(h), int(w))

    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0

    caps = args.caps if args.device.startswith("cuda") else [None]
    results = []
    for cap in caps:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--device", args.device,
               "--seconds", str(args.seconds), "--source-frames", str(args.source_frames), "--frame-size",
               f"{args.frame_size[0]}x{args.frame_size[1]}", "--oom-batch", str(args.oom_batch), "--oom-frames",
               str(args.oom_frames)]
        cmd += ["--cap", str(cap)] if cap is not None else []
        cmd += ["--tiny"] if args.tiny else []
        cmd += ["--configs", args.configs] if args.configs else []
        label = "cpu" if cap is None else f"{cap:g} GiB"
        print(f"running cap {label} ...", flush=True)
        t = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            print(f"cap {label}: timed out after {args.timeout:g} s")
            continue
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"cap {label}: worker failed (status {done.returncode})\n"
                  f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
            continue
        if done.stderr.strip():
            print("\n".join(f"  [{label}] {ln}" for ln in done.stderr.strip().splitlines()[-10:]))
        results.append(json.loads(lines[-1][len("RESULT "):]))
        print(f"cap {label}: done in {time.perf_counter() - t:.0f} s", flush=True)
    if not results:
        return 1
    print()
    report_results(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if len(results) == len(caps) else 1


if __name__ == "__main__":
    sys.exit(main())
