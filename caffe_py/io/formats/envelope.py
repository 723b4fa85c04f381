"""The image file inside an encoded Datum, found without the full decoder.

``convert_imageset --encoded`` writes an encoded record as data (field 4: the JPEG or PNG
file), label (field 5) and encoded=true (field 7), in that order and nothing else. For such a
record the file is a view of the value found by a few byte comparisons; any other layout
(dimensions written too, a negative label, other field orders) is left to the full Datum
decoder.
"""
from __future__ import annotations

from .wire import WireError, read_varint

_DATA = 0x22  # field 4, length-delimited
_LABEL = 0x28  # field 5, varint
_ENCODED_TRUE = b"\x38\x01"  # field 7 = 1

JPEG_MAGIC = b"\xff\xd8"


def file_span(value: bytes | memoryview) -> tuple[int, int, int] | None:
    """(where the image file starts and ends in ``value``, the label) of an encoded record in
    Caffe's layout, or None for anything else."""
    if not value or value[0] != _DATA:
        return None
    try:
        size, start = read_varint(value, 1)
        end = start + size
        if end >= len(value) or value[end] != _LABEL:
            return None
        label, tail = read_varint(value, end + 1)
    except WireError:
        return None
    if label >= 1 << 31 or value[tail:] != _ENCODED_TRUE:
        return None
    return start, end, label


def image_file(value: bytes | memoryview) -> tuple[memoryview, int] | None:
    """(the image file, as a view of ``value``; the label) of an encoded record in Caffe's
    layout, or None for anything else."""
    span = file_span(value)
    if span is None:
        return None
    start, end, label = span
    return memoryview(value)[start:end], label


def is_jpeg(file: bytes | memoryview) -> bool:
    """Whether an image file is a JPEG (it starts with the SOI marker)."""
    return bytes(file[:2]) == JPEG_MAGIC
