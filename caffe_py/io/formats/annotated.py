"""SSD's AnnotatedDatum records (weiliu89/caffe's caffe.proto extension), by hand on the
protobuf wire format, so that the fork's tools read the LMDBs caffe-py writes and caffe-py
reads theirs::

    AnnotatedDatum  { Datum datum = 1; AnnotationType type = 2 (BBOX = 0);
                      repeated AnnotationGroup annotation_group = 3; }
    AnnotationGroup { int32 group_label = 1; repeated Annotation annotation = 2; }
    Annotation      { int32 instance_id = 1 [default 0]; NormalizedBBox bbox = 2; }
    NormalizedBBox  { float xmin = 1; ymin = 2; xmax = 3; ymax = 4; int32 label = 5;
                      bool difficult = 6; float score = 7; float size = 8; }

:func:`encode_annotated` writes the fields the fork's convert_annoset sets, in field order,
byte for byte as its ``SerializeToString``; :func:`decode_annotated` reads any valid record.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ...errors import DataError
from .datum import Datum, _decode, encode_datum, format_key
from .wire import (
    FIXED32,
    LEN,
    VARINT,
    WireError,
    as_int32,
    len_field,
    read_len,
    read_varint,
    skip,
    tag,
    varint,
)

BBOX = 0
_FLOAT = struct.Struct("<f")


@dataclass
class NormalizedBBox:
    """A box in [0, 1] coordinates of its image; the optional fields are None when absent."""

    xmin: float = 0.0
    ymin: float = 0.0
    xmax: float = 0.0
    ymax: float = 0.0
    label: int | None = None
    difficult: bool | None = None
    score: float | None = None
    size: float | None = None


@dataclass
class Annotation:
    instance_id: int | None = None
    bbox: NormalizedBBox | None = None


@dataclass
class AnnotationGroup:
    group_label: int | None = None
    annotation: list[Annotation] = field(default_factory=list)


@dataclass
class AnnotatedDatum:
    """One detection record: the image (a Datum) and its boxes, grouped by label."""

    datum: Datum = field(default_factory=Datum)
    type: int | None = None
    annotation_group: list[AnnotationGroup] = field(default_factory=list)

    def boxes(self) -> np.ndarray:
        """(M, 7) float32: [label, instance_id, xmin, ymin, xmax, ymax, difficult] per box,
        group by group."""
        rows = []
        for group in self.annotation_group:
            for anno in group.annotation:
                b = anno.bbox or NormalizedBBox()
                rows.append([group.group_label or 0, anno.instance_id or 0, b.xmin, b.ymin,
                             b.xmax, b.ymax, 1.0 if b.difficult else 0.0])
        return np.asarray(rows, np.float32).reshape(-1, 7)


# --- encoding -------------------------------------------------------------------------------
def _float(number: int, value: float) -> bytes:
    return tag(number, FIXED32) + _FLOAT.pack(value)


def _int(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value)


def encode_bbox(b: NormalizedBBox) -> bytes:
    parts = [_float(1, b.xmin), _float(2, b.ymin), _float(3, b.xmax), _float(4, b.ymax)]
    if b.label is not None:
        parts.append(_int(5, b.label))
    if b.difficult is not None:
        parts.append(_int(6, int(b.difficult)))
    if b.score is not None:
        parts.append(_float(7, b.score))
    if b.size is not None:
        parts.append(_float(8, b.size))
    return b"".join(parts)


def encode_annotated(record: AnnotatedDatum) -> bytes:
    """Serialize as protobuf's SerializeToString does (fields in number order)."""
    parts = [len_field(1, encode_datum(record.datum))]
    if record.type is not None:
        parts.append(_int(2, record.type))
    for group in record.annotation_group:
        inner = [] if group.group_label is None else [_int(1, group.group_label)]
        for anno in group.annotation:
            body = b"" if anno.instance_id is None else _int(1, anno.instance_id)
            if anno.bbox is not None:
                body += len_field(2, encode_bbox(anno.bbox))
            inner.append(len_field(2, body))
        parts.append(len_field(3, b"".join(inner)))
    return b"".join(parts)


# --- decoding -------------------------------------------------------------------------------
def _fields(buf: bytes):
    """(number, wire type, value) per field: ints for varints, (start, end) for the others."""
    pos, size = 0, len(buf)
    while pos < size:
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
            yield number, wire, value
        elif wire == LEN:
            start, pos = read_len(buf, pos, number)
            yield number, wire, (start, pos)
        elif wire == FIXED32:
            if pos + 4 > size:
                raise WireError(f"field {number} runs past the end")
            yield number, wire, (pos, pos + 4)
            pos += 4
        else:
            end = skip(buf, pos, number, wire)
            yield number, wire, (pos, end)
            pos = end


def _decode_bbox(buf: bytes) -> NormalizedBBox:
    b = NormalizedBBox()
    names = {1: "xmin", 2: "ymin", 3: "xmax", 4: "ymax", 7: "score", 8: "size"}
    for number, wire, value in _fields(buf):
        if number in names and wire == FIXED32:
            setattr(b, names[number], _FLOAT.unpack_from(buf, value[0])[0])
        elif number == 5 and wire == VARINT:
            b.label = as_int32(value)
        elif number == 6 and wire == VARINT:
            b.difficult = value != 0
    return b


def _decode_group(buf: bytes) -> AnnotationGroup:
    group = AnnotationGroup()
    for number, wire, value in _fields(buf):
        if number == 1 and wire == VARINT:
            group.group_label = as_int32(value)
        elif number == 2 and wire == LEN:
            anno = Annotation()
            inner = buf[value[0]:value[1]]
            for n2, w2, v2 in _fields(inner):
                if n2 == 1 and w2 == VARINT:
                    anno.instance_id = as_int32(v2)
                elif n2 == 2 and w2 == LEN:
                    anno.bbox = _decode_bbox(inner[v2[0]:v2[1]])
            group.annotation.append(anno)
    return group


def decode_annotated(buf: bytes) -> AnnotatedDatum:
    """Parse a serialized AnnotatedDatum (a WireError when it does not parse)."""
    buf = bytes(buf)
    record = AnnotatedDatum()
    for number, wire, value in _fields(buf):
        if number == 1 and wire == LEN:
            record.datum = _decode(buf[value[0]:value[1]])
        elif number == 2 and wire == VARINT:
            record.type = as_int32(value)
        elif number == 3 and wire == LEN:
            record.annotation_group.append(_decode_group(buf[value[0]:value[1]]))
    return record


def decode_annotated_record(value: bytes, *, source: str, key: bytes) -> AnnotatedDatum:
    """One database value; a failure names the database and the key."""
    try:
        record = decode_annotated(value)
    except WireError as exc:
        raise DataError(f"{source}: record {format_key(key)} is not an AnnotatedDatum ({exc}); "
                        "write the database with `cpy convert annoset` (or SSD's "
                        "convert_annoset)") from None
    if not record.datum.data and not record.datum.float_data:
        raise DataError(f"{source}: record {format_key(key)} holds no image: not an "
                        "AnnotatedDatum (a plain Datum database is read by a Data layer)")
    return record
