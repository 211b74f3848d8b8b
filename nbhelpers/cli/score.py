"""``score VIDEO``: is a clip in sync? The mouth-audio lag, then SyncNet's LSE-D and LSE-C."""

from __future__ import annotations

import argparse
import re
import sys

from .. import quality
from ..config import InferenceConfig
from ..errors import NoAudioError, NoFaceError, WeightsError
from .flags import config_from
from .terms import cli_terms

__all__ = ["score"]

_BOX_HINT = re.compile(r"try another backend, or give the crop box yourself: boxes=.*? on the command line\.")


def score(args: argparse.Namespace) -> int:
    """``score VIDEO [--audio FILE]``: the lag always; LSE-D/LSE-C when the quality weights are there."""
    config = config_from(args, InferenceConfig)  # the flags' values checked before any frame is read
    try:
        lag = quality.mouth_audio_lag(args.video, args.audio, backend=config.landmark_backend,
                                      weights_dir=args.weights, device=config.device)
    except NoAudioError as exc:  # a silent VIDEO needs --audio, not another video
        if args.audio is None:
            raise NoAudioError(exc.param, exc.path, exc.info, "Give the speech with --audio FILE.") from None
        raise
    except NoFaceError as exc:  # its hint offers a crop box, which score does not take
        exc.args = (_BOX_HINT.sub("try another --backend (score takes no crop box: the mouth-audio lag follows the "
                                  "face's landmarks).", str(exc)),)
        raise
    print(lag.summary())
    try:
        sync = quality.sync_score(args.video, args.audio, weights_dir=args.weights, device=config.device)
    except WeightsError as exc:
        print(f"LSE-D / LSE-C not computed: {cli_terms(str(exc))}", file=sys.stderr)  # caught: not in_cli_terms
        return 0
    print(sync.summary())
    return 0
