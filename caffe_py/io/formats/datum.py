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

from ...errors import DataError
from .wire import (
    FIXED32,
    LEN,
    VARINT,
    WireError,
    as_int32,
    read_len,
    read_varint,
    skip,
    tag,
    varint,
)

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
            return decode_image(self.data).shape
        return (self.channels, self.height, self.width)


# ---------------------------------------------------------------------------------------------
# Encoding


def _int_field(number: int, value: int) -> bytes:
    if not -(2**31) <= value < 2**31:
        raise DataError(f"Datum field {number} = {value} does not fit in int32")
    return tag(number, VARINT) + varint(value)


def encode_datum(datum: Datum) -> bytes:
    """Serialize ``datum`` exactly as Caffe's ``Datum::SerializeToString`` would."""
    parts: list[bytes] = []
    dims = (datum.channels, datum.height, datum.width)
    if not (datum.encoded and dims == (0, 0, 0)):
        for number, value in zip((1, 2, 3), dims, strict=True):
            parts.append(_int_field(number, value))
    if datum.data or not datum.float_data:
        parts += [tag(4, LEN), varint(len(datum.data)), bytes(datum.data)]
    parts.append(_int_field(5, datum.label))
    float_tag = tag(6, FIXED32)
    for x in datum.float_data:
        parts += [float_tag, _FLOAT.pack(x)]
    if datum.encoded is not None:
        parts += [tag(7, VARINT), b"\x01" if datum.encoded else b"\x00"]
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# Decoding


def _read_floats(buf: bytes, pos: int, end: int, out: list[float]) -> None:
    if (end - pos) % 4:
        raise WireError("packed float_data length is not a multiple of 4")
    out.extend(v for (v,) in _FLOAT.iter_unpack(buf[pos:end]))


def decode_datum(buf: bytes) -> Datum:
    """Parse a serialized Datum. Raises :class:`DataError` with the reason if it does not
    parse; callers that know the database and key use :func:`decode_record` instead."""
    try:
        return _decode(bytes(buf))
    except WireError as exc:
        raise DataError(f"not a Caffe Datum: {exc}") from None


def _decode(buf: bytes) -> Datum:
    datum = Datum()
    pos, size = 0, len(buf)
    while pos < size:
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if number not in _KNOWN:
            pos = skip(buf, pos, number, wire)
        elif wire == VARINT and number in (1, 2, 3, 5, 7):
            value, pos = read_varint(buf, pos)
            if number == 7:
                datum.encoded = value != 0
            else:
                setattr(datum, _INT_FIELDS[number], as_int32(value))
        elif wire == LEN and number in (4, 6):
            start, pos = read_len(buf, pos, number)
            if number == 4:
                datum.data = buf[start:pos]
            else:
                _read_floats(buf, start, pos, datum.float_data)
        elif wire == FIXED32 and number == 6:
            if pos + 4 > size:
                raise WireError(f"field 6 runs past the end ({pos + 4} > {size} bytes)")
            datum.float_data.append(_FLOAT.unpack_from(buf, pos)[0])
            pos += 4
        else:
            raise WireError(f"field {number} has wire type {wire}")
    return datum


_KNOWN = frozenset(range(1, 8))
_INT_FIELDS = {1: "channels", 2: "height", 3: "width", 5: "label"}


def decode_record(value: bytes, *, source: str, key: bytes) -> Datum:
    """Parse one database value; a failure names the database and the key."""
    try:
        return _decode(bytes(value))
    except WireError as exc:
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
    if min(c, h, w) < 1:
        raise DataError(f"holds no image (channels x height x width = {c} x {h} x {w})")
    if datum.data:
        if len(datum.data) != c * h * w:
            raise DataError(f"data holds {len(datum.data)} bytes but channels x height x width "
                            f"= {c} x {h} x {w} = {c * h * w}")
        array: np.ndarray = np.frombuffer(datum.data, dtype=np.uint8).reshape(c, h, w)
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
    except Image.DecompressionBombError as exc:
        from .images import bomb_reason

        raise DataError(bomb_reason(exc)) from None
    except UnidentifiedImageError:   # its message names Pillow's BytesIO object
        begin = f": they begin {bytes(data[:8]).hex(' ')}" if len(data) else ""
        raise DataError(f"encoded image does not decode (its {len(data)} bytes are no image "
                        f"format Pillow reads{begin})") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"encoded image does not decode ({exc})") from None


def pil_to_chw(image, *, color: bool | None = None) -> np.ndarray:
    """A Pillow image as a (C, H, W) uint8 array, colour in BGR order; a 16-bit gray image
    (PNG) as OpenCV reads it, each value's high byte (libpng's strip_16), where Pillow's own
    conversion would clip every value above 255 to 255."""
    if image.mode.startswith("I;16") or (image.mode == "I" and image.format == "PNG"):
        from PIL import Image

        high = np.asarray(image).astype(np.int64) >> 8
        image = Image.fromarray(np.clip(high, 0, 255).astype(np.uint8), "L")
    if color is False or (color is None and image.mode in ("1", "L", "I;16", "I", "F")):
        return np.asarray(image.convert("L"), dtype=np.uint8)[None]
    if color is None and image.mode in ("RGBA", "LA", "PA") or (
            color is None and image.mode == "P" and "transparency" in image.info):
        rgba = np.asarray(image.convert("RGBA"), dtype=np.uint8)
        return np.ascontiguousarray(rgba[..., [2, 1, 0, 3]].transpose(2, 0, 1))
    rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return np.ascontiguousarray(rgb[..., ::-1].transpose(2, 0, 1))
