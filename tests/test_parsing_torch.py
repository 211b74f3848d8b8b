"""Face parsing material on a torch device: the integer-exact resizes and blur against PIL and OpenCV themselves,
the jaw/raw/neck masks against parsing.face_mask on known label maps, and the whole batched material against
blending.prepare_materials on real frames (CPU device here; the same code on CUDA in the gpu-marked tests)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import BarRecorder, face_frames

torch = pytest.importorskip("torch")
cv2 = pytest.importorskip("cv2")
from PIL import Image  # noqa: E402

from nbhelpers import blending as B  # noqa: E402
from nbhelpers import resample as R  # noqa: E402
from nbhelpers.errors import InputError  # noqa: E402
from nbhelpers.parsing import FaceParser, face_mask, face_mask_torch  # noqa: E402

BILINEAR = getattr(Image, "Resampling", Image).BILINEAR
BICUBIC = getattr(Image, "Resampling", Image).BICUBIC


@pytest.fixture(autouse=True)
def _two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(min(old, 2))
    yield
    torch.set_num_threads(old)


# ------------------------------------------------------------------------------------------------------------
# resample: PIL and OpenCV, bit for bit
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_crop_resize_equals_pil_crop_then_bilinear_resize(seed):
    rng = np.random.default_rng(seed)
    height, width = (int(v) for v in rng.integers(60, 400, 2))
    images = rng.integers(0, 256, (3, height, width, 3), dtype=np.uint8)
    images[1] = cv2.GaussianBlur(images[1], (9, 9), 0)  # smooth content too, not only noise
    squares = []
    for _ in range(3):  # inside, past the top-left, past the bottom-right; up- and down-scaling to 512
        side = int(rng.integers(40, 900))
        xs, ys = int(rng.integers(-side // 2, width)), int(rng.integers(-side // 2, height))
        squares.append((xs, ys, xs + side, ys + side))
    got = R.crop_resize_batch(torch.from_numpy(images).permute(0, 3, 1, 2), squares, 512, "bilinear")
    for b in range(3):
        expected = np.asarray(Image.fromarray(images[b]).crop(squares[b]).resize((512, 512), BILINEAR))
        np.testing.assert_array_equal(got[b].permute(1, 2, 0).numpy(), expected)


@pytest.mark.parametrize("filter_name,pil_filter", [("bicubic", BICUBIC), ("bilinear", BILINEAR)])
def test_resize_batch_equals_pil_at_each_frames_own_side(filter_name, pil_filter):
    rng = np.random.default_rng(5)
    masks = np.stack([synthetic_mask(seed) for seed in range(3)] + [rng.integers(0, 256, (512, 512), np.uint8)])
    sides = [164, 512, 731, 37]  # down, same size, up, far down
    got = R.resize_batch(torch.from_numpy(masks), sides, filter_name).numpy()
    assert got.shape == (4, 731, 731)
    for b, side in enumerate(sides):
        expected = np.asarray(Image.fromarray(masks[b]).resize((side, side), pil_filter))
        np.testing.assert_array_equal(got[b, :side, :side], expected)
        assert not got[b, side:].any() and not got[b, :, side:].any()


def test_gaussian_blur_equals_opencv_for_every_kernel_kind():
    # 1-9: OpenCV's fixed tables; larger: computed kernel with error-diffused 8-bit taps (a float Gaussian would
    # be off by up to 9 levels at k=91, which is why the taps are OpenCV's own)
    rng = np.random.default_rng(7)
    ksizes = [1, 3, 5, 7, 9, 11, 15, 21, 31, 45, 91]
    sides = [int(v) for v in rng.integers(100, 300, len(ksizes))]
    masks = np.zeros((len(ksizes), max(sides), max(sides)), np.uint8)
    for b, side in enumerate(sides):
        masks[b, :side, :side] = synthetic_mask(b)[:side, :side] if b % 2 else rng.integers(0, 256, (side, side))
    got = R.gaussian_blur_batch(torch.from_numpy(masks), sides, ksizes).numpy()
    for b, (side, k) in enumerate(zip(sides, ksizes, strict=True)):
        expected = cv2.GaussianBlur(np.ascontiguousarray(masks[b, :side, :side]), (k, k), 0)
        np.testing.assert_array_equal(got[b, :side, :side], expected, err_msg=f"k={k} side={side}")


def test_gaussian_taps_sum_to_256_and_match_opencv_on_an_impulse():
    for k in (1, 9, 11, 33):
        taps = R.gaussian_taps(k)
        assert taps.sum() == 256 and list(taps) == list(taps[::-1])
    with pytest.raises(InputError, match="odd"):
        R.gaussian_taps(4)
    np.testing.assert_array_equal(R.reflect_101(np.arange(-3, 8), 5), [3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1])


# ------------------------------------------------------------------------------------------------------------
# Masks from known label maps
# ------------------------------------------------------------------------------------------------------------

def synthetic_labels(seed: int) -> np.ndarray:
    """A face-like label map: skin ellipse, nose, lips, mouth, neck, hair, specks of skin, skin on the borders."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:512, 0:512]
    lab = np.zeros((512, 512), np.uint8)
    lab[yy > 430] = 14
    lab[yy < 60] = 17
    lab[((xx - 256 - seed * 7) / 170.0) ** 2 + ((yy - 260) / 200.0) ** 2 <= 1] = 1
    lab[240:330, 230:282] = 10
    lab[350:372, 200:312] = 12
    lab[360:366, 220:290] = 11
    lab[372:390, 200:312] = 13
    lab[rng.random((512, 512)) < 0.005] = 1
    lab[:, :8] = 1  # skin touching the border: OpenCV's border rules matter here
    lab[505:, 100:200] = 1
    return lab


