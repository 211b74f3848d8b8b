"""Blending: geometry and masks by known answers, the CPU path bit-exact against an independent PIL
implementation of the official sequence on real frames, and the torch path within 2 levels of it
(official-behaviour.md §7.1-7.4)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import face_frames

from nbhelpers import blending as B
from nbhelpers.errors import InputError
from nbhelpers.parsing import face_mask

FACE_BOX = (220, 180, 340, 330)  # covers the face in face-sing-576x768-25fps.mp4 (mouth near (275, 273))


# ------------------------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def frames(shared_data) -> np.ndarray:
    """Frames 25, 125 and 250 of the real face video as (3, 768, 576, 3) uint8 BGR."""
    return face_frames([25, 125, 250])


def synthetic_mask_512(seed: int = 0) -> np.ndarray:
    """A 0/255 parsing-like mask: jaw mode of an elliptical skin map with lips and nose, plus a few random holes."""
    yy, xx = np.mgrid[0:512, 0:512]
    lab = np.zeros((512, 512), np.uint8)
    lab[((xx - 256) / 170.0) ** 2 + ((yy - 260) / 200.0) ** 2 <= 1] = 1
    lab[240:330, 230:282] = 10
    lab[350:372, 200:312] = 12
    lab[372:390, 200:312] = 13
    rng = np.random.default_rng(seed)
    for y, x in rng.integers(150, 480, (12, 2)):
        lab[y:y + 9, x:x + 13] = 0
    return face_mask(lab, "jaw")


def random_face(seed: int, size: int = 256) -> np.ndarray:
    """A random "generated" face: smooth colour ramps plus noise, (size, size, 3) uint8 BGR."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    base = np.stack([xx, yy, (xx + yy) // 2], -1) * (255.0 / size)
    return np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------------------------
# The official sequence, written independently with PIL as official-behaviour.md §7.2 describes it
# ------------------------------------------------------------------------------------------------------------

