"""The install recipes, statically (the dry-run resolves themselves run in ci/colab-resolve.sh, which needs PyPI).

The [colab] extra (what Colab lacks): floors only, no protected package. environment.yml: parses, pins the Python/torch
pair that has mmcv wheels, keeps torch out of pip. ci/resolve_check.py: its YAML fallback reads environment.yml as
PyYAML does, and its verdict on pip reports flags exactly the protected changes.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import ROOT

spec = importlib.util.spec_from_file_location("resolve_check", ROOT / "ci" / "resolve_check.py")
resolve_check = importlib.util.module_from_spec(spec)
sys.modules["resolve_check"] = resolve_check
spec.loader.exec_module(resolve_check)


def test_the_colab_extra_holds_floors_of_unprotected_packages_only():
    pytest.importorskip("tomllib")
    lines = resolve_check.colab_extra_lines()
    assert lines, "the [colab] extra is empty"
    assert resolve_check.static_colab_problems(lines) == []
    assert {resolve_check.requirement_name(line) for line in lines}.isdisjoint(resolve_check.PROTECTED)


@pytest.mark.parametrize("line, problem", [
    ("torch>=2.1", "protected"),
    ("numpy>=1.24", "protected"),
    ("opencv-python-headless>=4.8", "protected"),
    ("soxr", "give a floor"),
    ("soxr==0.5.0", "floors only"),
    ("soxr>=0.3,<1", "floors only"),
    ("-r other.txt", "options"),
])
def test_static_check_catches(line, problem):
    problems = resolve_check.static_colab_problems([line])
    assert any(problem in p for p in problems), problems


def test_colab_snapshot_pins_every_protected_package():
    pins = resolve_check.preinstalled(ROOT / "ci" / "colab-preinstalled.txt")
    for name in ("torch", "numpy", "transformers", "huggingface-hub", "ipywidgets", "opencv-python-headless"):
        assert name in pins
    assert pins["torch"].startswith("2.11") and pins["ipywidgets"] == "7.7.1"  # DESIGN.md's Colab
    # The stack issue 14 describes (and tests/test_zz_environments.py builds): Colab late 2026.
    assert (pins["numpy"], pins["transformers"], pins["huggingface-hub"], pins["ipython"], pins["ipykernel"],
            pins["opencv-python"]) == ("2.1.3", "5.15.0", "1.27.0", "7.34.0", "6.17.1", "5.0.0.93")


def test_the_snapshot_check_runs_a_real_resolve_of_the_pins(monkeypatch, tmp_path):
    """ci/colab-preinstalled.txt listed transformers 5.20.2 with huggingface_hub 1.30 (5.20.2 needs >= 1.31): the
    stand-ins carry no dependencies, so only a resolve of the pins themselves can see it."""
    seen = {}

    def fake_dry_run(venv, args):
        seen["args"] = args
        return None, "ERROR: Cannot install transformers==5.20.2 and huggingface-hub==1.30.0 because ..."

    monkeypatch.setattr(resolve_check, "dry_run", fake_dry_run)
    problems = resolve_check.snapshot_problems(tmp_path, {"transformers": "5.20.2", "huggingface-hub": "1.30.0"})
    assert seen["args"][:1] == ["--ignore-installed"] and "transformers==5.20.2" in seen["args"]
    assert problems and "not self-consistent" in problems[0] and "huggingface-hub==1.30.0" in problems[0]
    monkeypatch.setattr(resolve_check, "dry_run", lambda venv, args: ({"install": []}, ""))
    assert resolve_check.snapshot_problems(tmp_path, {"soxr": "0.5.0"}) == []


def test_environment_yml():
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load((ROOT / "environment.yml").read_text())
    python, conda, pip_lines = resolve_check.read_environment_yml(ROOT / "environment.yml")
    assert python in ("3.10", "3.11")
    assert conda["torch"].startswith("2.1.") and "pytorch-cuda=12.1" in data["dependencies"]
    assert "pytorch" in data["channels"]
    names = {resolve_check.requirement_name(line.removeprefix("-e ")) for line in pip_lines if line != "-e .[dlib]"}
    assert not names & {"torch", "torchvision", "torchaudio"}  # conda owns torch; pip must never replace it
    assert "-e .[dlib]" in pip_lines and "numpy<2" in pip_lines
    # transformers 4.47+ does not run on torch 2.1 (4.57 broke even `import torchvision`); 4.46.3 does.
    from packaging.requirements import Requirement

    specs = {Requirement(line).name.lower(): Requirement(line).specifier for line in pip_lines if line[0] != "-"}
    assert "4.46.3" in specs["transformers"] and "4.47.0" not in specs["transformers"]
    assert "0.31.0" in specs["diffusers"] and "0.35.0" not in specs["diffusers"]


def test_yaml_fallback_reads_environment_yml_as_pyyaml_does():
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "environment.yml").read_text()
    assert resolve_check._tiny_yaml(text)["dependencies"] == yaml.safe_load(text)["dependencies"]


def test_verdict_on_a_pip_report():
    report = {"install": [
        {"metadata": {"name": "musetalk-workbook", "version": "0.1.0"}},
        {"metadata": {"name": "onnxruntime-gpu", "version": "1.31.1"}},
        {"metadata": {"name": "NumPy", "version": "2.4.0"}},
        {"metadata": {"name": "protobuf", "version": "6.0.0"}},
        {"metadata": {"name": "ipywidgets", "version": "8.1.0"}},
    ]}
    installed = {"numpy": "2.3.5", "protobuf": "5.29.5"}
    violations, warnings, new = resolve_check.judge(report, installed)
    assert violations == ["would change numpy 2.3.5 -> 2.4.0 (protected)",
                          "would install ipywidgets 8.1.0 (protected)"]
    assert warnings == ["would change preinstalled protobuf 5.29.5 -> 6.0.0"]
    assert new == ["onnxruntime-gpu==1.31.1"]
    # in the conda environment only what conda installed is protected
    violations, _, new = resolve_check.judge(report, installed, protected=("numpy", "torch"))
    assert violations == ["would change numpy 2.3.5 -> 2.4.0 (protected)"] and "ipywidgets==8.1.0" in new


def test_stand_ins_are_seen_as_installed(tmp_path):
    """A metadata-only .dist-info is an installed distribution for importlib.metadata (and so for pip)."""
    import importlib.metadata as md

    resolve_check.add_stand_ins(tmp_path, {"fake-torch-xyz": "2.11.0"})
    [dist] = md.distributions(path=[str(tmp_path)])
    assert (dist.metadata["Name"], dist.version) == ("fake-torch-xyz", "2.11.0")


# ------------------------------------------------------------------------------------------ ci/mmpose-env.sh guards


def _mmpose_env(folder: Path, python: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "ci" / "mmpose-env.sh"), str(folder)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120, env={**os.environ, "PYTHON": python})


def test_mmpose_env_never_empties_a_folder_it_did_not_build(tmp_path):
    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    proc = _mmpose_env(keep, sys.executable)
    assert proc.returncode == 2 and "is not an overlay built by this script" in proc.stderr
    assert (keep / "notes.txt").read_text() == "mine"


def test_mmpose_env_names_the_python_problem_before_building(tmp_path):
    proc = _mmpose_env(tmp_path / "o1", "no-such-python")
    assert proc.returncode == 2 and "no Python 'no-such-python'; set PYTHON" in proc.stderr
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a Python without torch
    proc = _mmpose_env(tmp_path / "o2", str(bare / "bin" / "python"))
    assert proc.returncode == 2 and "cannot import torch" in proc.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


# ------------------------------------------------------------------------------------------ pyproject metadata


def test_pyproject_license_is_an_spdx_expression_that_setuptools_reads_without_deprecation():
    """`project.license` as a TOML table stops being supported by setuptools after 2027-02-18 (PEP 639): it must
    be an SPDX string with the licence text named in `license-files`, and setuptools must read it silently."""
    import warnings

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = data["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] and all((ROOT / f).is_file() for f in project["license-files"])
    assert "MIT License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in data["build-system"]["requires"])
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (77, 0):
        pytest.skip(f"setuptools {setuptools.__version__} here predates PEP 639 support (77)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught if "license" in str(w.message).lower()] == []
    assert dist.metadata.license_expression == "MIT"


def test_the_package_data_globs_cover_the_files_the_package_reads():
    """pyproject.toml's package-data (what a wheel ships besides modules) matches the weights manifest, the bundled
    model configs and the demo speech; the build below checks it for real where setuptools is new enough."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in globs["nbhelpers"] for p in (ROOT / "nbhelpers").glob(pattern) if p.is_file()}
    needed = ["data/weights.json", "data/demo-speech.wav", "configs/musetalkV15-unet.json", "configs/whisper-tiny.json"]
    assert {ROOT / "nbhelpers" / rel for rel in needed} <= shipped, sorted(map(str, shipped))


