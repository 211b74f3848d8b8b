"""``download``, ``verify`` and ``report``: the weights and the machine."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .. import gpu, weights
from .terms import cli_terms

__all__ = ["download", "report", "verify"]


def download(args: argparse.Namespace) -> int:
    """``download [--sets ...]``."""
    print(weights.download(sets=args.sets or None, directory=args.weights))
    return 0


def verify(args: argparse.Namespace) -> int:
    """``verify``: exit status 1 when the folder is missing or a file is missing or damaged."""
    folder = Path(args.weights or weights.default_dir()).expanduser()
    if not folder.is_dir():
        print(f"error: the weights folder {str(folder)!r} does not exist. Download the weights with `python -m "
              f"nbhelpers download --weights {folder}`, or pass --weights with the folder that holds them.",
              file=sys.stderr)
        return 1
    result = weights.verify(folder, sets=args.sets or None, deep=args.deep)
    print(result)
    return 0 if getattr(result, "ok", True) else 1


def report(args: argparse.Namespace) -> int:
    """``report``: the GPU report and the plan of a lip-sync job here (its warnings shown once, in the plan)."""
    rep = gpu.report()
    folder = Path(args.weights or weights.default_dir()).expanduser()
    tiny = weights.is_tiny(folder)
    if tiny and rep.verdict:  # the report's verdict plans the full-size models, whatever the folder holds
        rep = dataclasses.replace(rep, verdict=f"{rep.verdict} [a lip-sync job with the full-size models]")
    print(rep)
    plan = gpu.plan(kind="lipsync", report=rep, warn=False, weights="tiny" if tiny else "full")
    if tiny:
        print(f"{folder} holds tiny random test weights: the plan is for the tiny models.")
        plan = str(plan).replace(plan.verdict, f"{plan.verdict} [the tiny test models, not a real job]", 1)
    print(cli_terms(str(plan)))
    return 0
