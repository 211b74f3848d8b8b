"""nbhelpers.weights: the manifest, the cache folder, verification, and downloads through the real huggingface_hub
client against a fake hub on 127.0.0.1 (tests/fakehub.py).

The download tests run the client in a subprocess with HF_ENDPOINT set before huggingface_hub is imported (the
library reads it at import). They pass through whatever huggingface_hub / gdown is installed: ci/old-stack.sh
runs this file again with huggingface_hub 0.26 first on PYTHONPATH.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

from nbhelpers import weights as w
from nbhelpers.errors import InputError, WeightsError
from nbhelpers.hashing import sha256_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakehub import FakeHub  # noqa: E402

pytestmark = pytest.mark.notorch


# ---------------------------------------------------------------------------------------------------------------
# Files in the real formats, made without torch
# ---------------------------------------------------------------------------------------------------------------

def make_safetensors(n_floats: int, seed: int = 0) -> bytes:
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}).encode()
    header += b" " * (-len(header) % 8)
    body = hashlib.shake_256(f"st{seed}".encode()).digest(4 * n_floats)
    return struct.pack("<Q", len(header)) + header + body


def make_torch_zip(n_bytes: int, seed: int = 0) -> bytes:
    """A zip laid out like torch.save's (stored members archive/data.pkl + archive/data/0)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("archive/data/0", hashlib.shake_256(f"zip{seed}".encode()).digest(n_bytes))
        zf.writestr("archive/version", b"3\n")
    return buf.getvalue()


def make_onnx(n_bytes: int) -> bytes:
    # ir_version (field 1, varint 8), producer_name (field 2), graph (field 7, length-delimited)
    graph = b"\x00" * n_bytes
    length = n_bytes
    varint = bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"\x08\x08" + b"\x12\x04test" + b"\x3a" + bytes(varint) + graph


HTML = b"<!DOCTYPE html>\n<html><head><title>Google Drive - Virus scan warning</title></head><body></body></html>"
LFS = (b"version https://git-lfs.github.com/spec/v1\noid sha256:"
       + b"a" * 64 + b"\nsize 3400000000\n")


def entry(name, path, fmt, sources=(), **kw):
    return w.WeightFile(name, path, ("core",), fmt, tuple(sources), **kw)


# ---------------------------------------------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------------------------------------------

LAYOUT = ["musetalkV15/unet.pth", "musetalkV15/musetalk.json", "musetalk/pytorch_model.bin", "musetalk/musetalk.json",
          "sd-vae/config.json", "sd-vae/diffusion_pytorch_model.safetensors", "whisper/config.json",
          "whisper/model.safetensors", "whisper/preprocessor_config.json", "dwpose/dw-ll_ucoco_384.pth",
          "dwpose/dw-ll_ucoco_384.onnx", "face-parse-bisent/79999_iter.pth", "s3fd/s3fd-619a316812.pth"]


def test_manifest_holds_every_file_of_the_layout_with_sources():
    paths = {e.path for e in w.MANIFEST}
    assert set(LAYOUT) <= paths
    for e in w.MANIFEST:
        assert e.sources, e.name
        assert e.format in {"torch", "safetensors", "json", "onnx"}
        assert set(e.sets) <= set(w.SETS)
        for fact in (e.size, e.sha256, e.sha256_prefix):
            assert fact is None or isinstance(fact.verified, bool)
    # the official .bin files are accepted in place of the safetensors we download
    assert w.MANIFEST.get("sd-vae/diffusion_pytorch_model.bin").name == "vae"
    assert w.MANIFEST.get("whisper/pytorch_model.bin").name == "whisper"
    # safetensors where the hub has them
    assert w.MANIFEST.get("vae").sources[0].filename == "diffusion_pytorch_model.safetensors"
    assert w.MANIFEST.get("whisper").sources[0].filename == "model.safetensors"
    # Drive is a fallback for BiSeNet, after the hub
    kinds = [s.kind for s in w.MANIFEST.get("bisenet").sources]
    assert kinds[0] == "hub" and "gdrive" in kinds
    assert w.MANIFEST.get("bisenet").sources[kinds.index("gdrive")].id == "154JgKpzCPW82qINcVieuPH3fZ2e0P812"
    # nothing claims to be verified: no value here was checked against the real files
    assert not any(f.verified for e in w.MANIFEST for f in (e.size, e.sha256, e.sha256_prefix) if f)


