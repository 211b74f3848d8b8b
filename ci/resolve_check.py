#!/usr/bin/env python3
"""Dry-run resolves of the workbook's two install recipes, without downloading torch or touching this environment.

    python ci/resolve_check.py colab   # the package with its [colab] extra on Colab (Python 3.13)
    python ci/resolve_check.py conda   # the pip part of environment.yml on its conda packages (Python 3.11)
    python ci/resolve_check.py conda --import   # ... then installs it for real and imports it, builds the models

How: a throwaway venv of the target Python gets metadata-only stand-ins ("fake installed distributions": a
``.dist-info`` folder with a METADATA file, no code) for what the target already has — Colab's preinstalled
packages (ci/colab-preinstalled.txt), or the conda packages of environment.yml. Then
``pip install --dry-run --report`` asks pip what installing the recipe there would do. pip's resolver sees the
stand-ins exactly as it sees real installs, so the report lists what would be installed or changed.

It fails (exit 1) when:
- the resolve fails (a conflict, a floor that no release meets, no wheel for the target Python...);
- a protected package (torch, torchvision, torchaudio, numpy, transformers, huggingface-hub, ipywidgets,
  opencv-*) would be installed, upgraded or downgraded;
- colab: the [colab] extra (pyproject.toml) names a protected package, or has a requirement without a floor or
  with a pin.
Other packages that would be installed are listed; a preinstalled unprotected package that would change is
listed as a warning. Only the Python standard library is used here (PyYAML when available for environment.yml).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTECTED = ("torch", "torchvision", "torchaudio", "numpy", "transformers", "huggingface-hub", "ipywidgets",
             "opencv-python", "opencv-python-headless", "opencv-contrib-python", "opencv-contrib-python-headless")

# What conda's pytorch=2.1.2 / torchvision=0.16.2 / numpy=1.26 / python=3.11 bring as Python distributions
# (pytorch's run dependencies on conda-forge and the pytorch channel, early 2024).
CONDA_IMPLIED = {
    "pillow": "10.2.0", "filelock": "3.13.1", "jinja2": "3.1.3", "markupsafe": "2.1.5", "networkx": "3.1",
    "sympy": "1.12", "mpmath": "1.3.0", "typing-extensions": "4.9.0", "pyyaml": "6.0.1", "requests": "2.31.0",
    "urllib3": "2.2.1", "idna": "3.6", "certifi": "2024.2.2", "charset-normalizer": "3.3.2",
    "setuptools": "69.1.1", "wheel": "0.42.0",
}
CONDA_TO_PIP = {"pytorch": "torch", "pytorch-cuda": None, "python": None, "pip": None, "cudatoolkit": None,
                "ffmpeg": None}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------------------------------- inputs


def requirement_lines(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def requirement_name(line: str) -> str:
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    if not match:
        raise ValueError(f"cannot read a package name in {line!r}")
    return norm(match.group(1))


def colab_extra_lines(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirement lines of the package's ``[colab]`` extra (what Colab lacks), from pyproject.toml."""
    import tomllib

    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return list(data["project"]["optional-dependencies"]["colab"])


def static_colab_problems(lines: list[str]) -> list[str]:
    """The [colab] extra: floors only, no pins, no protected package."""
    problems = []
    for line in lines:
        if line.startswith("-"):
            problems.append(f"{line!r}: options do not belong in the [colab] extra")
            continue
        name = requirement_name(line)
        spec = line[len(re.match(r"^\s*[A-Za-z0-9._-]+(\[[^\]]*\])?", line).group(0)):].split(";")[0]
        if name in PROTECTED:
            problems.append(f"{line!r}: {name} is preinstalled on Colab and must not be named (protected)")
        if ">=" not in spec:
            problems.append(f"{line!r}: give a floor (name>=version)")
        if re.search(r"==|<|~=|!=", spec.replace(">=", "")):
            problems.append(f"{line!r}: floors only, no pins or upper bounds")
    return problems


