"""The weight files: a manifest, a cache folder, downloads that survive real networks, and verification.

The layout is the official ``models/`` folder, relative to one *weights dir*::

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

Nothing here imports torch; importing the package is cheap and touches no network. Submodules:
:mod:`.manifest` (the files, sets and folders), :mod:`.inspect` (what a file on disk really is),
:mod:`.verification` (the folder checked against the manifest), :mod:`.downloads` (downloads that survive real
networks), :mod:`.cli` (``python -m nbhelpers.weights list|download|verify``).
"""

from __future__ import annotations

from .cli import main
from .downloads import DownloadReport, DownloadRow, download
from .inspect import (
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
    inspect_file,
)
from .manifest import (
    DEFAULT_SETS,
    DOWNLOAD_COMMAND,
    DRIVE_DIR,
    ENV_VAR,
    MANIFEST,
    NOTEBOOK,
    SETS,
    STAGING_DIR,
    STATE_FILE,
    TINY_MARKER,
    Fact,
    FileTable,
    Manifest,
    Source,
    WeightFile,
    default_dir,
    drive_dir,
    is_tiny,
    list_files,
    missing_files,
    required_files,
)
from .verification import (
    Expected,
    FileCheck,
    VerifyReport,
    check_job_files,
    expected_facts,
    job_files,
    verify,
)

__all__ = [
    "BAD_STATES", "CORRUPT", "DEFAULT_SETS", "DOWNLOAD_COMMAND", "DRIVE_DIR", "ENV_VAR", "HASH_MISMATCH",
    "HTML_PAGE", "LFS_POINTER", "MANIFEST", "MISSING", "NOTEBOOK", "OK", "SETS", "STAGING_DIR", "STATE_FILE",
    "TINY_MARKER", "TRUNCATED", "UNVERIFIABLE", "WRONG_SIZE", "DownloadReport", "DownloadRow", "Expected", "Fact",
    "FileCheck", "FileTable", "Inspection", "Manifest", "Source", "VerifyReport", "WeightFile", "check_job_files",
    "default_dir", "download", "drive_dir", "expected_facts", "inspect_file", "is_tiny", "job_files", "list_files",
    "main", "missing_files", "required_files", "verify",
]
