"""nbhelpers.models and nbhelpers.testing: strict loaders over checkpoints written in the official formats."""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REFERENCE

torch = pytest.importorskip("torch")

from nbhelpers import models, testing, weights  # noqa: E402
from nbhelpers.errors import CheckpointError, InputError, WeightsError  # noqa: E402
from nbhelpers.testing import make_tiny_weights  # noqa: E402
from nbhelpers.weights import verification  # noqa: E402

HTML = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Sign in to continue</body></html>"
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"b" * 64 + b"\nsize 3400000000\n"
CORE = ["musetalkV15", "sd-vae", "whisper"]


@pytest.fixture
def core_copy(tiny_weights, tmp_path):
    """A private copy of the tiny core models (UNet, VAE, whisper) that a test may damage."""
    out = tmp_path / "models"
    for folder in CORE:
        shutil.copytree(tiny_weights / folder, out / folder)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Positional encoding
# ---------------------------------------------------------------------------------------------------------------

def test_positional_encoding_known_answers():
    pe = models.PositionalEncoding()
    assert pe.pe.shape == (1, 5000, 384) and pe.pe.dtype == torch.float32
    i = np.arange(192, dtype=np.float64)
    for pos in (0, 1, 7, 49):
        angle = pos * np.exp(-2 * i * math.log(10000.0) / 384)
        np.testing.assert_allclose(pe.pe[0, pos, 0::2].numpy(), np.sin(angle), atol=3e-5)  # float32 angles up to 49 rad
        np.testing.assert_allclose(pe.pe[0, pos, 1::2].numpy(), np.cos(angle), atol=3e-5)
    pos = 4999  # float32 angles of ~5000 rad round to ~2e-4; still the same function
    angle = pos * np.exp(-2 * i * math.log(10000.0) / 384)
    np.testing.assert_allclose(pe.pe[0, pos, 0::2].numpy(), np.sin(angle), atol=1e-3)
    x = torch.randn(2, 50, 384)
    torch.testing.assert_close(pe(x), x + pe.pe[:, :50])
    half = pe(x.half())
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, (x.half() + pe.pe[:, :50].half()))
    with pytest.raises(InputError):
        pe(torch.zeros(1, 5001, 384))
    assert dict(pe.named_buffers())["pe"] is pe.pe


# ---------------------------------------------------------------------------------------------------------------
# UNet architecture and config
# ---------------------------------------------------------------------------------------------------------------

def test_bundled_configs_equal_the_reference():
    if not REFERENCE.is_dir():
        pytest.skip(f"reference folder not found at {REFERENCE}")
    for name in ("musetalkV15-unet.json", "sd-vae-ft-mse.json", "whisper-tiny.json",
                 "whisper-tiny-preprocessor.json"):
        assert models.bundled_config(name) == json.loads((REFERENCE / "configs" / name).read_text())
    assert models.unet_config("v1") == models.unet_config("v15")
    with pytest.raises(InputError):
        models.unet_config("v2")
    with pytest.raises(InputError, match="available"):
        models.bundled_config("nope.json")


def test_unet_from_the_real_config_has_exactly_the_official_keys_and_shapes():
    path = REFERENCE / "checkpoints" / "musetalk-unet.keys.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    official = json.loads(path.read_text())
    unet = models.build_unet("v15", device="meta")
    ours = {k: list(v.shape) for k, v in unet.state_dict().items()}
    assert ours == official
    assert sum(math.prod(s) for s in ours.values()) == 849_947_844
    assert all(p.is_meta for p in unet.parameters())  # nothing was allocated


def test_tiny_unet_keeps_the_block_types():
    real, tiny = models.unet_config("v15"), testing.tiny_unet_config()
    assert tiny["block_out_channels"] == [32, 64, 64, 64]
    for key in ("down_block_types", "up_block_types", "in_channels", "out_channels", "cross_attention_dim",
                "attention_head_dim", "layers_per_block"):
        assert tiny[key] == real[key]


# ---------------------------------------------------------------------------------------------------------------
# The tiny tree and the loaders
# ---------------------------------------------------------------------------------------------------------------