def snapshot_problems(venv: Path, pins: dict[str, str]) -> list[str]:
    """The Colab snapshot must be installable as it stands: a dry-run resolve of every pin with its dependencies
    (metadata only: pip reads each wheel's published metadata, no torch is downloaded). The stand-ins carry no
    dependencies, so without this a snapshot that no real runtime can hold (transformers 5.20.2 beside
    huggingface_hub 1.30, when it needs >= 1.31) would pass unseen."""
    report, log = dry_run(venv, ["--ignore-installed", *[f"{name}=={version}" for name, version in pins.items()]])
    if report is not None:
        return []
    lines = [line for line in log.splitlines() if "WARNING: Location" not in line]
    return ["not self-consistent: pip cannot install these pins together:\n" + "\n".join(lines[-20:])]


def preinstalled(path: Path) -> dict[str, str]:
    pins = {}
    for line in requirement_lines(path):
        name, _, version = line.partition("==")
        if not version:
            raise ValueError(f"{path}: {line!r} must be name==version")
        pins[norm(name)] = version.strip()
    return pins


def read_environment_yml(path: Path) -> tuple[str, dict[str, str], list[str]]:
    """(python version, conda packages as pip names -> version, pip lines) of environment.yml."""
    try:
        import yaml  # type: ignore[import-untyped]

        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except ImportError:
        data = _tiny_yaml(path.read_text(encoding="utf-8"))
    python, conda, pip_lines = "", {}, []
    for dep in data["dependencies"]:
        if isinstance(dep, dict):
            pip_lines = [str(x) for x in dep.get("pip", [])]
            continue
        name, _, version = str(dep).partition("=")
        version = version.lstrip("=")
        if name == "python":
            python = version
        pip_name = CONDA_TO_PIP.get(name, name)
        if pip_name:
            conda[norm(pip_name)] = version
    if not python:
        raise ValueError("environment.yml does not pin python")
    return python, conda, pip_lines


def _tiny_yaml(text: str) -> dict:
    """The subset of YAML environment.yml uses (for machines without PyYAML): top-level lists and one pip list."""
    deps: list = []
    pip: list | None = None
    section = None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not raw.startswith(" "):
            section = line.split(":", 1)[0]
            continue
        item = line.strip()[2:].strip() if line.strip().startswith("- ") else None
        if section != "dependencies" or item is None:
            continue
        indent = len(line) - len(line.lstrip())
        if item == "pip:":
            pip = []
            deps.append({"pip": pip})
        elif pip is not None and indent > 2:
            pip.append(item)
        else:
            deps.append(item)
    return {"dependencies": deps}


def exact(version: str, known: dict[str, str] | None = None) -> str:
    """A conda spec like ``1.26`` or ``2.1.2`` as one exact version pip can hold."""
    fill = {"1.26": "1.26.4", "4": "4.1.5", "8": "8.1.2"}
    return fill.get(version, version)


# ---------------------------------------------------------------------------------------------------- venv


def find_python(version: str, override: str | None) -> str:
    """An interpreter of ``version`` (major.minor): --python, else pyenv's versions, else python3.X on PATH."""
    if override:
        return override
    major_minor = ".".join(version.split(".")[:2])
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [str(p) for p in sorted(pyenv.glob(f"{major_minor}.*/bin/python"))] if pyenv.is_dir() else []
    candidates += [p for p in [shutil.which(f"python{major_minor}")] if p]
    for exe in candidates:  # a pyenv shim on PATH may exist without that version being active: try each
        done = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode == 0 and done.stdout.strip() == major_minor:
            return exe
    raise FileNotFoundError(f"no working Python {major_minor} found (looked in {pyenv} and for "
                            f"python{major_minor} on PATH); pass --python")


