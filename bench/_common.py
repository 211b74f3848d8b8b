"""Shared helpers of the GPU benchmarks: full-size random weights in the official layout, test media lookup."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = Path(os.environ.get("NBHELPERS_REFERENCE_CONFIGS", ROOT.parent / "shared" / "reference" / "configs"))


def media_dir() -> Path:
    """Real test media: $NBHELPERS_SHARED_DATA, ../shared/data, or .benchdata/ (carried to the GPU machine)."""
    for cand in (os.environ.get("NBHELPERS_SHARED_DATA"), ROOT.parent / "shared" / "data", ROOT / ".benchdata"):
        if cand and (Path(cand) / "face-sing-576x768-25fps.mp4").is_file():
            return Path(cand)
    raise SystemExit("test media not found: set NBHELPERS_SHARED_DATA to the shared/data folder "
                     "(or copy it into .benchdata/ for the GPU machine)")


def _config(name: str) -> dict:
    for folder in (CONFIGS, ROOT / ".benchdata" / "configs", ROOT / "nbhelpers" / "configs"):
        p = Path(folder) / name
        if p.is_file():
            return {k: v for k, v in json.loads(p.read_text()).items() if not k.startswith("_")}
    raise SystemExit(f"config {name} not found (looked in {CONFIGS} and .benchdata/configs)")


def make_full_weights(directory: Path, seed: int = 0) -> Path:
    """Write the full-size v1.5 inference set with random weights in the official layout (fp16 UNet file).

    UNet (musetalkV15/unet.pth + musetalk.json), sd-vae folder, whisper folder and BiSeNet; landmark weights are
    written by :func:`make_face_weights`. Returns ``directory``. Skips work when a marker says it is done.
    """
    import torch

    directory = Path(directory)
    marker = directory / ".full-random-done"
    if marker.is_file():
        return directory
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    from diffusers import AutoencoderKL, UNet2DConditionModel

    (directory / "musetalkV15").mkdir(parents=True, exist_ok=True)
    unet_cfg = _config("musetalkV15-unet.json")
    (directory / "musetalkV15" / "musetalk.json").write_text(json.dumps(unet_cfg, indent=1))
    unet = UNet2DConditionModel(**unet_cfg)
    torch.save({k: v.half() for k, v in unet.state_dict().items()}, directory / "musetalkV15" / "unet.pth")
    del unet
    vae = AutoencoderKL(**_config("sd-vae-ft-mse.json"))
    vae.save_pretrained(directory / "sd-vae", safe_serialization=True)
    del vae
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperModel

    wcfg = {k: v for k, v in _config("whisper-tiny.json").items() if k not in ("architectures",)}
    whisper = WhisperModel(WhisperConfig(**wcfg))
    whisper.save_pretrained(directory / "whisper", safe_serialization=True)
    WhisperFeatureExtractor(**{k: v for k, v in _config("whisper-tiny-preprocessor.json").items()
                               if k in ("feature_size", "sampling_rate", "hop_length", "chunk_length",
                                        "n_fft", "padding_value")}).save_pretrained(directory / "whisper")
    from nbhelpers.testing import write_random_bisenet

    write_random_bisenet(directory / "face-parse-bisent" / "79999_iter.pth", seed=seed)
    marker.write_text("ok")
    print(f"full-size random weights written to {directory} in {time.perf_counter() - t0:.1f} s", flush=True)
    return directory


def silence_s3fd(path: Path) -> Path:
    """Rewrite an S3FD checkpoint so that no cell of any head is a face candidate (network cost unchanged).

    Random confidence heads make tens of thousands of candidates per frame, and their NMS (a Python loop) would
    dominate the detector's time; real weights give a handful. Zero weights and a face logit of -10 on every
    ``*_mbox_conf`` head give p(face) ~ 5e-5 < 0.05 everywhere: the convolutions run at full size, the decoding
    finds nothing (as bench/s3fd_speed.py does in memory). Written to a temporary name, then renamed.
    """
    import torch

    path = Path(path)
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    for key in [k for k in state if "_mbox_conf." in k]:
        state[key] = torch.zeros_like(state[key])
        if key.endswith(".bias"):
            state[key][-1] = -10.0
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, str(tmp))
    os.replace(tmp, path)
    return path


def ensure_silenced(path: Path) -> Path:
    """:func:`silence_s3fd` unless a marker says this very file (size and mtime) was already silenced."""
    path = Path(path)
    marker = path.with_name(path.name + ".silenced")
    stamp = lambda: f"{path.stat().st_size} {path.stat().st_mtime_ns}"  # noqa: E731
    if not (marker.is_file() and marker.read_text() == stamp()):
        silence_s3fd(path)
        marker.write_text(stamp())
    return path


def make_face_weights(directory: Path, seed: int = 0) -> dict[str, str]:
    """Write the full-size face detector weights with random values in the official layout, where missing.

    - ``s3fd/s3fd-619a316812.pth``: the whole S3FD network (``nbhelpers.testing.write_tiny_s3fd`` writes the
      full architecture), confidence heads silenced by :func:`silence_s3fd`.
    - ``dwpose/dw-ll_ucoco_384.pth``: RTMPose-l whole-body through
      ``nbhelpers.testing.write_random_dwpose_checkpoint`` when the torch DWPose backend exists; otherwise no
      DWPose file.

    Returns a dict naming what was written or found, for the bench's output.
    """
    directory = Path(directory)
    notes: dict[str, str] = {}
    from nbhelpers.faces.s3fd import S3FD_FILE
    from nbhelpers.testing import write_random_dwpose_checkpoint, write_tiny_s3fd

    s3fd = directory / S3FD_FILE
    if not s3fd.is_file():
        write_tiny_s3fd(directory)
    ensure_silenced(s3fd)
    notes["s3fd"] = f"{S3FD_FILE}: full-size S3FD, random weights, confidence heads silenced (no candidates)"
    try:
        from nbhelpers.faces import dwpose_torch
    except ImportError:
        notes["dwpose"] = ("no full-size DWPose written: nbhelpers.faces.dwpose_torch is missing (the torch DWPose "
                           "backend); the default backend then needs its own weights")
        return notes
    pth = directory / dwpose_torch.CHECKPOINT_FILE
    if not pth.is_file():
        write_random_dwpose_checkpoint(directory, seed=seed)
    notes["dwpose"] = f"{dwpose_torch.CHECKPOINT_FILE}: full-size RTMPose-l whole-body, random weights"
    return notes


T4_PUBLISHED = {"matmul_tflops": 65.0, "copy_gbs": 320.0}  # NVIDIA T4 datasheet: fp16 tensor peak, memory bandwidth


def cuda_median_ms(fn, iters: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` on the current CUDA stream (CUDA events), after ``warmup`` calls."""
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def gpu_ceilings() -> dict:
    """Measure this GPU's fp16 matmul rate (8192^3, median of 10 after 3 warm-ups, CUDA events) and device copy
    bandwidth (1 GiB, read + write), print them beside a T4's published figures, and return them."""

    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn_like(a)
    tflops = 2 * 8192**3 / cuda_median_ms(lambda: a @ b) / 1e9
    x = torch.empty(2**29, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    gbs = 2 * x.numel() * 2 / cuda_median_ms(lambda: y.copy_(x)) / 1e6
    share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    where = f"MPS share {share} % of an {torch.cuda.get_device_name()}" if share else torch.cuda.get_device_name()
    print(f"GPU: {where}: measured {tflops:.1f} TFLOP/s fp16 matmul, {gbs:.0f} GB/s copy (a T4's published "
          f"figures: {T4_PUBLISHED['matmul_tflops']:.0f} TFLOP/s, {T4_PUBLISHED['copy_gbs']:.0f} GB/s)", flush=True)
    return {"gpu": where, "matmul_tflops": tflops, "copy_gbs": gbs, "t4_published": T4_PUBLISHED}
