"""Caffe's protobuf messages (``caffe.proto.caffe_pb2``) as real protobuf classes.

The classes are built when this module is imported, from the table of caffe.proto's
messages in :mod:`.caffe_proto_table`, in a descriptor pool of their own (so a genuine
pycaffe's ``caffe_pb2`` in the same process is not disturbed). Everything the protobuf
library gives a generated module works: ``text_format.Merge(text, caffe_pb2.NetParameter())``,
``str(msg)`` in Caffe's prototxt form, ``SerializeToString`` / ``ParseFromString`` (the
bytes Caffe reads), ``HasField``, nested enums as class attributes
(``caffe_pb2.PoolingParameter.MAX``, ``caffe_pb2.SolverParameter.GPU``) and the top-level
``Phase`` values ``TRAIN`` / ``TEST``. It needs the ``protobuf`` package, as pycaffe does.
"""
from __future__ import annotations

from typing import Any

from ...errors import CaffePyError
from .caffe_proto_table import ENUMS, MESSAGES

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError:  # pragma: no cover - protobuf is in caffe-py's pycaffe extra
    raise CaffePyError("caffe.proto.caffe_pb2 needs the protobuf package, as pycaffe does: "
                       "pip install protobuf (or caffe-py[pycaffe])") from None

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64, "int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32,
    "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES,
}
_LABELS = {"optional": _F.LABEL_OPTIONAL, "repeated": _F.LABEL_REPEATED,
           "required": _F.LABEL_REQUIRED}
FILE_NAME = "caffe_py/pycaffe/caffe.proto"
"""The descriptor file's name (Caffe's is caffe.proto; the package, ``caffe``, is Caffe's)."""


def _enum_scope(message: str, kind: str) -> str | None:
    """The full name of enum ``kind`` used by a field of ``message`` (nested first)."""
    if kind in MESSAGES[message][0]:
        return f".caffe.{message}.{kind}"
    if kind in ENUMS:
        return f".caffe.{kind}"
    return None


def _file() -> Any:
    file = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package="caffe", syntax="proto2")
    for name, values in ENUMS.items():
        enum = file.enum_type.add(name=name)
        for value, number in values:
            enum.value.add(name=value, number=number)
    for name, (nested, fields) in MESSAGES.items():
        message = file.message_type.add(name=name)
        for enum_name, values in nested.items():
            enum = message.enum_type.add(name=enum_name)
            for value, number in values:
                enum.value.add(name=value, number=number)
        for field_name, number, label, kind, default, packed in fields:
            field = message.field.add(name=field_name, number=number, label=_LABELS[label])
            if kind in _SCALARS:
                field.type = _SCALARS[kind]
            elif _enum_scope(name, kind) is not None:
                field.type = _F.TYPE_ENUM
                field.type_name = str(_enum_scope(name, kind))
            else:
                field.type = _F.TYPE_MESSAGE
                field.type_name = f".caffe.{kind}"
            if default is not None:
                field.default_value = default
            if packed:
                field.options.packed = True
    return file


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
DESCRIPTOR = _POOL.FindFileByName(FILE_NAME)

_classes = {name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"caffe.{name}"))
            for name in MESSAGES}
globals().update(_classes)
for _enum_name, _values in ENUMS.items():
    for _value, _number in _values:
        globals()[_value] = _number
Phase: Any = None
try:
    from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

    Phase = EnumTypeWrapper(DESCRIPTOR.enum_types_by_name["Phase"])
except ImportError:  # pragma: no cover
    pass

__all__ = [*_classes, *(v for values in ENUMS.values() for v, _ in values), "Phase",
           "DESCRIPTOR"]


def __getattr__(name: str) -> Any:
    from ..errors import missing

    raise missing("caffe.proto.caffe_pb2", name, [*_classes, "TRAIN", "TEST", "Phase"])
