"""nbhelpers.env: run mode, setup report, install_missing, CI inputs and weights, result checks."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
import types
import warnings
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

from nbhelpers import env
from nbhelpers.env import drive as env_drive
from nbhelpers.errors import InputError, NbHelpersError


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Each test starts outside Colab with no mode set and its own work folder."""
    monkeypatch.delenv("NBHELPERS_MODE", raising=False)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv("NBHELPERS_WORKDIR", str(tmp_path / "work"))


# ------------------------------------------------------------------------------------------------ run mode


def test_run_mode_sources(monkeypatch):
    assert env.run_mode() == "local"
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert env.run_mode() == "colab"
    monkeypatch.setenv("NBHELPERS_MODE", "CI")
    assert env.run_mode() == "ci"
    assert env.run_mode("local") == "local"  # an explicit mode (papermill parameter) wins


@pytest.mark.parametrize("where", ["argument", "environment"])
def test_unknown_mode_is_an_input_error(monkeypatch, where):
    if where == "environment":
        monkeypatch.setenv("NBHELPERS_MODE", "prod")
    with pytest.raises(InputError, match="NBHELPERS_MODE" if where == "environment" else "mode must be"):
        env.run_mode("prod" if where == "argument" else None)


def test_ci_mode_turns_progress_bars_off(monkeypatch):
    from nbhelpers import progress

    monkeypatch.delenv("NBHELPERS_PROGRESS", raising=False)
    monkeypatch.setitem(progress._settings, "disable", False)
    env.run_mode("ci")
    assert progress._settings["disable"] is True


# ------------------------------------------------------------------------------------------------ setup report


def test_setup_report_lists_versions_without_importing(monkeypatch):
    import importlib.metadata as md

    report = env.setup("local")
    assert report.mode == "local"
    assert report.python == ".".join(map(str, sys.version_info[:3]))
    assert report.versions["numpy"] == md.version("numpy")
    assert set(env.REPORTED) == set(report.versions)
    assert report.drive_mounted is False and not report.restart_needed
    html = report._repr_html_()
    assert "<table>" in html and "run mode" in html and "Restart needed" not in html
    assert str(report).splitlines()[0].split() == ["run", "mode", "local"]


def test_setup_says_when_a_restart_is_needed(monkeypatch):
    fake = types.ModuleType("numpy")
    fake.__version__ = "1.0.0"  # what was imported before an install replaced numpy
    monkeypatch.setitem(sys.modules, "numpy", fake)
    reasons = env.restart_reasons()
    assert reasons == [f"numpy 1.0.0 is imported but {env.package_version('numpy')} is installed"]
    report = env.EnvReport("colab", "3.13.0", "cuda: Tesla T4", 15.0, {}, None, False, tuple(reasons))
    assert report.restart_needed and "Runtime &gt; Restart session" in report._repr_html_()
    assert "15.0" in str(report)


def test_short_module_versions_are_not_a_restart(monkeypatch):
    fake = types.ModuleType("cv2")
    fake.__version__ = "4.12.0"  # cv2 reports 4.12.0 for opencv-python-headless 4.12.0.88
    monkeypatch.setitem(sys.modules, "cv2", fake)
    monkeypatch.setattr("nbhelpers.env.install.package_version",
                        lambda *names: "4.12.0.88" if "opencv-python-headless" in names else None)
    assert env.restart_reasons() == []
    fake.__version__ = "4.11.0"
    assert env.restart_reasons() == ["cv2 4.11.0 is imported but 4.12.0.88 is installed"]


def test_ci_report_names_the_tiny_weights_without_making_them():
    report = env.setup("ci")
    assert report.weights_dir == env.work_dir("ci") / "tiny-weights" / "models"
    assert not report.weights_dir.exists()


def test_package_version():
    import importlib.metadata as md

    assert env.package_version("not-a-package-xyz", "pytest") == md.version("pytest")
    assert env.package_version("not-a-package-xyz") is None


# ------------------------------------------------------------------------------------------------ install_missing


