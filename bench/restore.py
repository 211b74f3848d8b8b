"""Face restoration on the GPU: frames/s of the offline job and of the avatar path without and with each restorer.

Full-size v1.5 architecture and full-size GFPGAN v1.4 / RestoreFormer / CodeFormer, all with random weights in the
published formats (nbhelpers.restore.write_random_weights), given boxes, the shared face video and speech. One
pipeline holds every model; each restorer is loaded before its runs, so the table separates the memory its weights
take from the extra peak its activations add. Each timed run follows an untimed warm-up of the same kind.

    python bench/restore.py                    # GPU: markdown table to stdout
    python bench/restore.py --cores 2          # held to 2 CPU cores, as on Colab
    python bench/restore.py --smoke            # CPU: tiny MuseTalk + tiny RestoreFormer, a few frames
                                               # (checks the script)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BOX = (190, 160, 360, 330)  # crop box around the face of the shared 576x768 video (as bench/realtime.py)


def _gib(n: float) -> float:
    return n / 2**30


def _standin_torchvision_for_spandrel() -> None:
    """CPU smoke run only: spandrel imports torchvision when it loads, and a CPU torch here has none that imports;
    import spandrel beside tests/standins/torchvision, then hide the stand-in again (see tests/test_restore.py)."""
    import importlib

    try:
        importlib.import_module("torchvision")
        return
    except Exception:  # noqa: BLE001 - absent, or a CUDA build beside a CPU torch
        pass
    folder = str(Path(__file__).resolve().parents[1] / "tests" / "standins")
    sys.path.insert(0, folder)
    try:
        importlib.import_module("spandrel")
        importlib.import_module("spandrel_extra_arches")
    finally:
        sys.path.remove(folder)
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        importlib.invalidate_caches()


def core_table(restorers, weights, cuda: bool, smoke: bool, batch: int = 16, repeats: int = 5) -> None:
    """The restorers on their own: a batch of generated-size faces (random), restored ``repeats`` times after a
    warm-up; faces/s, the memory the weights take, the extra peak at that batch, and (on CUDA) how far the run
    dtype's output is from float32's (random weights: a check that bf16 gives finite, close answers, not a quality
    claim)."""
    import torch

    from nbhelpers import restore

    device = "cuda" if cuda else "cpu"
    dtype = torch.float16 if cuda else torch.float32
    if smoke:
        batch, repeats = 1, 1
    g = torch.Generator().manual_seed(0)
    faces = torch.randint(0, 256, (batch, 256, 256, 3), dtype=torch.uint8, generator=g).to(device)
    print(f"\nRestorers alone, {torch.cuda.get_device_name() if cuda else 'CPU'}, batch {batch} faces 256x256 "
          "(resized to 512), random weights\n", flush=True)
    print("| restorer | dtype | faces/s | weights GiB | peak added at this batch GiB | max abs diff vs float32 "
          "(0-255) | finite |")
    print("|---|---|---|---|---|---|---|")
    for name in restorers:
        if not restore.weight_path(name, weights).is_file():
            restore.write_random_weights(weights, name, tiny=smoke)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated() if cuda else 0
        r = restore.load_restorer(name, weights, device, dtype)
        w_gib = _gib(torch.cuda.memory_allocated() - before) if cuda else float("nan")
        with torch.inference_mode():
            out = r(faces)  # warm-up
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            for _ in range(repeats):
                out = r(faces)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            peak = _gib(torch.cuda.max_memory_allocated() - base) if cuda else float("nan")
            diff, finite = float("nan"), True
            if cuda and r.dtype != torch.float32:
                r.descriptor.model.float()
                ref = restore.Restorer(name, r.descriptor, r.device, torch.float32)(faces)
                diff = float((out.int() - ref.int()).abs().max())
            dtype = next(r.descriptor.model.parameters()).dtype
            y = r.descriptor(torch.rand(1, 3, 512, 512, device=device, dtype=dtype))
            finite = bool(torch.isfinite(y).all())
        print(f"| {name} | {str(r.dtype).replace('torch.', '')} | {batch * repeats / dt:.1f} | {w_gib:.2f} "
              f"| {peak:.2f} | {diff:g} | {finite} |", flush=True)
        r.close()
        del r, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="speech per timed run")
    parser.add_argument("--restorers", nargs="*", default=["gfpgan", "restoreformer", "codeformer"])
    parser.add_argument("--batch", type=int, default=None, help="frames per batch (default: planned)")
    parser.add_argument("--cores", type=int, default=0, help="limit to this many cores (0 = all)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--weights", default=None, help="folder for the full-size random weights (kept between runs)")
    parser.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny weights, tiny RestoreFormer")
    parser.add_argument("--core-only", action="store_true",
                        help="only the restorers on their own (needs torch and spandrel, no media or MuseTalk)")
    args = parser.parse_args()
    if args.cores:
        from realtime import limit_cpus

        limit_cpus(args.cores)

    import torch

    if args.cores:
        torch.set_num_threads(args.cores)
    if args.smoke:
        _standin_torchvision_for_spandrel()
    from nbhelpers import restore
    from nbhelpers.errors import NbHelpersWarning

    warnings.simplefilter("ignore", NbHelpersWarning)  # CodeFormer's licence note (said in the table instead)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-restore-"))
    work.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.smoke
    if args.core_only:
        core_table(["restoreformer"] if args.smoke else list(args.restorers), Path(args.weights or work / "weights"),
                   cuda, args.smoke)
        return

    import soundfile as sf
    from _common import make_full_weights, media_dir

    from nbhelpers import InferenceConfig, MuseTalkPipeline
    from nbhelpers.avatar import load_avatar, prepare_avatar

    data = media_dir()
    if args.smoke:
        from nbhelpers.testing import make_tiny_weights

        weights = make_tiny_weights(work / "tiny")
        restorers = ["restoreformer"]
        seconds, warm_seconds = 0.12, 0.04
    else:
        weights = make_full_weights(Path(args.weights or work / "weights"))
        restorers = list(args.restorers)
        seconds, warm_seconds = args.seconds, 1.0
    for name in restorers:
        if not restore.weight_path(name, weights).is_file():
            restore.write_random_weights(weights, name, tiny=args.smoke)
    speech, sr = sf.read(data / "speech-en-long.wav", dtype="float32")
    audio, warm = work / f"speech-{seconds:g}s.wav", work / "warm.wav"
    sf.write(audio, speech[: int(seconds * sr)], sr)
    sf.write(warm, speech[: int(warm_seconds * sr)], sr)
    video = data / "face-sing-576x768-25fps.mp4"
    if args.smoke:  # the avatar prepares every source frame: give it 4 (the whole clip takes 12 min on 2 CPU cores)
        import subprocess

        import imageio_ffmpeg

        short = work / "face-4f.mp4"
        subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-y", "-i", str(video), "-frames:v", "4",
                        "-c:v", "libx264", "-crf", "12", str(short)], check=True, stdin=subprocess.DEVNULL)
        video = short

    core_table(restorers, weights, cuda, args.smoke)
    pipe = MuseTalkPipeline.from_pretrained(weights, InferenceConfig(device="cuda" if cuda else "cpu"))
    base = pipe.config.replace(batch_size=args.batch)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def allocated():
        return _gib(torch.cuda.memory_allocated()) if cuda else float("nan")

    rows = []
    weights_gib: dict[str | None, float] = {None: 0.0}
    dtype_of: dict[str | None, str] = {None: str(pipe.dtype).replace("torch.", "")}

    def load(name):
        if name is None or name in weights_gib:
            return
        sync()
        before = allocated()
        r = pipe.restorer(name)
        sync()
        weights_gib[name] = allocated() - before
        dtype_of[name] = str(r.dtype).replace("torch.", "")

    def record(path, name, result, wall, peak, peak_none):
        gen = result.timings.get("generate", 0.0) + result.timings.get("blend", 0.0)
        rows.append((path, name or "none", dtype_of[name], result.n_frames, result.n_frames / wall,
                     result.n_frames / gen if gen else float("nan"), weights_gib[name], peak,
                     peak - peak_none if peak_none is not None else 0.0))

    # Offline job: the whole lipsync (faces given, parsing, latents, generation, paste-back, encode).
    peak_none = None
    for name in [None, *restorers]:
        load(name)
        config = base.replace(restore=name)
        if not args.smoke:
            pipe.lipsync(video, warm, work / "warm.mp4", config=config, boxes=BOX)  # warm-up
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = pipe.lipsync(video, audio, work / f"offline-{name}.mp4", config=config, boxes=BOX)
        sync()
        wall = time.perf_counter() - t0
        peak = _gib(torch.cuda.max_memory_allocated()) if cuda else float("nan")
        peak_none = peak if name is None else peak_none
        record("offline job", name, result, wall, peak, peak_none)

    # Avatar path: prepared once, then clips generated from audio only (no file written: generation + paste-back).
    avatar = prepare_avatar(video, work / "avatar", pipe, config=base, boxes=BOX)
    peak_none = None
    for name in [None, *restorers]:
        av = load_avatar(avatar.directory, pipe, config=avatar.config.replace(restore=name))
        av.load_models()
        if not args.smoke:
            av.generate(warm, output=False)  # warm-up
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = av.generate(audio, output=False)
        sync()
        wall = time.perf_counter() - t0
        peak = _gib(torch.cuda.max_memory_allocated()) if cuda else float("nan")
        peak_none = peak if name is None else peak_none
        record("avatar (no file)", name, result, wall, peak, peak_none)
        av.close()

    device = torch.cuda.get_device_name() if cuda else "CPU (smoke run: tiny random weights, not a measurement)"
    print(f"\nFace restoration, {device}; {seconds:g} s of speech ({int(seconds * 25)} frames), batch "
          f"{base.batch_size or 'planned'}, random weights; CodeFormer is for non-commercial use only.\n")
    print("| path | restorer | restorer dtype | frames | fps end to end | fps generate + paste-back | restorer "
          "weights GiB | peak allocated GiB | peak added GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path, name, dtype, n, fps, gen_fps, w, peak, added in rows:
        print(f"| {path} | {name} | {dtype} | {n} | {fps:.1f} | {gen_fps:.1f} | {w:.2f} | {peak:.2f} | {added:+.2f} |")
    pipe.release()


if __name__ == "__main__":
    main()
