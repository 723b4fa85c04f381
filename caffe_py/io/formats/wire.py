"""The protobuf wire format, by hand: just what Caffe's messages (Datum, BlobProto) need, and
a streaming reader (:class:`WireStream`) for files too big to hold twice (.caffemodel).

A message is a run of fields, each a varint key ``(number << 3) | wire_type`` and a payload:
a varint (0), 8 bytes (1), a varint length and that many bytes (2), or 4 bytes (5). Negative
int32/int64 values are 10-byte two's-complement varints (proto2's int32, not sint32).
"""
from __future__ import annotations

import numpy as np

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


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
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


class WireStream:
    """A message read in order from a binary file object of ``size`` bytes, without holding the
    file in memory: keys, varints and small fields come through a 64 KiB buffer, packed floats
    go straight from the file into the numpy arrays that become the blobs (``readinto``), and
    fields nobody reads are skipped by seeking. :meth:`blob` parses one BlobProto this way.
    Errors are :class:`WireError` with the byte offset in the file."""

    CHUNK = 1 << 16

    def __init__(self, file, size: int):
        self.file, self.size = file, size
        self._buf = b""  # buffered bytes, from file offset _base on
        self._base = 0
        self._off = 0  # the next unread byte of _buf

    @property
    def pos(self) -> int:
        """The offset in the file of the next byte to read."""
        return self._base + self._off

    def at(self, end: int) -> bool:
        """Whether the reader stands at ``end`` (the end of the enclosing message)."""
        if self.pos > end:
            raise WireError(f"a field runs past the end of its message at byte {end}")
        return self.pos == end

    def _fill(self, n: int) -> None:
        """At least ``n`` bytes buffered (fewer only at the end of the file)."""
        if len(self._buf) - self._off >= n:
            return
        rest = self._buf[self._off:]
        more = self.file.read(max(n - len(rest), self.CHUNK))
        self._base += self._off
        self._buf, self._off = rest + more, 0

    def varint(self) -> int:
        self._fill(10)
        start = self.pos
        try:
            value, self._off = read_varint(self._buf, self._off)
        except WireError:
            raise WireError(f"truncated varint at byte {start}") from None
        return value

    def key(self) -> tuple[int, int]:
        """(field number, wire type) of the next field."""
        value = self.varint()
        return value >> 3, value & 7

    def length_end(self, number: int) -> int:
        """The end offset of a length-delimited payload whose length comes next."""
        end = self.varint()
        end += self.pos
        if end > self.size:
            raise WireError(f"field {number} runs past the end ({end} > {self.size} bytes)")
        return end

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (for small fields)."""
        self._fill(n)
        out = self._buf[self._off:self._off + n]
        if len(out) < n:
            raise WireError(f"truncated at byte {self.pos + len(out)}")
        self._off += n
        return out

    def read_into(self, array: np.ndarray) -> None:
        """Fill ``array`` (contiguous) with the next ``array.nbytes`` bytes."""
        view = array.data.cast("B")
        have = min(len(view), len(self._buf) - self._off)
        view[:have] = self._buf[self._off:self._off + have]
        self._off += have
        if have == len(view):
            return
        # the rest straight from the file: the buffer is used up and the file stands at pos
        start, filled = self.pos, have
        while filled < len(view):
            got = self.file.readinto(view[filled:])
            if not got:
                raise WireError(f"truncated at byte {start + filled - have}")
            filled += got
        self._base, self._buf, self._off = start + len(view) - have, b"", 0

    def skip(self, n: int) -> None:
        if n <= len(self._buf) - self._off:
            self._off += n
            return
        target = self.pos + n
        if target > self.size:
            raise WireError(f"truncated at byte {self.size}")
        self.file.seek(target)
        self._base, self._buf, self._off = target, b"", 0

    def skip_field(self, number: int, wire: int) -> None:
        """Step over the payload of a field nobody reads."""
        if wire == VARINT:
            self.varint()
        elif wire == LEN:
            self.skip(self.length_end(number) - self.pos)
        elif wire in (FIXED64, FIXED32):
            self.skip(8 if wire == FIXED64 else 4)
        else:
            raise WireError(f"field {number} has unsupported wire type {wire} at byte "
                            f"{self.pos}")

    def blob(self, end: int, empty=np.empty) -> np.ndarray:
        """A BlobProto ending at ``end`` as a float32 array of its shape (``shape``, or the
        legacy num/channels/height/width), read into arrays ``empty(n, dtype)`` makes; diffs
        are skipped."""
        legacy: list[int] | None = None
        shape: tuple[int, ...] | None = None
        parts: list[np.ndarray] = []
        doubles: list[np.ndarray] = []
        while not self.at(end):
            number, wire = self.key()
            if number in (1, 2, 3, 4) and wire == VARINT:
                legacy = legacy or [0, 0, 0, 0]
                legacy[number - 1] = as_int32(self.varint())
            elif number in (5, 8) and wire == LEN:
                stop, width = self.length_end(number), 4 if number == 5 else 8
                if (stop - self.pos) % width:
                    raise WireError(f"packed field {number} length is not a multiple of "
                                    f"{width}")
                values = empty((stop - self.pos) // width, np.float32 if width == 4
                               else np.float64)
                self.read_into(values)
                (parts if number == 5 else doubles).append(values)
            elif number in (5, 8) and wire in (FIXED32, FIXED64):
                raw = self.read(4 if wire == FIXED32 else 8)
                (parts if number == 5 else doubles).append(
                    np.frombuffer(raw, "<f4" if wire == FIXED32 else "<f8"))
            elif number == 7 and wire == LEN:
                shape = blob_shape(self.read(self.length_end(7) - self.pos))
            else:
                self.skip_field(number, wire)
        return _blob_array(parts, doubles, shape, legacy)


def blob_shape(buf: bytes) -> tuple[int, ...]:
    """A ``BlobShape`` message's dims (``repeated int64 dim = 1``, packed or not; other fields
    skipped): the one decoder of it, for BlobProto and the streamed blobs alike."""
    dims: list[int] = []
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 1 and wire == LEN:
            start, end = read_len(buf, pos, 1)
            while start < end:
                value, start = read_varint(buf, start)
                dims.append(as_int64(value))
            pos = end
        elif number == 1 and wire == VARINT:
            value, pos = read_varint(buf, pos)
            dims.append(as_int64(value))
        else:
            pos = skip(buf, pos, number, wire)
    return tuple(dims)


def _blob_array(parts: list[np.ndarray], doubles: list[np.ndarray],
                shape: tuple[int, ...] | None, legacy: list[int] | None) -> np.ndarray:
    if parts:
        values = parts[0] if len(parts) == 1 else np.concatenate(parts)
    elif doubles:
        values = np.concatenate(doubles).astype(np.float32)
    else:
        values = np.zeros(0, np.float32)
    dims = shape if shape is not None else tuple(legacy) if legacy is not None else ()
    count = int(np.prod(dims, dtype=np.int64))
    if count != values.size:
        raise WireError(f"a blob holds {values.size} values but its shape "
                        f"{'x'.join(map(str, dims)) or '()'} needs {count}")
    return values.reshape(dims)