def test_a_built_wheel_ships_the_package_data(tmp_path):
    """The wheel that a non-editable install builds (the setup cell's git install) holds the data files the package
    reads at run time: the weights manifest, the bundled model configs and the demo speech."""
    import shutil
    import zipfile

    setuptools = pytest.importorskip("setuptools")
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (77, 0):
        pytest.skip(f"setuptools {setuptools.__version__} here is older than pyproject.toml's build floor (77)")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "nbhelpers", src / "nbhelpers", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("musetalk_workbook-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        shipped = zf.read("nbhelpers/data/weights.json")
    assert shipped == (ROOT / "nbhelpers" / "data" / "weights.json").read_bytes()
    data = {f"nbhelpers/{p.relative_to(ROOT / 'nbhelpers').as_posix()}"
            for folder in ("data", "configs") for p in (ROOT / "nbhelpers" / folder).iterdir()}
    assert "nbhelpers/configs/musetalkV15-unet.json" in data and data <= names, sorted(data - names)


def test_requirements_colab_txt_is_the_colab_extra():
    """requirements-colab.txt (for pip -r beside a checkout) lists exactly the [colab] extra the setup cell installs,
    and neither asks for torch, numpy, transformers or onnxruntime."""
    import re

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = ROOT
    extra = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["project"]["optional-dependencies"]["colab"]
    lines = [line.split("#")[0].strip() for line in (root / "requirements-colab.txt").read_text("utf-8").splitlines()]
    assert [line for line in lines if line] == extra
    names = {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].lower() for r in extra}
    assert not names & {"torch", "numpy", "transformers", "huggingface-hub", "onnxruntime", "onnxruntime-gpu"}