def test_manifest_is_read_from_the_packaged_data_file():
    import importlib.resources

    from nbhelpers.weights import manifest as m

    text = (importlib.resources.files("nbhelpers") / "data" / m.DATA_FILE).read_text("utf-8")
    assert json.loads(text)["manifest_version"] == m.MANIFEST_VERSION == 1
    assert tuple(w.MANIFEST) == m._load(text)[0] and len(w.MANIFEST) == 18
    assert [e.name for e in w.MANIFEST][:4] == ["unet-v15", "unet-v15-config", "vae-config", "vae"]
    assert list(w.SETS) == ["core", "faces", "faces-onnx", "faces-mmpose", "parsing", "s3fd", "v1", "syncnet",
                            "quality", "restore-gfpgan", "restore-restoreformer", "restore-codeformer"]
    assert w.DEFAULT_SETS == ("core", "faces", "parsing", "s3fd") and set(w.MANIFEST.sets) == set(w.SETS)
    hub = w.Source("hub", repo="TMElyralab/MuseTalk", filename="musetalkV15/unet.pth")
    assert w.MANIFEST.get("musetalkV15/unet.pth") == w.WeightFile(
        "unet-v15", "musetalkV15/unet.pth", ("core",), "torch", (hub, dataclasses.replace(hub, endpoint=m.HF_MIRROR)),
        sha256=w.Fact("7ebf6c98c181e20838e4c0054e96e944ac60d5d692cc01db42839fe11b787007", False, "a third-party page"),
        approx_bytes=3_399_791_376, cited="download_weights.sh:22-24, unet.py:44-45",
        description="MuseTalk 1.5 UNet, torch.save of a plain diffusers UNet2DConditionModel state dict "
                    "(849.9 M float32 values)")
    s3fd = w.MANIFEST.get("s3fd")
    assert s3fd.sources == (w.Source("url", url="https://www.adrianbulat.com/downloads/python-fan/s3fd-619a316812.pth"),)
    assert (s3fd.sha256_prefix.value, s3fd.size, s3fd.approx_bytes) == ("619a316812", None, 89_840_000)
    assert [s.kind for s in w.MANIFEST.get("bisenet").sources] == ["hub", "gdrive", "hub"]
    assert w.MANIFEST.get("unet-v1-config").sources[-1] == w.Source("bundled", resource="musetalkV15-unet.json")
    assert {s.endpoint for e in w.MANIFEST for s in e.sources} == {None, m.HF_MIRROR}
    assert all(hash(e) for e in w.MANIFEST)  # tuples, not lists: the frozen entries hash


def test_the_manifest_loader_refuses_another_version_an_unknown_key_or_set():
    from nbhelpers.weights import manifest as m

    one = {"name": "a", "path": "a.json", "sets": ["core"], "format": "json", "sources": [{"kind": "url", "url": "u"}]}
    good = {"manifest_version": 1, "sets": {"core": "c"}, "default_sets": ["core"], "files": [one]}
    entry = w.WeightFile("a", "a.json", ("core",), "json", (w.Source("url", url="u"),))
    assert m._load(json.dumps(good)) == ((entry,), {"core": "c"}, ("core",))
    with pytest.raises(ValueError, match="manifest_version 2"):
        m._load(json.dumps({**good, "manifest_version": 2}))
    with pytest.raises(TypeError, match="sizes"):
        m._load(json.dumps({**good, "files": [{**one, "sizes": 3}]}))
    with pytest.raises(ValueError, match="'faces'"):
        m._load(json.dumps({**good, "default_sets": ["faces"]}))


def test_default_set_is_the_v15_inference_set_of_about_4_2_gb():
    table = w.list_files(None)
    names = {e.name for e in table.entries}
    # DWPose as the official .pth (the dwpose backend, plain torch); the ONNX file is optional (issue 15)
    assert {"unet-v15", "vae", "whisper", "dwpose-mmpose", "bisenet", "s3fd"} <= names
    assert not names & {"unet-v1", "syncnet", "dwpose-onnx"}
    assert w.MANIFEST.get("dwpose/dw-ll_ucoco_384.pth").sources[0].repo == "yzd-v/DWPose"  # download_weights.sh:37-39
    assert 3.9e9 < table.approx_total_bytes < 4.5e9


def test_sets_and_unknown_names():
    assert [e.name for e in w.MANIFEST.select("v1")] == ["unet-v1", "unet-v1-config"]
    assert {e.name for e in w.MANIFEST.select(files=["syncnet", "s3fd/s3fd-619a316812.pth"])} == {"syncnet", "s3fd"}
    assert len(w.MANIFEST.select("all")) == len(w.MANIFEST)
    with pytest.raises(InputError) as err:
        w.download(sets=["cor"])
    assert "'cor'" in str(err.value) and "core" in str(err.value) and "faces-onnx" in str(err.value)
    with pytest.raises(InputError) as err:
        w.verify("/nonexistent", files=["unet-v2"])
    assert "unet-v15" in str(err.value)


def test_list_files_renders_as_text_and_html():
    table = w.list_files()
    text, page = str(table), table._repr_html_()
    assert "musetalkV15/unet.pth" in text and "unverified" in text and "GB" in text
    assert page.startswith("<table") and "hf-mirror.com" in page


def test_required_and_missing_files(tmp_path):
    need = w.required_files("v15")
    assert "musetalkV15/unet.pth" in need and "face-parse-bisent/79999_iter.pth" in need
    assert "musetalk/pytorch_model.bin" in w.required_files("v1", parsing=False)
    (tmp_path / "whisper").mkdir()
    (tmp_path / "whisper" / "pytorch_model.bin").write_bytes(b"x")
    missing = w.missing_files(tmp_path, need)
    assert "whisper/model.safetensors" not in missing  # the official .bin stands in for it
    assert "musetalkV15/unet.pth" in missing


