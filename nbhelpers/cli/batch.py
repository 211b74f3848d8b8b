"""``batch JOBS``: many clips on Ray (:func:`nbhelpers.batch.run`)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from .. import batch as batches
from ..config import BatchConfig
from .flags import box_flag, config_from, inference_config
from .lipsync import tiny_note

__all__ = ["batch"]


def batch(args: argparse.Namespace) -> int:
    """``batch JOBS``: exit status 0 when every job is done or skipped, 1 when one failed."""
    config, inference = config_from(args, BatchConfig), inference_config(args)  # the flags first, before the file
    jobs = batches.read_jobs(args.jobs)
    if args.box:  # --box gives the jobs that set no box of their own one crop box
        box = box_flag(args.box)
        jobs = [j if "box" in j.settings else replace(j, settings={**j.settings, "box": box}) for j in jobs]
    result = batches.run(jobs, config, inference=inference, weights_dir=args.weights)
    print(result)
    if result.count("done") and (note := tiny_note(args.weights)):
        print(note)
    return 0 if result.ok else 1
