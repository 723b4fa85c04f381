"""caffe.proto's Datum, BlobShape and BlobProto as real protobuf classes (built at run time from
descriptors, proto2 as in caffe.proto), to check the hand-written codecs against the protobuf
library's serializer where it is installed."""
from __future__ import annotations

import pytest

protobuf = pytest.importorskip("google.protobuf")

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _message(file, name, fields):
    message = file.message_type.add(name=name)
    for field_name, number, kind, label, *extra in fields:
        field = message.field.add(name=field_name, number=number, type=kind, label=label)
        if extra and extra[0] == "packed":
            field.options.packed = True
        elif extra:
            field.type_name = extra[0]


def _build():
    file = descriptor_pb2.FileDescriptorProto(name="caffe_py_test_caffe.proto", package="caffe",
                                              syntax="proto2")
    _message(file, "Datum", [
        ("channels", 1, _F.TYPE_INT32, _OPT), ("height", 2, _F.TYPE_INT32, _OPT),
        ("width", 3, _F.TYPE_INT32, _OPT), ("data", 4, _F.TYPE_BYTES, _OPT),
        ("label", 5, _F.TYPE_INT32, _OPT), ("float_data", 6, _F.TYPE_FLOAT, _REP),
        ("encoded", 7, _F.TYPE_BOOL, _OPT)])
    _message(file, "BlobShape", [("dim", 1, _F.TYPE_INT64, _REP, "packed")])
    _message(file, "BlobProto", [
        ("shape", 7, _F.TYPE_MESSAGE, _OPT, ".caffe.BlobShape"),
        ("data", 5, _F.TYPE_FLOAT, _REP, "packed"), ("diff", 6, _F.TYPE_FLOAT, _REP, "packed"),
        ("double_data", 8, _F.TYPE_DOUBLE, _REP, "packed"),
        ("double_diff", 9, _F.TYPE_DOUBLE, _REP, "packed"),
        ("num", 1, _F.TYPE_INT32, _OPT), ("channels", 2, _F.TYPE_INT32, _OPT),
        ("height", 3, _F.TYPE_INT32, _OPT), ("width", 4, _F.TYPE_INT32, _OPT)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"caffe.{n}"))
                 for n in ("Datum", "BlobProto"))


CaffeDatum, CaffeBlobProto = _build()
