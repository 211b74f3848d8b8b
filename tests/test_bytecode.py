"""The bytecode cache a local Ray batch's processes share where the installed packages have none (nbhelpers.bytecode).

A fake package in a temporary folder stands for torch and the rest: with or without its ``.pyc``, and with
Python allowed or not to write one beside it. The ``.pyc`` files the compile ahead writes are checked against
their sources by their header (PEP 552: magic number, flags, source mtime and size), computed here, not by
nbhelpers.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import py_compile
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nbhelpers import bytecode

pytestmark = pytest.mark.notorch


def fake_package(root: Path, name: str = "fakepkg") -> Path:
    """``root/name`` with two modules, a test suite and a file that does not compile."""
    pkg = root / name
    (pkg / "tests").mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "mod.py").write_text("def f():\n    return 42\n")
    (pkg / "tests" / "test_mod.py").write_text("def test():\n    pass\n")
    (pkg / "py2.py").write_text("print 'old'\n")
    return pkg


def mirror_pyc(folder: Path, source: Path) -> Path:
    """Where PYTHONPYCACHEPREFIX puts ``source``'s bytecode (the Python docs: the source's absolute folder, mirrored
    under the prefix, with no __pycache__ level), computed by hand."""
    rel = source.resolve().parent.relative_to(source.resolve().anchor)
    return folder / rel / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def header_matches(pyc: Path, source: Path) -> bool:
    magic, flags, mtime, size = struct.unpack("<4sIII", pyc.read_bytes()[:16])
    st = source.stat()
    return (magic == importlib.util.MAGIC_NUMBER and flags == 0 and mtime == int(st.st_mtime) & 0xFFFFFFFF
            and size == st.st_size & 0xFFFFFFFF)


@pytest.fixture
def pkg_root(tmp_path, monkeypatch):
    root = tmp_path / "site"
    fake_package(root)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    monkeypatch.setenv(bytecode.SWITCH, str(tmp_path / "cache"))
    monkeypatch.setattr(bytecode, "_python_writes_bytecode", lambda: False)  # as PYTHONDONTWRITEBYTECODE=1
    return root


def test_the_switch_turns_it_off(pkg_root, monkeypatch):
    monkeypatch.setenv(bytecode.SWITCH, "0")
    the_plan = bytecode.plan(cpus=8, packages=["fakepkg"])
    assert the_plan.folder is None and "NBHELPERS_BYTECODE_CACHE=0" in the_plan.reason


def test_packages_with_their_bytecode_need_no_cache(pkg_root):
    init = pkg_root / "fakepkg" / "__init__.py"
    py_compile.compile(str(init), cfile=importlib.util.cache_from_source(str(init)), doraise=True)
    the_plan = bytecode.plan(cpus=8, packages=["fakepkg"])
    assert the_plan.folder is None and the_plan.reason.startswith("the installed packages have their bytecode")


def test_where_python_writes_bytecode_beside_the_sources_no_cache_is_needed(pkg_root, monkeypatch):
    monkeypatch.setattr(bytecode, "_python_writes_bytecode", lambda: True)
    assert bytecode.plan(cpus=8, packages=["fakepkg"]).folder is None


def test_a_package_without_bytecode_gets_the_cache_and_a_compile_ahead_on_enough_cpus(pkg_root, tmp_path):
    many = bytecode.plan(cpus=8, packages=["fakepkg", "no_such_package_here"])
    assert many.folder.parent == tmp_path / "cache" and many.folder.name.startswith("env-")
    assert many.missing == ("fakepkg",)
    assert many.warm_dirs[1:] == (pkg_root / "fakepkg",) and many.marker.parent == many.folder
    assert "compiling the standard library and 1 package folders ahead on 6 CPUs" in many.reason
    few = bytecode.plan(cpus=2, packages=["fakepkg"])
    assert few.folder == many.folder and few.warm_dirs == () and "the workers fill it as they import" in few.reason
    assert (many.folder.stat().st_mode & 0o777) == 0o700 == (many.folder.parent.stat().st_mode & 0o777)


def test_the_compile_ahead_writes_checked_bytecode_into_the_cache_and_not_beside_the_sources(pkg_root, tmp_path):
    planned = bytecode.plan(cpus=8, packages=["fakepkg"])
    # the standard library is left out here (it takes a minute on 2 cores); the package's folder is the case
    the_plan = bytecode.Plan(planned.folder, planned.reason, planned.missing, planned.warm_dirs[1:], planned.marker)
    proc = bytecode.start_warmup(the_plan, cpus=4)
    assert proc is not None and proc.wait(timeout=120) == 0
    pkg = pkg_root / "fakepkg"
    for name in ("__init__.py", "mod.py"):
        pyc = mirror_pyc(the_plan.folder, pkg / name)
        assert pyc.is_file() and header_matches(pyc, pkg / name), pyc
    assert not mirror_pyc(the_plan.folder, pkg / "tests" / "test_mod.py").exists()  # test suites left out
    assert not mirror_pyc(the_plan.folder, pkg / "py2.py").exists()  # does not compile: passed over, quietly
    assert not list(pkg_root.rglob("__pycache__")) and not list(pkg_root.rglob("*.pyc"))
    record = json.loads(the_plan.marker.read_text())
    assert record["files"] == 3 and record["compiled"] == 2 and record["seconds"] >= 0  # tests/ left out; py2 fails
    again = bytecode.plan(cpus=8, packages=["fakepkg"])
    assert again.warm_dirs == () and "compiled ahead already" in again.reason
    bytecode.reap()
    assert proc not in bytecode._warmups


def test_a_cache_folder_others_can_write_to_or_on_a_full_disk_is_not_used(pkg_root, tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)
    the_plan = bytecode.plan(cpus=8, packages=["fakepkg"])
    assert the_plan.folder is None and "can be written by other users (mode 777)" in the_plan.reason
    folder.chmod(0o700)
    monkeypatch.setattr(bytecode, "MIN_FREE_BYTES", 2**62)
    the_plan = bytecode.plan(cpus=8, packages=["fakepkg"])
    assert the_plan.folder is None and "GiB free, less than" in the_plan.reason


def test_a_cache_over_its_cap_is_emptied_first_and_a_folder_of_other_files_is_never_used(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    assert bytecode.folder_problem(folder) == ""  # empty: tagged, then used
    tag = (folder / "CACHEDIR.TAG").read_bytes()
    assert tag[:43] == b"Signature: 8a477f597d28d172789f06886806bc55"  # bford.info/cachedir, version 0.6
    (folder / "a" / "b").mkdir(parents=True)
    (folder / "a" / "b" / "x.pyc").write_bytes(b"\0" * 5000)
    (folder / "warmed-1").write_text("")
    monkeypatch.setattr(bytecode, "CAP_BYTES", 4000)
    assert bytecode.folder_problem(folder) == ""
    assert sorted(p.name for p in folder.iterdir()) == ["CACHEDIR.TAG"]
    (folder / "small.pyc").write_bytes(b"\0" * 100)
    assert bytecode.folder_problem(folder) == "" and (folder / "small.pyc").exists()  # under the cap: kept
    mine = tmp_path / "my-project"  # NBHELPERS_BYTECODE_CACHE set to a folder of one's own files, by mistake
    mine.mkdir(mode=0o700)
    mine.chmod(0o700)
    (mine / "thesis.tex").write_bytes(b"\0" * 5000)
    problem = bytecode.folder_problem(mine)
    assert "holds other files and no CACHEDIR.TAG of nbhelpers" in problem
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]  # nothing emptied, nothing tagged


def test_the_environment_holds_the_prefix_only_while_ray_starts(pkg_root, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setattr(bytecode, "PACKAGES", ("fakepkg",))
    with bytecode.for_local_ray(cpus=2) as the_plan:
        assert os.environ["PYTHONPYCACHEPREFIX"] == str(the_plan.folder)
        assert the_plan.folder.parent == tmp_path / "cache"
        assert "PYTHONDONTWRITEBYTECODE" not in os.environ
    assert os.environ["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in os.environ
    monkeypatch.setenv(bytecode.SWITCH, "off")
    with bytecode.for_local_ray(cpus=2) as the_plan:
        assert the_plan.folder is None and "PYTHONPYCACHEPREFIX" not in os.environ


def test_ray_workers_read_and_write_the_shared_cache(tmp_path):
    """A real local Ray start in a fresh process: its worker imports a module of a package without bytecode, with
    PYTHONDONTWRITEBYTECODE=1 in the environment; the module's bytecode lands in the cache, not beside it, and the
    driver's environment is as it was after the start."""
    pytest.importorskip("ray")
    root = tmp_path / "site"
    pkg = fake_package(root)
    cache = tmp_path / "cache"
    script = textwrap.dedent("""
        import os, sys, ray
        from nbhelpers import batch, bytecode
        bytecode.PACKAGES = ("fakepkg",)
        batch.init_ray(num_cpus=1)

        @ray.remote
        def work():
            import fakepkg.mod
            return sys.pycache_prefix, sys.flags.dont_write_bytecode, fakepkg.mod.f()

        print(repr((ray.get(work.remote()), os.environ.get("PYTHONPYCACHEPREFIX"),
                    os.environ.get("PYTHONDONTWRITEBYTECODE"), str(batch._bytecode_plan.folder))))
        batch.shutdown_ray()
    """)
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", NBHELPERS_BYTECODE_CACHE=str(cache),
               PYTHONPATH=os.pathsep.join([str(root), str(repo), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONPYCACHEPREFIX", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    worker, prefix, dont_write, planned = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    tree = Path(planned)
    assert tree.parent == cache and worker == (planned, 0, 42)
    assert (prefix, dont_write) == (None, "1")
    assert header_matches(mirror_pyc(tree, pkg / "mod.py"), pkg / "mod.py")
    assert not list(root.rglob("*.pyc"))


def test_torchs_own_bytecode_keeps_the_cache_off_and_the_choice_follows_what_ray_inherits(pkg_root, monkeypatch):
    """A prefix makes Python pass over every __pycache__: where torch has its bytecode and only a small package has
    none, no cache. The decision reads the environment Ray's processes inherit, not this interpreter's flags."""
    torch_pkg = fake_package(pkg_root, "torch_standin")
    init = torch_pkg / "__init__.py"
    py_compile.compile(str(init), cfile=str(init.parent / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"),
                       doraise=True)
    monkeypatch.setattr(bytecode, "_HEAVY", ("torch_standin",))
    the_plan = bytecode.plan(cpus=8, packages=["torch_standin", "fakepkg"])
    assert the_plan.folder is None and "torch_standin has its bytecode" in the_plan.reason
    monkeypatch.undo()
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert bytecode._python_writes_bytecode() is False
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert bytecode._python_writes_bytecode() is True
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/somewhere")
    assert bytecode.plan(cpus=8).folder is None


def test_the_folder_is_absolute_and_its_parents_must_not_let_others_replace_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(bytecode.SWITCH, "rel/cache")
    assert bytecode.default_folder() == tmp_path / "rel" / "cache"
    for on in ("1", "on", "yes", "auto"):
        monkeypatch.setenv(bytecode.SWITCH, on)
        monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # ignored, as the XDG spec says
        assert bytecode.default_folder() == Path.home() / ".cache" / "musetalk-workbook" / bytecode.FOLDER_NAME
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    problem = bytecode.folder_problem(shared / "bytecode")
    assert "above it, can be written by other users (mode 777)" in problem
    shared.chmod(0o1777)  # sticky, as /tmp: others cannot rename what is ours
    assert bytecode.folder_problem(shared / "bytecode") == ""


def test_a_stopped_compile_ahead_leaves_no_process_behind(tmp_path):
    """reap(stop=True) ends the compile ahead and its pool's processes (their own session)."""
    pkg = tmp_path / "big"
    pkg.mkdir()
    for k in range(3000):
        (pkg / f"m{k}.py").write_text("x = [i for i in range(10)]\n" * 50)
    folder = tmp_path / "cache" / "env-test"
    folder.mkdir(parents=True, mode=0o700)
    the_plan = bytecode.Plan(folder, "test", ("big",), (pkg,), folder / "warmed-x")
    proc = bytecode.start_warmup(the_plan, cpus=4)
    assert proc is not None
    assert bytecode.start_warmup(the_plan, cpus=4) is None  # one at a time
    time.sleep(1.0)
    group = proc.pid
    bytecode.reap(stop=True)
    assert proc.poll() is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the compile ahead's pool outlived reap(stop=True)")
    assert not the_plan.marker.exists()
