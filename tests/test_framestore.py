"""The frame store's leftovers: a process that dies without closing its store leaves a folder that the next store
removes, while the folders of living stores stay (nbhelpers.framestore's owner locks)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from nbhelpers import framestore
from nbhelpers.framestore import FrameStore, remove_stale_frames

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="flock is POSIX")

# A child process that stores one frame and then waits, as a batch worker holding an avatar's frames does.
_CHILD = """
import sys, time
import numpy as np
from nbhelpers.framestore import FrameStore
store = FrameStore(4, 6)
store.append(np.zeros((4, 6, 3), np.uint8))
store.finish()
print(store.directory, flush=True)
time.sleep(600)
"""


def _child_store(tmp: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=tmp))
    line = proc.stdout.readline().strip()
    assert line, f"the child made no store (exit {proc.poll()})"
    return proc, line


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """A temporary folder of the test's own, as the one stores use (TMPDIR for children, tempfile's here)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_killed_processs_frames_are_removed_by_the_next_store_and_a_living_ones_stay(own_tmp):
    killed, killed_dir = _child_store(str(own_tmp))
    living, living_dir = _child_store(str(own_tmp))
    try:
        assert os.path.isfile(os.path.join(killed_dir, "frames.u8"))
        os.kill(killed.pid, signal.SIGKILL)  # no finalizer, no atexit: the folder stays
        killed.wait(10)
        assert os.path.isfile(os.path.join(killed_dir, "frames.u8"))
        with FrameStore(2, 2) as store:
            assert store.directory.parent == own_tmp
            assert not os.path.exists(killed_dir), "the dead process's frames are still there"
            assert os.path.isfile(os.path.join(living_dir, "frames.u8")), "a living store's frames were removed"
            assert remove_stale_frames() == []  # this store's own folder is held too
            assert store.path.exists()
        assert not store.directory.exists()  # close() removes its own folder
    finally:
        living.kill()
        living.wait(10)
    assert [str(p) for p in remove_stale_frames()] == [living_dir]  # its lock went with its process


def test_folders_without_a_lock_go_only_when_old_and_other_folders_are_never_touched(own_tmp):
    old, young, marked = (own_tmp / f"{framestore.PREFIX}{n}" for n in ("old", "young", "marked"))
    for folder in (old, young, marked):
        folder.mkdir()
        (folder / "frames.u8").write_bytes(b"\0" * 12)
    (marked / framestore.NO_LOCK_NAME).touch()
    other = own_tmp / "someone-elses-frames"
    other.mkdir()
    stale = time.time() - framestore.UNLOCKED_AGE_S - 60
    for folder in (old, marked, other):
        os.utime(folder, (stale, stale))
    assert remove_stale_frames() == [old]
    assert young.is_dir() and marked.is_dir() and other.is_dir()


def test_a_store_still_works_where_flock_is_refused(own_tmp, monkeypatch):
    import fcntl

    def refuse(fd, op):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    with FrameStore(2, 3) as store:
        assert (store.directory / framestore.NO_LOCK_NAME).exists()
        store.append(np.full((2, 3, 3), 7, np.uint8))
        store.finish()
        assert int(store[0].sum()) == 7 * 18
    assert not store.directory.exists()