def make_venv(python: str, folder: Path) -> Path:
    subprocess.run([python, "-m", "venv", str(folder)], check=True, stdin=subprocess.DEVNULL)
    exe = folder / "bin" / "python"
    site = subprocess.run([str(exe), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    return Path(site)


def add_stand_ins(site: Path, pins: dict[str, str]) -> None:
    """Metadata-only installed distributions: pip sees ``name==version`` installed (no code, no dependencies)."""
    for name, version in pins.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                       encoding="utf-8")
        (info / "INSTALLER").write_text("resolve-check stand-in\n", encoding="utf-8")
        (info / "RECORD").write_text("", encoding="utf-8")


def dry_run(venv: Path, args: list[str]) -> tuple[dict | None, str]:
    report = venv / "report.json"
    command = [str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet",
               "--report", str(report), *args]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_PROGRESS_BAR="off")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
    log = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or not report.is_file():
        return None, log
    return json.loads(report.read_text(encoding="utf-8")), log


# ---------------------------------------------------------------------------------------------------- verdict


def judge(report: dict, installed: dict[str, str], protected: tuple[str, ...] = PROTECTED
          ) -> tuple[list[str], list[str], list[str]]:
    """(violations, warnings, new packages) of a pip report against what was installed before.

    A protected package that pip would install or change is a violation; on Colab that is every package of
    PROTECTED, in the conda environment the ones conda installs (torch, torchvision, numpy), which pip must not
    replace while the pip part may add transformers, opencv and the rest.
    """
    violations, warnings, new = [], [], []
    for item in report.get("install", []):
        name, version = norm(item["metadata"]["name"]), item["metadata"]["version"]
        if name == "musetalk-workbook":
            continue
        before = installed.get(name)
        if name in protected:
            what = f"install {name} {version}" if before is None else f"change {name} {before} -> {version}"
            violations.append(f"would {what} (protected)")
        elif before is not None:
            warnings.append(f"would change preinstalled {name} {before} -> {version}")
        else:
            new.append(f"{name}=={version}")
    return violations, warnings, sorted(new)


IMPORT_CHECK = r"""
import sys, tempfile, warnings
import numpy, torch, torchvision, transformers, diffusers, huggingface_hub, cv2
print("   stack:", f"Python {sys.version.split()[0]}, torch {torch.__version__}, torchvision {torchvision.__version__},"
      f" numpy {numpy.__version__}, transformers {transformers.__version__}, diffusers {diffusers.__version__},"
      f" huggingface_hub {huggingface_hub.__version__}, opencv {cv2.__version__}")
import nbhelpers
from nbhelpers import models
from nbhelpers.testing import make_tiny_weights
with tempfile.TemporaryDirectory() as tmp:
    root = make_tiny_weights(tmp + "/models", writers=["unet", "vae", "whisper", "parsing"])
    unet, vae, whisper = models.load_unet(root), models.load_vae(root), models.load_whisper(root)
    with torch.no_grad():
        latent = vae.encode(torch.zeros(1, 3, 256, 256)).latent_dist.mode()
        feats = whisper.encoder(torch.zeros(1, 80, 3000)).last_hidden_state
    print("   tiny models built and run:", tuple(latent.shape), tuple(feats.shape), type(unet).__name__)
"""


def import_check(python: str, folder: Path, conda: dict[str, str], pip_args: list[str]) -> list[str]:
    """Install the conda environment's Python packages for real and use them: torch, torchvision and numpy at the
    conda versions (PyPI's builds), the pip part of environment.yml on top with those three held, then import the
    stack and build, load and run the tiny models. A resolve alone passed while transformers 4.57 made even
    ``import torchvision`` fail on torch 2.1."""
    make_venv(python, folder)
    exe = str(folder / "bin" / "python")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_PROGRESS_BAR="off")
    held = [f"{name}=={exact(conda[name])}" for name in ("torch", "torchvision", "numpy") if name in conda]
    pins = folder / "conda-pins.txt"
    pins.write_text("\n".join(held) + "\n", encoding="utf-8")
    steps = [[exe, "-m", "pip", "install", "-q", *held],
             [exe, "-m", "pip", "install", "-q", "-c", str(pins), *[a for a in pip_args if a != "-U"]]]
    for command in steps:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
        if done.returncode != 0:
            log = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING: Location" not in line]
            return [f"install failed: {' '.join(command[3:])}\n" + "\n".join(log[-25:])]
    done = subprocess.run([exe, "-c", IMPORT_CHECK], cwd=folder, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env=env)
    print(done.stdout.rstrip())
    if done.returncode != 0:
        return ["the installed stack does not work:\n" + "\n".join((done.stdout + done.stderr).splitlines()[-25:])]
    return []


