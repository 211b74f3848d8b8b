"""``avatar prepare``, ``avatar generate`` and ``avatar live``: a face prepared once, then any number of clips."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import media
from ..avatar import load_avatar, prepare_avatar
from ..avatar.avatar import RUNTIME_FIELDS, read_meta
from ..checks import check_audio, check_speech_seconds, names_folder
from ..config import InferenceConfig, LiveConfig
from ..errors import InputError
from ..live import LiveSession, play
from ..media.stream import container_of
from .flags import box_flag, config_from, given_settings, inference_config

__all__ = ["avatar"]


def avatar(args: argparse.Namespace) -> int:
    """``avatar prepare|generate|live``."""
    return {"prepare": _prepare, "generate": _generate, "live": _live}[args.avatar_cmd](args)


def _prepare(args: argparse.Namespace) -> int:
    print(prepare_avatar(args.video, args.directory, config=inference_config(args), boxes=box_flag(args.box),
                         weights_dir=args.weights, rebuild=args.rebuild))
    return 0


def _check_folder(directory: str) -> None:
    if not Path(directory).is_dir():
        raise InputError(f"{directory!r} is not an avatar folder; make one first with "
                         "`python -m nbhelpers avatar prepare VIDEO DIR`.")


def _generate(args: argparse.Namespace) -> int:
    into = Path(args.output).expanduser() if args.output else Path(args.directory) / "vid_output"
    one = args.output is not None and not names_folder(args.output)  # -o FILE.mp4, else the clips go into a folder
    if one and len(args.audio) > 1:
        raise InputError(f"-o/--output names one file but {len(args.audio)} audio files were given; give a folder "
                         "(-o DIR) or leave -o out to write each clip to <avatar>/vid_output/<audio name>.mp4.")
    if one and into.suffix.lower() != ".mp4":  # before the avatar and its models load
        raise InputError(f"output must end in .mp4 or be an existing folder; got {str(into)!r}.")
    _check_folder(args.directory)
    for path, info in map(check_audio, args.audio):  # each file probed before the avatar and its models load
        check_speech_seconds(info.duration_s, f"audio {str(path)!r}")
    # settings the cache does not depend on (device, precision, batch, compile, restorer): an avatar does not store
    # them, so they are the defaults unless given; the encoder is passed per clip below
    given = given_settings(args, InferenceConfig, only=[k for k in RUNTIME_FIELDS if k != "encoder"])
    config = None
    if given:
        stored = InferenceConfig(**read_meta(Path(args.directory), check=False)["params"])
        config = stored.replace(**given)  # InputError for a value the config refuses, before the models load
    loaded = load_avatar(args.directory, weights_dir=args.weights, config=config)
    used: set[str] = set()
    for audio in args.audio:
        out = into if one else None
        if out is None:  # distinct names: two clips called reply.wav in different folders must not collide
            stem, k = Path(audio).stem, 1
            name = stem
            while name in used:
                k += 1
                name = f"{stem}-{k}"
            used.add(name)
            out = into / f"{name}.mp4"
        result = loaded.generate(audio, output=out, encoder=args.encoder)  # None: config.encoder, its default
        print(f"{result.summary()} -> {result.output}")
    return 0


def _live(args: argparse.Namespace) -> int:
    _check_folder(args.directory)
    if not 0 < args.chunk_ms < float("inf"):  # also NaN
        raise InputError(f"--chunk-ms must be > 0; got {args.chunk_ms:g}.")
    config = config_from(args, LiveConfig, iterate=False)
    waveform = media.load_audio(args.audio)
    if config.to is None:  # as `avatar generate`: the avatar's vid_output folder
        config = config.replace(to=str(Path(args.directory) / "vid_output" / f"live-{Path(args.audio).stem}.mp4"))
    container_of(config.to)  # a name ffmpeg could not write to is refused before the models load
    if "://" not in config.to:  # a file: its folder is checked before the models load
        media.check_writable(Path(config.to).expanduser().parent)
    loaded = load_avatar(args.directory, weights_dir=args.weights)
    loaded.load_models()
    session = LiveSession(loaded, config, on_frame=lambda n, frame: None)
    result = play(session, waveform, chunk_ms=args.chunk_ms, realtime=config.realtime)
    print(f"{result.summary()} -> {result.output or config.to}")
    return 0
