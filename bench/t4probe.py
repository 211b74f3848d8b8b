"""Which way of running the model core is fastest on a T4-class GPU: eager, CUDA graphs, torch.compile modes.

Full-size MuseTalk v1.5 UNet and sd-vae-ft-mse (random weights, fp16, batch 20), built from the bundled configs.
Each variant runs after a warm-up; the median of ``--iters`` timed batches (CUDA events) is reported as frames/s.
Results go to stdout and, one JSON object a line, to ``--out``. Meant for the T4-class MPS proxy (bench/t4proxy.sh)
but runs on any CUDA GPU.

    python bench/t4probe.py --out probe.jsonl [--only E0,E1,C2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 20


def ceilings(torch) -> dict:
    """Measured fp16 matmul TFLOP/s (8192^3) and device copy GB/s (1 GiB, read + write)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    ms = timed(torch, lambda: a @ b, iters=10)
    x = torch.empty(2**29, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    copy_ms = timed(torch, lambda: y.copy_(x), iters=10)
    return {"matmul_tflops": 2 * 8192**3 / ms / 1e9, "copy_gbs": 2 * x.numel() * 2 / copy_ms / 1e6}


def timed(torch, fn, iters: int = 10, warmup: int = 2) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` runs, CUDA events, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def build(torch):
    from diffusers import AutoencoderKL, UNet2DConditionModel

    cfg = ROOT / "nbhelpers" / "configs"

    def read(name):
        return {k: v for k, v in json.loads((cfg / name).read_text()).items() if not k.startswith("_")}

    torch.manual_seed(0)
    with torch.device("cuda"):
        unet = UNet2DConditionModel(**read("musetalkV15-unet.json")).half().eval()
        vae = AutoencoderKL(**read("sd-vae-ft-mse.json")).half().eval()
    for p in list(unet.parameters()) + list(vae.parameters()):
        p.requires_grad_(False)
    return unet, vae


def graphed(torch, fn, example):
    """Capture ``fn(example)`` in a CUDA graph; returns a callable that replays it (static input/output)."""
    static_in = example.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = fn(static_in)

    def run(x):
        static_in.copy_(x)
        g.replay()
        return static_out

    return run


def profile_top(torch, fn, n=14) -> list:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for ev in sorted(prof.key_averages(), key=lambda e: -getattr(e, "device_time_total", 0))[:n]:
        rows.append((ev.key[:90], round(getattr(ev, "device_time_total", 0) / 1e3, 2), ev.count))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe.jsonl")
    ap.add_argument("--only", default="")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=540, help="skip variants that start after this many seconds")
    args = ap.parse_args()
    t_start = time.perf_counter()
    import torch

    out = open(args.out, "a")

    def emit(rec):
        rec["at_s"] = round(time.perf_counter() - t_start, 1)
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()

    emit({"what": "env", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
          "mps_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "cores": len(os.sched_getaffinity(0)),
          **ceilings(torch)})
    unet, vae = build(torch)
    emit({"what": "built"})
    lat = torch.randn(BATCH, 8, 32, 32, device="cuda", dtype=torch.float16)
    feats = torch.randn(BATCH, 50, 384, device="cuda", dtype=torch.float16)
    z = torch.randn(BATCH, 4, 32, 32, device="cuda", dtype=torch.float16)
    img = torch.randn(BATCH, 3, 256, 256, device="cuda", dtype=torch.float16)
    t0 = torch.zeros((), device="cuda", dtype=torch.long)
    sf = vae.config.scaling_factor
    wanted = set(filter(None, args.only.split(",")))

    def unet_fn(m):
        return lambda x=lat: m(x, t0, encoder_hidden_states=feats).sample

    def dec_fn(m):
        return lambda x=z: m(x / sf)

    def enc_fn(m):
        return lambda x=img: m(x)

    ref = {}

    def variant(name, note, make):
        if wanted and name not in wanted:
            return
        if time.perf_counter() - t_start > args.deadline_s:
            emit({"what": name, "skipped": "deadline"})
            return
        rec = {"what": name, "note": note}
        try:
            c0 = time.perf_counter()
            fns = make()
            for part, fn, x in fns:
                with torch.inference_mode():
                    w0 = time.perf_counter()
                    y = fn(x).clone()
                    torch.cuda.synchronize()
                    rec[f"{part}_first_s"] = round(time.perf_counter() - w0, 2)
                    ms = timed(torch, lambda fn=fn, x=x: fn(x), iters=args.iters)
                rec[f"{part}_fps"] = round(BATCH * 1e3 / ms, 1)
                if part in ref:
                    d = (y.float() - ref[part].float()).abs()
                    rec[f"{part}_maxdiff"] = round(float(d.max()), 4)
                    rec[f"{part}_meandiff"] = round(float(d.mean()), 5)
                elif name == "E0":
                    ref[part] = y.clone()
            rec["setup_s"] = round(time.perf_counter() - c0, 1)
            if "unet_fps" in rec and "dec_fps" in rec:
                rec["core_fps"] = round(1 / (1 / rec["unet_fps"] + 1 / rec["dec_fps"]), 1)
        except Exception as exc:  # noqa: BLE001 - a failing variant is a result
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        emit(rec)

    def eager(cl):
        torch.backends.cudnn.benchmark = True
        fmt = torch.channels_last if cl else torch.contiguous_format
        unet.to(memory_format=fmt)
        vae.to(memory_format=fmt)
        xin = lat.contiguous(memory_format=fmt)
        zin = z.contiguous(memory_format=fmt)
        return [("unet", lambda x: unet(x, t0, encoder_hidden_states=feats).sample, xin),
                ("dec", lambda x: vae.decoder(vae.post_quant_conv(x / sf)), zin),
                ("enc", lambda x: vae.quant_conv(vae.encoder(x)), img.contiguous(memory_format=fmt))]

    def e0():
        torch.backends.cudnn.benchmark = False
        unet.to(memory_format=torch.contiguous_format)
        vae.to(memory_format=torch.contiguous_format)
        return [("unet", lambda x: unet(x, t0, encoder_hidden_states=feats).sample, lat),
                ("dec", lambda x: vae.decoder(vae.post_quant_conv(x / sf)), z),
                ("enc", lambda x: vae.quant_conv(vae.encoder(x)), img)]

    variant("E0", "eager NCHW, cudnn.benchmark off (the official loop's setting)", e0)
    variant("E1", "eager NCHW, cudnn.benchmark on", lambda: eager(False))
    variant("E2", "eager channels_last, cudnn.benchmark on", lambda: eager(True))

    def with_graphs(cl):
        parts = eager(cl)
        out = []
        with torch.inference_mode():
            for part, fn, x in parts:
                out.append((part, graphed(torch, fn, x), x))
        return out

    variant("G1", "eager NCHW + CUDA graph", lambda: with_graphs(False))
    variant("G2", "eager channels_last + CUDA graph", lambda: with_graphs(True))

    if not wanted or "P" in wanted:
        with torch.inference_mode():
            parts = eager(False)
            emit({"what": "profile-eager-dec-NCHW", "top": profile_top(torch, lambda: parts[1][1](parts[1][2]))})
            parts = eager(True)
            emit({"what": "profile-eager-dec-CL", "top": profile_top(torch, lambda: parts[1][1](parts[1][2]))})

    def compiled(cl, mode=None, freezing=False, parts=("unet", "dec")):
        import torch._dynamo
        import torch._inductor.config as ic

        torch._dynamo.reset()
        ic.freezing = freezing
        base = {p: (f, x) for p, f, x in eager(cl)}
        kw = {"mode": mode} if mode else {}
        out = []
        for p in parts:
            f, x = base[p]
            out.append((p, torch.compile(f, **kw), x))
        return out

    variant("C2", "compile default, channels_last", lambda: compiled(True, parts=("unet", "dec", "enc")))
    if not wanted or "PC" in wanted:
        try:
            with torch.inference_mode():
                f = compiled(True, parts=("dec",))[0]
                emit({"what": "profile-compiled-dec-CL", "top": profile_top(torch, lambda: f[1](f[2]))})
        except Exception as exc:  # noqa: BLE001
            emit({"what": "profile-compiled-dec-CL", "error": str(exc)[:300]})
    variant("C1", "compile default, NCHW", lambda: compiled(False))
    variant("C5", "compile reduce-overhead (CUDA graphs), channels_last", lambda: compiled(True, "reduce-overhead"))
    variant("C3", "compile default + freezing, channels_last", lambda: compiled(True, freezing=True))
    variant("C4", "compile max-autotune-no-cudagraphs, channels_last, decoder only",
            lambda: compiled(True, "max-autotune-no-cudagraphs", parts=("dec",)))
    emit({"what": "done", "total_s": round(time.perf_counter() - t_start, 1)})


if __name__ == "__main__":
    sys.exit(main())
