"""Benchmark of the model core on the full-size MuseTalk v1.5 architectures with random weights.

Measures, through the package's own functions (``nbhelpers.latents`` and ``nbhelpers.audio``):

- UNet step (``unet_step``: PE + UNet at t=0), frames per second;
- VAE decode to uint8 BGR (``decode``), frames per second;
- VAE encode of masked + reference crops (``encode``, posterior sample), frames per second;
- whisper features (``whisper_features``) for 30 s and 240 s of audio, seconds of audio per second;

in fp16 and fp32 at batch 8 and 20 (the official offline and realtime defaults), with CUDA events after a warm-up,
median of ``--iters`` runs, and FLOPs per frame from ``torch.utils.flop_counter``. Prints a markdown table.

Architectures: UNet from ``musetalkV15-unet.json`` and VAE from ``sd-vae-ft-mse.json`` (shared/reference/configs; the
same values are embedded below so the script runs where that folder is absent), whisper-tiny from
``whisper-tiny.json``. Needs only torch, diffusers and transformers (numpy comes with them).

Run on a GPU machine from the repository root (about 1 minute on an H200):

    python bench/core.py                      # full size, CUDA, fp16 + fp32, batch 8 and 20
    python bench/core.py --tiny --device cpu --iters 1   # smoke test on a CPU (tiny widths)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The values of shared/reference/configs/*.json (official MuseTalk v1.5 UNet, sd-vae-ft-mse, whisper-tiny).
UNET_CONFIG = {
    "act_fn": "silu", "attention_head_dim": 8, "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False, "cross_attention_dim": 384,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 8, "layers_per_block": 2,
    "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}
VAE_CONFIG = {
    "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "in_channels": 3, "latent_channels": 4, "layers_per_block": 2,
    "norm_num_groups": 32, "out_channels": 3, "sample_size": 256, "up_block_types": ["UpDecoderBlock2D"] * 4,
}
WHISPER_CONFIG = {
    "d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_layers": 4,
    "decoder_attention_heads": 6, "decoder_ffn_dim": 1536, "num_mel_bins": 80, "vocab_size": 51865,
    "max_source_positions": 1500, "max_target_positions": 448, "activation_function": "gelu",
    "scale_embedding": False, "pad_token_id": 50257, "bos_token_id": 50257, "eos_token_id": 50257,
    "decoder_start_token_id": 50258,
}
# Tiny widths for the CPU smoke run: same block types.
TINY_UNET = {"block_out_channels": [32, 64, 64, 64], "layers_per_block": 1}
TINY_VAE = {"block_out_channels": [16, 16, 16, 16], "layers_per_block": 1, "norm_num_groups": 8}
TINY_WHISPER = {"decoder_layers": 1, "decoder_ffn_dim": 64, "vocab_size": 64, "max_target_positions": 16,
                "pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
CONFIG_DIR = ROOT.parent / "shared" / "reference" / "configs"


def load_configs(folder: Path | None) -> tuple[dict, dict, dict, str]:
    """UNet, VAE and whisper configs: from ``folder`` when it has the JSON files, else the embedded copies."""
    unet, vae, whisper, source = dict(UNET_CONFIG), dict(VAE_CONFIG), dict(WHISPER_CONFIG), "embedded"
    if folder is not None and (folder / "musetalkV15-unet.json").is_file():
        def read(name):
            return {k: v for k, v in json.loads((folder / name).read_text()).items() if not k.startswith("_")}
        unet, vae = read("musetalkV15-unet.json"), read("sd-vae-ft-mse.json")
        whisper = {k: v for k, v in read("whisper-tiny.json").items() if k not in ("architectures", "model_type")}
        source = str(folder)
    return unet, vae, whisper, source


def build(args):
    import diffusers
    import torch
    import transformers

    unet_cfg, vae_cfg, whisper_cfg, source = load_configs(args.configs)
    if args.tiny:
        unet_cfg.update(TINY_UNET)
        vae_cfg.update(TINY_VAE)
        whisper_cfg.update(TINY_WHISPER)
    torch.manual_seed(0)
    with torch.device(args.device):  # parameters are made (and randomly initialised) directly on the device
        unet = diffusers.UNet2DConditionModel.from_config(unet_cfg).eval()
        vae = diffusers.AutoencoderKL.from_config(vae_cfg).eval()
        whisper = transformers.WhisperModel(transformers.WhisperConfig(**whisper_cfg)).eval()
    return unet, vae, whisper, source


def positional_encoding(device, dtype):
    """nbhelpers.models.PositionalEncoding when available; else an identity (its cost, one add, is negligible)."""
    try:
        from nbhelpers.models import PositionalEncoding
    except ImportError:
        return (lambda x: x), "identity (nbhelpers.models not available)"
    return PositionalEncoding(d_model=384).to(device=device, dtype=dtype).eval(), "nbhelpers.models.PositionalEncoding"


class Timer:
    """Median wall time of a callable: CUDA events on a GPU, perf_counter after synchronising elsewhere."""

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, fn, iters: int, warmup: int) -> float:
        torch = self.torch
        for _ in range(warmup):
            fn()
        self._sync()
        times = []
        for _ in range(iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def flops_per_item(fn) -> float | None:
    """FLOPs of one call of ``fn`` (2 per multiply-add) counted by torch's FlopCounterMode, or None."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:  # torch < 2.1
        return None
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return float(counter.get_total_flops())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda (default when available), cuda:1, or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny widths (same block types) for a CPU smoke run")
    parser.add_argument("--iters", type=int, default=10, help="timed runs per row; the median is reported")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 3, 1 with --iters 1)")
    parser.add_argument("--batches", default="8,20", help="comma-separated batch sizes (default 8,20)")
    parser.add_argument("--dtypes", default=None, help="fp16,fp32 (default on CUDA) or fp32 (default on CPU)")
    parser.add_argument("--configs", type=Path, default=CONFIG_DIR, help="folder of the reference config JSONs")
    parser.add_argument("--skip", default="", help="comma-separated stages to skip: unet,decode,encode,whisper")
    args = parser.parse_args(argv)

    import diffusers
    import numpy as np
    import torch
    import transformers

    from nbhelpers.audio import whisper_features
    from nbhelpers.latents import decode, encode, unet_step

    if args.device is None:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: pass --device cpu (with --tiny for a quick smoke run)")
        args.device = "cuda"
    device = torch.device(args.device)
    is_cuda = device.type == "cuda"
    dtypes = (args.dtypes or ("fp16,fp32" if is_cuda else "fp32")).split(",")
    batches = [int(b) for b in args.batches.split(",")]
    warmup = args.warmup if args.warmup is not None else (1 if args.iters <= 1 else 3)
    skip = set(filter(None, args.skip.split(",")))
    timer = Timer(args.device)
    diffusers.utils.logging.set_verbosity_error()  # silences the "modules kept in float32: []" note of .to(dtype)

    t0 = time.perf_counter()
    unet, vae, whisper, source = build(args)
    build_s = time.perf_counter() - t0
    n_unet = sum(p.numel() for p in unet.parameters())
    n_vae = sum(p.numel() for p in vae.parameters())
    n_whisper = sum(p.numel() for p in whisper.encoder.parameters())
    attn = type(next(iter(unet.attn_processors.values()))).__name__

    print(f"# MuseTalk model core benchmark ({'tiny' if args.tiny else 'full-size'} architectures, random weights)\n")
    if is_cuda:
        prop = torch.cuda.get_device_properties(device)
        print(f"- device: {prop.name}, {prop.total_memory / 2**30:.1f} GiB, {prop.multi_processor_count} SMs")
        print(f"- TF32: matmul {torch.backends.cuda.matmul.allow_tf32}, cuDNN conv {torch.backends.cudnn.allow_tf32} "
              "(torch defaults, as in the official scripts)")
    else:
        print(f"- device: {platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads")
    print(f"- torch {torch.__version__}, diffusers {diffusers.__version__}, transformers {transformers.__version__}, "
          f"Python {platform.python_version()}")
    print(f"- configs: {source}; parameters: UNet {n_unet / 1e6:.1f} M, VAE {n_vae / 1e6:.1f} M, whisper encoder "
          f"{n_whisper / 1e6:.1f} M; built in {build_s:.1f} s")
    print(f"- attention: UNet/VAE {attn}; whisper {getattr(whisper.config, '_attn_implementation', '?')}")
    print(f"- timing: median of {args.iters} after {warmup} warm-up runs, "
          f"{'CUDA events' if is_cuda else 'perf_counter'}\n")

    rows = []
    rng = np.random.default_rng(0)
    for dtype_name in dtypes:
        dtype = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        unet.to(dtype)
        vae.to(dtype)
        whisper.to(dtype)
        pe, pe_name = positional_encoding(device, dtype)
        with torch.inference_mode():
            lat1 = torch.randn(1, 8, 32, 32, device=device, dtype=dtype)
            feat1 = torch.randn(1, 50, 384, device=device, dtype=dtype)
            crop1 = rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8)
            one = {"unet": partial(unet_step, unet, pe, lat1, feat1), "decode": partial(decode, lat1[:, :4], vae),
                   "encode": partial(encode, crop1, vae, generator=0)}
            flops = {stage: flops_per_item(fn) for stage, fn in one.items() if stage not in skip}
        for batch in batches:
            lat = torch.randn(batch, 8, 32, 32, device=device, dtype=dtype)
            feat = torch.randn(batch, 50, 384, device=device, dtype=dtype)
            crops = torch.from_numpy(rng.integers(0, 256, (batch, 256, 256, 3), dtype=np.uint8)).to(device)
            stages = {"unet": partial(unet_step, unet, pe, lat, feat), "decode": partial(decode, lat[:, :4], vae),
                      "encode": partial(encode, crops, vae, generator=0, batch_size=batch)}
            for stage, fn in stages.items():
                if stage not in skip:
                    rows.append(measure(stage, dtype_name, batch, batch, fn, flops.get(stage), timer, args, warmup,
                                        is_cuda))
        if "whisper" not in skip:
            for seconds in ((30,) if args.tiny else (30, 240)):
                wave = (rng.standard_normal(seconds * 16_000) * 0.1).astype(np.float32)
                rows.append(measure("whisper_features", dtype_name, f"{seconds} s audio", seconds,
                                    partial(whisper_features, wave, whisper), None, timer, args, warmup, is_cuda,
                                    unit="audio s/s"))

    print("| stage | dtype | batch | ms / batch | throughput | GFLOP / frame | TFLOP/s | peak GiB |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\nUNet rows include the positional encoding ({pe_name}); decode rows include the uint8 BGR conversion; "
          "encode rows encode 2 images (masked + reference) per frame and sample the posterior.")
    return 0


def measure(stage, dtype_name, batch_label, items, fn, flop, timer, args, warmup, is_cuda, unit="frames/s"):
    """One table row: median time, throughput, GFLOP per frame, achieved TFLOP/s, peak memory."""
    import torch

    if is_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        seconds = timer(fn, args.iters, warmup)
    except Exception as exc:  # noqa: BLE001 - an out-of-memory or unsupported dtype ends the row, not the run
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
        return [stage, dtype_name, str(batch_label), "-", msg, "-", "-", "-"]
    peak = f"{torch.cuda.max_memory_allocated() / 2**30:.2f}" if is_cuda else "-"
    gflop = f"{flop / 1e9:.1f}" if flop else "-"
    tflops = f"{flop * items / seconds / 1e12:.2f}" if flop else "-"
    return [stage, dtype_name, str(batch_label), f"{seconds * 1000:.1f}", f"{items / seconds:.1f} {unit}", gflop,
            tflops, peak]


if __name__ == "__main__":
    sys.exit(main())
