"""BlobProto (.binaryproto) against bytes written by hand from caffe.proto and the wire rules."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from caffe_py.errors import DataError
from caffe_py.io.formats.blobproto import (
    BlobProto,
    blob_from_array,
    decode_blob,
    encode_blob,
    read_blob_file,
    read_mean_file,
    write_blob_file,
)
from caffe_py.io.formats.wire import blob_shape, len_field

FLOATS = struct.pack("<2f", 1.5, -2.0)
# compute_image_mean: num=1 (08 01), channels=1 (10 01), height=1 (18 01), width=2 (20 02),
# data packed (2a 08 + two floats).
LEGACY_BYTES = bytes([0x08, 0x01, 0x10, 0x01, 0x18, 0x01, 0x20, 0x02, 0x2A, 0x08]) + FLOATS
# Blob::ToProto: data packed (2a 08 ...), then shape (3a 04) holding dim packed (0a 02 01 02).
SHAPE_BYTES = bytes([0x2A, 0x08]) + FLOATS + bytes([0x3A, 0x04, 0x0A, 0x02, 0x01, 0x02])


def test_legacy_blob_bytes():
    blob = blob_from_array(np.array([[[[1.5, -2.0]]]]), legacy=True)
    assert encode_blob(blob) == LEGACY_BYTES
    decoded = decode_blob(LEGACY_BYTES)
    assert decoded.legacy == (1, 1, 1, 2) and decoded.shape is None
    np.testing.assert_array_equal(decoded.array(), [[[[1.5, -2.0]]]])


def test_shape_blob_bytes():
    blob = blob_from_array(np.array([[1.5, -2.0]]))
    assert encode_blob(blob) == SHAPE_BYTES
    decoded = decode_blob(SHAPE_BYTES)
    assert decoded.shape == (1, 2) and decoded.legacy is None
    assert decoded.array().dtype == np.float32 and decoded.array().shape == (1, 2)


def test_unpacked_floats_doubles_and_unknown_fields():
    # data as two unpacked fixed32 fields (2d ...), an unknown field 20 (a0 01 05), shape with
    # an unpacked dim (08 02), double_data packed (42 08 + one double).
    raw = (b"\x2d" + FLOATS[:4] + b"\x2d" + FLOATS[4:] + b"\xa0\x01\x05"
           + b"\x3a\x02\x08\x02" + b"\x42\x08" + struct.pack("<d", 0.25))
    blob = decode_blob(raw)
    np.testing.assert_array_equal(blob.data, [1.5, -2.0])
    np.testing.assert_array_equal(blob.double_data, [0.25])
    assert blob.shape == (2,)
    again = decode_blob(encode_blob(blob))
    np.testing.assert_array_equal(again.double_data, [0.25])
    np.testing.assert_array_equal(again.data, [1.5, -2.0])


def test_diff_round_trips():
    blob = BlobProto(shape=(3,), data=np.arange(3, dtype=np.float32),
                     diff=np.ones(3, dtype=np.float32))
    np.testing.assert_array_equal(decode_blob(encode_blob(blob)).diff, [1, 1, 1])


def test_bad_bytes():
    with pytest.raises(DataError) as info:
        decode_blob(b"\x2a\x09" + FLOATS)
    assert str(info.value) == "not a Caffe BlobProto: field 5 runs past the end (11 > 10 bytes)"
    with pytest.raises(DataError, match="values but its shape 3 needs 3"):
        BlobProto(shape=(3,), data=np.zeros(2, dtype=np.float32)).array()


def test_mean_file_round_trip(tmp_path):
    mean = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2) / 4
    path = tmp_path / "sub" / "mean.binaryproto"
    write_blob_file(path, blob_from_array(mean, legacy=True))
    assert [p.name for p in path.parent.iterdir()] == ["mean.binaryproto"]  # no temp left
    np.testing.assert_array_equal(read_mean_file(path), mean[0])
    assert read_blob_file(path).legacy == (1, 3, 2, 2)


def test_mean_file_errors(tmp_path):
    with pytest.raises(DataError) as info:
        read_mean_file(tmp_path / "mean.binaryproto")
    assert str(info.value) == (f"{tmp_path}/mean.binaryproto: file not found; create a mean "
                               "file with `cpy compute-mean DB OUT`")
    garbage = tmp_path / "garbage.binaryproto"
    garbage.write_bytes(b"\x2a\xff")
    with pytest.raises(DataError) as info:
        read_mean_file(garbage)
    assert str(info.value) == (f"{garbage}: not a Caffe BlobProto (truncated varint at byte 2); "
                               "create it with `cpy compute-mean DB OUT`")
    two = tmp_path / "two.binaryproto"
    write_blob_file(two, blob_from_array(np.zeros((2, 1, 2, 2)), legacy=True))
    with pytest.raises(DataError) as info:
        read_mean_file(two)
    assert str(info.value) == (f"{two}: a mean file holds one (1, C, H, W) image, this blob is "
                               "2x1x2x2")


@pytest.mark.parametrize("raw, dims", [
    ("0a 03 02 03 04", (2, 3, 4)),  # packed, as Blob::ToProto writes it
    ("08 02 08 03 08 04", (2, 3, 4)),  # one field per dim
    ("08 02 a0 01 05 0a 01 07", (2, 7)),  # mixed, with an unknown field 20 in between
    ("", ()),  # a scalar blob's empty shape
    ("08 ff ff ff ff ff ff ff ff ff 01", (-1,)),  # int64, ten-byte negative
])
def test_the_one_blob_shape_decoder(raw, dims):
    """BlobShape as BlobProto and the streamed .caffemodel blobs both read it."""
    buf = bytes.fromhex(raw)
    assert blob_shape(buf) == dims
    assert decode_blob(len_field(7, buf)).shape == dims