def check(target: str, python_override: str | None, keep: bool, do_import: bool = False) -> int:
    start = time.time()
    problems: list[str] = []
    if target == "colab":
        lines = colab_extra_lines()
        problems += [f"[colab] extra: {p}" for p in static_colab_problems(lines)]
        installed = preinstalled(ROOT / "ci" / "colab-preinstalled.txt")
        python = find_python("3.13", python_override)
        pip_args = [".[colab]"]  # what the setup cell installs: the package with its [colab] extra
        protected = PROTECTED
        title = "Colab (Python 3.13): pip install .[colab]"
    else:
        version, conda, pip_lines = read_environment_yml(ROOT / "environment.yml")
        installed = dict(CONDA_IMPLIED)
        installed.update({name: exact(v) for name, v in conda.items()})
        python = find_python(version, python_override)
        # conda runs `pip install -U -r <the pip list>` in the folder of environment.yml; -e is resolved as a
        # plain install here (same metadata, no build of an editable wheel).
        pip_args = ["-U", *[line.removeprefix("-e ").strip() for line in pip_lines]]
        protected = tuple(name for name in conda if name in PROTECTED)
        title = f"conda (Python {version}): the pip part of environment.yml, {len(pip_lines)} lines"
    print(f"== {title}")
    print(f"   interpreter {python}; {len(installed)} preinstalled stand-ins")
    folder = Path(tempfile.mkdtemp(prefix=f"resolve-{target}-"))
    try:
        site = make_venv(python, folder)
        if target == "colab":
            problems += [f"ci/colab-preinstalled.txt: {p}" for p in snapshot_problems(folder, installed)]
        add_stand_ins(site, installed)
        report, log = dry_run(folder, pip_args)
        if report is None:
            problems.append("pip could not resolve the install:\n" + "\n".join(log.splitlines()[-30:]))
        else:
            violations, warnings, new = judge(report, installed, protected)
            problems += violations
            for w in warnings:
                print(f"   WARNING: {w}")
            print(f"   would install {len(new)} new package(s): {', '.join(new) or 'none'}")
        if do_import and target == "conda" and not problems:
            print("   installing it for real (torch 2.1 from PyPI) to import the stack and build the tiny models")
            problems += import_check(python, folder.with_name(folder.name + "-import"), conda, pip_args)
    finally:
        if not keep:
            shutil.rmtree(folder.with_name(folder.name + "-import"), ignore_errors=True)
        if keep:
            print(f"   kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    for p in problems:
        print(f"   FAIL: {p}")
    print(f"   {'FAILED' if problems else 'OK'} in {time.time() - start:.0f} s")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", metavar="colab|conda", help="what to check (default: both)")
    parser.add_argument("--python", help="interpreter of the target version (default: found on PATH or pyenv)")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway venvs (to inspect them)")
    parser.add_argument("--import", dest="do_import", action="store_true",
                        help="conda: also install it for real, import the stack and build the tiny models "
                             "(PyPI's torch 2.1.2: about 2.5 GB to download, 5 GB on disk, a few minutes)")
    args = parser.parse_args(argv)
    args.targets = args.targets or ["colab", "conda"]
    unknown = sorted(set(args.targets) - {"colab", "conda"})
    if unknown:
        parser.error(f"unknown target(s) {unknown}; choose colab and/or conda")
    return max([check(t, args.python if len(args.targets) == 1 else None, args.keep, args.do_import)
                for t in args.targets])


if __name__ == "__main__":
    sys.exit(main())
