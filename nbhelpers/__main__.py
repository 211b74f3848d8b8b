"""Command line: the same jobs as the notebooks, without Jupyter.

    python -m nbhelpers demo                      # lip-sync the bundled demo (astronaut photo + speech)
    python -m nbhelpers demo --tiny               # the same with tiny random weights: no download, noise mouth
    python -m nbhelpers download                  # fetch the v1.5 weights (about 4.2 GB)
    python -m nbhelpers verify                    # check the weights folder
    python -m nbhelpers lipsync VIDEO AUDIO -o OUT.mp4
    python -m nbhelpers avatar prepare VIDEO DIR  # prepare a face once
    python -m nbhelpers avatar generate DIR AUDIO -o OUT.mp4
    python -m nbhelpers avatar live DIR --audio FILE --realtime --to URL  # a file played as live speech
    python -m nbhelpers report                    # GPU and the planner's choice
    python -m nbhelpers score VIDEO [--audio FILE]  # is it in sync? mouth-audio lag, and LSE-D/LSE-C
    python -m nbhelpers batch JOBS.csv            # many clips on Ray (pip install "ray>=2.10"), nothing lost

Every error the package raises on purpose is printed as one message (no traceback) with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path

from . import media, pipeline
from .avatar import load_avatar, prepare_avatar
from .errors import InputError
from .live import LiveConfig, LiveSession, play


def _add_settings(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("settings (defaults are the official v1.5 ones; device, precision, batch are planned)")
    g.add_argument("--version", choices=["v15", "v1"], default="v15")
    g.add_argument("--batch-size", type=int, default=None, help="frames per batch (default: from free GPU memory)")
    prec = g.add_mutually_exclusive_group()
    prec.add_argument("--fp16", dest="fp16", action="store_const", const=True, default=None,
                      help="half precision (default: on a GPU that runs it well, a T4 included)")
    prec.add_argument("--fp32", dest="fp16", action="store_const", const=False, help="full precision")
    g.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: CUDA when available)")
    g.add_argument("--extra-margin", type=int, default=10, help="pixels added below the crop box (v15)")
    g.add_argument("--bbox-shift", type=int, default=0, help="pixels added to landmark 29's y: + repaints more mouth, - less (both versions, as the official app)")
    g.add_argument("--parsing-mode", choices=["jaw", "raw", "neck"], default="jaw")
    g.add_argument("--left-cheek-width", type=int, default=90)
    g.add_argument("--right-cheek-width", type=int, default=90)
    g.add_argument("--backend", default="auto", help="landmarks: auto, dwpose, dwpose-onnx, mmpose or dlib")
    g.add_argument("--smooth-boxes", type=int, default=0, help="temporal smoothing window in frames (0 = off)")
    g.add_argument("--seed", type=int, default=0)
    _add_encoder(g, "libx264")
    g.add_argument("--box", default=None, help="one crop box for the whole clip, skipping detection: --box=x1,y1,x2,y2 "
                                               "(with '=', so negative numbers are not taken for options)")
    _add_restore(g)
    p.add_argument("--weights", default=None, help="weights folder (default: $NBHELPERS_WEIGHTS or the cache)")


def _add_encoder(group, default) -> None:
    from .constants import ENCODERS

    group.add_argument("--encoder", choices=ENCODERS, default=default,
                       help="video encoder: libx264 (CRF 18, preset medium, the official), libx264-fast ... "
                            "libx264-ultrafast (faster presets), nvenc/auto (h264_nvenc when a test encode works, "
                            "else libx264 with a warning)" + ("" if default else "; default: the avatar's setting"))


def _add_restore(g) -> None:
    g.add_argument("--restore", choices=["gfpgan", "restoreformer", "codeformer"], default=None,
                   help="restore the repainted face before paste-back (default: off). Needs spandrel and the weight "
                        "set restore-<name>; codeformer is for NON-COMMERCIAL use only (S-Lab License 1.0)")
    g.add_argument("--restore-strength", type=float, default=None,
                   help="blend of restored and unrestored face, 0..1 (default 1 = restored only); needs --restore")


def _check_restore(args) -> None:
    """Refuse ``--restore-strength`` without ``--restore`` before any work: the strength blends the restorer's
    output (InferenceConfig: "used only with restore"), and no avatar or jobs-file row names a restorer of its own,
    so alone it would be silently ignored.

    Raises:
        InputError: ``--restore-strength`` given and ``--restore`` not.
    """
    if getattr(args, "restore_strength", None) is not None and getattr(args, "restore", None) is None:
        from .config import RESTORERS
        from .errors import InputError

        raise InputError(f"--restore-strength {args.restore_strength:g} blends the restored face into the generated "
                         f"one, but no face restorer is chosen: add --restore NAME ({', '.join(RESTORERS)}), or "
                         "leave --restore-strength out.")


def _strength(args) -> float:
    return 1.0 if args.restore_strength is None else args.restore_strength


def _config(args):
    from .config import InferenceConfig

    return InferenceConfig(version=args.version, batch_size=args.batch_size, fp16=args.fp16, device=args.device,
                           extra_margin=args.extra_margin, bbox_shift=args.bbox_shift,
                           parsing_mode=args.parsing_mode, left_cheek_width=args.left_cheek_width,
                           right_cheek_width=args.right_cheek_width,
                           landmark_backend="boxes" if args.box else args.backend, smooth_boxes=args.smooth_boxes,
                           seed=args.seed, encoder=args.encoder, restore=args.restore,
                           restore_strength=_strength(args))


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
    if not (values[0] < values[2] and values[1] < values[3]):
        raise InputError(f"--box={text} is inverted: x1,y1 is the top-left corner and x2,y2 the bottom-right one, "
                         "so x1 < x2 and y1 < y2.")
    return tuple(values)


def _tiny_note(weights_dir: str | None) -> str:
    """The notice for outputs made with tiny random test weights from ``--weights`` ("" for real weights)."""
    from .weights import default_dir, is_tiny

    folder = Path(weights_dir).expanduser() if weights_dir else default_dir()
    if not is_tiny(folder):
        return ""
    return (f"NOTE: {folder} holds tiny RANDOM test weights: the repainted mouths are colour noise, not lip-sync. "
            "For real results: python -m nbhelpers download, and leave --weights out (or give the folder it names).")


def _cmd_lipsync(args) -> int:
    result = pipeline.lipsync(args.video, args.audio, args.output, config=_config(args), boxes=_box(args.box),
                     weights_dir=args.weights)
    print(f"{result.summary()} -> {result.output}")
    note = _tiny_note(args.weights)
    if note:
        print(note)
    return 0


#: What to run to see the tool work with no weights at all; the missing-weights messages name it.
TRY_TINY = ("To see the tool run without any download: `python -m nbhelpers demo --tiny` (tiny random weights; "
            "the repainted mouth is noise).")
TINY_OUTPUT = "results/demo-tiny-noise.mp4"
TINY_SECONDS = 1.0  # of the demo speech: 25 frames, under a minute on 2 CPU cores (the whole 4.7 s took 3 min)
TINY_NOTE = ("NOTE: made with tiny RANDOM weights (--tiny): the repainted mouth is colour noise, not lip-sync. It "
             "shows that every stage runs here. For the real result: python -m nbhelpers demo --download")


def _cmd_demo(args) -> int:
    import tempfile

    from . import weights

    tiny = args.tiny
    if tiny and (args.download or args.weights):
        raise InputError("--tiny makes its own random weights: leave out --download and --weights (or leave out "
                         "--tiny to run the real models).")
    if args.download:
        weights.download(directory=args.weights, sets=_sets_for(args))
    folder = Path(tempfile.mkdtemp(prefix="nbhelpers-demo-"))
    try:
        photo, speech = media.demo_inputs(folder)
        config, weights_dir, output = _config(args), args.weights, args.output
        if tiny:
            from .testing import make_tiny_weights

            print("demo --tiny: making tiny random weights (a few seconds; nothing is downloaded)", flush=True)
            from .env.folders import _cut

            weights_dir = make_tiny_weights(folder / "tiny-weights")
            speech = _cut(Path(speech), folder / "speech-1s.wav", TINY_SECONDS, "audio")
            output = output or TINY_OUTPUT
            if config.device is None and not _has_cuda():
                config = config.replace(device="cpu")
        result = pipeline.lipsync(photo, speech, output or "results/demo.mp4", config=config, boxes=_box(args.box),
                         weights_dir=weights_dir)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{result.summary()} -> {result.output}")
    if tiny:
        print(TINY_NOTE)
    return 0


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _sets_for(args) -> list[str]:
    """The weight sets a job with these settings needs (no landmark weights for dlib or a given box)."""
    sets = ["core", "parsing"]
    if args.version == "v1":
        sets.append("v1")
    backend = "boxes" if args.box else args.backend
    if backend in ("auto", "dwpose", "mmpose"):  # all three read dwpose/dw-ll_ucoco_384.pth
        sets += ["faces", "s3fd"]
    elif backend == "dwpose-onnx":
        sets += ["faces-onnx", "s3fd"]
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
    if args.avatar_cmd == "live":
        return _cmd_avatar_live(args)
    if args.avatar_cmd == "prepare":
        avatar = prepare_avatar(args.video, args.directory, config=_config(args), boxes=_box(args.box),
                                weights_dir=args.weights, rebuild=args.rebuild)
        print(avatar)
    else:
        if args.output and len(args.audio) > 1:
            raise InputError(f"-o/--output names one file but {len(args.audio)} audio files were given; leave -o "
                             "out to write each clip to <avatar>/vid_output/<audio name>.mp4.")
        if not Path(args.directory).is_dir():
            raise InputError(f"{args.directory!r} is not an avatar folder; make one first with "
                             "`python -m nbhelpers avatar prepare VIDEO DIR`.")
        avatar = load_avatar(args.directory, weights_dir=args.weights)
        if args.restore is not None:  # not a cached field: the same avatar renders with or without restoration
            avatar.config = avatar.config.replace(restore=args.restore, restore_strength=_strength(args))
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
            # --encoder given: passed on; left out: the avatar's own setting
            options = {} if args.encoder is None else {"encoder": args.encoder}
            result = avatar.generate(audio, output=out, **options)
            print(f"{result.summary()} -> {result.output}")
    return 0


def _cmd_avatar_live(args) -> int:
    if not Path(args.directory).is_dir():
        raise InputError(f"{args.directory!r} is not an avatar folder; make one first with "
                         "`python -m nbhelpers avatar prepare VIDEO DIR`.")
    if args.chunk_ms <= 0:
        raise InputError(f"--chunk-ms must be > 0; got {args.chunk_ms}.")
    waveform = media.load_audio(args.audio)
    to = args.to
    if to is None:  # as `avatar generate`: the avatar's vid_output folder
        target = Path(args.directory) / "vid_output" / f"live-{Path(args.audio).stem}.mp4"
        target.parent.mkdir(parents=True, exist_ok=True)
        to = str(target)
    avatar = load_avatar(args.directory, weights_dir=args.weights)
    avatar.load_models()
    config = LiveConfig(realtime=args.realtime, to=to, silence=None if args.silence == "none" else args.silence,
                        encoder=args.encoder, iterate=False)
    session = LiveSession(avatar, config, on_frame=lambda n, frame: None)
    result = play(session, waveform, chunk_ms=args.chunk_ms, realtime=args.realtime)
    print(f"{result.summary()} -> {result.output or to}")
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


# Python names in the package's messages -> what a command-line user types (issue 14 item 11). Applied, in order,
# to the messages of errors and warnings that reach the command line; each rule is checked against the real
# message in tests/test_cli_terms.py, so a reworded message fails a test instead of slipping through unchanged.
_CLI_TERMS: tuple[tuple[str, str], ...] = (
    (r" ?\(upload the file first in notebook 02_media, or give the full path\)",
     " (give the full path, or a path relative to the current folder)"),
    (r" ?\(or (?:run )?(?:notebook |notebooks/)?0\d_\w+(?:\.ipynb)?\)", ""),
    (r"(?<![\w.-])cache_dir(?!\w)", "--cache-dir"),
    (r"run notebooks/00_setup\.ipynb(?: \(weights\.download\))?", "run `python -m nbhelpers download`"),
    # the three ways to name the weights folder, as the weights module lists them, become the two a CLI user has
    (r"--weights DIR(?: on the command line)?, weights_dir=(?: in Python)?,? (?:or )?(?:the )?NBHELPERS_WEIGHTS"
     r"(?: environment variable)?",
     "--weights DIR or the NBHELPERS_WEIGHTS environment variable"),
    (r"\(weights_dir=, NBHELPERS_WEIGHTS\)", "(or the NBHELPERS_WEIGHTS environment variable)"),
    # weights_dir= followed by a value, by the folder it names, or by nothing: a flag needs its DIR word and one space
    (r"weights_dir=(?=['\"])", "--weights "),
    (r"weights_dir= the folder", "--weights DIR, the folder"),
    (r"weights_dir=", "--weights DIR"),
    (r"landmark_backend='boxes' needs boxes=: one \(x1, y1, x2, y2\) for the clip or one per frame\.",
     "--backend boxes needs --box=x1,y1,x2,y2 (one crop box for the clip)."),
    (r"config\.device is", "--device is"),
    (r"then run the notebook again from the top", "then run the command again"),
    (r"Or set device=None \(automatic\) or 'cpu'\.", "Or leave --device out (automatic), or pass --device cpu."),
    (r"or device=None \(automatic\)", "or leave --device out (automatic)"),
    (r" or None \(automatic\)", " or left out (automatic)"),
    (r"(?<![\w.-])(batch_size|extra_margin|bbox_shift|left_cheek_width|right_cheek_width|smooth_boxes|parsing_mode|"
     r"landmark_backend|device|version|seed|cpu_workers|workers_per_gpu|jobs_per_worker|max_attempts|gpus|cache_dir)"
     r"(?= must| [\w.]+ \(user override\)| \(user override\)|=)",
     lambda m: "--" + {"landmark_backend": "backend"}.get(m.group(1), m.group(1)).replace("_", "-")),
)


def cli_terms(message: str) -> str:
    """A package message in command-line terms: flags (``--batch-size``) for Python names (``batch_size``),
    ``--weights`` for ``weights_dir=``, and no pointers to notebooks.

    Args:
        message: The text of an error or warning raised by the package.

    Returns:
        The same message for a command-line user.
    """
    import re

    for pattern, replacement in _CLI_TERMS:
        message = re.sub(pattern, replacement, message)
    return message


def _in_cli_terms(func):
    """Wrap a command so that the package's errors and warnings reach the terminal in command-line terms."""
    import functools
    import warnings

    from .errors import NbHelpersError, NbHelpersWarning

    @functools.wraps(func)
    def run(args):
        shown = warnings.showwarning

        def show(message, category, *rest, **kw):
            if isinstance(message, NbHelpersWarning):
                message = category(cli_terms(str(message)))
            return shown(message, category, *rest, **kw)

        warnings.showwarning = show
        try:
            return func(args)
        except NbHelpersError as exc:
            if exc.args and isinstance(exc.args[0], str):
                exc.args = (cli_terms(exc.args[0]), *exc.args[1:])
            raise
        finally:
            warnings.showwarning = shown

    return run


