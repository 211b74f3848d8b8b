"""The weight files: a manifest, a cache folder, downloads that survive real networks, and verification.

The layout is the official ``models/`` folder (reference §1.1), relative to one *weights dir*::

    musetalkV15/unet.pth  musetalkV15/musetalk.json        (core, v1.5 UNet, about 3.4 GB)
    sd-vae/config.json    sd-vae/diffusion_pytorch_model.safetensors   (or the official .bin)
    whisper/config.json   whisper/model.safetensors (or pytorch_model.bin)   whisper/preprocessor_config.json
    dwpose/dw-ll_ucoco_384.pth                           (faces: DWPose for the default dwpose backend and mmpose)
    dwpose/dw-ll_ucoco_384.onnx                          (faces-onnx: only for the optional dwpose-onnx backend)
    face-parse-bisent/79999_iter.pth                     (parsing)
    s3fd/s3fd-619a316812.pth                             (s3fd: the face box detector)
    musetalk/pytorch_model.bin  musetalk/musetalk.json   (v1: MuseTalk 1.0, only when asked)
    syncnet/latentsync_syncnet.pt                        (syncnet: training only, only when asked)
    syncnet/syncnet_v2.model                             (quality: the LSE-D / LSE-C score, only when asked)
    restore/GFPGANv1.4.pth  restore/RestoreFormer.pth  restore/codeformer.pth   (restore-*: face restoration)

>>> from nbhelpers import weights
>>> weights.list_files()                 # doctest: +SKIP  (the manifest as a table)
>>> weights.download()                   # doctest: +SKIP  (the v1.5 inference set, about 4.2 GB)
>>> weights.verify(weights.default_dir())  # doctest: +SKIP  (a table: ok / missing / truncated / ...)

Where the files go (:func:`default_dir`), in this order:

1. ``$NBHELPERS_WEIGHTS`` when set: any folder, for example a Google Drive folder shared with a whole workshop
   class, so that every session finds the files, verifies them and downloads nothing.
2. On Colab with Google Drive mounted: ``/content/drive/MyDrive/musetalk-workbook/models`` *if it already holds
   weight files* (a folder that an earlier session filled on purpose). Nothing is written to Drive unless you
   choose it (set the variable, or pass ``directory=``), because 4.2 GB is a third of a free Drive.
3. ``$XDG_CACHE_HOME/musetalk-workbook/models``, i.e. ``~/.cache/musetalk-workbook/models``.

How downloads work: each file has sources in order of preference (the Hugging Face hub through the installed
``huggingface_hub`` client, a Google Drive id through ``gdown``, plain HTTP mirrors). A source is tried up to
three times (the hub client resumes a cut transfer with a Range request; our HTTP mirror client resumes its
``.part`` file), the result is checked (size and sha256 from the hub's own metadata when it gives them, and a
look inside the file: HTML pages, git-lfs pointers and cut-off files are refused), and only then renamed into
place with ``os.replace``. A file that fails moves on to the next source. No package is ever installed or
upgraded. ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are honoured (the token is never sent to a
mirror); partial downloads live in ``<weights dir>/.nbhelpers-downloads/``.

Facts about files (sizes, sha256) are marked *verified* or *unverified*. An unverified value is shown but never
turns into a "mismatch": :func:`verify` reports what it can prove, and says "unverifiable" otherwise. Facts the
hub reports at download time are recorded in ``<weights dir>/.nbhelpers-weights.json`` together with cached
sha256 results (keyed by size and modification time, so a second ``verify(deep=True)`` is instant).

Nothing here imports torch; importing this module is cheap and touches no network.

Layout (made by ``tools/split_modules.py`` from the former ``nbhelpers/weights.py``; each submodule's docstring says
what it owns):

- :mod:`nbhelpers.weights.manifest`: the manifest of the weight files: what a job needs, where each file comes from,
  and the folders.
- :mod:`nbhelpers.weights.inspect`: file inspection: what a file on disk really is, read without trusting or
  unpickling it.
- :mod:`nbhelpers.weights.verification`: verification: the weights folder checked against the manifest, with a fix
  for every bad file.
- :mod:`nbhelpers.weights.downloads`: downloads that survive real networks: three transports, retries, staging and
  acceptance.
- :mod:`nbhelpers.weights.cli`: the command line of the weights: ``python -m nbhelpers.weights
  list|download|verify``.

Every name of the former module is importable from here, private ones included. The package is one namespace with
its submodules: setting a name on it (``monkeypatch.setattr(weights, name, value)``) sets it in every submodule that
holds it, so code that looks the name up at call time sees the new value.
"""