def test_default_dir_order(monkeypatch, tmp_path):
    monkeypatch.setenv("NBHELPERS_WEIGHTS", str(tmp_path / "shared"))
    assert w.default_dir() == tmp_path / "shared"
    monkeypatch.delenv("NBHELPERS_WEIGHTS")
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert w.default_dir() == tmp_path / "cache" / "musetalk-workbook" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert w.default_dir() == tmp_path / "home" / ".cache" / "musetalk-workbook" / "models"
    # On Colab, a Drive folder is used only once it holds weights
    drive = tmp_path / "drive" / "models"
    monkeypatch.setattr("nbhelpers.weights.manifest.DRIVE_DIR", drive)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab")
    drive.mkdir(parents=True)
    assert w.default_dir() == tmp_path / "home" / ".cache" / "musetalk-workbook" / "models"
    (drive / "sd-vae").mkdir()
    (drive / "sd-vae" / "config.json").write_text("{}")
    assert w.default_dir() == drive
    monkeypatch.setenv("NBHELPERS_WEIGHTS", str(tmp_path / "mine"))
    assert w.default_dir() == tmp_path / "mine"


# ---------------------------------------------------------------------------------------------------------------
# Looking inside files and verify()
# ---------------------------------------------------------------------------------------------------------------

