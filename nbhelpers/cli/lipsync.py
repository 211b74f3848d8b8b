"""``lipsync`` and ``demo``: one clip from a face and a speech file."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from .. import media, pipeline, testing, weights
from ..checks import check_boxes, names_folder
from ..errors import InputError
from .flags import box_flag, inference_config
from .parser import TINY_OUTPUT, TINY_SECONDS

__all__ = ["TINY_NOTE", "TRY_TINY", "demo", "has_cuda", "lipsync", "tiny_note", "weight_sets"]

#: What to run to see the tool work with no weights at all; the missing-weights messages name it.
TRY_TINY = ("To see the tool run without any download: `python -m nbhelpers demo --tiny` (tiny random weights; "
            "the repainted mouth is noise).")
TINY_NOTE = ("NOTE: made with tiny RANDOM weights (--tiny): the repainted mouth is colour noise, not lip-sync. It "
             "shows that every stage runs here. For the real result: python -m nbhelpers demo --download")


def tiny_note(weights_dir: str | None) -> str:
    """The notice for outputs made with tiny random test weights from ``--weights`` ("" for real weights)."""
    folder = Path(weights_dir).expanduser() if weights_dir else weights.default_dir()
    if not weights.is_tiny(folder):
        return ""
    named = os.environ.get(weights.ENV_VAR)
    if not (named and weights.is_tiny(Path(named).expanduser())):
        fix = "python -m nbhelpers download, and leave --weights out (or give the folder it names)."
    else:  # the variable names tiny weights: the download and a job without --weights would use them
        fix = (f"python -m nbhelpers download --weights DIR into a folder of their own, and set {weights.ENV_VAR} to "
               "it (it names the tiny folder now).")
    return (f"NOTE: {folder} holds tiny RANDOM test weights: the repainted mouths are colour noise, not lip-sync. "
            f"For real results: {fix}")


def lipsync(args: argparse.Namespace) -> int:
    """``lipsync VIDEO AUDIO``: the offline job."""
    result = pipeline.lipsync(args.video, args.audio, args.output, config=inference_config(args),
                              boxes=box_flag(args.box), weights_dir=args.weights)
    print(f"{result.summary()} -> {result.output}")
    if note := tiny_note(args.weights):
        print(note)
    return 0


def demo(args: argparse.Namespace) -> int:
    """``demo``: the bundled photo and speech, with the real weights or (``--tiny``) tiny random ones."""
    if args.tiny and (args.download or args.weights):
        raise InputError("--tiny makes its own random weights: leave out --download and --weights (or leave out "
                         "--tiny to run the real models).")
    config, boxes = inference_config(args), box_flag(args.box)
    default = TINY_OUTPUT if args.tiny else "results/demo.mp4"
    output = Path(args.output or default).expanduser()
    output = output / Path(default).name if names_folder(args.output or default) else output  # -o DIR: its name
    if output.suffix.lower() != ".mp4":  # before any download or tiny weights
        raise InputError(f"output must end in .mp4 or be an existing folder; got {str(output)!r}.")
    if args.download:
        weights.download(directory=args.weights, sets=weight_sets(args))
    folder = Path(tempfile.mkdtemp(prefix="nbhelpers-demo-"))
    try:
        photo, speech = media.demo_inputs(folder)
        check_boxes(boxes, photo)  # a box off the photo is named before any weights are made or read
        weights_dir = args.weights
        if args.tiny:
            print("demo --tiny: making tiny random weights (a few seconds; nothing is downloaded)", flush=True)
            weights_dir = testing.make_tiny_weights(folder / "tiny-weights", versions=(config.version,))
            speech = media.cut_audio(speech, TINY_SECONDS, folder / "speech-1s.wav")
            if config.device is None and not has_cuda():
                config = config.replace(device="cpu")
        result = pipeline.lipsync(photo, speech, output, config=config, boxes=boxes,
                                  weights_dir=weights_dir)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{result.summary()} -> {result.output}")
    if args.tiny:
        print(TINY_NOTE)
    return 0


def has_cuda() -> bool:
    """True when torch imports and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def weight_sets(args: argparse.Namespace) -> list[str]:
    """The weight sets a job with these flags needs (no landmark weights for dlib or a given box)."""
    config = inference_config(args)
    sets = ["core", "parsing"] + (["v1"] if config.version == "v1" else [])
    if config.landmark_backend in ("auto", "dwpose", "mmpose"):  # all three read dwpose/dw-ll_ucoco_384.pth
        sets += ["faces", "s3fd"]
    elif config.landmark_backend == "dwpose-onnx":
        sets += ["faces-onnx", "s3fd"]
    return sets