def test_tiny_tree_has_the_official_layout_and_loads(tiny_weights):
    for rel in ["musetalkV15/unet.pth", "musetalkV15/musetalk.json", "sd-vae/config.json",
                "sd-vae/diffusion_pytorch_model.safetensors", "whisper/config.json", "whisper/model.safetensors",
                "whisper/preprocessor_config.json", "tiny.json"]:
        assert (tiny_weights / rel).is_file(), rel
    marker = json.loads((tiny_weights / "tiny.json").read_text())
    assert {"unet", "vae", "whisper"} <= set(marker["writers"]) and marker["versions"] == ["v15"]
    assert weights.is_tiny(tiny_weights)
    assert json.loads((tiny_weights / "whisper/preprocessor_config.json").read_text()) == \
        models.bundled_config("whisper-tiny-preprocessor.json")
    # the UNet file is a plain state dict, exactly what torch.save(unet.state_dict()) gives
    state = torch.load(tiny_weights / "musetalkV15/unet.pth", map_location="cpu", weights_only=True)
    assert isinstance(state, dict) and "conv_in.weight" in state and state["conv_in.weight"].shape == (32, 8, 3, 3)

    m = models.load_models(tiny_weights)
    assert m.tiny and m.version == "v15" and m.dtype == torch.float32 and m.device == torch.device("cpu")
    for module in (m.unet, m.vae, m.whisper, m.pe):
        assert not module.training
        assert not any(p.requires_grad for p in module.parameters())
    torch.testing.assert_close(m.unet.state_dict()["conv_in.weight"], state["conv_in.weight"])
    with torch.no_grad():
        out = m.unet(torch.randn(2, 8, 32, 32), torch.tensor([0]), encoder_hidden_states=m.pe(torch.randn(2, 50, 384)))
        assert out.sample.shape == (2, 4, 32, 32)
        latent = m.vae.encode(torch.rand(1, 3, 256, 256) * 2 - 1).latent_dist.mean
        assert latent.shape == (1, 4, 32, 32)
        assert m.vae.decode(latent).sample.shape == (1, 3, 256, 256)
        mel = m.feature_extractor(np.zeros(16000, np.float32), sampling_rate=16000, return_tensors="pt")
        assert mel["input_features"].shape == (1, 80, 3000)
        hidden = m.whisper.encoder(mel["input_features"], output_hidden_states=True).hidden_states
        assert len(hidden) == 5 and all(h.shape == (1, 1500, 384) for h in hidden)
    assert "tiny" in repr(m)


def test_legacy_vae_attention_names_are_converted(tiny_weights):
    from safetensors.torch import load_file

    stored = load_file(tiny_weights / "sd-vae/diffusion_pytorch_model.safetensors")
    assert "encoder.mid_block.attentions.0.query.weight" in stored  # as the 2022 checkpoint
    vae = models.load_vae(tiny_weights)
    torch.testing.assert_close(vae.state_dict()["encoder.mid_block.attentions.0.to_q.weight"],
                               stored["encoder.mid_block.attentions.0.query.weight"])


def test_official_bin_files_load_in_place_of_safetensors(core_copy):
    from safetensors.torch import load_file

    for folder, name in (("sd-vae", "diffusion_pytorch_model"), ("whisper", "model")):
        st = core_copy / folder / f"{name}.safetensors"
        binary = core_copy / folder / ("pytorch_model.bin" if folder == "whisper" else f"{name}.bin")
        torch.save(load_file(st), binary)
        st.unlink()
    assert weights.verify(core_copy, sets="core").ok
    m = models.load_models(core_copy)
    assert m.vae.state_dict()["decoder.conv_out.weight"].shape[0] == 3
    assert len(m.whisper.encoder.layers) == 4


def test_dtype_and_device_are_applied_to_every_model(tiny_weights):
    m = models.load_models(tiny_weights, dtype=torch.bfloat16)
    for module in (m.unet, m.vae, m.whisper, m.pe):
        assert {p.dtype for p in [*module.parameters(), *module.buffers()] if p.is_floating_point()} == \
            {torch.bfloat16}
    with pytest.raises(InputError):
        models.load_models(tiny_weights, dtype=torch.int8)
    with pytest.raises(InputError):
        models.load_models(tiny_weights, version="v2")


def test_unet_is_memory_mapped_and_assigned(core_copy, monkeypatch):
    calls = []
    real = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    unet = models.load_unet(core_copy)
    assert calls[0]["mmap"] is True and calls[0]["weights_only"] is True and calls[0]["map_location"] == "cpu"
    assert not any(p.is_meta for p in unet.parameters())


