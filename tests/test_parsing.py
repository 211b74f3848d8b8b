"""Face parsing: the raw / jaw / neck masks by known answers and an independent slow implementation, and our
BiSeNet against the official checkpoint's parameter names and shapes (official-behaviour.md §7.3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import REFERENCE, loaded_by

from nbhelpers.errors import CheckpointError, InputError, WeightsError
from nbhelpers.parsing import cheek_mask, face_mask, jaw_dilation_kernel, jaw_erosion_kernel

KEYS = REFERENCE / "checkpoints" / "bisenet-79999_iter.keys.json"
pytestmark = []


@pytest.fixture(scope="module")
def official_keys() -> dict:
    """The official BiSeNet checkpoint's parameter names and shapes (../shared/reference); skips where absent."""
    if not KEYS.is_file():
        pytest.skip(f"the official checkpoint's key list is not at {KEYS} (the shared reference folder beside the "
                    "repository); it is not part of the repository")
    return json.loads(KEYS.read_text())


# ------------------------------------------------------------------------------------------------------------
# A hand-made label map: a face-like layout in the 512 parsing space
# ------------------------------------------------------------------------------------------------------------

def synthetic_labels() -> np.ndarray:
    """Background 0, hair 17 on top, a skin (1) ellipse, a nose (10), upper/lower lip (12/13), mouth (11),
    eyes (4/5), neck (14) below the chin, cloth (16) at the bottom, and skin touching the left image border."""
    yy, xx = np.mgrid[0:512, 0:512]
    lab = np.zeros((512, 512), np.uint8)
    lab[:120, 100:412] = 17
    lab[((xx - 256) / 150.0) ** 2 + ((yy - 240) / 190.0) ** 2 <= 1] = 1
    lab[(yy >= 420) & (np.abs(xx - 256) < 70)] = 14
    lab[480:, :] = 16
    lab[200:215, 180:230] = 4
    lab[200:215, 282:332] = 5
    lab[230:320, 236:276] = 10
    lab[340:352, 206:306] = 12
    lab[352:360, 216:296] = 11
    lab[360:374, 206:306] = 13
    lab[250:300, 0:30] = 1  # skin at the border: exercises the border rules of dilation/erosion
    lab[5:9, 500:506] = 1  # a lone skin speck near the top-right corner
    return lab


def test_raw_and_neck_modes_keep_exactly_their_labels():
    lab = synthetic_labels()
    raw = face_mask(lab, "raw")
    neck = face_mask(lab, "neck")
    assert raw.dtype == np.uint8 and raw.shape == (512, 512)
    for value in range(19):
        sel = lab == value
        if not sel.any():
            continue
        assert set(np.unique(raw[sel])) == {255 if value in (1, 11, 12, 13) else 0}, value
        assert set(np.unique(neck[sel])) == {255 if value in (1, 11, 12, 13, 14) else 0}, value


def test_raw_mode_known_pixels():
    lab = synthetic_labels()
    raw = face_mask(lab, "raw")
    assert raw[240, 256 - 140] == 255  # skin
    assert raw[250, 256] == 0  # nose
    assert raw[345, 256] == 255 and raw[355, 256] == 255 and raw[365, 256] == 255  # lips + mouth
    assert raw[450, 256] == 0 and face_mask(lab, "neck")[450, 256] == 255  # neck
    assert lab[60, 120] == 17 and raw[60, 120] == 0  # hair


# ------------------------------------------------------------------------------------------------------------
# Jaw mode kernels, built from the reference's words
# ------------------------------------------------------------------------------------------------------------

def described_dilation_kernel() -> np.ndarray:
    k = np.zeros((33, 33), np.uint8)
    for r in range(33):
        if 10 <= r <= 20:
            width = 2 * (r - 10) + 1
            start = 16 - (width - 1) // 2
            k[r, start:start + width] = 1
        elif r >= 21:
            k[r, 6:27] = 1
    return k


def described_erosion_kernel() -> np.ndarray:
    k = np.zeros((3, 35), np.uint8)
    k[0, 17] = k[2, 17] = 1
    k[1, :] = 1
    return k


def test_jaw_kernels_equal_the_description():
    k = jaw_dilation_kernel()
    assert k.shape == (33, 33) and k.dtype == np.uint8
    np.testing.assert_array_equal(k, described_dilation_kernel())
    assert int(k.sum()) == sum(range(1, 22, 2)) + 12 * 21 == 373
    np.testing.assert_array_equal(jaw_erosion_kernel(), described_erosion_kernel())