def test_inspect_detects_each_kind_of_bad_file(tmp_path):
    def put(name, data):
        p = tmp_path / name
        p.write_bytes(data)
        return p

    good_zip = make_torch_zip(5000)
    good_st = make_safetensors(1000)
    good_onnx = make_onnx(3000)
    cases = {
        ("a.pth", good_zip): w.OK,
        ("b.pth", good_zip[: len(good_zip) // 2]): w.TRUNCATED,
        ("c.pth", good_zip[:-10]): w.TRUNCATED,
        ("d.pth", HTML): w.HTML_PAGE,
        ("e.pth", LFS): w.LFS_POINTER,
        ("f.pth", b"\x00" * 100): w.CORRUPT,
        ("g.safetensors", good_st): w.OK,
        ("h.safetensors", good_st[:-1]): w.TRUNCATED,
        ("i.safetensors", good_st[:20]): w.TRUNCATED,
        ("j.safetensors", good_st + b"\x00"): w.CORRUPT,
        ("k.json", b'{"a": [1, 2]}'): w.OK,
        ("l.json", b'{"a": [1, 2'): w.TRUNCATED,
        ("m.onnx", good_onnx): w.OK,
        ("n.onnx", good_onnx[:-1]): w.TRUNCATED,
        ("o.bin", b""): w.TRUNCATED,
        ("p.json", HTML): w.HTML_PAGE,
        ("q.safetensors", LFS): w.LFS_POINTER,
    }
    for (name, data), want in cases.items():
        got = w.inspect_file(put(name, data))
        assert got.state == want, (name, got)
    assert "3400000000" in w.inspect_file(tmp_path / "e.pth").detail  # the pointer says what the real file is
    assert "Virus scan warning" in w.inspect_file(tmp_path / "d.pth").detail


def test_verify_names_the_bad_file_and_the_fix(tmp_path):
    manifest = w.Manifest([
        entry("good", "a/good.safetensors", "safetensors"),
        entry("page", "a/page.pth", "torch", (w.Source("hub", repo="o/r", filename="page.pth"),)),
        entry("pointer", "a/pointer.pth", "torch"),
        entry("cut", "a/cut.pth", "torch"),
        entry("sized", "a/sized.safetensors", "safetensors", size=w.Fact(123, True, "test")),
        entry("guess", "a/guess.safetensors", "safetensors", size=w.Fact(5, False, "a guess")),
        entry("absent", "a/absent.json", "json"),
        entry("blob", "a/blob.dat", "other"),
    ])
    (tmp_path / "a").mkdir()
    (tmp_path / "a/good.safetensors").write_bytes(make_safetensors(10))
    (tmp_path / "a/page.pth").write_bytes(HTML)
    (tmp_path / "a/pointer.pth").write_bytes(LFS)
    (tmp_path / "a/cut.pth").write_bytes(make_torch_zip(4000)[:3000])
    (tmp_path / "a/sized.safetensors").write_bytes(make_safetensors(10))
    (tmp_path / "a/guess.safetensors").write_bytes(make_safetensors(10))
    (tmp_path / "a/blob.dat").write_bytes(b"whatever")
    report = w.verify(tmp_path, sets="core", manifest=manifest)
    states = {c.name: c.state for c in report.checks}
    assert states == {"good": w.OK, "page": w.HTML_PAGE, "pointer": w.LFS_POINTER, "cut": w.TRUNCATED,
                      "sized": w.WRONG_SIZE, "guess": w.OK, "absent": w.MISSING, "blob": w.UNVERIFIABLE}
    assert not report.ok
    assert {c.name for c in report.problems} == {"page", "pointer", "cut", "sized", "absent"}
    by = {c.name: c for c in report.checks}
    assert "python -m nbhelpers download" in by["absent"].fix
    assert "https://huggingface.co/o/r/resolve/main/page.pth" in by["page"].fix
    assert "git-lfs" in by["pointer"].fix
    assert by["guess"].expected == "5 B (unverified)"  # shown, but never turned into a mismatch
    text, page = str(report), report._repr_html_()
    assert "a/page.pth" in text and "HTML page" in text and "<table" in page
    with pytest.raises(WeightsError) as err:
        report.raise_for_problems()
    assert "a/cut.pth" in str(err.value) and "truncated" in str(err.value)


def test_verify_deep_hashes_once_and_never_reports_a_false_mismatch(tmp_path, monkeypatch):
    data = make_safetensors(100)
    good = hashlib.sha256(data).hexdigest()
    manifest = w.Manifest([
        entry("known", "known.safetensors", "safetensors", sha256=w.Fact(good, True, "test")),
        entry("wrong", "wrong.safetensors", "safetensors", sha256=w.Fact("0" * 64, True, "test")),
        entry("rumour", "rumour.safetensors", "safetensors", sha256=w.Fact("1" * 64, False, "a blog")),
    ])
    for name in ("known", "wrong", "rumour"):
        (tmp_path / f"{name}.safetensors").write_bytes(data)
    calls = []
    real = sha256_file
    monkeypatch.setattr("nbhelpers.weights.verification.sha256_file",
                        lambda p, desc=None: calls.append(Path(p).name) or real(p, desc))
    shallow = w.verify(tmp_path, sets="core", manifest=manifest)
    assert calls == [] and all(c.state == w.OK for c in shallow.checks)
    deep = w.verify(tmp_path, sets="core", deep=True, manifest=manifest)
    states = {c.name: c.state for c in deep.checks}
    assert states == {"known": w.OK, "wrong": w.HASH_MISMATCH, "rumour": w.OK}
    assert "differs from the unverified value" in {c.name: c for c in deep.checks}["rumour"].detail
    assert sorted(calls) == ["known.safetensors", "rumour.safetensors", "wrong.safetensors"]
    w.verify(tmp_path, sets="core", deep=True, manifest=manifest)
    assert len(calls) == 3  # cached by (size, mtime) in .nbhelpers-weights.json
    os.utime(tmp_path / "known.safetensors", ns=(1, 1))
    w.verify(tmp_path, sets="core", deep=True, manifest=manifest)
    assert calls[3:] == ["known.safetensors"]  # a changed file is hashed again


def test_python_m_weights_runs_the_weights_command_line():
    proc = subprocess.run([sys.executable, "-m", "nbhelpers.weights", "--help"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "list" in proc.stdout and "download" in proc.stdout and "verify" in proc.stdout


def test_verify_of_a_read_only_folder_still_works(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    data = b'{"a": 1}'
    (folder / "c.json").write_bytes(data)
    manifest = w.Manifest([entry("c", "c.json", "json", sha256=w.Fact(hashlib.sha256(data).hexdigest(), True))])
    os.chmod(folder, 0o555)
    try:
        report = w.verify(folder, sets="core", deep=True, manifest=manifest)  # the hash cache cannot be saved
        assert report.ok and report.checks[0].state == w.OK and "sha256 matches" in report.checks[0].detail
    finally:
        os.chmod(folder, 0o755)


def test_verify_default_checks_the_default_sets_and_present_extras(tmp_path):
    (tmp_path / "musetalk").mkdir()
    (tmp_path / "musetalk" / "musetalk.json").write_text("{}")
    names = [c.name for c in w.verify(tmp_path).checks]
    assert "unet-v15" in names and "unet-v1-config" in names and "unet-v1" not in names and "syncnet" not in names


def test_verify_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "w" / "musetalk").mkdir(parents=True)
    (tmp_path / "w" / "musetalk" / "musetalk.json").write_text("{}")
    report = w.verify("~/w")
    assert report.directory == tmp_path / "w"
    assert [(c.name, c.state) for c in report.checks] == [(c.name, c.state) for c in w.verify(tmp_path / "w").checks]
    assert "unet-v1-config" in [c.name for c in report.checks]  # the present extra was found under ~/w


@pytest.mark.parametrize("reachable", [False, True])
def test_a_drive_connection_error_is_retried_only_where_drive_can_be_reached(tmp_path, monkeypatch, reachable):
    import contextlib
    import socket
    import types

    from nbhelpers.weights import downloads
    from nbhelpers.weights.manifest import Source

    def download(**kwargs):  # what gdown's requests raise when the connection fails
        raise ConnectionError("HTTPSConnectionPool(host='drive.google.com', port=443): Max retries exceeded")

    def connect(address, timeout=None):
        assert address == ("drive.google.com", 443)
        if not reachable:
            raise socket.gaierror(-2, "Name or service not known")
        return contextlib.nullcontext()

    monkeypatch.setitem(sys.modules, "gdown", types.SimpleNamespace(download=download))
    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(downloads, "_HOSTS", {})
    with pytest.raises(Exception) as caught:
        downloads._fetch_gdrive(Source(kind="gdrive", id="abc"), tmp_path, "face-parse-bisent/79999_iter.pth")
    assert downloads._permanent(caught.value) is not reachable  # a dropped connection is tried again
    assert downloads._short(caught.value) == (
        "ConnectionError: HTTPSConnectionPool(host='drive.google.com', port=443): Max retries exceeded" if reachable
        else "drive.google.com cannot be reached from this machine (Name or service not known)")


# ---------------------------------------------------------------------------------------------------------------
# Downloads through the real clients against the fake hub (in a subprocess: HF_ENDPOINT is read at import)
# ---------------------------------------------------------------------------------------------------------------

CHILD = r"""
import dataclasses, json, sys, warnings
from pathlib import Path
spec = json.loads(sys.argv[1])
if spec.get("gdown"):
    import gdown
    def fake_download(*args, output=None, **kwargs):
        if spec["gdown"] == "html":  # Drive's quota page saved under the weight's name
            Path(output).write_bytes(b"<!DOCTYPE html><html><head><title>Quota exceeded</title></head></html>")
            return output
        raise RuntimeError("gdown forced to fail")
    gdown.download = fake_download
from nbhelpers import weights as w
from nbhelpers.errors import WeightsError
def fact(d):
    return None if d is None else w.Fact(**d)
entries = [w.WeightFile(e["name"], e["path"], ("core",), e["format"], tuple(w.Source(**s) for s in e["sources"]),
                        size=fact(e.get("size")), sha256=fact(e.get("sha256"))) for e in spec["entries"]]
manifest = w.Manifest(entries)
out = {}
import huggingface_hub
out["hub_version"] = huggingface_hub.__version__
for i in range(spec.get("calls", 1)):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            report = w.download(spec["dir"], sets="core", manifest=manifest)
            out[f"rows{i}"] = [dataclasses.asdict(r) for r in report.rows]
        except WeightsError as exc:
            out[f"error{i}"] = str(exc)
    out[f"warnings{i}"] = [str(c.message) for c in caught
                           if "nbhelpers" in str(c.filename) or "download" in str(c.message)]
    print("CALL-DONE", i, flush=True)
    if i + 1 < spec.get("calls", 1):
        sys.stdin.readline()  # the parent counts requests between calls
print("RESULT " + json.dumps(out, default=str), flush=True)
"""


def _env(hub: FakeHub, tmp_path: Path, **extra: str) -> dict:
    env = dict(os.environ)
    for key in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_ENABLE_HF_TRANSFER"):
        env.pop(key, None)
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_XET="1", NBHELPERS_PROGRESS="0",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONPATH=os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), str(ROOT)] if p))
    env.update(extra)
    return env


