"""Caffe's ``Datum`` record and a hand-written protobuf wire codec for it (no protobuf import).

caffe.proto (proto2)::

    message Datum {
      optional int32 channels = 1;  optional int32 height = 2;  optional int32 width = 3;
      optional bytes data = 4;      // uint8 pixels, C x H x W planar, or a PNG/JPEG file
      optional int32 label = 5;
      repeated float float_data = 6;  // not [packed=true]: Caffe writes one tag per float
      optional bool encoded = 7 [default = false];
    }

The encoder writes fields in field-number order, as Caffe's C++ serializer does, and writes the
same set of fields Caffe's converters set, so an LMDB written here is byte-identical to Caffe's:

- ``convert_mnist_data`` / ``convert_cifar_data``: channels, height, width, data, label
  (``encoded`` is left unset: :attr:`Datum.encoded` is ``None``).
- ``convert_imageset`` raw: channels, height, width, data, label, encoded=false.
- ``convert_imageset --encoded``: data, label, encoded=true (no dimensions: the file has them).

The decoder accepts any valid Datum: unknown fields are skipped, ``float_data`` may be packed
or unpacked, and a negative int32 is the 10-byte two's-complement varint proto2 writes.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError

# Wire types.
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5

_FLOAT = struct.Struct("<f")


@dataclass
class Datum:
    """One record. ``data`` holds ``channels*height*width`` uint8 pixels (C, H, W) unless
    ``encoded`` is true, when it holds a whole PNG/JPEG file and the dimensions may be 0."""

    channels: int = 0
    height: int = 0
    width: int = 0
    data: bytes = b""
    label: int = 0
    float_data: list[float] = field(default_factory=list)
    encoded: bool | None = None  # None: the field is absent (MNIST and CIFAR converters)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) as stored; for an encoded record, of the decoded image."""
        if self.encoded:
            return decode_image(self.data).shape  # type: ignore[return-value]
        return (self.channels, self.height, self.width)


# ---------------------------------------------------------------------------------------------
# Encoding


def _varint(value: int) -> bytes:
    """Base-128 varint of an unsigned 64-bit value; a negative int32 becomes 10 bytes."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _int_field(number: int, value: int) -> bytes:
    if not -(2**31) <= value < 2**31:
        raise DataError(f"Datum field {number} = {value} does not fit in int32")
    return _tag(number, _VARINT) + _varint(value)


def encode_datum(datum: Datum) -> bytes:
    """Serialize ``datum`` exactly as Caffe's ``Datum::SerializeToString`` would."""
    parts: list[bytes] = []
    dims = (datum.channels, datum.height, datum.width)
    if not (datum.encoded and dims == (0, 0, 0)):
        for number, value in zip((1, 2, 3), dims, strict=True):
            parts.append(_int_field(number, value))
    if datum.data or not datum.float_data:
        parts += [_tag(4, _LEN), _varint(len(datum.data)), bytes(datum.data)]
    parts.append(_int_field(5, datum.label))
    float_tag = _tag(6, _FIXED32)
    for value in datum.float_data:
        parts += [float_tag, _FLOAT.pack(value)]
    if datum.encoded is not None:
        parts += [_tag(7, _VARINT), b"\x01" if datum.encoded else b"\x00"]
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# Decoding