def test_single_skin_pixel_grows_upwards_as_the_reference_says():
    import cv2

    y0, x0 = 200, 256
    img = np.zeros((512, 512), np.uint8)
    img[y0, x0] = 255
    dil = cv2.dilate(img, jaw_dilation_kernel(), iterations=1)
    rows = np.nonzero(dil.any(axis=1))[0]
    assert rows.min() == y0 - 16 and rows.max() == y0 + 6
    for y in range(y0 - 16, y0 - 3):  # full width 21
        cols = np.nonzero(dil[y])[0]
        assert (cols.min(), cols.max()) == (x0 - 10, x0 + 10)
    for i, y in enumerate(range(y0 - 3, y0 + 7)):  # triangle 19, 17, ..., 1
        cols = np.nonzero(dil[y])[0]
        width = 19 - 2 * i
        assert len(cols) == width and cols.min() == x0 - (width - 1) // 2


def test_cheek_mask_columns_inclusive():
    m = cheek_mask(90, 90)
    cols = np.nonzero(m[0] == 255)[0]
    assert set(cols) == set(range(0, 167)) | set(range(346, 512))
    assert (m == m[:1]).all()  # the same on every row
    cols80 = np.nonzero(cheek_mask(80, 80)[300] == 255)[0]
    assert set(cols80) == set(range(0, 177)) | set(range(336, 512))


# An independent slow implementation of jaw mode: maxima/minima over shifted copies, following the words of
# official-behaviour.md §7.3 (OpenCV's anchor at the kernel centre; outside the image never wins a max or a min).