def official_blend(frame_bgr, face_256_bgr, box, mask_512, blur_ratio=0.05):
    """get_image (offline, blending.py:35-93) with the parsing mask given, after the cv2 resize of inference.py:218."""
    import cv2
    from PIL import Image

    x, y, x1, y1 = box
    res = cv2.resize(face_256_bgr, (x1 - x, y1 - y))                                # §7.1, default bilinear
    body = Image.fromarray(frame_bgr[:, :, ::-1].copy())                             # step 1 (RGB)
    face = Image.fromarray(res[:, :, ::-1].copy())
    xc, yc = (x + x1) // 2, (y + y1) // 2                                            # step 2
    s = int(max(x1 - x, y1 - y) // 2 * 1.5)
    xs, ys, xe, ye = xc - s, yc - s, xc + s, yc + s
    face_large = body.crop((xs, ys, xe, ye))                                         # step 3
    size = face_large.size
    mask_image = Image.fromarray(mask_512).resize(size)                              # step 4, PIL default filter
    mask_small = mask_image.crop((x - xs, y - ys, x1 - xs, y1 - ys))                 # step 5
    mask_image = Image.new("L", size, 0)
    mask_image.paste(mask_small, (x - xs, y - ys, x1 - xs, y1 - ys))
    width, height = mask_image.size                                                  # step 6
    top = int(height * 0.5)
    lower = Image.new("L", size, 0)
    lower.paste(mask_image.crop((0, top, width, height)), (0, top))
    k = int(blur_ratio * size[0] // 2 * 2) + 1                                       # step 7
    mask_array = cv2.GaussianBlur(np.array(lower), (k, k), 0)
    face_large.paste(face, (x - xs, y - ys, x1 - xs, y1 - ys))                       # step 8
    body.paste(face_large, (xs, ys), Image.fromarray(mask_array))
    return np.array(body)[:, :, ::-1], mask_array, (xs, ys, xe, ye)                 # step 9 (BGR)


# ------------------------------------------------------------------------------------------------------------
# Known answers
# ------------------------------------------------------------------------------------------------------------

def test_expanded_square_known_answers():
    assert B.expanded_square(FACE_BOX) == (168, 143, 392, 367)  # w 120, h 150: s = int(75 * 1.5) = 112
    assert B.expanded_square((10, 5, 130, 160)) == (-45, -33, 185, 197)  # s = int(77 * 1.5) = 115
    assert B.expanded_square((0, 0, 134, 100)) == (-33, -50, 167, 150)  # s = int(67 * 1.5) = 100 -> side 200
    assert B.expanded_square((100, 100, 103, 103)) == (100, 100, 102, 102)  # s = 1: smaller than the box
    assert B.expanded_square(np.array([220, 180, 340, 330], np.int32)) == (168, 143, 392, 367)  # numpy ints


def test_feather_kernel_sizes():
    assert [B.feather_kernel_size(side) for side in (200, 300, 400)] == [11, 15, 21]
    assert B.feather_kernel_size(300, B.REALTIME_BLUR_RATIO) == 31
    assert B.feather_kernel_size(224) == 11 and B.feather_kernel_size(2) == 1
    assert all(B.feather_kernel_size(side, r) % 2 == 1 for side in range(2, 900, 2) for r in (0.05, 0.1))


def test_box_mask_keeps_inside_box_and_lower_half_only():
    box = (0, 0, 134, 100)
    square = B.expanded_square(box)  # (-33, -50, 167, 150), side 200, s = 100
    m = B.box_mask(np.full((512, 512), 255, np.uint8), box, square)
    assert m.shape == (200, 200) and m.dtype == np.uint8
    expected = np.zeros((200, 200), np.uint8)
    expected[100:150, 33:167] = 255  # rows >= s, and inside the box: rows 50..149, cols 33..166 of the square
    np.testing.assert_array_equal(m, expected)


def test_feathered_mask_profile_is_a_symmetric_gaussian_edge():
    box = (0, 0, 134, 134)
    square = B.expanded_square(box)  # (-33, -33, 167, 167), side 200 -> kernel 11
    assert square[2] - square[0] == 200
    unblurred = B.box_mask(np.full((512, 512), 255, np.uint8), box, square)
    assert not unblurred[:100].any() and (unblurred[100:167, 33:167] == 255).all()
    mask = B.prepare_mask(np.full((512, 512), 255, np.uint8), box, square, blur_ratio=0.05)
    col = mask[:, 100].astype(int)  # far from the box's left/right edges: a 1-D step blurred vertically
    # Independent Gaussian of size 11 and OpenCV's sigma rule, applied to the step at row 100.
    k = 11
    sigma = 0.3 * ((k - 1) * 0.5 - 1) + 0.8
    g = np.exp(-((np.arange(k) - k // 2) ** 2) / (2 * sigma ** 2))
    g /= g.sum()
    for i in range(6):  # rows 100 + i and 99 - i mirror each other about the edge
        expected = 255 * g[: k // 2 + 1 + i].sum()
        assert abs(col[100 + i] - expected) <= 1
        assert abs(col[100 + i] + col[99 - i] - 255) <= 1
    assert col[:94].max() == 0 and (col[106:161] == 255).all()


def test_blend_of_constant_images_known_answers():
    m = np.array([[0, 1, 64, 127, 128, 200, 254, 255]], np.uint8)
    orig = np.full((1, 8, 3), 10, np.uint8)
    new = np.full((1, 8, 3), 250, np.uint8)
    # round((10 * (255 - m) + 250 * m) / 255), computed by hand
    expected = [10, 11, 70, 130, 130, 198, 249, 250]
    got = B.blend_pixels(orig, new, m)
    assert got[0, :, 0].tolist() == expected and (got == got[..., :1]).all()
    # through the whole CPU path: a box-sized constant face on a constant frame with a constant mask
    frame = np.full((60, 60, 3), 10, np.uint8)
    box = (10, 10, 50, 50)
    square = B.expanded_square(box)
    side = square[2] - square[0]
    out = B.blend_cpu(frame, np.full((40, 40, 3), 250, np.uint8), box, np.full((side, side), 128, np.uint8), square)
    assert (out[10:50, 10:50] == 130).all() and (out[:10] == 10).all() and (out[50:] == 10).all()
    assert (frame == 10).all()  # not in place by default


def test_pil_blend_rule_is_the_integer_round():
    """The rule blend_pixels implements equals PIL's paste with an 'L' mask for every (orig, new, m)."""
    from PIL import Image

    o = np.repeat(np.arange(256, dtype=np.uint8)[None], 256, 0)
    n = o.T.copy()
    for m in (0, 1, 2, 77, 127, 128, 200, 254, 255):
        body = Image.fromarray(np.stack([o] * 3, -1))
        body.paste(Image.fromarray(np.stack([n] * 3, -1)), (0, 0), Image.fromarray(np.full((256, 256), m, np.uint8)))
        t = o.astype(np.int64) * (255 - m) + n.astype(np.int64) * m
        np.testing.assert_array_equal(np.asarray(body)[..., 0], np.floor(t / 255 + 0.5))
        ours = B.blend_pixels(o[..., None], n[..., None], np.full((256, 256), m, np.uint8))
        np.testing.assert_array_equal(ours[..., 0], np.asarray(body)[..., 0])


# ------------------------------------------------------------------------------------------------------------
# CPU path == official PIL sequence, bit for bit, on real frames
# ------------------------------------------------------------------------------------------------------------

BOXES = [
    FACE_BOX,                # the face
    (235, 200, 325, 318),    # a tighter box
    (10, 5, 130, 160),       # top-left: the square starts at negative offsets
    (500, 690, 620, 830),    # bottom-right: box and square partly outside the frame (quirk Q17)
    (100, 100, 103, 103),    # tiny: the box is larger than its square
]


@pytest.mark.parametrize("box", BOXES)
@pytest.mark.parametrize("blur_ratio", [B.OFFLINE_BLUR_RATIO, B.REALTIME_BLUR_RATIO])
def test_cpu_path_bit_exact_with_official_pil_sequence(frames, box, blur_ratio):
    for i, frame in enumerate(frames[:2]):
        face = random_face(i)
        mask_512 = synthetic_mask_512(i)
        expected, expected_mask, expected_square = official_blend(frame, face, box, mask_512, blur_ratio)
        square = B.expanded_square(box)
        assert square == expected_square
        mask = B.prepare_mask(mask_512, box, square, blur_ratio)
        np.testing.assert_array_equal(mask, expected_mask)
        got = B.blend_cpu(frame, face, box, mask, square)
        np.testing.assert_array_equal(got, expected)
        changed = (got != frame).any(-1)
        assert changed.any() or box[0] >= frame.shape[1] or box == (100, 100, 103, 103)


def test_only_the_lower_half_of_the_box_changes(frames):
    frame = frames[0]
    square = B.expanded_square(FACE_BOX)
    mask = B.prepare_mask(np.full((512, 512), 255, np.uint8), FACE_BOX, square)
    out = B.blend_cpu(frame, random_face(5), FACE_BOX, mask, square)
    rows, cols = np.nonzero((out != frame).any(-1))
    yc = (FACE_BOX[1] + FACE_BOX[3]) // 2
    assert rows.min() >= yc - 6  # the feather (kernel 11) reaches 5 rows above the centre row
    assert rows.max() < FACE_BOX[3] and cols.min() >= FACE_BOX[0] and cols.max() < FACE_BOX[2]


def test_crop_padded_is_black_outside_the_frame(frames):
    from PIL import Image

    frame = frames[0]
    for square in [(-45, -33, 185, 197), (400, 600, 700, 900), (168, 143, 392, 367)]:
        expected = np.asarray(Image.fromarray(frame).crop(square))
        np.testing.assert_array_equal(B.crop_padded(frame, square), expected)


def test_inplace_and_resized_face(frames):
    import cv2

    frame = frames[1].copy()
    square = B.expanded_square(FACE_BOX)
    mask = B.prepare_mask(synthetic_mask_512(), FACE_BOX, square)
    face = random_face(3)
    resized = cv2.resize(face, (120, 150))
    a = B.blend_cpu(frame, face, FACE_BOX, mask, square)
    b = B.blend_cpu(frame, resized, FACE_BOX, mask, square)
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------------------
# Material preparation (parsing of the square's crop)
# ------------------------------------------------------------------------------------------------------------

class FakeParser:
    """Records what it is given and returns fixed labels."""

    def __init__(self, labels):
        self.fixed = labels
        self.seen = []

    def labels(self, images_rgb):
        self.seen.extend(images_rgb)
        return np.stack([self.fixed] * len(images_rgb))


def test_prepare_material_parses_the_rgb_square_of_the_original(frames):
    from test_parsing import synthetic_labels  # tests/ is on sys.path (rootdir-less test folder); a package
    # named `tests` may be another's (IPython 7.34 puts IPython/extensions, which holds one, on sys.path)

    lab = synthetic_labels()
    parser = FakeParser(lab)
    box = (10, 5, 130, 160)
    mat = B.prepare_material(frames[0], box, parser, mode="jaw", blur_ratio=B.REALTIME_BLUR_RATIO)
    square = B.expanded_square(box)
    assert mat.square == square and mat.box == box
    np.testing.assert_array_equal(parser.seen[0], B.crop_padded(frames[0], square)[:, :, ::-1])
    np.testing.assert_array_equal(mat.mask, B.prepare_mask(face_mask(lab, "jaw"), box, square, 0.1))
    mats = B.prepare_materials(list(frames), [FACE_BOX, box, FACE_BOX], parser, mode="raw", chunk=2)
    assert [m.box for m in mats] == [FACE_BOX, box, FACE_BOX]
    np.testing.assert_array_equal(mats[2].mask, B.prepare_mask(face_mask(lab, "raw"), FACE_BOX))


def test_prepare_material_with_the_real_parser(frames, tmp_path):
    torch = pytest.importorskip("torch")
    from nbhelpers.parsing import BISENET_FILE, FaceParser
    from nbhelpers.testing import write_random_bisenet

    write_random_bisenet(tmp_path / BISENET_FILE, seed=0, dtype=torch.float16)
    parser = FaceParser(tmp_path)
    mat = B.prepare_material(frames[0], FACE_BOX, parser, mode="jaw")
    crop = B.crop_padded(frames[0], mat.square)[:, :, ::-1]
    labels = parser.labels([crop])[0]
    np.testing.assert_array_equal(mat.mask, B.prepare_mask(face_mask(labels, "jaw"), FACE_BOX, mat.square))
    assert mat.mask.shape == (224, 224)


def test_bad_inputs_raise_input_errors(frames):
    square = B.expanded_square(FACE_BOX)
    mask = np.zeros((224, 224), np.uint8)
    with pytest.raises(InputError, match="no face"):
        B.expanded_square((0, 0, 0, 0))
    with pytest.raises(InputError, match="4 integers"):
        B.check_box((1.5, 2, 3, 4))
    with pytest.raises(InputError, match=r"\(224, 224\) uint8 mask"):
        B.blend_cpu(frames[0], random_face(0), FACE_BOX, mask[:-1], square)
    with pytest.raises(InputError, match="frame_bgr"):
        B.blend_cpu(frames[0].astype(np.float32), random_face(0), FACE_BOX, mask, square)
    with pytest.raises(InputError, match="blur_ratio"):
        B.prepare_mask(np.zeros((512, 512), np.uint8), FACE_BOX, blur_ratio=-1)
    with pytest.raises(InputError, match="parsing_mode"):
        B.prepare_material(frames[0], FACE_BOX, FakeParser(np.zeros((512, 512), np.uint8)), mode="lips")


# ------------------------------------------------------------------------------------------------------------
# torch path: within 2 levels of the CPU path
# ------------------------------------------------------------------------------------------------------------

def _torch_inputs(frames, device="cpu"):
    import torch

    boxes = [FACE_BOX, (10, 5, 130, 160), (500, 690, 620, 830), (235, 200, 325, 318), (200, 150, 460, 420)]
    n = len(boxes)
    batch = np.stack([frames[i % len(frames)] for i in range(n)])
    faces = np.stack([random_face(10 + i) for i in range(n)])
    squares = [B.expanded_square(b) for b in boxes]
    masks = [B.prepare_mask(synthetic_mask_512(i), b, s, 0.1)
             for i, (b, s) in enumerate(zip(boxes, squares, strict=True))]
    return (batch, faces, boxes, masks, squares,
            torch.from_numpy(batch).to(device), torch.from_numpy(faces).to(device))


def test_torch_path_within_two_levels_of_cpu_path(frames):
    import torch

    batch, faces, boxes, masks, squares, tb, tf = _torch_inputs(frames)
    got = B.blend_torch(tb, tf, boxes, masks, squares)
    assert got.dtype == torch.uint8 and got.shape == tb.shape and not torch.equal(got, tb)
    assert torch.equal(tb, torch.from_numpy(batch))  # not in place by default
    for i in range(len(boxes)):  # box 4 is larger than 256 (upscale), the others smaller (downscale)
        expected = B.blend_cpu(batch[i], faces[i], boxes[i], masks[i], squares[i])
        diff = np.abs(got[i].numpy().astype(int) - expected.astype(int))
        assert diff.max() <= 2, (i, diff.max())
        assert (diff == 0).mean() > 0.99
    # masks given as tensors, in place
    out = B.blend_torch(tb, tf, boxes, [torch.from_numpy(m) for m in masks], squares, inplace=True)
    assert out is tb and torch.equal(out, got)


def test_torch_path_with_box_sized_faces_is_exact(frames):
    import cv2
    import torch

    batch, faces, boxes, masks, squares, tb, _ = _torch_inputs(frames)
    i = 3  # (235, 200, 325, 318): 90 x 118
    resized = cv2.resize(faces[i], (90, 118))
    got = B.blend_torch(tb[i:i + 1], torch.from_numpy(resized)[None], boxes[i:i + 1], masks[i:i + 1],
                        squares[i:i + 1])
    np.testing.assert_array_equal(got[0].numpy(), B.blend_cpu(batch[i], faces[i], boxes[i], masks[i], squares[i]))


def test_torch_path_rejects_mismatched_inputs(frames):
    import torch

    _, _, boxes, masks, squares, tb, tf = _torch_inputs(frames)
    with pytest.raises(InputError, match="one entry per frame"):
        B.blend_torch(tb, tf, boxes[:-1], masks, squares)
    with pytest.raises(InputError, match="faces"):
        B.blend_torch(tb, tf.float(), boxes, masks, squares)
    with pytest.raises(InputError, match=r"masks\[1\]"):
        B.blend_torch(tb, tf, boxes, [masks[0]] * len(boxes), squares)
    with pytest.raises(InputError, match="frames"):
        B.blend_torch(tb.numpy(), tf, boxes, masks, squares)
    assert torch.equal(tb, torch.from_numpy(_torch_inputs(frames)[0]))


@pytest.mark.gpu
def test_torch_path_on_cuda_matches_cpu(frames):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    batch, faces, boxes, masks, squares, tb, tf = _torch_inputs(frames)
    cpu = B.blend_torch(tb, tf, boxes, masks, squares)
    gpu = B.blend_torch(tb.cuda(), tf.cuda(), boxes, masks, squares).cpu()
    assert (gpu.int() - cpu.int()).abs().max() <= 1
    for i in range(len(boxes)):
        expected = B.blend_cpu(batch[i], faces[i], boxes[i], masks[i], squares[i])
        assert np.abs(gpu[i].numpy().astype(int) - expected.astype(int)).max() <= 2