def run_child(hub: FakeHub, tmp_path: Path, spec: dict, between=None, **env: str) -> dict:
    """Run downloads in a fresh interpreter; ``between(i)`` runs in this process after call ``i``."""
    pytest.importorskip("huggingface_hub")
    if spec.get("gdown"):
        pytest.importorskip("gdown")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec)], env=_env(hub, tmp_path, **env),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp_path))
    result = None
    try:
        for line in proc.stdout:
            if line.startswith("CALL-DONE"):
                i = int(line.split()[1])
                if i + 1 < spec.get("calls", 1):
                    if between:
                        between(i)
                    proc.stdin.write("\n")
                    proc.stdin.flush()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    assert proc.returncode == 0 and result is not None, stderr
    result["stderr"] = stderr
    return result


def hub_source(repo, filename, endpoint=None):
    return {"kind": "hub", "repo": repo, "filename": filename, "endpoint": endpoint}


UNET = make_torch_zip(24_000_000, seed=1)  # > 10 MiB: the hub client writes (and resumes) in 10 MiB chunks
WHISPER = make_safetensors(60_000, seed=2)
CONFIG = b'{"d_model": 384, "encoder_layers": 4}'
BISENET = make_torch_zip(80_000, seed=3)
ONNX = make_onnx(90_000)
S3FD = make_torch_zip(70_000, seed=4)
VAE = make_safetensors(20_000, seed=5)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    """One download of six files that exercise every path, then a second call; returns what happened."""
    tmp_path = tmp_path_factory.mktemp("hub")
    target = tmp_path / "models"
    with FakeHub() as hub:
        hub.add("org/models", "musetalkV15/unet.pth", UNET)
        hub.add("org/models", "config.json", CONFIG)
        hub.add("org/whisper", "model.safetensors", WHISPER)
        hub.add("org/parse", "79999_iter.pth", BISENET)
        hub.add("org/vae", "diffusion_pytorch_model.safetensors", VAE)
        hub.mirror["s3fd.pth"] = S3FD
        hub.mirror["page.onnx"] = b""
        hub.html.add("page.onnx")
        hub.mirror["dw.onnx"] = ONNX
        hub.cut_once[f"/cdn/{hashlib.sha256(UNET).hexdigest()}"] = 15_000_000  # hub transfer cut mid-file
        hub.cut_once["/mirror/s3fd.pth"] = 30_000  # plain-HTTP transfer cut mid-file
        spec = {"dir": str(target), "calls": 2, "gdown": "fail", "entries": [
            # clean (after a cut): hub, resumed
            {"name": "unet", "path": "musetalkV15/unet.pth", "format": "torch",
             "sources": [hub_source("org/models", "musetalkV15/unet.pth")]},
            # the hub file name differs from the layout path
            {"name": "whisper", "path": "whisper/model.safetensors", "format": "safetensors",
             "sources": [hub_source("org/whisper", "model.safetensors")]},
            {"name": "whisper-config", "path": "whisper/config.json", "format": "json",
             "sources": [hub_source("org/models", "config.json")]},
            # 401 (no such repo), then 404 (no such file), then the second hub repository answers
            {"name": "vae", "path": "sd-vae/diffusion_pytorch_model.safetensors", "format": "safetensors",
             "sources": [hub_source("org/nope", "diffusion_pytorch_model.safetensors"),
                         hub_source("org/models", "diffusion_pytorch_model.safetensors"),
                         hub_source("org/vae", "diffusion_pytorch_model.safetensors")]},
            # Drive fails, the hub answers
            {"name": "bisenet", "path": "face-parse-bisent/79999_iter.pth", "format": "torch",
             "sources": [{"kind": "gdrive", "id": "154JgKpzCPW82qINcVieuPH3fZ2e0P812"},
                         hub_source("org/parse", "79999_iter.pth")]},
            # a plain-HTTP mirror cut mid-file, resumed with a Range request
            {"name": "s3fd", "path": "s3fd/s3fd-619a316812.pth", "format": "torch",
             "sources": [{"kind": "url", "url": f"{hub.url}/mirror/s3fd.pth"}]},
            # a mirror that answers with a web page, then one that works
            {"name": "dwpose-onnx", "path": "dwpose/dw-ll_ucoco_384.onnx", "format": "onnx",
             "sources": [{"kind": "url", "url": f"{hub.url}/mirror/page.onnx"},
                         {"kind": "url", "url": f"{hub.url}/mirror/dw.onnx"}]},
        ]}
        counts = {}

        def between(i):
            counts["after_first"] = len(hub.requests)

        result = run_child(hub, tmp_path, spec, between=between)
        counts["after_second"] = len(hub.requests)
        requests = list(hub.requests)
    return {"result": result, "dir": target, "requests": requests, "counts": counts}


