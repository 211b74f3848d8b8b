"""The command line's parser: its commands, their arguments, and the settings' flags made from the config fields.

It reads the config classes only (no job package), so building it imports no model code.
"""

from __future__ import annotations

import argparse

from ..config import LANDMARK_BACKENDS, BatchConfig, InferenceConfig, LiveConfig
from ..config.fields import settings
from ..weights import DEFAULT_SETS, SETS
from .flags import Parser, add_fields

__all__ = ["EXAMPLES", "TINY_OUTPUT", "TINY_SECONDS", "build_parser"]

EXAMPLES = """examples:
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

exit status: 0 done; 1 a check that ran and failed (verify: a weight file missing or damaged; batch: a job
failed); 2 the command could not run as given (a bad flag, a missing or unreadable file or folder, missing
weights), printed as one message without a traceback; 130 Ctrl-C; 143 SIGTERM."""

TINY_OUTPUT = "results/demo-tiny-noise.mp4"
TINY_SECONDS = 1.0  # of the demo speech: 25 frames, under a minute on 2 CPU cores

SETTINGS = ("settings (InferenceConfig; defaults are the official v1.5 ones; device, precision and batch size are "
            "planned)")
WEIGHTS_HELP = "weights folder (default: $NBHELPERS_WEIGHTS, else ~/.cache/musetalk-workbook/models)"
VIDEO_HELP = "face video (any frame rate: read at 25 fps) or a photo (PNG, JPEG, ...)"
AUDIO_HELP = "speech file (WAV, MP3, M4A, FLAC, or a video's sound track)"
# The settings an avatar does not cache (nbhelpers.avatar.avatar.RUNTIME_FIELDS, named here so that building the
# parser imports no avatar code): `avatar generate` takes them; of those, `avatar prepare` writes no clip, so it does
# not take the ones that only shape a clip.
AVATAR_RUNTIME = ("device", "fp16", "batch_size", "compile", "encoder", "restore", "restore_strength")
CLIP_ONLY = ("encoder", "restore", "restore_strength")
AVATAR_DIR_HELP = "avatar folder, made by `avatar prepare`"


def _command(sub: argparse._SubParsersAction, name: str, help: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description)


