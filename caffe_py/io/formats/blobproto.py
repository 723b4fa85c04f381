"""Caffe's ``BlobProto``: the ``.binaryproto`` mean files, and the blobs inside Caffe's weight
and solver-state files.

caffe.proto::

    message BlobShape { repeated int64 dim = 1 [packed = true]; }
    message BlobProto {
      optional int32 num = 1; optional int32 channels = 2;     // legacy 4-D shape
      optional int32 height = 3; optional int32 width = 4;
      repeated float data = 5 [packed = true];  repeated float diff = 6 [packed = true];
      optional BlobShape shape = 7;
      repeated double double_data = 8 [packed = true];  repeated double double_diff = 9 [...];
    }

``compute_image_mean`` writes the legacy fields and ``data`` (no ``shape``); ``Blob::ToProto``
writes ``shape`` and ``data``. Both read back here; fields come out in field-number order.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import DataError
from ...fileio import atomic_write_bytes
from .wire import (
    FIXED32,
    FIXED64,
    LEN,
    VARINT,
    WireError,
    as_int32,
    blob_shape,
    len_field,
    read_len,
    read_varint,
    skip,
    tag,
    varint,
)

_LEGACY = ("num", "channels", "height", "width")


@dataclass
class BlobProto:
    """A blob as stored. ``shape`` is None when the file has only the legacy 4-D fields."""

    shape: tuple[int, ...] | None = None
    data: np.ndarray | None = None  # float32, flat
    diff: np.ndarray | None = None  # float32, flat
    double_data: np.ndarray | None = None  # float64, flat
    double_diff: np.ndarray | None = None  # float64, flat
    legacy: tuple[int, int, int, int] | None = None  # (num, channels, height, width)

    def dims(self) -> tuple[int, ...]:
        """The blob's shape: ``shape`` if present, else the legacy (num, C, H, W)."""
        if self.shape is not None:
            return self.shape
        return self.legacy if self.legacy is not None else ()

    def array(self) -> np.ndarray:
        """``data`` (or ``double_data``) reshaped to :meth:`dims`."""
        values = self.data if self.data is not None else self.double_data
        if values is None:
            values = np.zeros(0, dtype=np.float32)
        dims = self.dims()
        if int(np.prod(dims, dtype=np.int64)) != values.size:
            raise DataError(f"blob holds {values.size} values but its shape "
                            f"{'x'.join(map(str, dims)) or '()'} needs "
                            f"{int(np.prod(dims, dtype=np.int64))}")
        return values.reshape(dims)


def blob_from_array(array: np.ndarray, *, legacy: bool = False) -> BlobProto:
    """A float32 blob of ``array``: with ``shape`` as Blob::ToProto writes it, or (``legacy``,
    4-D arrays only) with num/channels/height/width as compute_image_mean writes them."""
    data = np.ascontiguousarray(array, dtype=np.float32).ravel()
    if legacy:
        if array.ndim != 4:
            raise ValueError(f"legacy BlobProto fields need a 4-D array, got {array.shape}")
        return BlobProto(data=data, legacy=tuple(int(n) for n in array.shape))  # type: ignore
    return BlobProto(shape=tuple(int(n) for n in array.shape), data=data)


def encode_blob(blob: BlobProto) -> bytes:
    parts: list[bytes] = []
    if blob.legacy is not None:
        for number, value in enumerate(blob.legacy, start=1):
            parts += [tag(number, VARINT), varint(value)]
    for number, values, dtype in ((5, blob.data, "<f4"), (6, blob.diff, "<f4")):
        if values is not None and values.size:
            parts.append(len_field(number, np.asarray(values, dtype=dtype).tobytes()))
    if blob.shape is not None:
        dims = b"".join(varint(d) for d in blob.shape)
        parts.append(len_field(7, len_field(1, dims) if dims else b""))
    for number, values in ((8, blob.double_data), (9, blob.double_diff)):
        if values is not None and values.size:
            parts.append(len_field(number, np.asarray(values, dtype="<f8").tobytes()))
    return b"".join(parts)


def decode_blob(buf: bytes) -> BlobProto:
    """Parse a BlobProto (packed or unpacked repeated fields; unknown fields skipped)."""
    try:
        return _decode_blob(bytes(buf))
    except WireError as exc:
        raise DataError(f"not a Caffe BlobProto: {exc}") from None


def _decode_blob(buf: bytes) -> BlobProto:
    blob = BlobProto()
    legacy = [0, 0, 0, 0]
    has_legacy = False
    repeated: dict[int, list[np.ndarray]] = {5: [], 6: [], 8: [], 9: []}
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number in (1, 2, 3, 4) and wire == VARINT:
            value, pos = read_varint(buf, pos)
            legacy[number - 1], has_legacy = as_int32(value), True
        elif number in repeated:
            pos = _read_repeated(buf, pos, number, wire, repeated[number])
        elif number == 7 and wire == LEN:
            start, pos = read_len(buf, pos, 7)
            blob.shape = blob_shape(buf[start:pos])
        elif number in (1, 2, 3, 4, 7):
            raise WireError(f"field {number} has wire type {wire}")
        else:
            pos = skip(buf, pos, number, wire)
    if has_legacy:
        blob.legacy = tuple(legacy)  # type: ignore[assignment]
    for number, name, dtype in ((5, "data", "<f4"), (6, "diff", "<f4"),
                                (8, "double_data", "<f8"), (9, "double_diff", "<f8")):
        if repeated[number]:
            setattr(blob, name, np.concatenate(repeated[number]).astype(dtype[1:]))
    return blob


def _read_repeated(buf: bytes, pos: int, number: int, wire: int, out: list[np.ndarray]) -> int:
    dtype, width, single = ("<f4", 4, FIXED32) if number in (5, 6) else ("<f8", 8, FIXED64)
    if wire == LEN:
        start, end = read_len(buf, pos, number)
        if (end - start) % width:
            raise WireError(f"packed field {number} length is not a multiple of {width}")
        out.append(np.frombuffer(buf[start:end], dtype=dtype))
        return end
    if wire == single:
        if pos + width > len(buf):
            raise WireError(f"field {number} runs past the end")
        out.append(np.frombuffer(buf[pos:pos + width], dtype=dtype))
        return pos + width
    raise WireError(f"field {number} has wire type {wire}")


def write_blob_file(path: str | os.PathLike, blob: BlobProto) -> None:
    """Write a ``.binaryproto`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    atomic_write_bytes(path, encode_blob(blob))


def read_blob_file(path: str | os.PathLike) -> BlobProto:
    """Read a ``.binaryproto``; a missing or unreadable file is a one-line DataError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found; create a mean file with `cpy compute-mean "
                        "DB OUT`") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a .binaryproto file") from None
    try:
        return _decode_blob(raw)
    except WireError as exc:
        raise DataError(f"{path}: not a Caffe BlobProto ({exc}); create it with "
                        "`cpy compute-mean DB OUT`") from None


def read_mean_file(path: str | os.PathLike) -> np.ndarray:
    """A mean file as a float32 (C, H, W) array (its num must be 1), for transform_param."""
    blob = read_blob_file(path)
    try:
        array = blob.array()
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None
    if array.ndim == 4 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 3:
        raise DataError(f"{path}: a mean file holds one (1, C, H, W) image, this blob is "
                        f"{'x'.join(map(str, array.shape)) or 'empty'}")
    return array.astype(np.float32, copy=False)