def synthetic_mask(seed: int) -> np.ndarray:
    return face_mask(synthetic_labels(seed), "jaw")


@pytest.mark.parametrize("mode,left,right", [("jaw", 90, 90), ("jaw", 0, 256), ("jaw", 37, 120), ("raw", 90, 90),
                                             ("neck", 90, 90)])
def test_face_mask_torch_equals_face_mask(mode, left, right):
    rng = np.random.default_rng(3)
    labels = np.stack([synthetic_labels(0), synthetic_labels(1), rng.integers(0, 19, (512, 512), np.uint8)])
    got = face_mask_torch(torch.from_numpy(labels), mode, left, right).numpy()
    for b in range(len(labels)):
        np.testing.assert_array_equal(got[b], face_mask(labels[b], mode, left, right))
    assert got[0].any() and not got[0].all()


def test_face_mask_torch_rejects_bad_input():
    with pytest.raises(InputError, match="labels"):
        face_mask_torch(torch.zeros(1, 256, 256, dtype=torch.uint8))
    with pytest.raises(InputError, match="parsing_mode"):
        face_mask_torch(torch.zeros(1, 512, 512, dtype=torch.uint8), "chin")


BOXES = [(220, 180, 340, 330), (-40, -30, 120, 150), (500, 700, 600, 790), (100, 100, 101 + 300, 102 + 400),
         (230, 200, 290, 250)]
SQUARES = [B.expanded_square(b) for b in BOXES]


@pytest.mark.parametrize("blur_ratio,boxes", [(B.OFFLINE_BLUR_RATIO, BOXES), (B.REALTIME_BLUR_RATIO, BOXES),
                                              (0.5, BOXES[1:3])])  # 0.5: the config's largest ratio
def test_prepare_masks_torch_equals_prepare_mask(blur_ratio, boxes):
    masks = np.stack([synthetic_mask(i % 3) for i in range(len(boxes))])
    got = B.prepare_masks_torch(torch.from_numpy(masks), boxes, [B.expanded_square(b) for b in boxes], blur_ratio)
    for b, box in enumerate(boxes):
        expected = B.prepare_mask(masks[b], box, blur_ratio=blur_ratio)
        assert tuple(got[b].shape) == expected.shape and got[b].is_contiguous()
        np.testing.assert_array_equal(got[b].numpy(), expected)
        assert expected.max() > 0


