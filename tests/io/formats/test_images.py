"""Image loading and OpenCV-style resizing for convert_imageset."""
from __future__ import annotations

import numpy as np
import pytest
from synthetic import write_png

from caffe_py.errors import DataError
from caffe_py.io.formats import images
from caffe_py.io.formats.datum import decode_image
from caffe_py.io.formats.images import (
    encode_image,
    extension_type,
    load_image,
    resize_linear,
    resize_linear_numpy,
)


@pytest.fixture(autouse=True, params=["cv2", "numpy"])
def resize_path(request, monkeypatch):
    """Each test of the resize runs on OpenCV's cv2.resize (where installed) and on the numpy
    path."""
    if request.param == "cv2":
        if images._CV2 is None:
            pytest.skip("opencv-python(-headless) is not installed")
    else:
        monkeypatch.setattr(images, "_CV2", None)
    return request.param


def test_halving_averages_two_by_two_blocks():
    # cv2.resize(a, (2, 2)) on this 4x4 image gives [[25, 45], [4, 6]] (checked with cv2 5.0).
    a = np.array([[[0, 10, 20, 30], [40, 50, 60, 71], [1, 2, 3, 4], [5, 6, 7, 8]]], np.uint8)
    np.testing.assert_array_equal(resize_linear(a, 2, 2), [[[25, 45], [4, 6]]])


def test_downscale_matches_opencv_exactly():
    # cv2.resize(a, (4, 3)) with INTER_LINEAR, from cv2 5.0.
    a = np.array([[255, 228, 34, 121, 243, 189, 6], [131, 102, 168, 82, 193, 187, 150],
                  [81, 243, 205, 24, 236, 8, 246], [164, 231, 36, 210, 111, 172, 210],
                  [174, 176, 218, 242, 169, 114, 205]], np.uint8)
    np.testing.assert_array_equal(resize_linear(a[None], 3, 4)[0],
                                  [[203, 82, 211, 104], [142, 182, 210, 157],
                                   [179, 167, 160, 179]])


def test_upscale_matches_opencv_exactly():
    # cv2 5.0 (and Caffe's OpenCV 4.6) give [[0, 50, 100], [100, 139, 178], [200, 227, 255]]:
    # the vertical pass keeps its weights at the edge rows, reading the edge row twice.
    a = np.array([[[0, 100], [200, 255]]], np.uint8)
    np.testing.assert_array_equal(resize_linear(a, 3, 3),
                                  [[[0, 50, 100], [100, 139, 178], [200, 227, 255]]])


def test_odd_sizes_match_opencv_exactly():
    # cv2.resize(a, (4, 3)) from cv2 5.0, a 2 x 3 image enlarged unevenly
    a = np.array([[[10, 200, 37], [250, 3, 90]]], np.uint8)
    np.testing.assert_array_equal(resize_linear(a, 3, 4)[0],
                                  [[10, 129, 139, 37], [130, 112, 87, 64], [250, 95, 35, 90]])


def test_resize_to_the_same_size_is_identity():
    a = np.arange(12, dtype=np.uint8).reshape(1, 3, 4)
    assert resize_linear(a, 3, 4) is a


def test_load_image_colour_is_bgr_and_gray_is_one_channel(tmp_path):
    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[..., 0] = 255
    path = write_png(tmp_path / "red.png", rgb)
    bgr = load_image(path, color=True)
    assert bgr.shape == (3, 2, 3) and bgr[2].min() == 255 and bgr[0].max() == 0
    assert load_image(path, color=False).shape == (1, 2, 3)
    # 0.299 * 255 = 76.2 -> 76
    assert int(load_image(path, color=False)[0, 0, 0]) == 76


def test_a_16_bit_gray_png_reads_as_opencv_reads_it(tmp_path):
    """OpenCV (and so Caffe) keeps each 16-bit value's high byte; Pillow's own conversion
    clipped every value above 255 to 255. The same for a DB's encoded record."""
    from PIL import Image

    values = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)
    path = tmp_path / "g16.png"
    Image.fromarray(values).save(path)   # a uint16 array: mode I;16
    want = (values >> 8).astype(np.uint8)
    np.testing.assert_array_equal(load_image(path, color=False), want[None])
    np.testing.assert_array_equal(load_image(path, color=True), np.stack([want] * 3))
    np.testing.assert_array_equal(decode_image(path.read_bytes()), want[None])


def test_load_image_errors(tmp_path):
    with pytest.raises(DataError) as info:
        load_image(tmp_path / "x.png", color=True)
    assert str(info.value) == f"{tmp_path}/x.png: image not found"
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"bad.png: not a readable image \("):
        load_image(tmp_path / "bad.png", color=True)


def test_encode_image_round_trips_bgr():
    bgr = np.random.default_rng(0).integers(0, 256, (3, 4, 5), dtype=np.uint8)
    np.testing.assert_array_equal(decode_image(encode_image(bgr, "png")), bgr)
    assert encode_image(bgr, "jpg")[:2] == b"\xff\xd8"
    gray = bgr[:1]
    np.testing.assert_array_equal(decode_image(encode_image(gray, "png")), gray)


def test_extension_type():
    assert [extension_type(p) for p in ("a/B.JPEG", "x.png", "y.jpg", "noext")] == [
        "jpg", "png", "jpg", ""]


def test_resize_equals_cv2_on_random_images_and_sizes(resize_path):
    """Where OpenCV's Python package is installed: 300 random shapes, up and down, 1 or 3
    channels, halving included; cv2.resize itself, the numpy path and resize_linear (which
    takes cv2 when present) give the same bits (the genuine Caffe's resizes are held in
    tests/golden)."""
    cv2 = pytest.importorskip("cv2")
    if resize_path == "numpy":
        pytest.skip("compares the two paths once")
    rng = np.random.default_rng(1)
    for case in range(300):
        h, w = (int(v) for v in rng.integers(1, 40, 2))
        th, tw = (max(1, h // 2), max(1, w // 2)) if case % 10 == 0 else \
            (int(v) for v in rng.integers(1, 50, 2))
        c = int(rng.choice([1, 3]))
        a = rng.integers(0, 256, (c, h, w), dtype=np.uint8)
        theirs = cv2.resize(np.ascontiguousarray(a.transpose(1, 2, 0)), (tw, th))
        theirs = theirs.reshape(th, tw, c).transpose(2, 0, 1)
        numpy_path = resize_linear_numpy(a, th, tw)
        np.testing.assert_array_equal(numpy_path, theirs, err_msg=f"{(c, h, w)} -> {(th, tw)}")
        got = resize_linear(a, th, tw)
        assert got.dtype == np.uint8 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, numpy_path, err_msg=f"{(c, h, w)} -> {(th, tw)}")
