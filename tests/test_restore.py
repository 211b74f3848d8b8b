"""Face restoration (nbhelpers.restore, issue 20): each architecture loads through the package's loader from random
weights in its published key layout and format; the restorer's colour order, range, strength and batching; in the
engine, restore=None gives the frames of the engine without restoration bit for bit, and a restorer changes only
pixels under the blend mask.

spandrel imports torchvision when it loads; the test venv's CPU torch has none that imports (docs/environments.md),
so tests/standins/torchvision stands in when no real one imports (normalize implemented, the rest fails loudly)."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import ENGINE_BOX, engine_parts, expected_frame, linked_copy, source_faces

torch = pytest.importorskip("torch")


def _spandrel_importable() -> bool:
    """Import spandrel; with the stand-in torchvision on sys.path only while it imports (spandrel keeps the names it
    took), so that diffusers and transformers, which look for torchvision, never see the stand-in."""
    standin = None
    try:
        importlib.import_module("torchvision")
    except Exception:  # noqa: BLE001 - absent, or a CUDA build beside a CPU torch
        _forget_torchvision()
        standin = str(Path(__file__).parent / "standins")
        sys.path.insert(0, standin)
    try:
        importlib.import_module("spandrel")
        importlib.import_module("spandrel_extra_arches")
    except ImportError:
        return False
    finally:
        if standin is not None:
            sys.path.remove(standin)
            _forget_torchvision()
    return True


def _forget_torchvision() -> None:
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


if not _spandrel_importable():
    pytest.skip("spandrel / spandrel-extra-arches are not installed (tools/dev-test.sh installs them with --no-deps)",
                allow_module_level=True)

from nbhelpers import restore  # noqa: E402
from nbhelpers.config import InferenceConfig  # noqa: E402
from nbhelpers.engine import repaint  # noqa: E402
from nbhelpers.errors import CheckpointError, InputError, NbHelpersWarning, WeightsError  # noqa: E402
from nbhelpers.framestore import cycle_index  # noqa: E402

# Published facts the random files must reproduce:
# - sizes of the released files, bytes (public download listings: GFPGANv1.4.pth 348 MB, codeformer.pth 376 MB;
#   RestoreFormer.pth about 280-290 MB): float32 values x 4 must land within 3 %.
PUBLISHED_MB = {"gfpgan": 348, "restoreformer": 285, "codeformer": 376}
# - keys spandrel detects each architecture by (spandrel 0.4.2 GFPGAN / RestoreFormer / CodeFormer __init__.py), and
#   the shapes the official scripts construct: GFPGANer num_mlp=8 (style_mlp.1..8), 512 px -> 7 toRGB layers
#   (log2(512) - 2); inference_codeformer.py dim_embd=512, codebook_size=1024, n_layers=9, latent 16x16 = 256
#   positions, connect_list 32/64/128/256; GFPGAN's RestoreFormer n_embed=1024, embed_dim=256, ch=64.
SHAPES = {
    "gfpgan": {"stylegan_decoder.style_mlp.1.weight": (512, 512), "stylegan_decoder.style_mlp.15.weight": (512, 512),
               "toRGB.0.bias": (3,), "toRGB.6.bias": (3,)},
    "restoreformer": {"quantize.embedding.weight": (1024, 256), "encoder.conv_in.weight": (64, 3, 3, 3),
                      "quant_conv.weight": (256, 256, 1, 1), "decoder.conv_out.weight": (3, 64, 3, 3)},
    "codeformer": {"position_emb": (256, 512), "idx_pred_layer.1.weight": (1024, 512),
                   "quantize.embedding.weight": (1024, 256), "ft_layers.8.self_attn.in_proj_weight": (1536, 512)},
}
ARCH_ID = {"gfpgan": "GFPGAN", "restoreformer": "RestoreFormer", "codeformer": "CodeFormer"}


@pytest.fixture(autouse=True)
def _quiet_licence():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbHelpersWarning)
        yield


@pytest.mark.parametrize("name", restore.RESTORERS)
def test_published_layout_loads_through_the_package_loader(name, tmp_path):
    path = restore.write_random_weights(tmp_path, name, seed=1)
    assert path == tmp_path / restore._SPECS[name][2]
    saved = torch.load(path, weights_only=True)
    assert list(saved) == ["params_ema"]  # the released container (gfpgan/utils.py, inference_codeformer.py)
    sd = saved["params_ema"]
    values = sum(v.numel() for v in sd.values())
    assert abs(values * 4 / 1e6 - PUBLISHED_MB[name]) / PUBLISHED_MB[name] < 0.03, values
    for key, shape in SHAPES[name].items():
        assert tuple(sd[key].shape) == shape, key
    if name == "gfpgan":
        assert sum(k.startswith("stylegan_decoder.style_mlp.") and k.endswith(".weight") for k in sd) == 8
        assert sum(k.startswith("toRGB.") and k.endswith(".weight") for k in sd) == 7
    if name == "codeformer":
        assert sum(k.startswith("ft_layers.") and k.endswith(".self_attn.in_proj_weight") for k in sd) == 9
        assert {k.split(".")[1] for k in sd if k.startswith("fuse_convs_dict.")} == {"32", "64", "128", "256"}
    del saved

    r = restore.load_restorer(name, tmp_path)
    assert r.descriptor.architecture.id == ARCH_ID[name]
    assert r.dtype == torch.float32 and r.device.type == "cpu"
    loaded = r.descriptor.model.state_dict()
    assert set(loaded) == set(sd)
    for key in ("conv_body_first.weight", "encoder.conv_in.weight", "position_emb"):
        if key in sd:
            assert torch.equal(loaded[key], sd[key])
    assert not any(p.requires_grad for p in r.descriptor.model.parameters())


def test_a_file_of_another_architecture_is_refused_by_name(tmp_path):
    src = restore.write_random_weights(tmp_path / "a", "restoreformer", tiny=True)
    dst = restore.weight_path("gfpgan", tmp_path / "b")
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes())
    with pytest.raises(CheckpointError, match="not a GFPGAN checkpoint"):
        restore.load_restorer("gfpgan", tmp_path / "b")


def test_missing_file_names_the_download_command(tmp_path):
    with pytest.raises(WeightsError, match="--sets restore-codeformer"):
        restore.load_restorer("codeformer", tmp_path)
    with pytest.raises(WeightsError, match="--sets restore-gfpgan"):
        restore.check_available("gfpgan", tmp_path)
    with pytest.raises(InputError, match="restore must be"):
        restore.load_restorer("gpfgan", tmp_path)


def test_config_validates_and_codeformer_warns_about_its_licence(monkeypatch):
    assert InferenceConfig().restore is None
    assert InferenceConfig(restore="gfpgan", restore_strength=0.25).restore_strength == 0.25
    for bad in (dict(restore="GFPGAN"), dict(restore_strength=1.01), dict(restore_strength=-0.1),
                dict(restore_strength=True), dict(restore_strength="1")):
        with pytest.raises(InputError):
            InferenceConfig(**bad)
    monkeypatch.setattr("nbhelpers.config.inference._warned_licence", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        InferenceConfig(restore="codeformer")
        InferenceConfig(restore="codeformer")
        InferenceConfig(restore="gfpgan")
    msgs = [str(w.message) for w in caught if issubclass(w.category, NbHelpersWarning)]
    assert len(msgs) == 1 and "non-commercial" in msgs[0]


# ------------------------------------------------------------------------------------------------------------------
# The Restorer wrapper, with stand-in networks whose answer is known


class DropRed:
    """A descriptor stand-in: RGB [0, 1] in -> the same image with the red channel set to 0 (records its input)."""

    def __init__(self):
        self.seen = []

    def __call__(self, x):
        self.seen.append(x.clone())
        y = x.clone()
        y[:, 0] = 0
        return y


class Invert:
    def __call__(self, x):
        return 1 - x


def stub(descriptor, strength=1.0):
    return restore.Restorer(name="gfpgan", descriptor=descriptor, device=torch.device("cpu"), dtype=torch.float32,
                            strength=strength, reason="test")


def smooth_faces(n=2, seed=0):
    """(n, 256, 256, 3) uint8 BGR faces that resample almost unchanged (smooth gradients + a constant)."""
    yy, xx = np.mgrid[0:256, 0:256].astype(np.float32)
    out = []
    for k in range(n):
        b = 40 + 150 * xx / 255
        g = 60 + 120 * yy / 255 + 10 * k
        r = np.full_like(b, 200.0 - 30 * k)
        out.append(np.stack([b, g, r], -1))
    return torch.from_numpy(np.round(np.stack(out)).astype(np.uint8))


def test_restorer_sends_rgb_0_1_at_512_and_returns_bgr_uint8():
    faces = smooth_faces()
    net = DropRed()
    out = stub(net)(faces)
    assert out.shape == faces.shape and out.dtype == torch.uint8
    x = net.seen[0]
    assert x.shape == (2, 3, 512, 512) and float(x.min()) >= 0 and float(x.max()) <= 1
    # channel 0 of the network's input is red: the BGR faces' channel 2 (200 and 170 everywhere)
    assert torch.allclose(x[:, 0].mean((1, 2)), torch.tensor([200 / 255, 170 / 255]), atol=1e-3)
    assert int(out[..., 2].max()) == 0  # red dropped by the network -> BGR channel 2 is 0
    # blue and green come back through bicubic x2 up and area /2 down: within one level of the input
    assert int((out[..., :2].int() - faces[..., :2].int()).abs().max()) <= 1


def test_strength_blends_and_zero_returns_the_input():
    faces = smooth_faces()
    full = stub(Invert())(faces)
    assert int((full.int() - (255 - faces.int())).abs().max()) <= 1
    assert stub(Invert(), 0.0)(faces) is faces
    half = stub(Invert()).at(0.5)(faces)
    assert int((half.int() * 2 - faces.int() - full.int()).abs().max()) <= 3  # (base + restored) / 2, rounded
    with pytest.raises(InputError, match="restore_strength"):
        stub(Invert()).at(2)
    with pytest.raises(InputError, match="uint8"):
        stub(Invert())(faces.float())


@pytest.mark.slow
def test_tiny_restoreformer_runs_batched_as_one_by_one(tmp_path):
    """The real spandrel path (detection, call_fn with torchvision's normalize, clamp) on a small RestoreFormer:
    a batch of two faces gives what each face gives alone."""
    restore.write_random_weights(tmp_path, "restoreformer", tiny=True, seed=2)
    r = restore.load_restorer("restoreformer", tmp_path)
    assert r.descriptor.architecture.id == "RestoreFormer"
    faces = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (2, 256, 256, 3), dtype=np.uint8))
    torch.set_flush_denormal(True)
    try:
        both = r(faces)
        one = r(faces[1:])
    finally:
        torch.set_flush_denormal(False)
    assert both.shape == faces.shape and both.dtype == torch.uint8
    assert int((both[1:].int() - one.int()).abs().max()) <= 1
    assert float((both.float() - faces.float()).abs().mean()) > 5  # random weights do change the face


# ------------------------------------------------------------------------------------------------------------------
# In the engine

BOX = ENGINE_BOX
N = 4


@pytest.fixture(scope="module")
def parts():
    return engine_parts(N, [0, 1, 3], 6, seed=7, torch_seed=5)  # frame 2 has no face


def frame_mask(parts, shape):
    """(H, W) bool: the frame pixels where the blend mask is > 0 (the mask lives on the expanded square)."""
    _, _, _, materials, _ = parts
    m = materials[0]
    xs, ys, xe, ye = m.square
    out = np.zeros(shape[:2], bool)
    y0, x0, y1, x1 = max(ys, 0), max(xs, 0), min(ye, shape[0]), min(xe, shape[1])
    out[y0:y1, x0:x1] = m.mask[y0 - ys:y1 - ys, x0 - xs:x1 - xs] > 0
    return out


def test_restore_none_is_bit_identical_to_the_engine_without_restoration(parts, tiny_models):
    import dataclasses

    ts = np.arange(6)
    plain, _ = repaint(source_faces(parts), parts[4], tiny_models, ts)
    with_none, _ = repaint(source_faces(parts), parts[4], dataclasses.replace(tiny_models, restorer=None), ts)
    assert np.array_equal(plain, with_none)
    for t in ts:  # one frame per call, as the reference computes it (a batch of 6 rounds differently by <= 1)
        one, _ = repaint(source_faces(parts), parts[4], dataclasses.replace(tiny_models, restorer=None), np.array([t]))
        assert np.array_equal(one[0], expected_frame(parts, tiny_models, int(t))), t


def test_restoration_changes_only_pixels_under_the_blend_mask(parts, tiny_models):
    import dataclasses

    ts = np.arange(6)
    base, faces = repaint(source_faces(parts), parts[4], tiny_models, ts)
    restored, faces_r = repaint(source_faces(parts), parts[4],
                                dataclasses.replace(tiny_models, restorer=stub(Invert())), ts)
    assert faces_r.shape == faces.shape and not torch.equal(faces_r, faces)
    under = frame_mask(parts, base.shape[1:])
    assert under.any() and not under.all()
    for k, t in enumerate(ts):
        j = int(cycle_index(int(t), N))
        diff = (base[k] != restored[k]).any(-1)
        assert not diff[~under].any(), t  # mask == 0: identical to restore=None
        if j in parts[1]:
            assert diff[under].mean() > 0.5, t  # under the mask the inverted face shows
        else:
            assert not diff.any()  # a frame without a face is written unchanged


def test_pipeline_attaches_the_restorer_of_the_config(tiny_weights, tmp_path, lavfi_video, lavfi_tone):
    from nbhelpers.checks import check_inputs
    from nbhelpers.pipeline import MuseTalkPipeline

    root = linked_copy(tiny_weights, tmp_path / "w")
    restore.write_random_weights(root, "restoreformer", tiny=True)
    pipe = MuseTalkPipeline.from_pretrained(root, InferenceConfig(device="cpu"))
    assert pipe.models_for(pipe.config).restorer is None
    cfg = pipe.config.replace(restore="restoreformer", restore_strength=0.5)
    bundle = pipe.models_for(cfg)
    assert bundle.restorer.name == "restoreformer" and bundle.restorer.strength == 0.5
    assert pipe.restorer("restoreformer") is pipe.restorer("restoreformer")  # loaded once
    assert "restorer:restoreformer" in pipe.loaded
    assert pipe.restorer("restoreformer").strength == 1.0  # .at() made a view; the cached one is unchanged
    pipe.release()
    # a job that asks for a restorer whose weights are absent stops in the input check, before any frame decodes
    video, audio = lavfi_video("testsrc", "64x64", frames=1), lavfi_tone(0.2, 220, 44100)
    check_inputs(video, audio, None, config=InferenceConfig(restore="restoreformer"), weights_dir=root)
    with pytest.raises(WeightsError, match="--sets restore-gfpgan"):
        check_inputs(video, audio, None, config=InferenceConfig(restore="gfpgan"), weights_dir=root)


# ------------------------------------------------------------------------------------------------------------------
# Settings panel and the before/after view


@pytest.mark.parametrize("use_widgets", [False, True])
def test_panel_sets_restore_and_strength(use_widgets):
    from nbhelpers import ui

    if use_widgets and not ui.widgets_available():
        pytest.skip("ipywidgets is not installed")
    panel = ui.settings_panel(InferenceConfig(), values={"restore": "gfpgan", "restore_strength": 0.4},
                              use_widgets=use_widgets)
    assert (panel.config.restore, panel.config.restore_strength) == ("gfpgan", 0.4)
    assert dict(panel.rows())["face restoration"] == "GFPGAN v1.4"
    assert not panel.controls["restore_strength"].disabled
    panel.set(restore=None)
    assert panel.config.restore is None and panel.controls["restore_strength"].disabled
    with pytest.raises(InputError, match="restore"):
        ui.settings_panel(InferenceConfig(), values={"restore": "gfpgan2"}, use_widgets=use_widgets)


def test_compare_restore_draws_both_previews():
    from nbhelpers import ui
    from nbhelpers.pipeline import Preview

    frame = np.zeros((120, 110, 3), np.uint8)
    mask = np.zeros((8, 8), np.uint8)

    def preview(face_value):
        return Preview(frame=frame, result=frame, face_256=np.full((256, 256, 3), face_value, np.uint8),
                       crop_box=BOX, landmarks=None, mask=mask, square=(0, 0, 8, 8), audio="test")

    chart = ui.compare_restore(preview(10), preview(200))
    assert len(chart.figure.axes) == 4 and chart.png()[:4] == b"\x89PNG"
    other = Preview(frame=frame, result=frame, face_256=np.zeros((256, 256, 3), np.uint8), crop_box=(0, 0, 50, 50),
                    landmarks=None, mask=mask, square=(0, 0, 8, 8), audio="test")
    with pytest.raises(InputError, match="same frame"):
        ui.compare_restore(preview(10), other)


def test_codeformer_runs_in_float32_on_a_gpu_where_the_others_take_reduced_precision():
    """spandrel marks CodeFormer bf16-safe, but its codebook lookup multiplies a float32 one-hot by the codebook and
    fails in bf16 (seen on the H200): run_dtype keeps it in float32 and says why; fp16-safe networks get fp16."""
    from types import SimpleNamespace

    from nbhelpers.restore import run_dtype

    codeformer = SimpleNamespace(architecture=SimpleNamespace(id="CodeFormer"), supports_half=False,
                                 supports_bfloat16=True)
    dtype, why = run_dtype(codeformer, "cuda", torch.float16)
    assert dtype == torch.float32 and "CodeFormer" in why and "bfloat16" in why
    half_ok = SimpleNamespace(architecture=SimpleNamespace(id="GFPGAN"), supports_half=True, supports_bfloat16=True)
    assert run_dtype(half_ok, "cuda", torch.float16)[0] == torch.float16
    assert run_dtype(codeformer, "cpu", torch.float16)[0] == torch.float32


@pytest.mark.parametrize("arch, signed", [("GFPGAN", True), ("CodeFormer", True), ("RestoreFormer", False)])
def test_gfpgan_and_codeformer_get_the_signed_range_they_were_trained_on(arch, signed):
    """spandrel's GFPGAN and CodeFormer call_fn pass our tensor straight to networks trained on [-1, 1] (GFPGANer
    normalises with mean/std 0.5); RestoreFormer's call_fn converts itself. An identity network must give the faces
    back either way, and see [-1, 1] only where the module converts."""
    from types import SimpleNamespace

    class Identity:
        architecture = SimpleNamespace(id=arch)

        def __init__(self):
            self.seen = []

        def __call__(self, x):
            self.seen.append(x.clone())
            return x.clone()

    faces = smooth_faces()
    net = Identity()
    out = stub(net)(faces)
    x = net.seen[0]
    low, high = (-1.0, 1.0) if signed else (0.0, 1.0)
    assert float(x.min()) >= low - 1e-6 and float(x.max()) <= high + 1e-6
    assert (float(x.min()) < -0.2) == signed  # the dark blue channel (40/255) lands below 0 only when mapped
    assert int((out.int() - faces.int()).abs().max()) <= 1
