"""The weight files: a manifest, a cache folder (:func:`default_dir`), downloads with retries, and verification.

The layout is the official ``models/`` folder of one weights dir; importing it loads no torch and uses no network.
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
    is_tiny,
    list_files,
    missing_files,
    required_files,
    resolve_dir,
)
from .verification import (
    Expected,
    FileCheck,
    VerifyReport,
    check_folder,
    check_job_files,
    expected_facts,
    job_files,
    verify,
)

__all__ = ["BAD_STATES", "CORRUPT", "DEFAULT_SETS", "DOWNLOAD_COMMAND", "DRIVE_DIR", "ENV_VAR", "HASH_MISMATCH",
           "HTML_PAGE", "LFS_POINTER", "MANIFEST", "MISSING", "NOTEBOOK", "OK", "SETS", "STAGING_DIR", "STATE_FILE",
           "TINY_MARKER", "TRUNCATED", "UNVERIFIABLE", "WRONG_SIZE", "DownloadReport", "DownloadRow", "Expected",
           "Fact", "FileCheck", "FileTable", "Inspection", "Manifest", "Source", "VerifyReport", "WeightFile",
           "check_folder", "check_job_files", "default_dir", "download", "expected_facts", "inspect_file", "is_tiny",
           "job_files", "list_files", "main", "missing_files", "required_files", "resolve_dir", "verify"]
