"""Every checkpoint goes through one loading policy, ``nbhelpers.models.load_checkpoint`` (issue 14, item 9).

A checkpoint that holds Python objects besides tensors can run code when unpickled. The mmpose backend used to
fall back to ``torch.load(weights_only=False)`` with only a warning; now it is unpickled only when its sha256 or
size matches a verified value (given, or recorded for the weights dir when ``weights.download`` fetched it).
These tests need torch only (not mmpose): they call the backend's checkpoint reader directly.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from nbhelpers.errors import WeightsError  # noqa: E402
from nbhelpers.hashing import sha256_file  # noqa: E402
from nbhelpers.weights import verification  # noqa: E402


class Payload:
    """Unpickling this object creates a folder: proof that code in the file ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _write(root: Path, marker: Path) -> Path:
    path = root / "dwpose" / "dw-ll_ucoco_384.pth"
    path.parent.mkdir(parents=True)
    state = {"module.backbone.stem.0.conv.weight": torch.ones(2, 3, 1, 1)}
    torch.save({"meta": {"hook": Payload(marker), "epoch": 270}, "state_dict": state}, path)
    return path


@pytest.fixture()
def mb():
    from nbhelpers.faces import mmpose_backend  # imports no mmpose at module level

    return mmpose_backend


def test_an_unverified_pickle_is_refused_and_nothing_in_it_runs(mb, tmp_path, recwarn):
    marker = tmp_path / "code-ran"
    path = _write(tmp_path / "models", marker)
    with pytest.raises(WeightsError, match="holds Python objects besides tensors"):
        mb.load_checkpoint_state(path)
    assert not marker.exists(), "the checkpoint was unpickled in full"
    with pytest.raises(WeightsError, match=re.escape("is not the expected")):
        mb.load_checkpoint_state(path, trusted_sha256="0" * 64)
    assert not marker.exists()


def test_a_verified_pickle_loads(mb, tmp_path):
    marker = tmp_path / "code-ran"
    path = _write(tmp_path / "models", marker)
    state, meta = mb.load_checkpoint_state(path, trusted_sha256=sha256_file(path))
    assert marker.exists() and meta["epoch"] == 270  # the trusted file was unpickled in full
    assert list(state) == ["backbone.stem.0.conv.weight"]  # "module." prefix removed
    assert torch.equal(state["backbone.stem.0.conv.weight"], torch.ones(2, 3, 1, 1))


def test_the_sha256_recorded_at_download_is_used_for_the_official_layout(mb, tmp_path):
    marker = tmp_path / "code-ran"
    root = tmp_path / "models"
    path = _write(root, marker)
    state_file = verification._State(root)  # what weights.download records from the hub's metadata
    state_file.record_facts(mb.CHECKPOINT_FILE, path.stat().st_size, sha256_file(path), "hub (test)")
    state_file.save()
    state, meta = mb.load_checkpoint_state(path)
    assert marker.exists() and meta["epoch"] == 270 and "backbone.stem.0.conv.weight" in state


def test_a_plain_state_dict_needs_no_facts_and_a_web_page_is_named(mb, tmp_path):
    path = tmp_path / "models" / "dwpose" / "dw-ll_ucoco_384.pth"
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": {"head.w": torch.zeros(3)}, "meta": {"epoch": 1}}, path)
    state, meta = mb.load_checkpoint_state(path)
    assert list(state) == ["head.w"] and meta == {"epoch": 1}
    path.write_text("<!doctype html><html><title>Quota exceeded</title></html>")
    with pytest.raises(WeightsError, match="HTML page"):
        mb.load_checkpoint_state(path)
