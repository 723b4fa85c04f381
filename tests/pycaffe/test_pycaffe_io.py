"""caffe_py.pycaffe.io (caffe.io): images, preprocessing, and Caffe's messages through
caffe-py's codecs."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import caffe_py.pycaffe as caffe
from caffe_py.io.formats.blobproto import decode_blob
from caffe_py.io.formats.datum import decode_datum

pytest.importorskip("google.protobuf")


def test_load_image_gives_float_rgb_or_intensity(tmp_path):
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 9
    Image.fromarray(rgb).save(tmp_path / "c.png")
    Image.fromarray(rgb[:, :, 0]).save(tmp_path / "g.png")
    color = caffe.io.load_image(str(tmp_path / "c.png"))
    assert color.dtype == np.float32 and color.shape == (2, 3, 3)
    np.testing.assert_allclose(color, rgb / 255.0, rtol=1e-6)
    gray = caffe.io.load_image(str(tmp_path / "c.png"), color=False)
    luma = rgb / 255.0 @ np.array([0.2125, 0.7154, 0.0721])  # scikit-image's rgb2gray
    np.testing.assert_allclose(gray[:, :, 0], luma, rtol=1e-6)
    assert caffe.io.load_image(str(tmp_path / "g.png")).shape == (2, 3, 3)  # gray tiled
    assert caffe.io.load_image(str(tmp_path / "g.png"), color=False).shape == (2, 3, 1)
    with pytest.raises(caffe.io.IoError, match="^caffe.io.load_image: .*none.png: no such "
                                               "file$"):
        caffe.io.load_image(str(tmp_path / "none.png"))


def test_resize_image_matches_scikit_image_and_keeps_constants():
    skimage = pytest.importorskip("skimage.transform")
    im = np.linspace(0, 2, 4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3)
    out = caffe.io.resize_image(im, (7, 3))
    expect = skimage.resize(im / 2, (7, 3), order=1, mode="constant") * 2
    np.testing.assert_allclose(out, expect, rtol=1e-6)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(caffe.io.resize_image(np.full((3, 3, 1), 4.0), (5, 2)), 4.0)
    assert caffe.io.resize_image(np.ones((4, 4, 2)), (8, 2)).shape == (8, 2, 2)  # scipy zoom


def test_transformer_preprocess_and_deprocess_are_inverse():
    t = caffe.io.Transformer({"data": (1, 3, 4, 2)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", np.array([1.0, 2.0, 3.0]))
    t.set_input_scale("data", 0.5)
    image = np.random.RandomState(0).uniform(0, 1, (4, 2, 3)).astype(np.float32)
    pre = t.preprocess("data", image)
    assert pre.shape == (3, 4, 2)
    np.testing.assert_allclose(pre[0], (image[:, :, 2] * 255 - 1) * 0.5, rtol=1e-6)
    np.testing.assert_allclose(t.deprocess("data", pre), image, rtol=1e-5, atol=1e-6)
    with pytest.raises(caffe.io.IoError, match="^label is not one of the net inputs"):
        t.preprocess("label", image)
    with pytest.raises(ValueError, match="^Mean channels incompatible with input.$"):
        t.set_mean("data", np.zeros(2))


def test_oversample_gives_corners_centre_and_mirrors():
    image = np.arange(6 * 6, dtype=np.float32).reshape(6, 6, 1)
    crops = caffe.io.oversample([image], (4, 4))
    assert crops.shape == (10, 4, 4, 1)
    np.testing.assert_array_equal(crops[0], image[:4, :4])
    np.testing.assert_array_equal(crops[4], image[1:5, 1:5])
    np.testing.assert_array_equal(crops[5], image[:4, :4][:, ::-1])


def test_blobprotos_and_datums_are_caffes_bytes():
    array = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    blob = caffe.io.array_to_blobproto(array, diff=-array)
    np.testing.assert_array_equal(decode_blob(blob.SerializeToString()).array(), array)
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(blob, return_diff=True), -array)
    text = caffe.io.arraylist_to_blobprotovector_str([array, array[0]])
    assert [a.shape for a in caffe.io.blobprotovector_str_to_arraylist(text)] == [(1, 2, 3),
                                                                                  (2, 3)]
    pixels = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    datum = caffe.io.array_to_datum(pixels, 7)
    record = decode_datum(datum.SerializeToString())
    assert (record.channels, record.height, record.width, record.label) == (2, 3, 4, 7)
    np.testing.assert_array_equal(caffe.io.datum_to_array(datum), pixels)
    floats = caffe.io.datum_to_array(caffe.io.array_to_datum(array))
    assert floats.dtype == np.float64 and floats.shape == (1, 2, 3)
    assert not caffe.io.array_to_datum(array).HasField("label")
    with pytest.raises(ValueError, match="^Incorrect array shape.$"):
        caffe.io.array_to_datum(np.zeros(3))


def test_an_uncovered_io_name_is_one_line():
    with pytest.raises(AttributeError) as info:
        _ = caffe.io.load_imag
    assert str(info.value) == ("caffe.io.load_imag is not covered by caffe-py's pycaffe; the "
                               "nearest covered name is caffe.io.load_image (docs/pycaffe.md "
                               "lists what is covered)")