def slow_dilate(img: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    kh, kw = kernel.shape
    ay, ax = kh // 2, kw // 2
    h, w = img.shape
    padded = np.zeros((h + kh, w + kw), img.dtype)  # 0 outside: never wins a max
    padded[ay:ay + h, ax:ax + w] = img
    out = np.zeros_like(img)
    for dy, dx in zip(*np.nonzero(kernel), strict=True):
        # dst(y, x) = max over kernel ones of src(y + dy - ay, x + dx - ax)
        out = np.maximum(out, padded[dy:dy + h, dx:dx + w])
    return out


def slow_erode(img: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    kh, kw = kernel.shape
    ay, ax = kh // 2, kw // 2
    h, w = img.shape
    padded = np.full((h + kh, w + kw), 255, img.dtype)  # 255 outside: never wins a min
    padded[ay:ay + h, ax:ax + w] = img
    out = np.full_like(img, 255)
    for dy, dx in zip(*np.nonzero(kernel), strict=True):
        out = np.minimum(out, padded[dy:dy + h, dx:dx + w])
    return out


def slow_jaw(lab: np.ndarray, left: int, right: int) -> np.ndarray:
    skin = np.where(lab == 1, 255, 0).astype(np.uint8)
    dil = slow_dilate(skin, described_dilation_kernel())
    ero = slow_erode(slow_erode(dil, described_erosion_kernel()), described_erosion_kernel())
    cheeks = np.zeros((512, 512), bool)
    cheeks[:, :256 - left + 1] = True
    cheeks[:, 256 + right:] = True
    region = np.where(cheeks, ero, dil) == 255
    out = np.zeros((512, 512), np.uint8)
    for y in range(512):  # the label rules, one row at a time
        for x in np.nonzero(region[y] | np.isin(lab[y], (11, 12, 13)))[0]:
            if lab[y, x] in (11, 12, 13) or (region[y, x] and lab[y, x] != 10):
                out[y, x] = 255
    return out


@pytest.mark.parametrize("left,right", [(90, 90), (80, 60), (20, 160), (0, 255)])
def test_jaw_mode_equals_independent_slow_implementation(left, right):
    lab = synthetic_labels()
    expected = slow_jaw(lab, left, right)
    got = face_mask(lab, "jaw", left, right)
    np.testing.assert_array_equal(got, expected)


def test_jaw_mode_known_pixels():
    lab = synthetic_labels()
    jaw = face_mask(lab, "jaw")
    assert jaw[250, 256] == 0  # nose stays out even inside the dilated skin
    assert jaw[355, 256] == 255  # mouth added back
    # The skin's top at column 256 is row 50: the dilation reaches 16 rows up (central band).
    assert jaw[34, 256] == 255 and jaw[33, 256] == 0
    # Its bottom there is row 419 (the neck starts at 420): the tail reaches 6 rows down, 1 pixel wide.
    assert jaw[425, 256] == 255 and jaw[426, 256] == 0
    # Eyes are inside the skin: the upward dilation covers them in the central band.
    assert jaw[207, 200] == 255 and face_mask(lab, "raw")[207, 200] == 0
    assert np.isin(jaw, (0, 255)).all()


def test_face_mask_rejects_bad_input():
    lab = synthetic_labels()
    with pytest.raises(InputError, match="parsing_mode"):
        face_mask(lab, "chin")
    with pytest.raises(InputError, match=r"\(512, 512\)"):
        face_mask(lab[:256], "raw")
    with pytest.raises(InputError, match="left_cheek_width"):
        face_mask(lab, "jaw", left_cheek_width=300)
    with pytest.raises(InputError, match="right_cheek_width"):
        face_mask(lab, "jaw", right_cheek_width=-1)


def test_import_is_light():
    code = "import nbhelpers.parsing, nbhelpers.blending; from nbhelpers.parsing import face_mask"
    assert loaded_by(code, ("torch", "cv2", "PIL", "diffusers")) == []


# ------------------------------------------------------------------------------------------------------------
# BiSeNet: names and shapes, strict loading, the parser
# ------------------------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A BiSeNet checkpoint in the official format (plain fp32 state dict, random weights)."""
    from nbhelpers.parsing import BISENET_FILE
    from nbhelpers.testing import write_random_bisenet

    weights = tmp_path_factory.mktemp("weights")
    write_random_bisenet(weights / BISENET_FILE, seed=1)
    return weights / BISENET_FILE


def test_bisenet_names_and_shapes_equal_the_official_checkpoint(official_keys):
    from nbhelpers.parsing.network import BiSeNet

    reference = official_keys
    state = BiSeNet().state_dict()
    assert list(state) == list(reference)
    assert {k: list(v.shape) for k, v in state.items()} == reference
    assert sum(v.numel() for v in state.values()) == 13_313_119


def test_official_format_loads_strictly(checkpoint, official_keys):
    from nbhelpers.parsing import load_bisenet

    raw = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert isinstance(raw, dict) and set(raw) == set(official_keys)
    model = load_bisenet(checkpoint.parents[1])  # a weights dir works, as does the file
    for key, value in model.state_dict().items():
        assert torch.equal(value, raw[key]), key
    assert not model.training


def test_fp16_storage_loads_into_fp32(tmp_path):
    from nbhelpers.parsing import load_bisenet
    from nbhelpers.testing import write_random_bisenet

    path = write_random_bisenet(tmp_path / "half.pth", seed=2, dtype=torch.float16)
    raw = torch.load(path, weights_only=True)
    assert raw["conv_out.conv_out.weight"].dtype == torch.float16
    assert raw["cp.resnet.bn1.num_batches_tracked"].dtype == torch.int64
    model = load_bisenet(path)
    assert model.conv_out.conv_out.weight.dtype == torch.float32
    assert torch.equal(model.conv_out.conv_out.weight, raw["conv_out.conv_out.weight"].float())


@pytest.mark.parametrize("change,message", [
    ("rename", r"missing: ffm.conv1.weight\n  unexpected: ffm.conv1.weights"),
    ("extra", "unexpected: head.extra"),
    ("shape", r"wrong shape: conv_out.conv_out.weight is \[18, 256, 1, 1\] in the file, "
              r"\[19, 256, 1, 1\] in the model"),
    ("prefix", "Every key starts with 'module.': saved from a wrapped model"),
])
def test_wrong_checkpoint_fails_with_a_clear_error(checkpoint, tmp_path, change, message):
    from nbhelpers.parsing import load_bisenet

    state = torch.load(checkpoint, weights_only=True)
    if change == "rename":
        state["ffm.conv1.weights"] = state.pop("ffm.conv1.weight")
    elif change == "extra":
        state["head.extra"] = torch.zeros(3)
    elif change == "shape":
        state["conv_out.conv_out.weight"] = state["conv_out.conv_out.weight"][:18].clone()
    else:
        state = {"module." + k: v for k, v in state.items()}
    bad = tmp_path / "bad.pth"
    torch.save(state, bad)
    with pytest.raises(CheckpointError, match=message) as info:
        load_bisenet(bad)
    assert str(bad) in str(info.value) and "version='v1'" not in str(info.value)  # the UNet's hint only
    assert "the official face-parse-bisent/79999_iter.pth is about 50.8 MiB" in str(info.value)


def test_missing_garbage_or_truncated_file_names_the_official_size(checkpoint, tmp_path):
    """Each error gives the official file's size from the weights manifest (a truncated download shows by it), and
    an unreadable file's own size."""
    from nbhelpers.parsing import FaceParser, load_bisenet
    from nbhelpers.weights import MANIFEST

    size = MANIFEST.get("bisenet").expected_text()
    assert size == "about 50.8 MiB, estimated"  # 53.3 MB
    with pytest.raises(WeightsError, match=f"face-parse-bisent/79999_iter.pth \\({size}\\)"):
        FaceParser(tmp_path)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="Could not read"):
        load_bisenet(junk)
    cut = tmp_path / "cut.pth"
    cut.write_bytes(checkpoint.read_bytes()[:20 * 2**20])  # a download stopped at 20 MiB
    with pytest.raises(CheckpointError, match=f"it has 20.0 MiB and the official face-parse-bisent/79999_iter.pth "
                                              f"is {size}: probably incomplete"):
        load_bisenet(cut)


def test_preprocess_matches_the_official_transform():
    from PIL import Image

    from nbhelpers.parsing import FaceParser

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (300, 280, 3), dtype=np.uint8)
    got = FaceParser.preprocess([image])
    # Independent: PIL bilinear (not OpenCV, which gives other values when downscaling), /255, mean/std.
    resized = np.asarray(Image.fromarray(image).resize((512, 512), Image.BILINEAR), dtype=np.float64) / 255.0
    expected = ((resized - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1)
    assert got.shape == (1, 3, 512, 512) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], expected, atol=1e-5)