def _rows(run, i=0):
    return {r["name"]: r for r in run["result"][f"rows{i}"]}


def test_clean_download_lands_in_the_official_layout(main_run):
    rows = _rows(main_run)
    assert all(r["action"] == "downloaded" for r in rows.values()), rows
    d = main_run["dir"]
    assert (d / "musetalkV15/unet.pth").read_bytes() == UNET
    assert (d / "whisper/model.safetensors").read_bytes() == WHISPER  # hub name model.safetensors -> whisper/
    assert (d / "whisper/config.json").read_bytes() == CONFIG
    assert (d / "s3fd/s3fd-619a316812.pth").read_bytes() == S3FD
    assert (d / "dwpose/dw-ll_ucoco_384.onnx").read_bytes() == ONNX
    assert not (d / w.STAGING_DIR).exists()  # partial files cleaned up after success
    assert "sha256 matches" in rows["whisper"]["note"]  # checked against the hub's LFS oid
    state = json.loads((d / w.STATE_FILE).read_text())["files"]
    assert state["musetalkV15/unet.pth"]["expected_sha256"] == hashlib.sha256(UNET).hexdigest()
    assert state["musetalkV15/unet.pth"]["expected_size"] == len(UNET)
    report = w.verify(d, sets="core", deep=True, manifest=w.Manifest(
        [entry(n, p, f) for n, p, f in [("unet", "musetalkV15/unet.pth", "torch"),
                                        ("whisper", "whisper/model.safetensors", "safetensors")]]))
    assert report.ok and all("sha256 matches (hub" in c.detail for c in report.checks), str(report)


def test_a_cut_hub_transfer_is_resumed_with_a_range_request(main_run):
    cdn = f"/cdn/{hashlib.sha256(UNET).hexdigest()}"
    gets = [r for r in main_run["requests"] if r["method"] == "GET" and r["path"] == cdn]
    assert len(gets) >= 2
    starts = [int(r["range"].split("=")[1].split("-")[0]) for r in gets if r["range"]]
    assert starts and max(starts) > 0, gets  # resumed, not restarted
    assert (main_run["dir"] / "musetalkV15/unet.pth").read_bytes() == UNET


def test_a_cut_mirror_transfer_is_resumed_with_a_range_request(main_run):
    gets = [r for r in main_run["requests"] if r["method"] == "GET" and r["path"] == "/mirror/s3fd.pth"]
    assert len(gets) == 2 and gets[0]["range"] is None and gets[1]["range"] == "bytes=30000-"


