"""How long until the models are compiled (cold and warm cache), and how much faster is each one compiled?

Through the package's own path (``MuseTalkPipeline.compile_for``, the background compiler and its cache folder):
loads the full-size models (random weights), asks for the UNet, VAE decoder and encoder and face parser at
``--batch``, waits, then times each model eager and compiled at that batch (median of ``--iters`` CUDA-event
timings) and the largest difference of their outputs. The cache folder is ``$NBHELPERS_COMPILE_CACHE`` (or beside
the weights): a first run fills it (cold), a second one finds it (warm).

    bash bench/t4proxy.sh python3 bench/compile.py --weights /tmp/ls/weights --out compile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def median_ms(torch, fn, iters: int) -> float:
    from _common import cuda_median_ms

    return cuda_median_ms(fn, iters, warmup=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True, help="folder of full-size random weights (bench/_common.py)")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--parts", default="unet,decoder,encoder,parser")
    ap.add_argument("--options", default="",
                    help="JSON of torch.compile options, e.g. '{\"coordinate_descent_tuning\": true}'")
    ap.add_argument("--no-timing", action="store_true", help="compile only (fill the cache)")
    ap.add_argument("--faces", default="", help="HxW: also the default backend's S3FD and DWPose as the offline job "
                    "asks for them on frames of that size (offline.compile_face_models)")
    ap.add_argument("--compare-dynamic", default="",
                    help="parts (e.g. decoder,encoder) also compiled with a dynamic batch dimension and timed")
    ap.add_argument("--dynamic", action="store_true", help="the VAE halves for any batch, as a live session asks")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    from _common import gpu_ceilings

    from nbhelpers import InferenceConfig, MuseTalkPipeline, latents
    from nbhelpers.gpu import device_constant

    doc: dict = {"ceilings": gpu_ceilings(), "batch": args.batch}
    config = InferenceConfig(device="cuda", fp16=True, batch_size=args.batch)
    t0 = time.perf_counter()
    pipe = MuseTalkPipeline.from_pretrained(args.weights, config)
    pipe.unet, pipe.vae, pipe.face_parser  # noqa: B018 - load
    doc["load_s"] = time.perf_counter() - t0
    comp = pipe.compiler
    if args.options:
        comp.options = json.loads(args.options)
    parts = tuple(args.parts.split(","))
    t0 = time.perf_counter()
    if args.faces:
        from nbhelpers.offline import FACE_BATCH_GPU, compile_face_models, fit_face_batches

        hw = tuple(int(v) for v in args.faces.split("x"))
        backend = pipe.landmarks("auto")
        fit_face_batches(backend, hw, pipe.device, loaded_gib=pipe.resident_gib("lipsync", backend.name))
        compile_face_models(comp, backend, hw)
        doc["faces"] = {"backend": backend.name, "batches": [backend.face_detector.batch_size,
                                                             backend.pose.batch_size, FACE_BATCH_GPU]}
    pipe.compile_for(args.batch, parts, dynamic_batch=args.dynamic)
    status = comp.wait()
    doc["compile"] = {"wall_s": time.perf_counter() - t0, "state": status.state, "warm": status.warm,
                      "parts": dict(status.parts), "part_seconds": dict(status.part_seconds),
                      "reason": status.reason, "enabled": comp.enabled,
                      "cache": str(comp.cache_dir)}
    print(f"compile: {doc['compile']}", flush=True)
    if args.no_timing or not comp.enabled:
        return finish(doc, args.out)

    b, dev, dt = args.batch, pipe.device, pipe.dtype
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.inference_mode():
        lat = torch.randn(b, 8, 32, 32, device=dev, dtype=dt, generator=g)
        tokens = torch.randn(b, 50, 384, device=dev, dtype=dt, generator=g)
        z = torch.randn(b, 4, 32, 32, device=dev, dtype=dt, generator=g)
        faces = torch.randn(b, 3, 512, 512, device=dev, dtype=dt, generator=g)
    with torch.no_grad():
        crops = torch.randn(2 * b, 3, 256, 256, device=dev, dtype=dt, generator=g)
    t = device_constant([0], dev)
    calls = {
        "unet": (pipe.unet, lambda m: m(lat, t, encoder_hidden_states=tokens).sample, torch.inference_mode),
        "decoder": (pipe.vae.decoder, lambda m: m(z), torch.inference_mode),
        "encoder": (pipe.vae.encoder, lambda m: m(crops), torch.no_grad),
        "parser": (pipe.face_parser.net, lambda m: m.parse(faces), torch.inference_mode),
    }
    rows = {}
    for name in parts:
        module, call, mode = calls[name]
        with mode():
            with comp.paused():
                eager_out = call(module).float()
                eager_ms = median_ms(torch, lambda c=call, m=module: c(m), args.iters)
            comp_out = call(module).float()
            comp_ms = median_ms(torch, lambda c=call, m=module: c(m), args.iters)
        diff = (comp_out - eager_out).abs()
        rows[name] = {"eager_fps": b * 1e3 / eager_ms, "compiled_fps": b * 1e3 / comp_ms,
                      "speedup": eager_ms / comp_ms, "max_abs_diff": float(diff.max()),
                      "mean_abs_diff": float(diff.mean())}
        print(f"{name}: {rows[name]}", flush=True)
    # the core as the engine runs it: UNet step, then decode to uint8 BGR on the GPU
    with torch.inference_mode():
        def core():
            return latents.decode(latents.unet_step(pipe.unet, pipe.pe, lat, tokens), pipe.vae)

        with comp.paused():
            eager_frames = core().clone()
            core_eager = median_ms(torch, core, args.iters)
        frames = core().clone()
        core_comp = median_ms(torch, core, args.iters)
    levels = (frames.int() - eager_frames.int()).abs()
    rows["core"] = {"eager_fps": b * 1e3 / core_eager, "compiled_fps": b * 1e3 / core_comp,
                    "speedup": core_eager / core_comp, "max_level_diff": int(levels.max()),
                    "share_over_1_level": float((levels > 1).float().mean())}
    print(f"core: {rows['core']}", flush=True)
    doc["models"] = rows
    pix = lambda x: ((x / 2 + 0.5).clamp(0, 1) * 255).round()  # noqa: E731 - the decode's rounding
    for name in filter(None, args.compare_dynamic.split(",")):  # the same calls, through a dynamic-batch compile
        module, call, mode = calls[name]
        method = "parse" if name == "parser" else "forward"
        compiled = torch.compile(getattr(module, method).eager, dynamic=None, options=comp.options or None)
        other = types.SimpleNamespace(parse=compiled) if name == "parser" else compiled
        with mode():
            for x in (lat, z, crops, faces):  # the engine's static code for these shapes is compiled already
                torch._dynamo.maybe_mark_dynamic(x, 0)
            t0 = time.perf_counter()
            out = call(other).float()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            with comp.paused():
                ref = call(module).float()
            ms = median_ms(torch, lambda c=call, o=other: c(o), args.iters)
        row = {"compile_s": first_s, "fps": b * 1e3 / ms, "max_abs_diff": float((out - ref).abs().max())}
        if name == "decoder":
            row["max_level_diff"] = float((pix(out) - pix(ref)).abs().max())
        doc.setdefault("dynamic_batch", {})[name] = row
        print(f"{name} with a dynamic batch: {row}", flush=True)
    finish(doc, args.out)


def finish(doc: dict, out: str | None) -> None:
    if out:
        Path(out).write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps({k: v for k, v in doc.items() if k != "ceilings"}, default=str))


if __name__ == "__main__":
    main()