def test_prepare_masks_torch_rejects_bad_input():
    masks = torch.zeros(2, 512, 512, dtype=torch.uint8)
    with pytest.raises(InputError, match="one entry per mask"):
        B.prepare_masks_torch(masks, BOXES[:1], SQUARES[:1])
    with pytest.raises(InputError, match="masks_512"):
        B.prepare_masks_torch(masks.float(), BOXES[:2], SQUARES[:2])
    with pytest.raises(InputError, match=r"boxes\[1\]"):
        B.prepare_masks_torch(masks, [BOXES[0], (0, 0, 0, 0)], SQUARES[:2])
    assert B.prepare_masks_torch(masks[:0], [], []) == []


# ------------------------------------------------------------------------------------------------------------
# The whole material on real frames
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def frames(shared_data) -> np.ndarray:
    """Frames 0-3 of the real face video, (4, 768, 576, 3) uint8 BGR."""
    return face_frames([0, 1, 2, 3])


class ColourNet(torch.nn.Module):
    """A stand-in for BiSeNet with meaningful labels on real frames: skin / lips / nose from the colour.

    Random BiSeNet weights label everything alike; this makes the jaw/raw masks on the real face non-trivial, so
    the material comparison tests the crop, the resizes, the morphology and the blur on real content.
    """

    def parse(self, x):
        mean = torch.tensor((0.485, 0.456, 0.406), device=x.device).view(1, 3, 1, 1)
        std = torch.tensor((0.229, 0.224, 0.225), device=x.device).view(1, 3, 1, 1)
        rgb = x.float() * std + mean
        r, g, b = rgb[:, 0], rgb[:, 1], rgb[:, 2]
        logits = torch.zeros(x.shape[0], 19, *x.shape[2:], device=x.device)
        logits[:, 0] = 0.5
        logits[:, 1] = ((r > 0.35) & (r > g) & (r > b)).float()
        logits[:, 12] = 2.0 * ((r > 0.45) & (r - g > 0.18)).float()
        logits[:, 10] = 1.5 * ((g > 0.55) & (r > 0.6)).float()
        return logits


def colour_parser(device: str = "cpu", batch_size: int = 2) -> FaceParser:
    parser = FaceParser.__new__(FaceParser)  # the real class's methods around a stand-in network
    parser.device, parser.dtype, parser.batch_size, parser.path = torch.device(device), torch.float32, batch_size, "-"
    parser.net = ColourNet()
    return parser


REAL_BOXES = [(220, 180, 340, 330), (-30, -20, 150, 160), (450, 600, 600, 790), (200, 170, 360, 340)]


@pytest.mark.parametrize("mode,blur_ratio", [("jaw", B.OFFLINE_BLUR_RATIO), ("raw", B.REALTIME_BLUR_RATIO)])
def test_materials_torch_equal_the_cpu_path_on_real_frames(frames, mode, blur_ratio):
    parser = colour_parser()
    expected = B.prepare_materials(frames, REAL_BOXES, parser, mode, blur_ratio=blur_ratio)
    got = B.prepare_materials_torch(torch.from_numpy(frames), REAL_BOXES, parser, mode, blur_ratio=blur_ratio)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.square == e.square and g.box == e.box and isinstance(g.mask, torch.Tensor)
        np.testing.assert_array_equal(g.mask.numpy(), e.mask)  # 0 levels apart: every step is integer-exact
    assert expected[0].mask.max() > 200 and (expected[0].mask > 0).mean() > 0.05  # real, non-trivial masks


