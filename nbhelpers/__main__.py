"""Command line: the same jobs as the notebooks, without Jupyter.

    python -m nbhelpers demo                      # lip-sync the bundled demo (astronaut photo + speech)
    python -m nbhelpers download                  # fetch the v1.5 weights (about 4.2 GB)
    python -m nbhelpers verify                    # check the weights folder
    python -m nbhelpers lipsync VIDEO AUDIO -o OUT.mp4
    python -m nbhelpers avatar prepare VIDEO DIR  # prepare a face once
    python -m nbhelpers avatar generate DIR AUDIO -o OUT.mp4
    python -m nbhelpers report                    # GPU and the planner's choice
    python -m nbhelpers score VIDEO [--audio FILE]  # is it in sync? mouth-audio lag, and LSE-D/LSE-C

Every error the package raises on purpose is printed as one message (no traceback) with exit status 2.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def _add_settings(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("settings (defaults are the official v1.5 ones; device, precision, batch are planned)")
    g.add_argument("--version", choices=["v15", "v1"], default="v15")
    g.add_argument("--batch-size", type=int, default=None, help="frames per batch (default: from free GPU memory)")
    prec = g.add_mutually_exclusive_group()
    prec.add_argument("--fp16", dest="fp16", action="store_const", const=True, default=None)
    prec.add_argument("--fp32", dest="fp16", action="store_const", const=False)
    g.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: CUDA when available)")
    g.add_argument("--extra-margin", type=int, default=10, help="pixels added below the crop box (v15)")
    g.add_argument("--bbox-shift", type=int, default=0, help="pixels added to landmark 29's y: + repaints more mouth, - less (both versions, as the official app)")
    g.add_argument("--parsing-mode", choices=["jaw", "raw", "neck"], default="jaw")
    g.add_argument("--left-cheek-width", type=int, default=90)
    g.add_argument("--right-cheek-width", type=int, default=90)
    g.add_argument("--backend", default="auto", help="landmarks: auto, dwpose-onnx, mmpose or dlib")
    g.add_argument("--smooth-boxes", type=int, default=0, help="temporal smoothing window in frames (0 = off)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--box", default=None, help="one crop box for the whole clip, skipping detection: --box=x1,y1,x2,y2 "
                                               "(with '=', so negative numbers are not taken for options)")
    _add_restore(g)
    p.add_argument("--weights", default=None, help="weights folder (default: $NBHELPERS_WEIGHTS or the cache)")


def _add_restore(g) -> None:
    g.add_argument("--restore", choices=["gfpgan", "restoreformer", "codeformer"], default=None,
                   help="restore the repainted face before paste-back (default: off). Needs spandrel and the weight "
                        "set restore-<name>; codeformer is for NON-COMMERCIAL use only (S-Lab License 1.0)")
    g.add_argument("--restore-strength", type=float, default=1.0,
                   help="blend of restored and unrestored face, 0..1 (default 1 = restored only)")


def _config(args):
    from .config import InferenceConfig

    return InferenceConfig(version=args.version, batch_size=args.batch_size, fp16=args.fp16, device=args.device,
                           extra_margin=args.extra_margin, bbox_shift=args.bbox_shift,
                           parsing_mode=args.parsing_mode, left_cheek_width=args.left_cheek_width,
                           right_cheek_width=args.right_cheek_width,
                           landmark_backend="boxes" if args.box else args.backend, smooth_boxes=args.smooth_boxes,
                           seed=args.seed, restore=args.restore, restore_strength=args.restore_strength)


def _box(text):
    if not text:
        return None
    from .errors import InputError

    try:
        values = [int(round(float(v))) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 4:
        raise InputError(f"--box must be four numbers x1,y1,x2,y2 in source pixels; got {text!r}.")
    return tuple(values)


def _cmd_lipsync(args) -> int:
    from .pipeline import lipsync

    result = lipsync(args.video, args.audio, args.output, config=_config(args), boxes=_box(args.box),
                     weights_dir=args.weights)
    print(f"{result.summary()} -> {result.output}")
    return 0


def _cmd_demo(args) -> int:
    import tempfile

    from . import media, weights
    from .pipeline import lipsync

    if args.download:
        weights.download(directory=args.weights, sets=_sets_for(args))
    folder = Path(tempfile.mkdtemp(prefix="nbhelpers-demo-"))
    photo, speech = media.demo_inputs(folder)
    try:
        result = lipsync(photo, speech, args.output, config=_config(args), boxes=_box(args.box),
                         weights_dir=args.weights)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{result.summary()} -> {result.output}")
    return 0


def _sets_for(args) -> list[str]:
    """The weight sets a job with these settings needs (no landmark weights for dlib or a given box)."""
    sets = ["core", "parsing"]
    if args.version == "v1":
        sets.append("v1")
    backend = "boxes" if args.box else args.backend
    if backend in ("auto", "dwpose-onnx"):
        sets += ["faces-onnx", "s3fd"]
    elif backend == "mmpose":
        sets += ["faces-mmpose", "s3fd"]
    return sets


def _cmd_download(args) -> int:
    from . import weights

    report = weights.download(sets=args.sets or None, directory=args.weights)
    print(report)
    return 0


def _cmd_verify(args) -> int:
    from . import weights

    folder = Path(args.weights or weights.default_dir()).expanduser()
    if not folder.is_dir():
        print(f"error: the weights folder {str(folder)!r} does not exist. Download the weights with `python -m "
              f"nbhelpers download --weights {folder}`, or pass --weights with the folder that holds them.",
              file=sys.stderr)
        return 1
    report = weights.verify(folder, sets=args.sets or None, deep=args.deep)
    print(report)
    return 0 if getattr(report, "ok", True) else 1


def _cmd_report(args) -> int:
    from . import gpu

    rep = gpu.report()
    print(rep)
    print(gpu.plan(kind="lipsync", report=rep))
    return 0


def _cmd_avatar(args) -> int:
    from .avatar import Avatar, prepare_avatar

    if args.avatar_cmd == "prepare":
        avatar = prepare_avatar(args.video, args.directory, config=_config(args), boxes=_box(args.box),
                                weights_dir=args.weights, rebuild=args.rebuild)
        print(avatar)
    else:
        from .errors import InputError

        if args.output and len(args.audio) > 1:
            raise InputError(f"-o/--output names one file but {len(args.audio)} audio files were given; leave -o "
                             "out to write each clip to <avatar>/vid_output/<audio name>.mp4.")
        if not Path(args.directory).is_dir():
            raise InputError(f"{args.directory!r} is not an avatar folder; make one first with "
                             "`python -m nbhelpers avatar prepare VIDEO DIR`.")
        avatar = Avatar.load(args.directory, weights_dir=args.weights)
        if args.restore is not None:  # not a cached field: the same avatar renders with or without restoration
            avatar.config = avatar.config.replace(restore=args.restore, restore_strength=args.restore_strength)
        used: set[str] = set()
        for audio in args.audio:
            out = Path(args.output) if args.output else None
            if out is None:  # distinct names: two clips called reply.wav in different folders must not collide
                stem, k = Path(audio).stem, 1
                name = stem
                while name in used:
                    k += 1
                    name = f"{stem}-{k}"
                used.add(name)
                out = Path(args.directory) / "vid_output" / f"{name}.mp4"
            result = avatar.generate(audio, output=out)
            print(f"{result.summary()} -> {result.output}")
    return 0


def _cmd_score(args) -> int:
    from . import quality
    from .errors import WeightsError

    lag = quality.mouth_audio_lag(args.video, args.audio, backend=args.backend, weights_dir=args.weights,
                                  device=args.device)
    print(lag.summary())
    try:
        score = quality.sync_score(args.video, args.audio, weights_dir=args.weights, device=args.device)
    except WeightsError as exc:
        print(f"LSE-D / LSE-C not computed: {exc}", file=sys.stderr)
        return 0
    print(score.summary())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nbhelpers", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("lipsync", help="lip-sync a face video or photo to a speech file")
    p.add_argument("video")
    p.add_argument("audio")
    p.add_argument("-o", "--output", default=None, help="output .mp4 (default results/<video>_<audio>.mp4)")
    _add_settings(p)
    p.set_defaults(func=_cmd_lipsync)

    p = sub.add_parser("demo", help="lip-sync the bundled demo photo and speech")
    p.add_argument("-o", "--output", default="results/demo.mp4")
    p.add_argument("--download", action="store_true", help="download the weights first if missing")
    _add_settings(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("download", help="download the weights")
    p.add_argument("--sets", nargs="*", default=None, help="weight sets (default: the v1.5 inference set)")
    p.add_argument("--weights", default=None)
    p.set_defaults(func=_cmd_download)

    p = sub.add_parser("verify", help="check the weights folder")
    p.add_argument("--weights", default=None)
    p.add_argument("--sets", nargs="*", default=None,
                   help="weight sets to check (default: the download default; e.g. core parsing for dlib users)")
    p.add_argument("--deep", action="store_true", help="also hash files whose sha256 is known (slow for the UNet)")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("report", help="GPU report and the planner's choice")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("score", help="is a clip in sync? the mouth-audio lag (no weights) and SyncNet's LSE-D/LSE-C "
                                     "(needs `download --sets quality`)")
    p.add_argument("video")
    p.add_argument("--audio", default=None, help="speech file to score against (default: the video's own sound)")
    p.add_argument("--backend", default="auto", help="landmarks for the mouth curve: auto, dwpose-onnx, mmpose, dlib")
    p.add_argument("--device", default=None)
    p.add_argument("--weights", default=None)
    p.set_defaults(func=_cmd_score)

    p = sub.add_parser("avatar", help="prepare a face once, then generate from many audio clips")
    asub = p.add_subparsers(dest="avatar_cmd", required=True)
    pp = asub.add_parser("prepare")
    pp.add_argument("video")
    pp.add_argument("directory")
    pp.add_argument("--rebuild", action="store_true")
    _add_settings(pp)
    pg = asub.add_parser("generate")
    pg.add_argument("directory")
    pg.add_argument("audio", nargs="+")
    pg.add_argument("-o", "--output", default=None)
    pg.add_argument("--weights", default=None)
    _add_restore(pg)
    p.set_defaults(func=_cmd_avatar)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import NbHelpersError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except NbHelpersError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