def test_tiny_weights_are_deterministic_and_versions_differ(tmp_path):
    core = ("unet", "vae", "whisper")
    a = make_tiny_weights(tmp_path / "a", versions=("v15", "v1"), writers=core)
    b = make_tiny_weights(tmp_path / "b", versions=("v15", "v1"), writers=core)
    for rel in ("musetalkV15/unet.pth", "musetalk/pytorch_model.bin"):
        sa = torch.load(a / rel, weights_only=True)
        sb = torch.load(b / rel, weights_only=True)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for rel in ("sd-vae/diffusion_pytorch_model.safetensors", "whisper/model.safetensors"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    v15 = models.load_unet(a, "v15")
    v1 = models.load_unet(a, "v1")
    assert not torch.equal(v15.conv_in.weight, v1.conv_in.weight)
    assert json.loads((a / "tiny.json").read_text())["versions"] == ["v15", "v1"]
    with pytest.raises(InputError):
        make_tiny_weights(tmp_path / "c", versions=("v3",))


def test_registered_writers_extend_the_tree(tmp_path, monkeypatch):
    def write_extra(directory):
        Path(directory, "extra").mkdir(exist_ok=True)
        Path(directory, "extra", "x.json").write_text(json.dumps({"r": torch.rand(1).item()}))

    with monkeypatch.context() as patch:
        patch.setitem(testing.WRITERS, "test-extra", write_extra)
        one = make_tiny_weights(tmp_path / "one", writers=["test-extra"])
        two = make_tiny_weights(tmp_path / "two", writers=["test-extra"])
        assert (one / "extra/x.json").read_text() == (two / "extra/x.json").read_text()  # seeded per writer
        assert "test-extra" in json.loads((one / "tiny.json").read_text())["writers"]
    assert "test-extra" not in testing.WRITERS
    with pytest.raises(InputError, match="unet"):
        make_tiny_weights(tmp_path / "three", writers=["test-extra"])


# ---------------------------------------------------------------------------------------------------------------
# Strict loading
# ---------------------------------------------------------------------------------------------------------------

def _rewrite_unet(folder: Path, change) -> Path:
    path = folder / "musetalkV15/unet.pth"
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)
    return path


@pytest.mark.parametrize("damage, key", [
    ("renamed", "conv_in.weight"),
    ("missing", "mid_block.attentions.0.proj_out.bias"),
    ("shape", "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight"),
])
def test_strict_unet_loading_names_the_key_and_the_file(core_copy, damage, key):
    def change(state):
        if damage == "renamed":
            state["conv_in.weights"] = state.pop(key)
        elif damage == "missing":
            del state[key]
        else:
            state[key] = torch.zeros(64, 768)  # a cross-attention input of SD's 768 instead of whisper's 384

    path = _rewrite_unet(core_copy, change)
    with pytest.raises(CheckpointError) as err:
        models.load_unet(core_copy)
    message = str(err.value)
    assert key in message and str(path) in message and "python -m nbhelpers download" in message
    assert "version='v1' use the musetalk/ folder" in message
    if damage == "renamed":
        assert "conv_in.weights" in message and "renamed" in message
    if damage == "shape":
        assert "[64, 768]" in message and "[64, 384]" in message


def test_a_prefixed_or_wrapped_checkpoint_is_explained(core_copy):
    _rewrite_unet(core_copy, lambda s: s.update({f"module.{k}": s.pop(k) for k in list(s)}))
    with pytest.raises(CheckpointError, match="'module.'"):
        models.load_unet(core_copy)
    path = core_copy / "musetalkV15/unet.pth"
    torch.save({"state_dict": {"a": torch.zeros(1)}, "epoch": 3}, path)
    with pytest.raises(CheckpointError, match="wrapper dict"):
        models.load_unet(core_copy)


