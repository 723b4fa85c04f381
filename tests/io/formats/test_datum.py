"""The Datum wire codec against bytes written by hand from the protobuf wire rules."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from caffe_py.errors import DataError
from caffe_py.io.formats.datum import (
    Datum,
    datum_from_array,
    datum_to_array,
    decode_datum,
    decode_image,
    decode_record,
    encode_datum,
)

# An MNIST-converter record: channels=1 (08 01), height=2 (10 02), width=2 (18 02),
# data=4 bytes (22 04 ...), label=7 (28 07); no encoded field.
MNIST_BYTES = bytes([0x08, 0x01, 0x10, 0x02, 0x18, 0x02, 0x22, 0x04, 0x00, 0x7F, 0x80, 0xFF,
                     0x28, 0x07])
MNIST_DATUM = Datum(1, 2, 2, b"\x00\x7f\x80\xff", 7)


def test_decoder_reads_hand_written_bytes():
    assert decode_datum(MNIST_BYTES) == MNIST_DATUM


def test_encoder_writes_the_same_bytes():
    assert encode_datum(MNIST_DATUM) == MNIST_BYTES


def test_imageset_raw_record_writes_encoded_false_last():
    datum = Datum(1, 2, 2, b"\x00\x7f\x80\xff", 7, encoded=False)
    assert encode_datum(datum) == MNIST_BYTES + b"\x38\x00"
    assert decode_datum(MNIST_BYTES + b"\x38\x00") == datum


def test_encoded_record_has_no_dimensions():
    datum = Datum(data=b"abc", label=1, encoded=True)
    raw = bytes([0x22, 0x03]) + b"abc" + bytes([0x28, 0x01, 0x38, 0x01])
    assert encode_datum(datum) == raw
    assert decode_datum(raw) == datum


def test_negative_label_is_a_ten_byte_varint():
    raw = encode_datum(Datum(1, 1, 1, b"\x05", -1))
    assert raw[-11:] == bytes([0x28] + [0xFF] * 9 + [0x01])
    assert decode_datum(raw).label == -1


def test_float_data_unpacked_on_write_packed_or_not_on_read():
    # channels 1, height 1, width 2, label 3, float_data [1.0, -2.5] one tag (0x35) per float.
    unpacked = bytes([0x08, 0x01, 0x10, 0x01, 0x18, 0x02, 0x28, 0x03,
                      0x35, 0x00, 0x00, 0x80, 0x3F, 0x35, 0x00, 0x00, 0x20, 0xC0])
    datum = Datum(1, 1, 2, b"", 3, [1.0, -2.5])
    assert encode_datum(datum) == unpacked
    assert decode_datum(unpacked) == datum
    packed = unpacked[:8] + bytes([0x32, 0x08, 0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x20, 0xC0])
    assert decode_datum(packed) == datum
    np.testing.assert_array_equal(datum_to_array(datum), [[[1.0, -2.5]]])


def test_unknown_fields_are_skipped():
    extra = bytes([0x78, 0x05, 0x82, 0x01, 0x02, 0xAA, 0xBB, 0x9D, 0x01, 1, 2, 3, 4])
    assert decode_datum(MNIST_BYTES[:6] + extra + MNIST_BYTES[6:]) == MNIST_DATUM


@pytest.mark.parametrize("raw, reason", [
    (MNIST_BYTES[:-1], "truncated varint at byte 13"),
    (MNIST_BYTES[:9], "field 4 runs past the end (12 > 9 bytes)"),
    (b"\x08\xff", "truncated varint at byte 2"),
    (b"\x0a\x01\x00", "field 1 has wire type 2"),
])
def test_bad_bytes_name_the_reason(raw, reason):
    with pytest.raises(DataError) as info:
        decode_datum(raw)
    assert str(info.value) == f"not a Caffe Datum: {reason}"


def test_decode_record_names_database_and_key():
    with pytest.raises(DataError) as info:
        decode_record(b"\x08", source="db/train_lmdb", key=b"00000042")
    assert str(info.value) == ("db/train_lmdb: record '00000042' is not a Caffe Datum "
                               "(truncated varint at byte 1); rebuild the database with "
                               "`cpy convert`")


def test_array_round_trip_is_planar_chw():
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    datum = datum_from_array(array, 5)
    assert (datum.channels, datum.height, datum.width, datum.label) == (2, 3, 4, 5)
    assert datum.data == bytes(range(24))
    np.testing.assert_array_equal(datum_to_array(decode_datum(encode_datum(datum))), array)


def test_data_size_mismatch_is_reported():
    with pytest.raises(DataError, match=r"data holds 3 bytes but channels x height x width "
                                        r"= 1 x 2 x 2 = 4"):
        datum_to_array(Datum(1, 2, 2, b"abc"))


@pytest.mark.parametrize("datum,shape", [
    (Datum(-1, -1, 1, b"\0"), "-1 x -1 x 1"), (Datum(0, 0, 0, b""), "0 x 0 x 0"),
    (Datum(1, -1, -1, b"", 0, [1.0]), "1 x -1 x -1"), (Datum(3, 0, 4, b""), "3 x 0 x 4"),
])
def test_a_record_without_a_shape_is_refused(datum, shape):
    """A negative or zero side (a damaged header converted, or an empty value) is an error
    naming the shape, not numpy's reshape failure or an empty array."""
    with pytest.raises(DataError) as info:
        datum_to_array(datum)
    assert str(info.value) == f"holds no image (channels x height x width = {shape})"


def _png(array_hwc: np.ndarray, mode: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array_hwc, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


def test_encoded_colour_decodes_to_bgr():
    rgb = np.zeros((2, 3, 3), dtype=np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 10, 20, 30
    datum = Datum(data=_png(rgb, "RGB"), label=2, encoded=True)
    array = datum_to_array(datum)
    assert array.shape == (3, 2, 3) and datum.shape == (3, 2, 3)
    assert [int(array[c, 0, 0]) for c in range(3)] == [30, 20, 10]  # B, G, R
    gray = datum_to_array(datum, color=False)
    # OpenCV's BGR2GRAY: 0.299 R + 0.587 G + 0.114 B = 2.99 + 11.74 + 3.42 = 18.15 -> 18.
    assert gray.shape == (1, 2, 3) and int(gray[0, 0, 0]) == 18


def test_encoded_gray_keeps_one_channel_unless_colour_forced():
    gray = np.array([[0, 50], [100, 255]], dtype=np.uint8)
    data = _png(gray, "L")
    np.testing.assert_array_equal(decode_image(data), gray[None])
    forced = decode_image(data, color=True)
    assert forced.shape == (3, 2, 2)
    np.testing.assert_array_equal(forced[2], gray)


def test_encoded_garbage_is_a_data_error():
    """The message shows the bytes, not Pillow's name for its BytesIO object."""
    with pytest.raises(DataError) as info:
        datum_to_array(Datum(data=b"not an image", encoded=True))
    assert str(info.value) == ("encoded image does not decode (its 12 bytes are no image format "
                               "Pillow reads: they begin 6e 6f 74 20 61 6e 20 69)")
    with pytest.raises(DataError) as info:
        datum_to_array(Datum(data=b"", encoded=True))
    assert str(info.value) == ("encoded image does not decode (its 0 bytes are no image format "
                               "Pillow reads)")