def test_404_falls_back_to_the_next_source_without_retrying_it(main_run):
    row = _rows(main_run)["vae"]
    assert row["action"] == "downloaded" and "org/vae" in row["source"]
    assert "RepositoryNotFound" in row["note"] and "EntryNotFound" in row["note"]
    tries = [r for r in main_run["requests"] if r["method"] == "HEAD"
             and r["path"].endswith("/org/models/resolve/main/diffusion_pytorch_model.safetensors")]
    assert 1 <= len(tries) <= 2  # one try (our HEAD, perhaps the client's), no retries of a 404


def test_drive_failure_falls_back_to_the_hub(main_run):
    row = _rows(main_run)["bisenet"]
    assert row["action"] == "downloaded" and "org/parse" in row["source"]
    assert "Google Drive" in row["note"] and "gdown forced to fail" in row["note"]
    assert (main_run["dir"] / "face-parse-bisent/79999_iter.pth").read_bytes() == BISENET


def test_a_web_page_from_a_mirror_is_refused(main_run):
    row = _rows(main_run)["dwpose-onnx"]
    assert row["source"].endswith("/mirror/dw.onnx") and "web page" in row["note"]


def test_a_second_call_verifies_and_downloads_nothing(main_run):
    rows = _rows(main_run, 1)
    assert all(r["action"] == "present" for r in rows.values()), rows
    assert main_run["counts"]["after_second"] == main_run["counts"]["after_first"]  # not one request


def _one_entry_spec(target, sources, fmt="torch", path="musetalkV15/unet.pth", **kw):
    return {"dir": str(target), "entries": [{"name": "unet", "path": path, "format": fmt, "sources": sources, **kw}]}


def test_every_source_failing_names_the_file_and_leaves_nothing_in_place(tmp_path):
    with FakeHub() as hub:
        hub.add("org/models", "musetalkV15/unet.pth", UNET)
        hub.mirror["unet.pth"] = UNET
        spec = _one_entry_spec(tmp_path / "models", [hub_source("org/models", "musetalkV15/unet.pth"),
                                                     {"kind": "url", "url": f"{hub.url}/mirror/unet.pth"}],
                               sha256={"value": "0" * 64, "verified": True, "source": "test"})
        result = run_child(hub, tmp_path, spec)
    error = result["error0"]
    assert "musetalkV15/unet.pth" in error and "rejected" in error and "sha256" in error
    assert f"{hub.url}/org/models/resolve/main/musetalkV15/unet.pth" in error  # the manual route
    assert "HF_ENDPOINT=https://hf-mirror.com" in error
    assert not (tmp_path / "models" / "musetalkV15" / "unet.pth").exists()


def test_drive_quota_page_is_refused_and_the_next_source_used(tmp_path):
    with FakeHub() as hub:
        hub.add("org/parse", "79999_iter.pth", BISENET)
        spec = _one_entry_spec(tmp_path / "models", [{"kind": "gdrive", "id": "abc"},
                                                     hub_source("org/parse", "79999_iter.pth")],
                               path="face-parse-bisent/79999_iter.pth")
        spec["gdown"] = "html"
        result = run_child(hub, tmp_path, spec)
    row = result["rows0"][0]
    assert row["action"] == "downloaded" and "HTML page" in row["note"]
    assert (tmp_path / "models/face-parse-bisent/79999_iter.pth").read_bytes() == BISENET


def test_a_bad_present_file_is_replaced_with_a_warning(tmp_path):
    target = tmp_path / "models"
    (target / "musetalkV15").mkdir(parents=True)
    (target / "musetalkV15" / "unet.pth").write_bytes(LFS)
    with FakeHub() as hub:
        hub.add("org/models", "musetalkV15/unet.pth", UNET)
        result = run_child(hub, tmp_path, _one_entry_spec(target, [hub_source("org/models", "musetalkV15/unet.pth")]))
    assert result["rows0"][0]["action"] == "replaced"
    assert any("git-lfs pointer" in m for m in result["warnings0"]), result["warnings0"]
    assert (target / "musetalkV15" / "unet.pth").read_bytes() == UNET


def test_offline_mode_tries_no_network_source_but_bundled_configs_work(tmp_path):
    with FakeHub() as hub:
        hub.add("org/models", "musetalkV15/musetalk.json", CONFIG)
        spec = {"dir": str(tmp_path / "models"), "entries": [
            {"name": "cfg", "path": "musetalkV15/musetalk.json", "format": "json",
             "sources": [hub_source("org/models", "musetalkV15/musetalk.json"),
                         {"kind": "bundled", "resource": "musetalkV15-unet.json"}]},
            {"name": "unet", "path": "musetalkV15/unet.pth", "format": "torch",
             "sources": [hub_source("org/models", "musetalkV15/unet.pth")]}]}
        result = run_child(hub, tmp_path, spec, HF_HUB_OFFLINE="1")
        assert hub.requests == []
        assert "HF_HUB_OFFLINE" in result["error0"] and "musetalkV15/unet.pth" in result["error0"]
        # the UNet failed, so the config copied from the package is not left alone in the folder (verify counted
        # "9 problems in 10 files" after a failed download)
        assert not (tmp_path / "models/musetalkV15/musetalk.json").exists()
        spec["entries"] = spec["entries"][:1]
        result = run_child(hub, tmp_path, spec, HF_HUB_OFFLINE="1")
        assert hub.requests == [] and result["rows0"][0]["action"] == "downloaded"
    bundled = json.loads((tmp_path / "models/musetalkV15/musetalk.json").read_text())
    assert bundled["cross_attention_dim"] == 384 and bundled["in_channels"] == 8