def test_install_missing_plans_only_what_is_needed(tmp_path):
    import numpy

    req = tmp_path / "req.txt"
    req.write_text("# comment\n--index-url https://example.invalid\npytest>=1.0  # satisfied\n"
                   "not-a-package-xyz>=1.0\nnumpy>=999\ntorch>=999\nfoo-bar>=1 ; python_version < '3'\n")
    report = env.install_missing(req, dry_run=True)
    actions = {row.name: row.action for row in report.rows}
    assert actions == {"pytest": "ok", "not-a-package-xyz": "install", "numpy": "refused", "torch": "refused",
                       "foo-bar": "skipped"}
    assert report.missing == ["not-a-package-xyz>=1.0"]
    assert report.dry_run and not report.installed_now
    assert "not-a-package-xyz>=1.0" in report.command
    assert f"numpy {numpy.__version__}" not in str(report)  # the table shows versions in columns
    assert "would install: not-a-package-xyz>=1.0" in str(report)
    assert len(report) == 5 and "<table>" in report._repr_html_()


def test_install_missing_counts_an_alternative_distribution(monkeypatch):
    versions = {"onnxruntime": "1.20.0"}
    monkeypatch.setattr("nbhelpers.env.install.package_version",
                        lambda *names: next((versions[n] for n in names if n in versions), None))
    [row] = env.install_missing(["onnxruntime-gpu>=1.16"], dry_run=True).rows
    assert row.action == "ok" and row.note == "provided by onnxruntime 1.20.0"


def test_install_missing_rejects_bad_lines():
    with pytest.raises(InputError, match="cannot be parsed"):
        env.install_missing(["numpy>>1"], dry_run=True)
    with pytest.raises(InputError, match="does not exist"):
        env.install_missing("/no/such/requirements.txt", dry_run=True)


def test_colab_requirements_are_the_packages_colab_extra_and_nothing_is_read_by_url(tmp_path):
    """00_setup read requirements-colab.txt from GitHub at run time: offline it failed, and the next cell then hit
    a NameError (issue 14). What Colab lacks is now the [colab] extra, read from the checkout or the metadata."""
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["colab"]
    assert env.colab_requirements() == extra and extra and all(">=" in line for line in extra)
    assert env.install_missing(dry_run=True).rows[0].requirement == extra[0]
    for address in ("https://github.com/x/y/raw/v1/requirements-colab.txt", "file:///tmp/r.txt"):
        with pytest.raises(InputError, match="is an address; nothing is fetched at run time"):
            env.read_requirements(address)
    (tmp_path / "r.txt").write_text("# a comment\nsoxr>=0.3  # why\n-c pins.txt\n")
    assert env.read_requirements(tmp_path / "r.txt") == ["soxr>=0.3"]


def test_colab_requirements_from_the_installed_metadata(monkeypatch):
    """Installed from git (no checkout beside the package), the extra comes from the distribution's metadata."""
    monkeypatch.setattr("nbhelpers.env.install._checkout_extra", lambda extra: None)
    monkeypatch.setattr("importlib.metadata.requires", lambda name: [
        "numpy>=1.24", 'onnxruntime-gpu>=1.20; extra == "colab"', 'soxr>=0.3; extra == "colab"',
        'pytest>=7.4; extra == "test"', 'tomli>=1; python_version < "3.0" and extra == "colab"'])
    assert env.colab_requirements() == ["onnxruntime-gpu>=1.20", "soxr>=0.3"]

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr("importlib.metadata.requires", absent)
    with pytest.raises(InputError, match=r'pip install "musetalk-workbook\[colab\] @ git\+'):
        env.colab_requirements()


