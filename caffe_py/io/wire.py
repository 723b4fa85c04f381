"""The protobuf wire format, by hand: just what Caffe's messages (Datum, BlobProto) need.

A message is a run of fields, each a varint key ``(number << 3) | wire_type`` and a payload:
a varint (0), 8 bytes (1), a varint length and that many bytes (2), or 4 bytes (5). Negative
int32/int64 values are 10-byte two's-complement varints (proto2's int32, not sint32).
"""
from __future__ import annotations

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5

_MASK64 = 0xFFFFFFFFFFFFFFFF


class WireError(Exception):
    """Bytes that do not parse; the message says where. Callers turn it into a DataError."""


def varint(value: int) -> bytes:
    """Base-128 varint of ``value`` taken as unsigned 64-bit (negative -> 10 bytes)."""
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint((number << 3) | wire)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: bytes, a nested message, or a packed repeated field."""
    return tag(number, LEN) + varint(len(payload)) + payload


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value as unsigned 64-bit, position after it)."""
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise WireError(f"varint longer than 10 bytes at byte {pos}")


def as_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def as_int64(value: int) -> int:
    return value - (1 << 64) if value & (1 << 63) else value


def read_len(buf: bytes, pos: int, number: int) -> tuple[int, int]:
    """(start, end) of a length-delimited payload that starts at ``pos``."""
    size, pos = read_varint(buf, pos)
    end = pos + size
    if end > len(buf):
        raise WireError(f"field {number} runs past the end ({end} > {len(buf)} bytes)")
    return pos, end


def skip(buf: bytes, pos: int, number: int, wire: int) -> int:
    """Position after the payload of a field this reader does not know."""
    if wire == VARINT:
        return read_varint(buf, pos)[1]
    if wire == LEN:
        return read_len(buf, pos, number)[1]
    if wire not in (FIXED64, FIXED32):
        raise WireError(f"field {number} has unsupported wire type {wire} at byte {pos}")
    end = pos + (8 if wire == FIXED64 else 4)
    if end > len(buf):
        raise WireError(f"field {number} runs past the end ({end} > {len(buf)} bytes)")
    return end
