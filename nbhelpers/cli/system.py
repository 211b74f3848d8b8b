"""``download``, ``verify`` and ``report``: the weights and the machine."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util

from .. import gpu, weights
from ..gpu.compile import compile_decision
from .terms import cli_terms

__all__ = ["download", "report", "verify"]


def download(args: argparse.Namespace) -> int:
    """``download [--sets ...]``."""
    print(weights.download(sets=args.sets or None, directory=args.weights))
    return 0


def verify(args: argparse.Namespace) -> int:
    """``verify``: exit status 1 when a file is missing or damaged; the folder missing or a file is an error (2)."""
    folder = weights.check_folder(args.weights)
    result = weights.verify(folder, sets=args.sets or None, deep=args.deep)
    fixes = tuple(dataclasses.replace(c, fix=cli_terms(c.fix)) for c in result.checks)  # before the columns
    print(cli_terms(str(dataclasses.replace(result, checks=fixes))))
    return 0 if result.ok else 1


def report(args: argparse.Namespace) -> int:
    """``report``: the GPU report and the plan of a lip-sync job here (its warnings shown once, in the plan); a
    ``--weights`` folder that is not there is an error, before the report."""
    folder = weights.check_folder(args.weights) if args.weights else weights.default_dir()
    rep = gpu.report()
    tiny = weights.is_tiny(folder)
    if tiny and rep.verdict:  # the report's verdict plans the full-size models, whatever the folder holds
        rep = dataclasses.replace(rep, verdict=f"{rep.verdict} [a lip-sync job with the full-size models]")
    print(rep)
    plan = gpu.plan(kind="lipsync", report=rep, warn=False, weights="tiny" if tiny else "full")
    if tiny:
        print(f"{folder} holds tiny random test weights: the plan is for the tiny models.")
        plan = str(plan).replace(plan.verdict, f"{plan.verdict} [the tiny test models, not a real job]", 1)
    print(cli_terms(str(plan)))
    if importlib.util.find_spec("torch") is not None:  # what --compile auto (the default) does here
        on, why = compile_decision(rep.device, "auto")
        print(cli_terms(f"compile (auto, the default): {'on' if on else 'off'}: {why}."))
    return 0
