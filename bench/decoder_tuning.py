"""What inductor's launch-configuration tuning buys the compiled VAE decoder, and what it costs a new session.

One process per phase, each with inductor and Triton caches of its own (``--tmp``), as two Colab sessions have:

* ``cold``: the decoder (full size, phase-form upsampling, random weights, fp16, batch 20) compiled with
  ``--options`` (inductor options, JSON); wall seconds of the compile and first call, frames/s (median of
  ``--iters`` batches, CUDA events), the largest difference from the eager decoder in 8-bit levels; then the
  process's compile artifacts (``torch.compiler.save_cache_artifacts``) written to ``--artifacts``.
* ``warm``: those artifacts loaded into empty caches with one compile thread (as ``nbhelpers.gpu.compile`` does
  with a warm cache), the same compile: its wall seconds, frames/s, inductor's counters (coordinate-descent
  benchmarks, cache hits) and the Triton kernels it compiled, with their seconds. ``--rebundle`` makes the cold
  phase compile a second time after tuning, so that its artifacts carry the tuned kernels (see :func:`rebundle`).

    python bench/decoder_tuning.py --phase cold --options '{"max_autotune_pointwise": true}' --artifacts a.bin
    taskset -c 0,1 python bench/decoder_tuning.py --phase warm --options '{...}' --artifacts a.bin
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def split4(x, conv):
    """The phase form as four 2x2 convolutions, each on the input padded for its phase (no crop), interleaved."""
    import torch
    import torch.nn.functional as F

    w = conv.weight.float()
    rows = torch.stack([torch.stack([w[:, :, 0], w[:, :, 1] + w[:, :, 2]], 2),
                        torch.stack([w[:, :, 0] + w[:, :, 1], w[:, :, 2]], 2)])
    taps = torch.stack([torch.stack([rows[..., 0], rows[..., 1] + rows[..., 2]], -1),
                        torch.stack([rows[..., 0] + rows[..., 1], rows[..., 2]], -1)], 1).to(x.dtype)
    n, o, (h, wd) = x.shape[0], w.shape[0], x.shape[-2:]
    bias = None if conv.bias is None else conv.bias.to(x.dtype)
    p = [[F.conv2d(F.pad(x, (1 - b, b, 1 - a, a)), taps[a, b], bias) for b in (0, 1)] for a in (0, 1)]
    return torch.stack([torch.stack(p[a], -1) for a in (0, 1)], 3).reshape(n, o, 2 * h, 2 * wd)


REBUNDLE = {"benchmark_harness": False}  # an inductor option in the graph cache's key that no kernel's source holds


def rebundle(torch, model, x: tuple, kw: dict, options: dict, out, iters: int) -> dict:
    """Compile ``model`` again after its first (tuning) call with :data:`REBUNDLE` added to ``options``: the graph
    cache misses, inductor generates the same kernels, finds their tuned launch configurations in the autotune cache,
    compiles only those (from Triton's cache) and bundles them with the graph. The in-memory kernel caches and the
    recorded artifacts are cleared first (code already compiled keeps its modules), so the saved artifacts are this
    compile's. Returns its seconds, frames/s and largest difference in levels from the first."""
    from t4probe import BATCH, timed
    from torch._inductor.async_compile import CompiledTritonKernels
    from torch._inductor.codecache import PyCodeCache
    from torch.compiler._cache import CacheArtifactManager

    t = time.perf_counter()
    PyCodeCache.cache_clear()
    CompiledTritonKernels.cache_clear()
    CacheArtifactManager.clear()
    fn = torch.compile(model, dynamic=False, options={**options, **REBUNDLE})
    again = fn(*x, **kw)
    torch.cuda.synchronize()
    again = again.sample if hasattr(again, "sample") else again
    lv = [((y.float() / 2 + 0.5).clamp(0, 1) * 255).round() for y in (out, again)]
    return {"rebundle_s": round(time.perf_counter() - t, 1),
            "rebundle_fps": round(BATCH / timed(torch, lambda: fn(*x, **kw), iters=iters) * 1e3, 2),
            "rebundle_levels_vs_first": float((lv[0] - lv[1]).abs().max())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("cold", "warm"), required=True)
    ap.add_argument("--options", default="{}", help="inductor options: JSON, or KEY=VALUE,... with JSON values")
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--model", choices=("decoder", "unet", "tiny"), default="decoder",
                    help="tiny: three GroupNorm + SiLU + 3x3 conv blocks, 64 channels at 64x64, to try the caching")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--tmp", type=Path, default=None, help="parent of this process's own caches")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--form", choices=("phase", "split4", "nearest"), default="phase",
                    help="the decoder's upsampling: one transposed 4x4 conv of stride 2 (the package's), "
                         "four 2x2 convs padded per phase, or diffusers' nearest 2x + 3x3 conv")
    ap.add_argument("--gn", choices=("group", "channels"), default="group",
                    help="GroupNorm statistics as F.group_norm reduces them, or from per-channel moments "
                         "(nbhelpers.groupnorm, the package's decoder)")
    ap.add_argument("--channels-last", action="store_true", help="the decoder's weights in channels-last order")
    ap.add_argument("--rebundle", action="store_true",
                    help="cold: after the first call (where coordinate descent tunes), compile again with REBUNDLE "
                         "options, so the saved artifacts bundle the tuned kernels' binaries; warm: compile with them")
    ap.add_argument("--dump", type=Path, default=None, help="folder for the generated code and the top kernels")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix=f"tune-{args.phase}-", dir=args.tmp))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(tmp / "triton")

    import torch
    import torch._inductor.config as ic
    from t4probe import BATCH, build, timed
    from torch._dynamo.utils import counters

    options = json.loads(args.options) if args.options.lstrip().startswith("{") else {
        k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.options.split(",") if kv)}
    rec = {"phase": args.phase, "model": args.model, "options": options, "torch": torch.__version__,
           "cores": len(os.sched_getaffinity(0))}
    triton_compiles = {"n": 0, "s": 0.0}
    try:  # count the Triton compiles of launch configurations (a warm cache should need none)
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner

        original = CachingAutotuner._precompile_config

        def counted(self, cfg, *a, **k):
            t = time.perf_counter()
            try:
                return original(self, cfg, *a, **k)
            finally:
                triton_compiles["n"] += 1
                triton_compiles["s"] += time.perf_counter() - t

        CachingAutotuner._precompile_config = counted
    except (ImportError, AttributeError) as exc:
        rec["count_error"] = repr(exc)

    if args.phase == "warm":
        ic.compile_threads = 1
        t = time.perf_counter()
        torch.compiler.load_cache_artifacts(args.artifacts.read_bytes())
        rec["load_artifacts_s"] = round(time.perf_counter() - t, 2)

    unet, vae = build(torch) if args.model != "tiny" else (None, None)
    torch.manual_seed(1)
    if args.model == "decoder":
        from nbhelpers.upsampling import phase_upsampling

        model = vae.decoder
        if args.form != "nearest":
            phase_upsampling(model)
        if args.gn == "channels":
            from nbhelpers.groupnorm import channel_moment_norms

            channel_moment_norms(model)
        if args.form == "split4":
            import nbhelpers.upsampling as up

            up.phase_upsample = split4
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        rec["form"], rec["channels_last"], rec["gn"] = args.form, args.channels_last, args.gn
        x = (torch.randn(BATCH, 4, 32, 32, device="cuda", dtype=torch.float16),)
        kw = {}
    elif args.model == "tiny":
        nn = torch.nn
        layers = [m for _ in range(3) for m in (nn.GroupNorm(32, 64), nn.SiLU(), nn.Conv2d(64, 64, 3, padding=1))]
        model = torch.nn.Sequential(*layers).to("cuda", torch.float16).eval()
        x, kw = (torch.randn(BATCH, 64, 64, 64, device="cuda", dtype=torch.float16),), {}
    else:
        model = unet.to(memory_format=torch.channels_last)
        x = (torch.randn(BATCH, 8, 32, 32, device="cuda", dtype=torch.float16),
             torch.zeros(BATCH, device="cuda", dtype=torch.long))
        kw = {"encoder_hidden_states": torch.randn(BATCH, 50, 384, device="cuda", dtype=torch.float16)}
    del unet, vae
    with torch.inference_mode():
        ref = model(*x, **kw)
        ref = ref.sample if hasattr(ref, "sample") else ref
        torch.cuda.synchronize()
        if args.phase == "cold":
            rec["eager_fps"] = round(BATCH / timed(torch, lambda: model(*x, **kw), iters=4) * 1e3, 2)
        t = time.perf_counter()
        warm_opts = {**options, **REBUNDLE} if args.rebundle and args.phase == "warm" else options
        fn = torch.compile(model, dynamic=False, options=warm_opts or None)
        out = fn(*x, **kw)
        torch.cuda.synchronize()
        rec["compile_s"] = round(time.perf_counter() - t, 1)
        out = out.sample if hasattr(out, "sample") else out
        rec["fps"] = round(BATCH / timed(torch, lambda: fn(*x, **kw), iters=args.iters) * 1e3, 2)
        if args.model != "unet":
            lv = [((y.float() / 2 + 0.5).clamp(0, 1) * 255).round() for y in (ref, out)]
            rec["max_levels_vs_eager"] = float((lv[0] - lv[1]).abs().max())
        if args.dump:
            from kernel_probe import kernels

            args.dump.mkdir(parents=True, exist_ok=True)
            tag = f"{args.model}-{args.form}-{args.gn}{'-cl' if args.channels_last else ''}"
            (args.dump / f"{tag}-kernels.json").write_text(json.dumps(kernels(torch, lambda: fn(*x, **kw), top=30)))
            code = [p for p in (tmp / "inductor").rglob("*.py") if "def call(" in p.read_text(errors="replace")]
            for i, p in enumerate(code):
                (args.dump / f"{tag}-code{i}.py").write_text(p.read_text(errors="replace"))
        else:
            rec["max_abs_vs_eager"] = float((ref.float() - out.float()).abs().max())
        if args.rebundle and args.phase == "cold":
            rec.update(rebundle(torch, model, x, kw, options, out, iters=args.iters))
    rec["triton_compiles"] = triton_compiles["n"]
    rec["triton_compile_s"] = round(triton_compiles["s"], 2)
    rec["counters"] = {k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd")}
    if args.phase == "cold":
        saved = torch.compiler.save_cache_artifacts()
        args.artifacts.write_bytes(saved[0])
        rec["artifacts_mb"] = round(len(saved[0]) / 2**20, 1)
    line = json.dumps(rec)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