def _job_settings(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The flags of a job's settings: every InferenceConfig field but those in ``skip``, ``--box`` and ``--weights``."""
    add_fields(p, InferenceConfig, title=SETTINGS,
               only=None if not skip else [f.name for f in settings(InferenceConfig) if f.name not in skip])
    p.add_argument("--box", default=None, metavar="X1,Y1,X2,Y2",
                   help="one crop box for the whole clip, skipping detection: --box=x1,y1,x2,y2 in source pixels "
                        "(with '=', so that negative numbers are not taken for options), as wide as the face, its "
                        "bottom at the chin and its middle at the nose: its lower half is repainted")
    p.add_argument("--weights", default=None, metavar="DIR", help=WEIGHTS_HELP)


def _lipsync(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "lipsync", "lip-sync a face video or photo to a speech file",
                 "Lip-sync a face video or photo to a speech file: the lower face is repainted to follow the "
                 "speech, and the output is the video at 25 fps (as long as the speech) with the speech as its "
                 "sound. The weights come from --weights, $NBHELPERS_WEIGHTS or the cache (`python -m nbhelpers "
                 "download`). On a CPU, --backend dlib finds the faces in seconds where DWPose takes minutes.")
    p.add_argument("video", help=VIDEO_HELP)
    p.add_argument("audio", help=AUDIO_HELP)
    p.add_argument("-o", "--output", default=None,
                   help="output .mp4, or a folder (existing, or ending in /) to write <video>_<audio>.mp4 into "
                        "(default: results/)")
    _job_settings(p)

    p = _command(sub, "demo", "lip-sync the bundled demo photo and speech",
                 "Lip-sync the bundled demo: scikit-image's public-domain astronaut photo and 4.7 s of speech made "
                 "by this project. --download fetches the weights first; --tiny runs every stage on tiny random "
                 "weights with no download (the mouth is noise).")
    p.add_argument("-o", "--output", default=None,
                   help=f"output .mp4, or a folder (existing, or ending in /) to write the default name into (default "
                        f"results/demo.mp4; with --tiny {TINY_OUTPUT})")
    p.add_argument("--download", action="store_true", help="download the weights first if missing")
    p.add_argument("--tiny", action="store_true",
                   help="no download: tiny RANDOM weights made on the spot, so the mouth is noise, and the first "
                        f"{TINY_SECONDS:g} s of the speech; shows that every stage runs (on the CPU without a GPU)")
    _job_settings(p)


def _weights(sub: argparse._SubParsersAction) -> None:
    sets = ", ".join(SETS)
    p = _command(sub, "download", "download the weights",
                 "Download the official weight files into the weights folder, in the official models/ layout, "
                 "checking each file's size and hash.")
    p.add_argument("--sets", nargs="*", default=None,
                   help=f"weight sets, of: {sets} (default: {' '.join(DEFAULT_SETS)}, the v1.5 inference set)")
    p.add_argument("--weights", default=None, metavar="DIR", help=WEIGHTS_HELP)

    p = _command(sub, "verify", "check the weights folder",
                 "Check that the weights folder holds every file of the sets, of the right size and kind. Exit "
                 "status 0 when all are usable, 1 when one is missing or damaged, 2 when the folder does not "
                 "exist or is a file.")
    p.add_argument("--weights", default=None, metavar="DIR", help=WEIGHTS_HELP)
    p.add_argument("--sets", nargs="*", default=None,
                   help=f"weight sets to check, of: {sets} (default: the download default; e.g. core parsing for "
                        "dlib users)")
    p.add_argument("--deep", action="store_true", help="also hash files whose sha256 is known (slow for the UNet)")

    p = _command(sub, "report", "GPU report and the planner's choice",
                 "Print this machine's GPU (or CPU) report: device, free memory, precision, and the batch size and "
                 "fp16 choice the planner makes for a job here (with the tiny test models when the weights folder "
                 "holds them). Reads no weights and starts no model.")
    p.add_argument("--weights", default=None, metavar="DIR", help=WEIGHTS_HELP)


def _score(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "score", "is a clip in sync? the mouth-audio lag (no weights) and SyncNet's LSE-D/LSE-C "
                               "(needs `download --sets quality`)",
                 "Score a clip's lip sync: the lag between the mouth opening and the speech envelope (no weights), "
                 "then SyncNet's LSE-D and LSE-C when the quality weights are there (`python -m nbhelpers download "
                 "--sets quality`).")
    p.add_argument("video", help="the clip to score: a 25 fps video with a face")
    p.add_argument("--audio", default=None, help="speech file to score against (default: the video's own sound)")
    add_fields(p, InferenceConfig, only=("landmark_backend", "device"),
               choices={"landmark_backend": [b for b in LANDMARK_BACKENDS if b != "boxes"]})
    p.add_argument("--weights", default=None, metavar="DIR", help=WEIGHTS_HELP)


def _batch(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "batch", "many clips on Ray: each face prepared once, every GPU used, nothing lost",
                 "Run a jobs file (CSV with columns video,audio,output and optional settings, or JSON lines) on "
                 "Ray. Finished outputs are skipped. Exit status 0 when every job is done or skipped, 1 when a job "
                 "failed, 2 when the batch could not start (a bad jobs file, no Ray, missing weights, a folder it "
                 "cannot write in, another batch running over the same outputs), 130 on Ctrl-C and 143 on SIGTERM "
                 "(half-written files removed, the unfinished jobs marked interrupted in the summary). --box gives "
                 "its box to every job that has none of its own.")
    p.add_argument("jobs", help="CSV or JSON-lines jobs file (relative paths are relative to it)")
    add_fields(p, BatchConfig, title="batch (BatchConfig)")
    _job_settings(p)


def _avatar(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "avatar", "prepare a face once, then generate from many audio clips",
                 "An avatar is everything computed once per face video (frames, crop boxes, latents, blend masks), "
                 "cached in a folder and reused for any audio: prepare it, then generate clips or play speech into "
                 "a live session.")
    asub = p.add_subparsers(dest="avatar_cmd", required=True)
    pp = _command(asub, "prepare", "prepare an avatar from a face video: frames, latents and masks cached in DIR",
                  "Prepare an avatar from a face video: frames, crop boxes, latents and blend masks cached in DIR. "
                  "An avatar already in DIR with the same video, settings and weights is loaded instead.")
    pp.add_argument("video", help=VIDEO_HELP)
    pp.add_argument("directory", help="folder to write the avatar into (made when missing)")
    pp.add_argument("--rebuild", action="store_true", help="prepare again even when DIR holds this avatar")
    _job_settings(pp, skip=CLIP_ONLY)  # prepare writes no clip: the encoder and restorer are avatar generate's
    pp.elsewhere = {flag: "The encoder and face restorer are chosen per clip: give them to `avatar generate`."
                    for flag in ("--encoder", "--restore", "--restore-strength")}

    pg = _command(asub, "generate", "make clips from a prepared avatar, one per speech file (default: into "
                                    "DIR/vid_output)",
                  "Make one clip per speech file from a prepared avatar, with the settings it was prepared with.")
    pg.add_argument("directory", help=AVATAR_DIR_HELP)
    pg.add_argument("audio", nargs="+", help="speech files, one clip each")
    pg.add_argument("-o", "--output", default=None,
                    help="output .mp4 for one speech file, or a folder (existing, or ending in /) to write "
                         "<audio name>.mp4 into (default: DIR/vid_output)")
    pg.add_argument("--weights", default=None, metavar="DIR", help=WEIGHTS_HELP)
    add_fields(pg, InferenceConfig, only=AVATAR_RUNTIME)  # not cached in the avatar: their own defaults

    pl = _command(asub, "live", "play a speech file into a live session as if it arrived in real time",
                  "Play a speech file into a live session of a prepared avatar, pushed in chunks as if it arrived "
                  "live, and write the frames with the sound to a file or stream.")
    pl.add_argument("directory", help=AVATAR_DIR_HELP)
    pl.add_argument("--audio", required=True, help="speech file pushed in chunks")
    pl.add_argument("--chunk-ms", type=float, default=200.0, metavar="MILLISECONDS",
                    help="length of each chunk pushed (default: 200)")
    pl.add_argument("--weights", default=None, metavar="DIR", help=WEIGHTS_HELP)
    add_fields(pl, LiveConfig, title="live session (LiveConfig)",
               defaults={"to": "<avatar>/vid_output/live-<audio name>.mp4"})


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m nbhelpers``; each command's ``command`` (and ``avatar_cmd``) names what to run."""
    parser = Parser(prog="python -m nbhelpers", epilog=EXAMPLES,
                    description="The jobs of the MuseTalk Workbook's notebooks, without Jupyter.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_lipsync, _weights, _score, _batch, _avatar):
        add(sub)
    return parser