def test_a_failed_download_leaves_no_empty_folder_it_made(tmp_path, monkeypatch):
    """Drive answers nothing (no network): neither the staging folder of that source nor the folder of the config
    copied from the package and not kept stays behind; a folder that was there does."""
    import types

    monkeypatch.setitem(sys.modules, "gdown", types.SimpleNamespace(download=lambda **kw: None))
    monkeypatch.setattr("nbhelpers.weights.downloads.RETRY_DELAY_S", 0.0)
    root = tmp_path / "models"
    (root / "kept").mkdir(parents=True)
    manifest = w.Manifest([entry("cfg", "musetalkV15/musetalk.json", "json",
                                 [w.Source("bundled", resource="musetalkV15-unet.json")]),
                           entry("unet", "musetalkV15/unet.pth", "torch", [w.Source("gdrive", id="abc")])])
    with pytest.raises(WeightsError, match="gdown could not fetch Drive id abc"):
        w.download(root, sets="core", manifest=manifest)
    assert sorted(p.name for p in root.iterdir()) == sorted(["kept", w.STATE_FILE])


def test_the_token_goes_to_the_hub_and_never_to_a_mirror(tmp_path):
    with FakeHub() as hub:
        hub.add("org/models", "musetalkV15/unet.pth", UNET)
        hub.add("org/models", "config.json", CONFIG)
        spec = {"dir": str(tmp_path / "models"), "entries": [
            {"name": "a", "path": "a/unet.pth", "format": "torch",
             "sources": [hub_source("org/models", "musetalkV15/unet.pth")]},
            {"name": "b", "path": "b/config.json", "format": "json",
             "sources": [hub_source("org/models", "config.json", endpoint=hub.cdn)]}]}
        result = run_child(hub, tmp_path, spec, HF_TOKEN="hf_" + "x" * 34)
        requests = list(hub.requests)
    assert all(r["action"] == "downloaded" for r in result["rows0"]), result
    hub_calls = [r for r in requests if r["host"].startswith("127.0.0.1") and "/resolve/" in r["path"]]
    mirror_calls = [r for r in requests if r["host"].startswith("localhost") and "/resolve/" in r["path"]]
    assert hub_calls and all(r["auth"] for r in hub_calls)
    assert mirror_calls and not any(r["auth"] for r in mirror_calls)


def test_unwritable_folder_is_a_clear_error(tmp_path):
    (tmp_path / "a-file").write_text("x")
    folder = tmp_path / "a-file" / "models"  # cannot be created, even by root
    with pytest.raises(WeightsError) as err:
        w.download(folder, files=["vae-config"])
    assert "cannot write" in str(err.value) and "NBHELPERS_WEIGHTS" in str(err.value)
    assert "sd-vae/config.json" in str(err.value)


def test_download_report_renders(tmp_path):
    rows = (w.DownloadRow("vae", "sd-vae/x", "downloaded", "hub a/b@main", 1234, 0.5, "ok"),
            w.DownloadRow("s3fd", "s3fd/y", "failed", "", None, 2.0, "URL: 404"))
    report = w.DownloadReport(tmp_path, rows)
    assert not report.ok and report.failed == (rows[1],) and report.downloaded_bytes == 1234
    assert "1 fetched" in str(report) and "<table" in report._repr_html_()
    assert dataclasses.asdict(rows[0])["action"] == "downloaded"


def test_the_child_runs_the_installed_huggingface_hub(main_run):
    import importlib.metadata

    assert main_run["result"]["hub_version"] == importlib.metadata.version("huggingface_hub")


def test_no_real_file_is_downloaded_into_a_folder_of_tiny_weights(tmp_path, monkeypatch):
    """A folder marked tiny.json holds random weights; a real file put beside them would be loaded with them. The
    refusal comes before any file is fetched or copied, and says when NBHELPERS_WEIGHTS is what named the folder."""
    root = tmp_path / "tiny"
    root.mkdir()
    (root / w.TINY_MARKER).write_text("{}")
    with pytest.raises(InputError, match=r"holds tiny random test weights .* 1 real weight file will not be "
                                         r"downloaded into it") as caught:
        w.download(root, files=["vae-config"])  # a bundled file: nothing would stop its copy but the check
    assert "NBHELPERS_WEIGHTS names" not in str(caught.value)
    monkeypatch.setenv(w.ENV_VAR, str(root))
    with pytest.raises(InputError, match="NBHELPERS_WEIGHTS names the tiny folder now"):
        w.download(None, files=["vae-config"])
    assert sorted(p.name for p in root.iterdir()) == [w.TINY_MARKER]
