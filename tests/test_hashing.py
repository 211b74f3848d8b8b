"""nbhelpers.hashing: the one SHA-256 helper, checked against hashlib on both of its read paths."""

from __future__ import annotations

import hashlib

import pytest
from helpers import BarRecorder

from nbhelpers import hashing, progress

pytestmark = pytest.mark.notorch


def test_sha256_file_matches_hashlib_small_and_large(tmp_path, monkeypatch):
    data = bytes(range(256)) * 40_000  # 10 MB, several chunks, not a multiple of the chunk size
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert hashing.sha256_file(path) == hashlib.sha256(data).hexdigest()
    recorder = BarRecorder()
    monkeypatch.setattr(hashing, "BAR_FROM_BYTES", 1 << 20)  # the large-file path: 8 MiB reads and a bar
    monkeypatch.setattr(progress, "bar", recorder)
    assert hashing.sha256_file(path, desc="blob") == hashlib.sha256(data).hexdigest()
    assert [(b.args, b.options, b.n) for b in recorder.bars] == [
        ((), dict(total=len(data), desc="sha256 blob", unit="B", unit_scale=True, unit_divisor=1024), len(data))]
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert hashing.sha256_file(empty) == hashlib.sha256(b"").hexdigest()