def test_parser_labels_equal_argmax_of_the_main_head(checkpoint):
    from nbhelpers.parsing import FaceParser

    parser = FaceParser(checkpoint, batch_size=1)
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (333, 410, 3), dtype=np.uint8), np.full((64, 64, 3), 128, np.uint8)]
    labels = parser.labels(images)  # one image per forward pass
    assert labels.shape == (2, 512, 512) and labels.dtype == np.uint8 and labels.max() < 19
    x = torch.from_numpy(FaceParser.preprocess(images))
    with torch.inference_mode():
        main = parser.net(x)[0]  # the official call: both images in one batch, all heads, take [0]
    np.testing.assert_array_equal(labels, main.argmax(1).numpy())
    masks = parser.masks(images[1:], "raw")
    np.testing.assert_array_equal(masks[0], face_mask(labels[1], "raw"))


def test_parser_rejects_bad_images(checkpoint):
    from nbhelpers.parsing import FaceParser

    parser = FaceParser(checkpoint)
    with pytest.raises(InputError, match="Wrap it"):
        parser.labels(np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(InputError, match=r"images_rgb\[0\]"):
        parser.labels([np.zeros((64, 64, 3), np.float32)])
    with pytest.raises(InputError, match="parsing_mode"):
        parser.masks([np.zeros((64, 64, 3), np.uint8)], "chin")


@pytest.mark.gpu
def test_parser_fp16_on_cuda(checkpoint):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nbhelpers.parsing import FaceParser

    rng = np.random.default_rng(4)
    images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(4)]
    ref = FaceParser(checkpoint).labels(images)
    half = FaceParser(checkpoint, device="cuda", dtype=torch.float16).labels(images)
    assert half.shape == ref.shape and (half == ref).mean() > 0.95


def test_half_precision_on_cpu_falls_back_to_float32_with_a_warning(checkpoint):
    from nbhelpers.parsing import FaceParser

    with pytest.warns(RuntimeWarning, match="float32"):
        parser = FaceParser(checkpoint, dtype=torch.float16)
    assert parser.dtype == torch.float32 and parser.net.conv_out.conv_out.weight.dtype == torch.float32


def test_tiny_writer_is_registered_and_loads(tmp_path):
    testing = pytest.importorskip("nbhelpers.testing")
    from nbhelpers.parsing import BISENET_FILE, FaceParser

    writer = testing.WRITERS["parsing"]
    writer(tmp_path)
    path = tmp_path / BISENET_FILE
    assert path.is_file() and 20e6 < path.stat().st_size < 40e6  # fp16 storage of the full 13.3 M values
    parser = FaceParser(tmp_path)
    assert parser.labels([np.zeros((32, 32, 3), np.uint8)]).shape == (1, 512, 512)
