"""The hand-written codecs against the protobuf library's own serializer of caffe.proto's
messages (skipped where protobuf is not installed): the bytes Caffe writes are the bytes
caffe-py writes, and each side parses the other's."""
from __future__ import annotations

import numpy as np
import pytest

from caffe_py.io.formats.blobproto import blob_from_array, decode_blob, encode_blob
from caffe_py.io.formats.datum import Datum, decode_datum, encode_datum

caffe_proto = pytest.importorskip("caffe_proto")
CaffeDatum, CaffeBlobProto = caffe_proto.CaffeDatum, caffe_proto.CaffeBlobProto


def _caffe_datum(d: Datum):
    """The message Caffe's converters build for ``d`` (the same fields set)."""
    m = CaffeDatum()
    if not (d.encoded and (d.channels, d.height, d.width) == (0, 0, 0)):
        m.channels, m.height, m.width = d.channels, d.height, d.width
    if d.data or not d.float_data:
        m.data = d.data
    m.label = d.label
    m.float_data.extend(d.float_data)
    if d.encoded is not None:
        m.encoded = d.encoded
    return m


DATUMS = [
    Datum(1, 28, 28, bytes(range(256)) * 3 + bytes(16), 9),  # convert_mnist_data
    Datum(3, 32, 32, bytes(3072), 6),  # convert_cifar_data
    Datum(3, 2, 2, bytes(12), 1, encoded=False),  # convert_imageset
    Datum(data=b"\x89PNG fake", label=-3, encoded=True),  # convert_imageset --encoded
    Datum(1, 1, 3, b"", 2147483647, [0.5, -(2.0**100), 3.25]),  # float record
]


@pytest.mark.parametrize("datum", DATUMS)
def test_datum_bytes_equal_protobuf(datum):
    theirs = _caffe_datum(datum).SerializeToString()
    assert encode_datum(datum) == theirs
    assert decode_datum(theirs) == datum
    parsed = CaffeDatum.FromString(encode_datum(datum))
    assert (parsed.label, parsed.data, list(parsed.float_data)) == (
        datum.label, datum.data, pytest.approx(datum.float_data))


def test_blob_bytes_equal_protobuf():
    mean = np.arange(6, dtype=np.float32).reshape(1, 2, 1, 3) / 7
    caffe = CaffeBlobProto(num=1, channels=2, height=1, width=3)
    caffe.data.extend(mean.ravel().tolist())
    assert encode_blob(blob_from_array(mean, legacy=True)) == caffe.SerializeToString()
    shaped = CaffeBlobProto()
    shaped.shape.dim.extend([2, 3])
    shaped.data.extend(mean.ravel().tolist())
    shaped.double_data.extend([0.1, 0.2])
    ours = blob_from_array(mean.reshape(2, 3))
    ours.double_data = np.array([0.1, 0.2])
    assert encode_blob(ours) == shaped.SerializeToString()
    decoded = decode_blob(shaped.SerializeToString())
    assert decoded.shape == (2, 3)
    np.testing.assert_array_equal(decoded.array(), mean.reshape(2, 3))
