"""Does the phase form of the VAE decoder's upsampling (nbhelpers.upsampling.py) make the decoder faster?

Full-size sd-vae-ft-mse decoder, random weights, fp16, batch 20: eager and ``torch.compile`` (static batch), each
with diffusers' upsampling and with the phase form; the median of ``--iters`` batches (CUDA events) as frames/s, and
the largest difference of each output from diffusers' eager one, in 8-bit levels of the decoded image. Meant for the
T4-class MPS proxy (bench/t4_run.sh t4-upsample).

    python bench/upsample_probe.py --out upsample.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from t4probe import BATCH, build, ceilings, timed  # noqa: E402


def levels(torch, y):
    return ((y.float() / 2 + 0.5).clamp(0, 1) * 255).round()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="upsample.json")
    ap.add_argument("--iters", type=int, default=8)
    args = ap.parse_args()
    import torch

    from nbhelpers.upsampling import phase_upsampling

    t0 = time.perf_counter()
    rec: dict = {"ceilings": ceilings(torch), "batch": BATCH, "device": torch.cuda.get_device_name()}
    _, vae = build(torch)
    base = vae.decoder
    phase = copy.deepcopy(base)
    rec["routed"] = phase_upsampling(phase)
    torch.manual_seed(1)
    z = torch.randn(BATCH, 4, 32, 32, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        ref = base(z)
        ref_lv = levels(torch, ref)
        for name, mod in (("eager", base), ("eager phase", phase)):
            rec[name] = {"fps": BATCH / timed(torch, lambda m=mod: m(z), iters=args.iters) * 1e3}
        rec["eager phase"]["max_levels"] = float((levels(torch, phase(z)) - ref_lv).abs().max())
        for name, mod in (("compiled", base), ("compiled phase", phase)):
            t = time.perf_counter()
            fn = torch.compile(mod)
            out = fn(z)
            torch.cuda.synchronize()
            rec[name] = {"compile_s": time.perf_counter() - t,
                         "fps": BATCH / timed(torch, lambda f=fn: f(z), iters=args.iters) * 1e3,
                         "max_levels": float((levels(torch, out) - ref_lv).abs().max()),
                         "max_abs": float((out.float() - ref.float()).abs().max())}
            print(name, rec[name], flush=True)
        b32, p32 = copy.deepcopy(base).float(), copy.deepcopy(phase).float()
        rec["fp32 eager phase vs eager max_abs"] = float((b32(z.float()) - p32(z.float())).abs().max())
    rec["seconds"] = time.perf_counter() - t0
    print(json.dumps(rec, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