class _Truncated(Exception):
    pass


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _Truncated(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise _Truncated(f"varint longer than 10 bytes at byte {pos}")


def _as_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _skip(buf: bytes, pos: int, wire: int) -> int:
    """Position after an unknown field's payload."""
    if wire == _VARINT:
        return _read_varint(buf, pos)[1]
    if wire == _FIXED64:
        end = pos + 8
    elif wire == _FIXED32:
        end = pos + 4
    elif wire == _LEN:
        size, pos = _read_varint(buf, pos)
        end = pos + size
    else:
        raise _Truncated(f"unsupported wire type {wire} at byte {pos}")
    if end > len(buf):
        raise _Truncated(f"field runs past the end ({end} > {len(buf)} bytes)")
    return end


def _read_floats(buf: bytes, pos: int, end: int, out: list[float]) -> None:
    if (end - pos) % 4:
        raise _Truncated("packed float_data length is not a multiple of 4")
    out.extend(v for (v,) in _FLOAT.iter_unpack(buf[pos:end]))


def decode_datum(buf: bytes) -> Datum:
    """Parse a serialized Datum. Raises :class:`DataError` with the reason if it does not
    parse; callers that know the database and key use :func:`decode_record` instead."""
    try:
        return _decode(bytes(buf))
    except _Truncated as exc:
        raise DataError(f"not a Caffe Datum: {exc}") from None


def _decode(buf: bytes) -> Datum:
    datum = Datum()
    pos, size = 0, len(buf)
    while pos < size:
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Truncated(f"field number 0 at byte {pos}")
        if wire == _VARINT and number in (1, 2, 3, 5, 7):
            value, pos = _read_varint(buf, pos)
            if number == 7:
                datum.encoded = value != 0
            else:
                setattr(datum, _INT_FIELDS[number], _as_int32(value))
        elif wire == _LEN and number in (4, 6):
            length, pos = _read_varint(buf, pos)
            end = pos + length
            if end > size:
                raise _Truncated(f"field {number} runs past the end ({end} > {size} bytes)")
            if number == 4:
                datum.data = buf[pos:end]
            else:
                _read_floats(buf, pos, end, datum.float_data)
            pos = end
        elif wire == _FIXED32 and number == 6:
            if pos + 4 > size:
                raise _Truncated(f"float_data runs past the end at byte {pos}")
            datum.float_data.append(_FLOAT.unpack_from(buf, pos)[0])
            pos += 4
        elif number in _INT_FIELDS or number in (4, 6, 7):
            raise _Truncated(f"field {number} has wire type {wire}")
        else:
            pos = _skip(buf, pos, wire)
    return datum


_INT_FIELDS = {1: "channels", 2: "height", 3: "width", 5: "label"}


def decode_record(value: bytes, *, source: str, key: bytes) -> Datum:
    """Parse one database value; a failure names the database and the key."""
    try:
        return _decode(bytes(value))
    except _Truncated as exc:
        raise DataError(
            f"{source}: record {format_key(key)} is not a Caffe Datum ({exc}); "
            "rebuild the database with `cpy convert`") from None


def format_key(key: bytes) -> str:
    """A key as users see it in messages: quoted text, or hex if it is not UTF-8."""
    try:
        return repr(key.decode("utf-8"))
    except UnicodeDecodeError:
        return "0x" + key.hex()


# ---------------------------------------------------------------------------------------------
# Pixels


def datum_from_array(array: np.ndarray, label: int, *, encoded: bool | None = None) -> Datum:
    """A raw record from a (C, H, W) uint8 array, or a float record from a float array.

    ``encoded=False`` writes the explicit ``encoded: false`` that convert_imageset writes;
    ``None`` leaves it out as the MNIST and CIFAR converters do.
    """
    if array.ndim != 3:
        raise ValueError(f"expected a (C, H, W) array, got shape {array.shape}")
    c, h, w = (int(n) for n in array.shape)
    if array.dtype == np.uint8:
        return Datum(c, h, w, np.ascontiguousarray(array).tobytes(), int(label), encoded=encoded)
    floats = np.ascontiguousarray(array, dtype=np.float32).ravel().tolist()
    return Datum(c, h, w, b"", int(label), floats, encoded)


def datum_to_array(datum: Datum, *, color: bool | None = None) -> np.ndarray:
    """The record's pixels as a (C, H, W) array: uint8 for ``data``, float32 for
    ``float_data``. An encoded record is decoded (BGR for colour, as OpenCV gives Caffe) and
    ``color`` forces 3 channels (True) or 1 (False), as ``force_color``/``force_gray`` do; as in
    Caffe, ``color`` does not apply to raw records."""
    if datum.encoded:
        return decode_image(datum.data, color=color)
    c, h, w = datum.channels, datum.height, datum.width
    if datum.data:
        if len(datum.data) != c * h * w:
            raise DataError(f"data holds {len(datum.data)} bytes but channels x height x width "
                            f"= {c} x {h} x {w} = {c * h * w}")
        array = np.frombuffer(datum.data, dtype=np.uint8).reshape(c, h, w)
    else:
        if len(datum.float_data) != c * h * w:
            raise DataError(f"float_data holds {len(datum.float_data)} values but channels x "
                            f"height x width = {c} x {h} x {w} = {c * h * w}")
        array = np.asarray(datum.float_data, dtype=np.float32).reshape(c, h, w)
    return array


def decode_image(data: bytes, *, color: bool | None = None) -> np.ndarray:
    """A PNG/JPEG file's bytes as a (C, H, W) uint8 array in OpenCV's channel order.

    ``color=None`` keeps the file's own channels (cv::imdecode(..., -1)): gray -> 1, colour ->
    3 (BGR), with alpha -> 4 (BGRA). True/False force 3 or 1 channels.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return pil_to_chw(image, color=color)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"encoded image does not decode ({exc})") from None


def pil_to_chw(image, *, color: bool | None = None) -> np.ndarray:
    """A Pillow image as a (C, H, W) uint8 array, colour in BGR order."""
    if color is False or (color is None and image.mode in ("1", "L", "I;16", "I", "F")):
        return np.asarray(image.convert("L"), dtype=np.uint8)[None]
    if color is None and image.mode in ("RGBA", "LA", "PA") or (
            color is None and image.mode == "P" and "transparency" in image.info):
        rgba = np.asarray(image.convert("RGBA"), dtype=np.uint8)
        return np.ascontiguousarray(rgba[..., [2, 1, 0, 3]].transpose(2, 0, 1))
    rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return np.ascontiguousarray(rgb[..., ::-1].transpose(2, 0, 1))