def _add_fields(p: argparse.ArgumentParser, config_class) -> None:
    """One flag per field of the config dataclass ``config_class``: ``--`` and the field's name with dashes, its
    default, its kind (a bool is a switch, an int field takes a whole number) and its ``help`` and ``choices``
    (the field's metadata)."""
    for f in dataclasses.fields(config_class):
        flag, kind = "--" + f.name.replace("_", "-"), str(f.type).split(" | ")[0]
        if kind == "bool":
            p.add_argument(flag, action="store_true", help=f.metadata.get("help"))
        else:
            p.add_argument(flag, type=int if kind == "int" else str, default=f.default,
                           choices=f.metadata.get("choices"), help=f.metadata.get("help"))


def _fields(args, config_class):
    """``config_class`` made from the flags :func:`_add_fields` added."""
    return config_class(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)})


def _cmd_batch(args) -> int:
    from . import batch

    jobs = batch.read_jobs(args.jobs)
    if args.box:  # --box gives the jobs that set no box of their own one crop box
        jobs = [j if "box" in j.settings else batch.Job(j.name, j.video, j.audio, j.output,
                                                        {**j.settings, "box": _box(args.box)}, j.source) for j in jobs]
    result = batch.run(jobs, _fields(args, batch.BatchConfig), inference=_config(args), weights_dir=args.weights)
    print(result)
    note = _tiny_note(args.weights)
    if note and result.count("done"):
        print(note)
    return 0 if result.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nbhelpers", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("lipsync", help="lip-sync a face video or photo to a speech file")
    p.add_argument("video", help="face video (any frame rate: read at 25 fps) or a photo (PNG, JPEG, ...)")
    p.add_argument("audio", help="speech file (WAV, MP3, M4A, FLAC, or a video's sound track)")
    p.add_argument("-o", "--output", default=None, help="output .mp4 (default results/<video>_<audio>.mp4)")
    _add_settings(p)
    p.set_defaults(func=_cmd_lipsync)

    p = sub.add_parser("demo", help="lip-sync the bundled demo photo and speech")
    p.add_argument("-o", "--output", default=None,
                   help=f"output .mp4 (default results/demo.mp4; with --tiny {TINY_OUTPUT})")
    p.add_argument("--download", action="store_true", help="download the weights first if missing")
    p.add_argument("--tiny", action="store_true",
                   help="no download: tiny RANDOM weights made on the spot, so the mouth is noise, and the first "
                        f"{TINY_SECONDS:g} s of the speech; shows that every stage runs (on the CPU without a GPU)")
    _add_settings(p)
    p.set_defaults(func=_cmd_demo)

    from .weights import DEFAULT_SETS, SETS

    sets = ", ".join(SETS)
    p = sub.add_parser("download", help="download the weights")
    p.add_argument("--sets", nargs="*", default=None,
                   help=f"weight sets, of: {sets} (default: {' '.join(DEFAULT_SETS)}, the v1.5 inference set)")
    p.add_argument("--weights", default=None, help="weights folder (default: $NBHELPERS_WEIGHTS, else ~/.cache/musetalk-workbook/models)")
    p.set_defaults(func=_cmd_download)

    p = sub.add_parser("verify", help="check the weights folder")
    p.add_argument("--weights", default=None, help="weights folder (default: $NBHELPERS_WEIGHTS, else ~/.cache/musetalk-workbook/models)")
    p.add_argument("--sets", nargs="*", default=None,
                   help=f"weight sets to check, of: {sets} (default: the download default; e.g. core parsing for "
                        "dlib users)")
    p.add_argument("--deep", action="store_true", help="also hash files whose sha256 is known (slow for the UNet)")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("report", help="GPU report and the planner's choice",
                       description="Print this machine's GPU (or CPU) report: device, free memory, precision, and "
                                   "the batch size and fp16 choice the planner makes for a job here. Reads no "
                                   "weights and starts no model.")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("score", help="is a clip in sync? the mouth-audio lag (no weights) and SyncNet's LSE-D/LSE-C "
                                     "(needs `download --sets quality`)")
    p.add_argument("video")
    p.add_argument("--audio", default=None, help="speech file to score against (default: the video's own sound)")
    p.add_argument("--backend", default="auto", help="landmarks for the mouth curve: auto, dwpose-onnx, mmpose, dlib")
    p.add_argument("--device", default=None)
    p.add_argument("--weights", default=None)
    p.set_defaults(func=_cmd_score)

    from .config import BatchConfig

    p = sub.add_parser("batch", help="many clips on Ray: each face prepared once, every GPU used, nothing lost",
                       description="Run a jobs file (CSV with columns video,audio,output and optional settings, or "
                                   "JSON lines) on Ray. Finished outputs are skipped. Exit status 0 when every job is "
                                   "done or skipped, 1 when a job failed, 2 when the batch could not start (a bad "
                                   "jobs file, no Ray, missing weights, a folder it cannot write in, another batch "
                                   "running over the same outputs), 130 on Ctrl-C and 143 on SIGTERM (half-written "
                                   "files removed, the unfinished jobs marked interrupted in the summary). --box "
                                   "gives its box to every job that has none of its own.")
    p.add_argument("jobs", help="CSV or JSON-lines jobs file (relative paths are relative to it)")
    _add_fields(p, BatchConfig)
    _add_settings(p)
    p.set_defaults(func=_cmd_batch)

    p = sub.add_parser("avatar", help="prepare a face once, then generate from many audio clips")
    asub = p.add_subparsers(dest="avatar_cmd", required=True)
    pp = asub.add_parser("prepare", help="prepare an avatar from a face video: frames, latents and masks cached in DIR")
    pp.add_argument("video")
    pp.add_argument("directory")
    pp.add_argument("--rebuild", action="store_true")
    _add_settings(pp)
    pg = asub.add_parser("generate", help="make clips from a prepared avatar, one per speech file (default: into "
                                          "DIR/vid_output)")
    pg.add_argument("directory")
    pg.add_argument("audio", nargs="+")
    pg.add_argument("-o", "--output", default=None)
    pg.add_argument("--weights", default=None)
    _add_encoder(pg, None)
    _add_restore(pg)
    pl = asub.add_parser("live", help="play a speech file into a live session as if it arrived in real time")
    pl.add_argument("directory")
    pl.add_argument("--audio", required=True, help="speech file pushed in chunks")
    pl.add_argument("--to", default=None, help="output file (.mp4/.mkv/.ts/.flv) or URL (rtmp://, srt://, udp://); "
                                               "default <avatar>/vid_output/live-<audio name>.mp4")
    pl.add_argument("--realtime", action="store_true", help="push chunks at the pace of the audio, output at 25 fps")
    pl.add_argument("--chunk-ms", type=float, default=200.0, help="chunk length in milliseconds")
    pl.add_argument("--silence", choices=["closed", "source", "none"], default="closed",
                    help="what silent frames show")
    pl.add_argument("--weights", default=None)
    _add_encoder(pl, None)
    p.set_defaults(func=_cmd_avatar)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import NbHelpersError, Terminated

    args = build_parser().parse_args(argv)
    args.func = _in_cli_terms(args.func)  # messages in flag names, not Python names or notebooks (issue 14)
    previous = _terminate_like_interrupt()
    try:
        _check_restore(args)  # before any download, model or frame
        return int(args.func(args) or 0)
    except NbHelpersError as exc:
        from .errors import WeightsError

        message = str(exc)
        if isinstance(exc, WeightsError) and not getattr(args, "tiny", False) and "demo --tiny" not in message:
            message += "\n" + TRY_TINY
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated), perhaps re-raised as Ctrl-C by a C wait
        if isinstance(exc, Terminated) or Terminated.pending:
            print("terminated", file=sys.stderr)
            return 143
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        Terminated.pending = False
        if previous is not None:  # main() called in-process (tests, notebooks): give the handler back
            import signal

            signal.signal(signal.SIGTERM, previous)


def _terminate_like_interrupt():
    """Turn SIGTERM into an exception in the main thread, so that the jobs' ``with`` blocks remove their partial
    output and frame store as they do on Ctrl-C (the default SIGTERM action kills the process without cleanup).

    Returns:
        The handler it replaced (to restore), or None when none was installed.
    """
    import signal
    import threading

    from .errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        Terminated.pending = True
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # not allowed here (an embedding host): keep the default
        return None


if __name__ == "__main__":
    sys.exit(main())
