"""The command line of the weights: ``python -m nbhelpers.weights list|download|verify``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import NbHelpersError
from .downloads import download
from .manifest import ENV_VAR, SETS, list_files
from .verification import verify


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nbhelpers.weights list|download|verify [--dir D] [--sets ...] [--files ...] [--deep]`` with ``argv``
    (None: ``sys.argv[1:]``); returns the exit code: 0, 1 when ``verify`` finds a problem, 2 on an error.

    Source: ``download_weights.sh`` (the official equivalent)."""
    parser = argparse.ArgumentParser(prog="python -m nbhelpers.weights", description="MuseTalk weight files")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("list", "download", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=None, help=f"weights dir (default: ${ENV_VAR} or the cache folder)")
        p.add_argument("--sets", nargs="*", default=None, help=f"sets: {', '.join(SETS)}, default, all")
        p.add_argument("--files", nargs="*", default=None, help="file names or layout paths")
        if name == "verify":
            p.add_argument("--deep", action="store_true", help="also compute sha256 where a value is known")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print(list_files(args.sets or "all"))
            return 0
        if args.command == "download":
            print(download(args.dir, sets=args.sets or None, files=args.files or None))
            return 0
        report = verify(args.dir, sets=args.sets or None, files=args.files or None, deep=args.deep)
        print(report)
        return 0 if report.ok else 1
    except NbHelpersError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