def test_bisenet_labels_and_input_equal_the_cpu_path_on_real_frames(frames):
    import tempfile
    from pathlib import Path

    from nbhelpers.parsing import BISENET_FILE
    from nbhelpers.testing import write_random_bisenet

    with tempfile.TemporaryDirectory() as tmp:
        write_random_bisenet(Path(tmp) / BISENET_FILE, seed=1)
        parser = FaceParser(tmp, batch_size=2)
    squares = [B.expanded_square(b) for b in REAL_BOXES[:2]]
    crops = [np.ascontiguousarray(B.crop_padded(frames[i], squares[i])[:, :, ::-1]) for i in range(2)]
    tensor = torch.from_numpy(frames[:2])
    np.testing.assert_array_equal(parser.preprocess_torch(tensor, squares).numpy(), parser.preprocess(crops))
    np.testing.assert_array_equal(parser.labels_torch(tensor, squares).numpy(), parser.labels(crops))
    with pytest.raises(InputError, match="squares"):
        parser.preprocess_torch(tensor, squares[:1])
    with pytest.raises(InputError, match="frames"):
        B.prepare_materials_torch(tensor.float(), REAL_BOXES[:2], parser)


@pytest.mark.gpu
def test_materials_on_cuda_equal_the_cpu_path(frames):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cpu = colour_parser("cpu")
    gpu = colour_parser("cuda", batch_size=4)
    expected = B.prepare_materials(frames, REAL_BOXES, cpu, "jaw")
    got = B.prepare_materials_torch(torch.from_numpy(frames).cuda(), REAL_BOXES, gpu, "jaw")
    for g, e in zip(got, expected, strict=True):
        assert g.mask.device.type == "cuda"
        assert np.abs(g.mask.cpu().numpy().astype(int) - e.mask.astype(int)).max() <= 1  # issue 16: within 1
    # the image ops alone, on known masks: bit-exact on the GPU too
    masks = np.stack([synthetic_mask(i % 3) for i in range(len(BOXES))])
    for ratio in (B.OFFLINE_BLUR_RATIO, B.REALTIME_BLUR_RATIO):
        on_gpu = B.prepare_masks_torch(torch.from_numpy(masks).cuda(), BOXES, SQUARES, ratio)
        for b, box in enumerate(BOXES):
            np.testing.assert_array_equal(on_gpu[b].cpu().numpy(), B.prepare_mask(masks[b], box, blur_ratio=ratio))
    labels = np.stack([synthetic_labels(0), synthetic_labels(1)])
    np.testing.assert_array_equal(face_mask_torch(torch.from_numpy(labels).cuda()).cpu().numpy(),
                                  np.stack([face_mask(lab) for lab in labels]))


@pytest.mark.gpu
def test_bisenet_fp16_materials_on_cuda_close_to_the_cpu_path(frames, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nbhelpers.parsing import BISENET_FILE
    from nbhelpers.testing import write_random_bisenet

    write_random_bisenet(tmp_path / BISENET_FILE, seed=1)
    cpu = FaceParser(tmp_path)
    gpu = FaceParser(tmp_path, device="cuda", dtype=torch.float16)
    squares = [B.expanded_square(b) for b in REAL_BOXES]
    crops = [np.ascontiguousarray(B.crop_padded(frames[i], squares[i])[:, :, ::-1]) for i in range(len(squares))]
    tensor = torch.from_numpy(frames).cuda()
    np.testing.assert_allclose(gpu.preprocess_torch(tensor, squares).cpu().numpy(), cpu.preprocess(crops),
                               atol=1e-5)
    labels = gpu.labels_torch(tensor, squares).cpu().numpy()
    assert (labels == cpu.labels(crops)).mean() > 0.95  # fp16 BiSeNet: a few boundary pixels may flip


def test_both_material_paths_count_frames_in_a_progress_bar(frames, monkeypatch):
    recorder = BarRecorder()
    monkeypatch.setattr(B, "bar", recorder)  # the name blending looks up
    parser = colour_parser(batch_size=2)
    B.prepare_materials(frames[:3], REAL_BOXES[:3], parser)
    B.prepare_materials_torch(torch.from_numpy(frames[:3]), REAL_BOXES[:3], parser)
    assert [(b.args, b.n) for b in recorder.bars] == [((3, "face parsing"), 3)] * 2