# ruff: noqa: F401 (re-exports)  Made by tools/split_modules.py; edit the submodules, not this list.
from __future__ import annotations

import dataclasses
import hashlib
import html
import importlib.resources
import json
import os
import pickle
import re
import shutil
import struct
import sys
import time
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .. import _namespace
from ..errors import InputError, NbHelpersWarning, WeightsError
from .cli import main
from .downloads import (
    _HOSTS,
    DownloadReport,
    DownloadRow,
    _accept,
    _check_host,
    _default_endpoint,
    _discard_staged,
    _download_one,
    _failure_message,
    _fetch,
    _fetch_bundled,
    _fetch_gdrive,
    _fetch_hub,
    _fetch_plain,
    _fetch_url,
    _offline,
    _permanent,
    _Rejected,
    _short,
    _Skipped,
    _staging,
    _Unreachable,
    download,
)
from .inspect import (
    _ELEMENT_BYTES,
    _FORMAT_BY_SUFFIX,
    _LFS_PREFIX,
    BAD_STATES,
    CORRUPT,
    HASH_MISMATCH,
    HTML_PAGE,
    LFS_POINTER,
    MISSING,
    OK,
    TRUNCATED,
    UNVERIFIABLE,
    WRONG_SIZE,
    Inspection,
    _inspect_json,
    _inspect_legacy_torch,
    _inspect_onnx,
    _inspect_safetensors,
    _inspect_torch,
    _looks_html,
    _SkimUnpickler,
    _Stub,
    _varint,
    inspect_file,
)
from .manifest import (
    _ALIASES,
    _CHUNK,
    _DWPOSE,
    _ENTRIES,
    _GB,
    _MUSETALK,
    _VAE,
    _WHISPER,
    ATTEMPTS_PER_SOURCE,
    DEFAULT_SETS,
    DOWNLOAD_COMMAND,
    DRIVE_DIR,
    ENV_VAR,
    HF_MIRROR,
    HTTP_TIMEOUT_S,
    MANIFEST,
    NOTEBOOK,
    RETRY_DELAY_S,
    SETS,
    STAGING_DIR,
    STATE_FILE,
    TINY_MARKER,
    TRY_TINY,
    Fact,
    FileTable,
    Manifest,
    Source,
    WeightFile,
    _holds_weights,
    _html_table,
    _hub,
    _human,
    _on_colab,
    _text_table,
    default_dir,
    drive_dir,
    is_tiny,
    list_files,
    missing_files,
    required_files,
)
from .verification import (
    _AUTO_ORDER,
    _LANDMARK_SETS,
    _STATE_COLOURS,
    Expected,
    FileCheck,
    VerifyReport,
    _auto_landmark_sets,
    _check,
    _expected,
    _fix,
    _same_dir,
    _set_arg,
    _State,
    check_job_files,
    expected_facts,
    job_files,
    sha256_file,
    verify,
)

__all__ = [
    "ENV_VAR", "DEFAULT_SETS", "SETS", "MANIFEST", "Fact", "Source", "WeightFile", "Manifest", "FileTable",
    "Inspection", "FileCheck", "VerifyReport", "DownloadRow", "DownloadReport", "default_dir", "drive_dir",
    "list_files", "download", "verify", "check_job_files", "job_files", "inspect_file", "required_files", "missing_files", "expected_facts",
    "sha256_file", "is_tiny", "main",
]

_SUBMODULES = ("manifest", "inspect", "verification", "downloads", "cli")

_namespace.share(__name__, _SUBMODULES)
