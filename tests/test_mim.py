"""The mim install path: the mmcv wheel check against a local fake find-links index, and the install commands.

Nothing here reaches OpenMMLab or installs anything: the index is a temporary folder served by ``http.server`` on
127.0.0.1 (and read through ``file://``), the install is checked as a dry run and, for the running of steps, with a
fake interpreter script that records its arguments.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import sys
import tempfile
import threading
from importlib.metadata import version
from pathlib import Path

import pytest
from helpers import fake_program

from nbhelpers.errors import InputError
from nbhelpers.faces import mim

PAGE = """<html><body>
<a href="mmcv-2.1.0-cp38-cp38-manylinux1_x86_64.whl">mmcv-2.1.0-cp38-cp38-manylinux1_x86_64.whl</a><br>
<a href="mmcv-2.1.0-cp310-cp310-manylinux1_x86_64.whl#sha256=00ab">mmcv-2.1.0-cp310-cp310-manylinux1_x86_64.whl</a><br>
<a href="https://example.invalid/x/mmcv-2.1.0-cp311-cp311-manylinux1_x86_64.whl">cp311</a><br>
<a href="mmcv-2.1.0-cp310-cp310-win_amd64.whl">win</a><br>
<a href="mmcv-2.0.1-cp312-cp312-manylinux1_x86_64.whl">older</a><br>
<a href="mmcv_full-1.7.2-cp312-cp312-manylinux1_x86_64.whl">mmcv-full</a><br>
<a href="index.html">not a wheel</a>
</body></html>
"""


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("openmmlab") / "mmcv" / "dist"
    for cuda, torch_dir in (("cu118", "torch2.1"), ("cpu", "torch2.1"), ("cu117", "torch2.0.0")):
        page = root / cuda / torch_dir / "index.html"
        page.parent.mkdir(parents=True)
        page.write_text(PAGE.replace("2.1.0", "2.0.1") if torch_dir == "torch2.0.0" else PAGE)
    return root


@pytest.fixture(scope="module")
def index_url(index_dir):
    """The fake index over HTTP on 127.0.0.1 (a thread; shut down after the module's tests)."""
    handler = functools.partial(_QuietHandler, directory=str(index_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


def test_matching_wheel_is_found_over_http(index_url):
    check = mim.check_mmcv_wheels(index_url, python="3.10", torch="2.1.2+cu118", platform="linux-x86_64")
    assert check.ok and check.recommended_backend == "mmpose"
    assert check.matching == ("mmcv-2.1.0-cp310-cp310-manylinux1_x86_64.whl",)
    assert check.page_url == f"{index_url}/cu118/torch2.1/index.html"
    assert (check.python_tag, check.torch_series, check.cuda_tag, check.mmcv_version) == ("cp310", "2.1", "cu118",
                                                                                         "2.1.0")
    assert len(check.listed) == 5  # mmcv_full is another project; index.html is no wheel
    check = mim.check_mmcv_wheels(index_url, python="cp311", torch="2.1+cu118", platform="linux-x86_64")
    assert check.ok and check.matching == ("mmcv-2.1.0-cp311-cp311-manylinux1_x86_64.whl",)


def test_no_wheel_for_this_python_says_so_with_build_time(index_url):
    check = mim.check_mmcv_wheels(index_url, python="3.13", torch="2.1.0+cu118", platform="linux-x86_64")
    assert not check.ok and check.page_found and check.reachable and check.matching == ()
    assert check.recommended_backend == "dwpose"
    text = check.message
    assert "No prebuilt mmcv 2.1.0 wheel for Python 3.13" in text
    assert "15-30 minutes on Colab" in text and "45-60 minutes on a 2-core machine" in text
    assert "'dwpose'" in text
    assert "cp310" in text and "cp38" in text  # which Pythons the page does serve


def test_other_platform_or_version_does_not_match(index_url):
    assert not mim.check_mmcv_wheels(index_url, python="3.12", torch="2.1+cu118",
                                     platform="linux-x86_64").ok  # only mmcv 2.0.1 for cp312
    assert mim.check_mmcv_wheels(index_url, python="3.10", torch="2.1+cu118", platform="win-amd64").ok
    assert not mim.check_mmcv_wheels(index_url, python="3.11", torch="2.1+cu118", platform="win-amd64").ok
    assert not mim.check_mmcv_wheels(index_url, python="3.10", torch="2.1+cu118",
                                     platform="macosx-11.0-arm64").ok


def test_missing_page_means_no_wheels_for_that_torch(index_url):
    check = mim.check_mmcv_wheels(index_url, python="3.10", torch="2.4.1+cu121", platform="linux-x86_64")
    assert not check.ok and not check.page_found and check.reachable
    assert check.page_url.endswith("/cu121/torch2.4/index.html")
    assert "has no mmcv wheels for torch 2.4 with cu121" in check.message and "'dwpose'" in check.message


def test_page_named_the_way_mim_asks_is_found_too(index_url):
    """mim 0.3.9 asks for torch2.0.0/index.html (major.minor.0); OpenMMLab's docs say torch2.0/: both are tried."""
    check = mim.check_mmcv_wheels(index_url, python="3.10", torch="2.0.1+cu117", platform="linux-x86_64")
    assert check.ok and check.mmcv_version == "2.0.1" and check.page_url.endswith("/cu117/torch2.0.0/index.html")


def test_file_url_and_cpu_pages(index_dir):
    url = index_dir.as_uri()
    check = mim.check_mmcv_wheels(url, python="3.10", torch="2.1.0+cpu", platform="linux-x86_64")
    assert check.ok and check.cuda_tag == "cpu" and check.page_url.startswith("file://")
    page = (index_dir / "cu118" / "torch2.1" / "index.html").as_uri()
    assert mim.check_mmcv_wheels(page, python="3.10", torch="2.1+cu118", platform="linux-x86_64").ok
    gone = mim.check_mmcv_wheels(url, python="3.10", torch="2.3+cu118", platform="linux-x86_64")
    assert not gone.ok and not gone.page_found


def test_unreachable_server_is_reported_not_raised():
    import socket

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    check = mim.check_mmcv_wheels(f"http://127.0.0.1:{port}", python="3.10", torch="2.1+cu118",
                                  platform="linux-x86_64", timeout=5)
    assert not check.ok and not check.reachable
    assert "Could not reach" in check.message and "'dwpose'" in check.message


def test_bad_arguments_raise_input_error(index_url):
    with pytest.raises(InputError, match="python="):
        mim.check_mmcv_wheels(index_url, python="three", torch="2.1+cpu")
    with pytest.raises(InputError, match="torch="):
        mim.check_mmcv_wheels(index_url, python="3.10", torch="eleven")
    with pytest.raises(InputError, match="torch="):
        mim.pins_for("latest")


def test_build_time_wording(monkeypatch):
    monkeypatch.setattr(mim.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(mim, "in_colab", lambda: True)
    assert mim.expected_build_time() == "about 15-30 minutes on Colab"
    monkeypatch.setattr(mim, "in_colab", lambda: False)
    assert mim.expected_build_time() == "about 45-60 minutes on a 2-core machine"
    monkeypatch.setattr(mim.os, "cpu_count", lambda: 8)
    assert "8 cores" in mim.expected_build_time()


def test_pins_per_torch_version():
    official = mim.pins_for("2.0.1+cu118")
    assert (official.mmcv, official.mmdet, official.mmpose) == ("2.0.1", "3.1.0", "1.1.0")  # README (Q29)
    t21 = mim.pins_for("2.1.2")
    assert (t21.mmcv, t21.mmdet, t21.mmpose) == ("2.1.0", "3.3.0", "1.3.2")
    new = mim.pins_for("2.11.0+cu128")
    assert new.mmcv == "2.1.0" and "from source" in new.note and new.torch_series == "2.11"


def test_wheel_name_parsing():
    info = mim.parse_wheel_name("mmcv-2.1.0-cp310-cp310-manylinux1_x86_64.whl")
    assert (info["name"], info["version"], info["py"], info["abi"], info["plat"]) == (
        "mmcv", "2.1.0", "cp310", "cp310", "manylinux1_x86_64")
    assert mim.parse_wheel_name("mmcv_full-1.7.2-cp38-cp38-win_amd64.whl")["name"] == "mmcv-full"
    assert mim.parse_wheel_name("README.txt") is None


# ------------------------------------------------------------------------------------------ install commands

@pytest.fixture()
def temp_dir(tmp_path, monkeypatch):
    """The temporary folder, where install_mmpose writes its constraints file, made ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_dry_run_pins_torch_and_numpy_to_installed_versions(temp_dir):
    torch_v = version("torch")
    numpy_v = version("numpy")
    result = mim.install_mmpose(dry_run=True)
    assert result.dry_run and not result.ok and result.steps == [] and result.wheel_check is None
    cons = result.constraints_path.read_text().splitlines()
    assert f"torch=={torch_v}" in cons and f"numpy=={numpy_v}" in cons
    assert result.constraints_path.parent == temp_dir / "nbhelpers-mim"
    pins = mim.pins_for(torch_v)
    for cmd in result.commands:
        assert cmd[:2] == [sys.executable, "-m"] and cmd[2] in ("pip", "mim") and cmd[3] == "install"
        assert cmd[4:6] == ["-c", str(result.constraints_path)]  # every step is held by the constraints
        assert not {"-U", "--upgrade", "--force-reinstall", "--ignore-installed"} & set(cmd)
        assert not any(a.split("=")[0].split("<")[0].split(">")[0] in ("torch", "numpy", "torchvision")
                       for a in cmd[6:]), cmd  # never asks for torch/numpy themselves
    flat = [" ".join(c[2:]) for c in result.commands]
    assert flat[0].startswith("pip install") and "openmim>=0.3.9" in flat[0] and "setuptools<81" in flat[0]
    assert flat[1].startswith("mim install") and "mmengine>=0.7.1,<1.0.0" in flat[1]
    assert flat[2].startswith("mim install") and f"mmcv=={pins.mmcv}" in flat[2]
    assert flat[3].startswith("mim install") and f"mmdet=={pins.mmdet}" in flat[3]
    assert flat[4].startswith("pip install") and f"--no-deps mmpose=={pins.mmpose}" in flat[4]
    if int(numpy_v.split(".")[0]) >= 2:
        assert "--no-binary xtcocotools --no-build-isolation" in flat[6]
    assert "Dry run" in result.message and torch_v in result.message


def test_dry_run_for_the_local_conda_setup(temp_dir, monkeypatch):
    """torch 2.1 + numpy 1.26 (environment.yml): the mmcv 2.1.0 set, xtcocotools from its wheel."""
    monkeypatch.setattr(mim, "_versions_of", lambda python: {"torch": "2.1.2", "numpy": "1.26.4", "torchvision": None})
    result = mim.install_mmpose(dry_run=True, only_binary=True)
    assert result.constraints.splitlines()[:2] == ["torch==2.1.2", "numpy==1.26.4"]
    assert result.commands[2][-3:] == ["mmcv==2.1.0", "--only-binary", "mmcv"]
    assert result.commands[6][-1] == "xtcocotools>=1.12" and "--no-binary" not in result.commands[6]
    assert "cython" not in result.commands[0]


FAKE_PYTHON = r"""#!/bin/sh
# A stand-in interpreter: records each call, answers the version query and the self-check, fails on demand.
echo "$*" >> "{log}"
echo "MMCV_BASE_URL=$MMCV_BASE_URL" >> "{log}.env"
case "$*" in
  "-c "*) printf '%s%s\n' '{{"torch": "2.1.2", "numpy": "1.26.4", "torchvision": "0.16.2", ' \
                          '"python": "3.13", "platform": "linux-aarch64"}}' ;;
  *"--self-check"*) echo '{{"ok": true, "build_seconds": 0.9, "pass_seconds": 0.6, "weights": "random"}}' ;;
  *"{fail}"*) echo "ERROR: could not build wheels for mmcv" >&2; exit 1 ;;
esac
exit 0
"""


def _fake_python(tmp_path, fail="NEVER"):
    log = tmp_path / "calls.log"
    return fake_program(tmp_path / "python", FAKE_PYTHON.format(log=log, fail=fail)), log


@pytest.mark.skipif(os.name != "posix", reason="the fake interpreter is a shell script")
def test_install_runs_the_commands_in_order_then_verifies(temp_dir, tmp_path):
    exe, log = _fake_python(tmp_path)
    check = mim.WheelCheck(True, "file:///x", "cp310", "2.1", "cu118", "linux-x86_64", "2.1.0")
    result = mim.install_mmpose(python=exe, wheel_check=check, mmcv_base_url="http://127.0.0.1:9/mirror/")
    calls = log.read_text().splitlines()
    env_lines = Path(f"{log}.env").read_text().splitlines()  # version queries before and after: no mirror needed
    assert env_lines.count("MMCV_BASE_URL=http://127.0.0.1:9/mirror") == 8  # the 7 installs and the self-check
    assert calls[0].startswith("-c ")  # the version query of the target interpreter
    assert calls[1:8] == [" ".join(c[1:]) for c in result.commands]
    assert "-m nbhelpers.faces.mmpose_backend --self-check --device cpu" in calls[-1]
    assert result.ok and len(result.steps) == 7 and all(s.returncode == 0 for s in result.steps)
    assert "torchvision==0.16.2" in result.constraints and result.verify["ok"] is True
    assert "unchanged" in result.message and "one landmark pass 0.6 s" in result.message
    summary = result._repr_markdown_()
    assert "mmpose install: ok" in summary and f"({result.seconds:.0f} s)" in summary  # it says how long it took


@pytest.mark.skipif(os.name != "posix", reason="the fake interpreter is a shell script")
def test_a_failed_step_stops_the_install_and_says_which(temp_dir, tmp_path):
    exe, log = _fake_python(tmp_path, fail="mmcv==2.1.0")
    check = mim.WheelCheck(False, "file:///x", "cp313", "2.1", "cu118", "linux-x86_64", "2.1.0",
                           message="No prebuilt mmcv 2.1.0 wheel ...")
    result = mim.install_mmpose(python=exe, wheel_check=check)
    assert not result.ok and len(result.steps) == 3 and result.steps[-1].returncode == 1
    assert "mmcv==2.1.0" in result.message and "could not build wheels" in result.message
    assert "No prebuilt mmcv" in result.message
    assert not any("self-check" in line for line in log.read_text().splitlines())


@pytest.mark.skipif(os.name != "posix", reason="the fake interpreter is a shell script")
def test_the_wheel_check_asks_for_the_tags_of_the_interpreter_installed_into(temp_dir, tmp_path, monkeypatch):
    exe, _ = _fake_python(tmp_path)  # Python 3.13 on linux-aarch64 with torch 2.1.2, whatever runs the tests
    asked = {}

    def check(index, **kwargs):
        asked.update(kwargs, index=index)
        return mim.WheelCheck(True, "file:///x", "cp313", "2.1", "cpu", "linux-aarch64", "2.1.0")

    monkeypatch.setattr(mim, "check_mmcv_wheels", check)
    assert mim.install_mmpose(python=exe, mmcv_base_url="http://127.0.0.1:9/mirror/").ok
    assert asked == {"index": "http://127.0.0.1:9/mirror/mmcv/dist", "python": "3.13", "torch": "2.1.2",
                     "mmcv": mim.pins_for("2.1.2").mmcv, "platform": "linux-aarch64"}


def test_wheel_check_renders_in_a_notebook(index_url):
    check = mim.check_mmcv_wheels(index_url, python="3.13", torch="2.1+cu118", platform="linux-x86_64")
    assert check._repr_markdown_().startswith("**mmcv wheel: none**")
    assert str(check) == check.message
    json.dumps(check.listed)  # plain data
    assert Path(mim.__file__).name == "mim.py"


def test_repeated_dry_runs_share_one_constraints_file(temp_dir, monkeypatch):
    # The constraints go to one folder in the temp dir, named by content: the setup notebook can be run many times
    # without leaving a new folder each time.
    first = mim.install_mmpose(dry_run=True)
    second = mim.install_mmpose(dry_run=True)
    assert first.constraints_path == second.constraints_path
    assert first.constraints_path.parent == temp_dir / "nbhelpers-mim"
    assert [p.name for p in temp_dir.iterdir()] == ["nbhelpers-mim"]
    assert list((temp_dir / "nbhelpers-mim").iterdir()) == [first.constraints_path]
    assert f"torch=={version('torch')}" in first.constraints_path.read_text()
    monkeypatch.setattr(mim, "_versions_of", lambda python: {"torch": version("torch"), "numpy": "1.26.4"})
    other = mim.install_mmpose(dry_run=True)
    assert other.constraints_path != first.constraints_path  # different pins, different file