def test_check_setup_needs_no_earlier_cell(monkeypatch):
    """00_setup's last cell reads the extra and finds the backend itself: it works when every cell before it failed
    (issue 14: `NameError: name 'installs' is not defined`)."""
    pytest.importorskip("torch")
    pytest.importorskip("dlib")
    monkeypatch.setattr("nbhelpers.env.install.colab_requirements", lambda: ["pytest>=1.0", "onnxruntime-gpu>=999"])
    message = env.check_setup(backend="dlib")
    assert message.startswith("OK: 1 requirement satisfied; onnxruntime-gpu>=999 not needed by the dlib backend")
    assert message.endswith("landmarks: dlib")
    with pytest.raises(env.ResultCheckError, match="still missing: onnxruntime-gpu>=999; install it with"):
        env.check_setup()


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel (one module), so that pip can install it from a local folder."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    requires_text = "".join(f"Requires-Dist: {r}\n" for r in requires)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires_text}"
    files = {f"{name.replace('-', '_')}.py": "VALUE = 1\n", f"{dist}.dist-info/METADATA": meta,
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for n, text in {**files, f"{dist}.dist-info/RECORD": record}.items():
            zf.writestr(n, text)
    return path


INSTALL_SCRIPT = """
import sys
from nbhelpers import env
from nbhelpers.env import drive as env_drive
from nbhelpers.env import install
from nbhelpers.errors import NbHelpersError
install.PROTECTED = install.PROTECTED + ("nbh-guarded",)  # stands in for numpy: installed, must not move
report = env.install_missing(["nbh-fresh>=1.0", "nbh-guarded>=1.0"])
print("ACTIONS", sorted((r.name, r.action) for r in report.rows))
print("NOW", list(report.installed_now))
try:
    env.install_missing(["nbh-greedy>=1.0"])  # its dependency wants a newer nbh-guarded
except NbHelpersError as exc:
    print("REFUSED", "without changing a protected package" in str(exc))
"""


def test_install_missing_really_installs_and_never_moves_a_protected_package(tmp_path):
    """A throwaway venv and a local wheel folder (no index): install one package, refuse to upgrade another."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "nbh-fresh", "1.2")
    _wheel(wheels, "nbh-guarded", "1.0")
    _wheel(wheels, "nbh-guarded", "2.0")
    _wheel(wheels, "nbh-greedy", "1.0", requires=("nbh-guarded>=2.0",))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    pip_env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_CONSTRAINT="", PYTHONPATH=str(ROOT))
    packaging_wheel = _packaging_wheel(tmp_path)
    subprocess.run([py, "-m", "pip", "install", "-q", str(packaging_wheel),
                    str(wheels / "nbh_guarded-1.0-py3-none-any.whl")], check=True, env=pip_env)
    done = subprocess.run([py, "-c", INSTALL_SCRIPT], capture_output=True, text=True, env=pip_env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ACTIONS [('nbh-fresh', 'install'), ('nbh-guarded', 'ok')]" in out
    assert "NOW ['nbh-fresh==1.2']" in out
    assert "REFUSED True" in out
    versions = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('nbh-guarded'), "
                               "m.version('nbh-fresh'))"], capture_output=True, text=True, check=True).stdout
    assert versions.split() == ["1.0", "1.2"]


def _packaging_wheel(tmp_path: Path) -> Path:
    """A wheel of the installed `packaging` (install_missing parses requirements with it), built offline."""
    import packaging

    out = tmp_path / "pkgwheel"
    out.mkdir()
    src = Path(packaging.__file__).parent
    version = env.package_version("packaging")
    dist = f"packaging-{version}"
    path = out / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for file in src.rglob("*.py"):
            zf.write(file, f"packaging/{file.relative_to(src).as_posix()}")
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: packaging\nVersion: {version}\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return path


# ------------------------------------------------------------------------------------------------ drive


def test_mount_drive_is_a_no_op_outside_colab(monkeypatch):
    monkeypatch.delenv("NBHELPERS_WEIGHTS", raising=False)
    status = env.mount_drive("/content/drive/MyDrive/weights")
    assert status.mounted is False and "not in Colab" in str(status)
    assert "NBHELPERS_WEIGHTS" not in os.environ


def test_mount_drive_in_colab_sets_the_shared_weights_folder(monkeypatch, tmp_path):
    mounted = []
    drive = types.ModuleType("google.colab.drive")
    drive.mount = lambda mountpoint: (Path(mountpoint, "MyDrive").mkdir(parents=True), mounted.append(mountpoint))
    colab = types.ModuleType("google.colab")
    colab.drive = drive
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.drive", drive)
    monkeypatch.delenv("NBHELPERS_WEIGHTS", raising=False)
    point = tmp_path / "drive"
    monkeypatch.setattr(env_drive, "DRIVE_MOUNTPOINT", str(point))
    assert env.mount_drive(enabled=False).mounted is False and not mounted
    with pytest.raises(InputError, match="Add shortcut"):
        env.mount_drive(str(point / "MyDrive" / "shared-weights"))
    (point / "MyDrive" / "shared-weights").mkdir()
    status = env.mount_drive(str(point / "MyDrive" / "shared-weights"))
    assert status.mounted and mounted == [str(point)]
    assert os.environ["NBHELPERS_WEIGHTS"] == str(point / "MyDrive" / "shared-weights")


# ------------------------------------------------------------------------------------------------ inputs


def test_given_paths_win_and_missing_ones_are_named(tmp_path):
    video, audio = tmp_path / "v.mp4", tmp_path / "a.wav"
    video.write_bytes(b"x")
    audio.write_bytes(b"y")
    assert env.workbook_inputs("local", str(video), audio) == (video, audio)
    with pytest.raises(InputError, match="video '/nope.mp4' does not exist"):
        env.workbook_inputs("local", "/nope.mp4", audio)


def test_uploads_are_sorted_into_video_and_audio(tmp_path):
    files = [tmp_path / n for n in ("speech.m4a", "face.mov")]
    for f in files:
        f.write_bytes(b"x")
    assert env.workbook_inputs("local", uploads=files) == (files[1], files[0])


def test_ci_inputs_are_short_clips_of_the_shared_media(shared_data, monkeypatch):
    from nbhelpers import media

    monkeypatch.setenv("NBHELPERS_SHARED_DATA", str(shared_data))
    video, audio = env.workbook_inputs("ci")
    assert video.parent == audio.parent == env.work_dir("ci") / "clips"
    info = media.probe(video)
    frames = round(env.CI_CLIP_SECONDS * 25)
    assert (info.frame_count, info.fps, info.has_audio) == (frames, 25, False)
    assert media.probe(audio).duration_s == pytest.approx(env.CI_CLIP_SECONDS, abs=0.001)
    mtime = video.stat().st_mtime
    assert env.workbook_inputs("ci")[0].stat().st_mtime == mtime  # cut once, then reused
    clips = env.sample_audios("ci")
    assert len(clips) == 2 and clips[0] == audio and clips[1].name == f"sing-{round(env.CI_CLIP_SECONDS * 1000)}ms.wav"


def test_without_shared_media_ci_uses_the_packaged_demo(monkeypatch, tmp_path):
    pytest.importorskip("skimage")
    from nbhelpers import media

    monkeypatch.setenv("NBHELPERS_SHARED_DATA", str(tmp_path / "nothing-here"))
    video, audio = env.workbook_inputs("ci")
    assert video.name == "astronaut.png"
    assert media.probe(audio).duration_s == pytest.approx(env.CI_CLIP_SECONDS, abs=0.001)


def test_local_mode_picks_up_what_02_media_left(tmp_path):
    folder = env.media_dir("local")
    (folder / env.WORKBOOK_VIDEO).write_bytes(b"v")
    src = tmp_path / "Speech Take 1.MP3"
    src.write_bytes(b"mp3")
    kept = env.keep_audio(src, "local")
    assert kept == folder / "audio.mp3" and kept.read_bytes() == b"mp3"
    assert env.workbook_inputs("local") == (folder / env.WORKBOOK_VIDEO, kept)
    assert env.keep_audio(kept, "local") == kept


def test_shared_data_is_found_walking_up(monkeypatch, tmp_path):
    monkeypatch.delenv("NBHELPERS_SHARED_DATA", raising=False)
    data = tmp_path / "shared" / "data"
    data.mkdir(parents=True)
    (data / env.SHARED_VIDEO).write_bytes(b"x")
    deep = tmp_path / "repo" / "notebooks"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert env.shared_data_dir() == data


def test_ci_weights_are_a_complete_tiny_tree_made_once():
    pytest.importorskip("torch")
    from nbhelpers import weights

    folder = env.weights_dir("ci")
    assert weights.is_tiny(folder)
    assert weights.verify(folder).ok
    marker = folder.parent / ".complete"
    stamp = marker.stat().st_mtime
    assert env.weights_dir("ci") == folder and marker.stat().st_mtime == stamp


def test_default_config_and_plan_in_ci_mode():
    pytest.importorskip("torch")
    config = env.default_config("ci", extra_margin=20)
    assert (config.landmark_backend, config.device, config.extra_margin) == ("dlib", "cpu", 20)
    assert env.default_config("local").landmark_backend == "auto"
    with pytest.warns(Warning):
        plan = env.plan("realtime", "ci")
    assert plan.config.device == "cpu" and plan.config.landmark_backend == "dlib" and plan.weights == "tiny"


def test_plan_in_local_mode_follows_the_weights_folder(monkeypatch, tmp_path):
    """Local mode plans the full-size models, or the tiny ones when NBHELPERS_WEIGHTS holds them, as the command
    line's report does."""
    pytest.importorskip("torch")
    from nbhelpers.weights.manifest import TINY_MARKER

    monkeypatch.setenv("NBHELPERS_WEIGHTS", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert env.plan("lipsync", "local").weights == "full"
        (tmp_path / TINY_MARKER).write_text("{}")
        assert env.plan("lipsync", "local").weights == "tiny"


# ------------------------------------------------------------------------------------------------ check_result


@pytest.fixture
def clip_25(lavfi_video):
    return lavfi_video(seconds=1)


def test_check_result_accepts_this_sessions_output(clip_25):
    class Result:
        output = Path(clip_25)
        n_frames = 25

    message = env.check_result(Result(), duration_s=1.0, since=0)
    assert message.startswith(f"OK: {clip_25.name} written this session") and "25 frames" in message


def test_check_result_rejects_stale_wrong_and_missing_files(clip_25, tmp_path):
    with pytest.raises(env.ResultCheckError, match="before this session"):
        env.check_result(clip_25, since=time.time() + 60)
    with pytest.raises(env.ResultCheckError, match="has 25 frames; the result reports 24"):
        env.check_result(clip_25, frames=24, since=0)
    with pytest.raises(env.ResultCheckError, match="lasts 1.000 s; expected 1.500 s"):
        env.check_result(clip_25, duration_s=1.5, since=0)
    with pytest.raises(env.ResultCheckError, match="missing or empty"):
        env.check_result(tmp_path / "nothing.mp4")
    assert issubclass(env.ResultCheckError, AssertionError) and issubclass(env.ResultCheckError, NbHelpersError)


def test_check_result_of_avatars_and_tables():
    class Avatar:
        loaded_from_cache = False
        n_frames = 25
        directory = Path("/tmp/a")

    assert env.check_result(Avatar()) == "OK: avatar with 25 frames (prepared now)"
    with pytest.raises(env.ResultCheckError, match="loaded_from_cache is False, expected True"):
        env.check_result(Avatar(), from_cache=True)

    class Table:
        checks = (1, 2, 3)

    assert env.check_result(Table()) == "OK: table with 3 rows"
    with pytest.raises(env.ResultCheckError, match="3 rows; expected at least 4"):
        env.check_result(Table(), min_rows=4)
    with pytest.raises(env.ResultCheckError, match="cannot check"):
        env.check_result(42)


# ------------------------------------------------------------------------------------------------ check_setup


def test_check_setup_passes_on_a_ready_runtime_and_names_what_it_checked():
    import torch

    from nbhelpers import media

    installs = env.install_missing(["pytest>=1.0", "numpy>=1.0"], dry_run=True)
    message = env.check_setup(installs, types.SimpleNamespace(name="dlib"))
    major, minor = media.ffmpeg_version()
    where = " with CUDA" if torch.cuda.is_available() else " (CPU)"
    assert message == (f"OK: 2 requirements satisfied; torch {torch.__version__}{where}; ffmpeg {major}.{minor}; "
                       "landmarks: dlib")


def test_check_setup_names_what_is_missing_and_the_command():
    installs = env.install_missing(["pytest>=1.0", "not-a-package-xyz>=2"], dry_run=True)
    with pytest.raises(env.ResultCheckError) as caught:
        env.check_setup(installs)
    assert "still missing: not-a-package-xyz>=2; install it with:" in str(caught.value)
    assert "-m pip install 'not-a-package-xyz>=2'" in str(caught.value)
    # After a real install that did not take effect, the fix is the restart.
    done = env.InstallReport(rows=installs.rows, dry_run=False)
    with pytest.raises(env.ResultCheckError, match="did not take effect: on Colab choose Runtime > Restart"):
        env.check_setup(done)


def test_check_setup_refuses_an_empty_table_a_protected_package_below_its_floor_and_a_broken_ffmpeg(monkeypatch):
    from nbhelpers import media

    with pytest.raises(env.ResultCheckError, match="install table is empty"):
        env.check_setup(env.InstallReport(rows=(), dry_run=True))
    with pytest.raises(env.ResultCheckError, match=r"numpy .* is below numpy>=999; it is a protected package"):
        env.check_setup(env.install_missing(["numpy>=999"], dry_run=True))
    with pytest.raises(env.ResultCheckError, match="has no name"):
        env.check_setup(env.install_missing(["pytest>=1.0"], dry_run=True), types.SimpleNamespace(name=""))
    monkeypatch.setattr(media, "ffmpeg_version", lambda exe=None: (0, 0))
    with pytest.raises(env.ResultCheckError, match="does not run or prints no version"):
        env.check_setup(env.install_missing(["pytest>=1.0"], dry_run=True))


def test_check_setup_does_not_ask_for_onnxruntime_when_another_backend_was_chosen():
    rows = ["pytest>=1.0", "onnxruntime-gpu>=999", "onnxruntime>=999"]
    installs = env.install_missing(rows, dry_run=True)
    assert len(installs.missing) == 2  # neither is satisfied here
    message = env.check_setup(installs, types.SimpleNamespace(name="dlib"))
    assert message.startswith("OK: 1 requirement satisfied; ")
    assert "onnxruntime-gpu>=999, onnxruntime>=999 not needed by the dlib backend" in message
    # The dwpose-onnx backend does need them, and so does a check that was not told the backend.
    for backend in (types.SimpleNamespace(name="dwpose-onnx"), None):
        with pytest.raises(env.ResultCheckError,
                           match="still missing: onnxruntime-gpu>=999, onnxruntime>=999; install them"):
            env.check_setup(installs, backend)


def test_install_report_shows_a_command_that_reads_right_and_names_refusals():
    report = env.install_missing(["not-a-package-xyz>=1", "numpy>=999"], dry_run=True)
    command = list(report.command)
    i = command.index("-c")
    assert command[i + 1] == "<pins of installed protected packages>" and command[-1] == "not-a-package-xyz>=1"
    assert not any("nbhelpers-pip-" in part for part in command)  # the temporary constraints file is gone
    import numpy

    refused = env.install_missing(["numpy>=999"], dry_run=True)
    assert str(refused).splitlines()[-1] == (f"nothing to install; below their floor but protected, so left alone: "
                                             f"numpy {numpy.__version__} (needs numpy>=999)")


def _fake_pip(monkeypatch, planned):
    """subprocess.run for pip: a dry run writes a report planning ``planned`` (name, version) pairs; every call is
    recorded."""
    import json

    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if "--dry-run" in cmd:
            report = Path(cmd[cmd.index("--report") + 1])
            report.write_text(json.dumps({"install": [{"metadata": {"name": n, "version": v}} for n, v in planned]}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr("nbhelpers.env.install.subprocess.run", run)
    return calls


def test_install_missing_refuses_a_dependency_on_torchvision_before_installing(monkeypatch):
    """A requirement whose resolution pulls torchvision from PyPI (spandrel does) is refused after pip's dry run,
    with what to do, and pip never installs."""
    calls = _fake_pip(monkeypatch, [("nbh-absent-package", "1.0"), ("torchvision", "0.28.0")])
    with pytest.raises(NbHelpersError, match=r"torchvision 0\.28\.0 from PyPI.*Nothing was installed.*pytorch\.org"):
        env.install_missing(["nbh-absent-package>=1.0"])
    assert len(calls) == 1 and "--dry-run" in calls[0]


def test_install_missing_installs_after_a_dry_run_without_torch(monkeypatch):
    calls = _fake_pip(monkeypatch, [("nbh-absent-package", "1.0"), ("einops", "0.8.0")])
    report = env.install_missing(["nbh-absent-package>=1.0"])
    assert [("--dry-run" in c) for c in calls] == [True, False]
    assert calls[1][-1] == "nbh-absent-package>=1.0" and report.rows[0].action == "install"
