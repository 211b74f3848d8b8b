"""``score VIDEO``: is a clip in sync? The mouth-audio lag, then SyncNet's LSE-D and LSE-C."""

from __future__ import annotations

import argparse
import sys

from .. import quality
from ..config import InferenceConfig
from ..errors import WeightsError
from .flags import config_from
from .terms import cli_terms

__all__ = ["score"]


def score(args: argparse.Namespace) -> int:
    """``score VIDEO [--audio FILE]``: the lag always; LSE-D/LSE-C when the quality weights are there."""
    config = config_from(args, InferenceConfig)  # the flags' values checked before any frame is read
    lag = quality.mouth_audio_lag(args.video, args.audio, backend=config.landmark_backend, weights_dir=args.weights,
                                  device=config.device)
    print(lag.summary())
    try:
        sync = quality.sync_score(args.video, args.audio, weights_dir=args.weights, device=config.device)
    except WeightsError as exc:
        print(f"LSE-D / LSE-C not computed: {cli_terms(str(exc))}", file=sys.stderr)  # caught: not in_cli_terms
        return 0
    print(sync.summary())
    return 0
