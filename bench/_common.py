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
    not written (the benchmarks give boxes). Returns ``directory``. Skips work when a marker says it is done.
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
    from nbhelpers.parsing import write_random_bisenet

    write_random_bisenet(directory / "face-parse-bisent" / "79999_iter.pth", seed=seed)
    marker.write_text("ok")
    print(f"full-size random weights written to {directory} in {time.perf_counter() - t0:.1f} s", flush=True)
    return directory