def test_whisper_missing_key_is_a_checkpoint_error(core_copy):
    from safetensors.torch import load_file, save_file

    path = core_copy / "whisper/model.safetensors"
    state = load_file(path)
    del state["model.encoder.layers.2.fc1.weight"]
    save_file(state, path, metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as err:
        models.load_whisper(core_copy)
    assert "encoder.layers.2.fc1.weight" in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("content, state", [(HTML, weights.HTML_PAGE), (LFS, weights.LFS_POINTER)])
@pytest.mark.parametrize("rel", ["musetalkV15/unet.pth", "sd-vae/diffusion_pytorch_model.safetensors",
                                 "whisper/model.safetensors"])
def test_web_pages_and_lfs_pointers_are_caught_before_unpickling(core_copy, monkeypatch, content, state, rel):
    (core_copy / rel).write_bytes(content)
    report = weights.verify(core_copy, sets="core")
    bad = {c.path: c.state for c in report.problems}
    assert bad.get(rel) == state
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was reached"))
    with pytest.raises(WeightsError) as err:
        models.load_models(core_copy)
    assert not isinstance(err.value, CheckpointError)
    assert rel in str(err.value) and state in str(err.value) and "python -m nbhelpers download" in str(err.value)


def test_missing_files_are_listed_with_the_download_command(core_copy):
    (core_copy / "musetalkV15/unet.pth").unlink()
    shutil.rmtree(core_copy / "whisper")
    with pytest.raises(WeightsError) as err:
        models.load_models(core_copy)
    message = str(err.value)
    for rel in ("musetalkV15/unet.pth", "whisper/config.json", "whisper/model.safetensors",
                "whisper/preprocessor_config.json"):
        assert rel in message
    assert f"python -m nbhelpers download --weights {shlex.quote(str(core_copy))}`" in message  # this folder
    assert "01_weights" in message
    with pytest.raises(WeightsError, match="--sets v1"):
        models.load_unet(core_copy, version="v1")


def test_a_cut_off_checkpoint_is_named(core_copy):
    path = core_copy / "musetalkV15/unet.pth"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(WeightsError, match="truncated"):
        models.load_unet(core_copy)
    assert weights.verify(core_copy, sets="core").problems[0].state == weights.TRUNCATED


# ---------------------------------------------------------------------------------------------------------------
# load_checkpoint: zip and legacy files, weights_only, trust
# ---------------------------------------------------------------------------------------------------------------

def test_legacy_pickle_checkpoints_load_without_mmap_and_truncation_is_found(tmp_path, monkeypatch):
    state = {"conv.weight": torch.randn(4, 3, 3, 3), "bn.num_batches_tracked": torch.tensor(5),
             "half": torch.randn(10).half()}
    path = tmp_path / "old.pth"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    insp = weights.inspect_file(path)
    assert insp.state == weights.OK and insp.container == "legacy-pickle"
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or real(*a, **k))
    loaded = models.load_checkpoint(path)
    assert "mmap" not in calls[0] and calls[0]["weights_only"] is True
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) - 50, 200):
        path.write_bytes(data[:cut])
        assert weights.inspect_file(path).state == weights.TRUNCATED, cut
        with pytest.raises(WeightsError, match="truncated"):
            models.load_checkpoint(path)


def test_pickles_with_objects_load_only_when_trusted(tmp_path):
    import argparse

    path = tmp_path / "mm.pth"
    torch.save({"state_dict": {"w": torch.ones(2)}, "meta": argparse.Namespace(epoch=3)}, path)
    with pytest.raises(WeightsError) as err:
        models.load_checkpoint(path)
    assert "trusted_sha256" in str(err.value) and str(path) in str(err.value)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert models.load_checkpoint(path, trusted_sha256=sha)["meta"].epoch == 3
    assert models.load_checkpoint(path, expected_size=path.stat().st_size)["meta"].epoch == 3
    assert models.load_checkpoint(path, allow_pickle=True)["state_dict"]["w"].sum() == 2
    with pytest.raises(WeightsError, match="sha256"):
        models.load_checkpoint(path, trusted_sha256="0" * 64)
    with pytest.raises(WeightsError, match="bytes"):
        models.load_checkpoint(path, expected_size=12)
    with pytest.raises(WeightsError, match="does not exist"):
        models.load_checkpoint(tmp_path / "nope.pth")


def test_expected_facts_combine_manifest_and_download_records(tmp_path):
    state = verification._State(tmp_path)
    state.record_facts("dwpose/dw-ll_ucoco_384.pth", 123, "c" * 64, "hub yzd-v/DWPose@abc")
    state.save()
    exp = weights.expected_facts(tmp_path, "dwpose-mmpose")
    assert (exp.size, exp.sha256) == (123, "c" * 64) and "hub" in exp.source
    unet = weights.expected_facts(tmp_path, "unet-v15")
    assert unet.sha256 is None and unet.unverified_sha256.startswith("7ebf6c98")


def test_a_library_that_fails_its_lazy_import_gives_one_clear_error(monkeypatch):
    """diffusers installed beside a torchvision of another build fails inside its lazy import with RuntimeError;
    the loader names the cause and what to do, as MissingDependencyError, not a traceback from the library."""
    import types

    from nbhelpers.errors import MissingDependencyError

    class Broken(types.ModuleType):
        def __getattr__(self, name):
            raise RuntimeError("Failed to import diffusers.models.unets\noperator torchvision::nms does not exist")

    monkeypatch.setitem(sys.modules, "diffusers", Broken("diffusers"))
    with pytest.raises(MissingDependencyError, match=r"cannot import UNet2DConditionModel: operator torchvision::nms "
                                                     r"does not exist.*torchvision from another build"):
        models.build_unet("v15")
