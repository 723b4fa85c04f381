"""The fast path for raw Datum records, a whole chunk at a time.

Caffe's serializer writes a raw (C, H, W) uint8 record as channels, height, width, data (the
pixels), label, and optionally encoded=false, in that field order; everything before the pixels
is fixed for a shape. So a chunk of such records is checked and sliced by a few numpy
operations on one (k, L) byte matrix, with no Python per record; records that are anything
else are left to the full Datum decoder.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from . import wire

Run = Callable[[Callable[[int, int], None], int], None]
"""``run(part, n)`` calls ``part(start, stop)`` over records 0 .. n-1, whole or cut into
contiguous parts that may run on several threads at once (the reader's copy threads), and
returns when every part is done."""


def raw_prefix(shape: Sequence[int]) -> np.ndarray:
    """What Caffe's serializer writes before the pixels of a raw (C, H, W) uint8 record."""
    c, h, w = shape
    prefix = b"".join((b"\x08", wire.varint(c), b"\x10", wire.varint(h), b"\x18",
                       wire.varint(w), b"\x22", wire.varint(c * h * w)))
    return np.frombuffer(prefix, np.uint8)


def raw_chunk(values: Sequence[bytes | memoryview], prefix: np.ndarray,
              shape: tuple[int, int, int], run: Run | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """The fast path for the common record (channels, height, width, data, label, and an
    optional encoded=false, in Caffe's field order), a whole chunk at once.

    Records of one length (the usual case) are joined into one (k, L) byte matrix, checked and
    sliced by numpy. Records of several lengths (labels of several varint widths: 0-127 and
    128-999 in an ImageNet database) are checked on their first and last bytes, and each
    one's pixels copied once into the result. Either way every byte is copied once; records of
    SEPARATE_COPY_BYTES or more are copied one by one, by ``run`` where given (the copy of a
    chunk of ImageNet records then runs on several threads: one thread's copy out of the map
    is what bounds a reader of big records).

    Returns (pixels (k, C, H, W), labels (k,), ok) where ok is None when every record took
    the fast path, else a (k,) mask of those that did (the rest are the full decoder's job:
    encoded images, float_data, negative labels, other field orders); None when none did.
    """
    k = len(values)
    lengths = np.fromiter(map(len, values), np.int64, k)
    if lengths.min() == lengths.max():
        joined = _joined(values, run)
        rows, labels = _raw_rows(joined, int(lengths[0]), k, prefix, shape)
        if rows.all():
            return _pixels(joined, int(lengths[0]), k, prefix, shape), labels, None
    ok, labels = raw_labels(values, prefix, shape, lengths)
    if not ok.any():
        return None
    pixels = np.empty((k, *shape), np.uint8)
    rows = pixels.reshape(k, int(np.prod(shape)))
    _copy_rows(rows, values, np.flatnonzero(ok).tolist(), len(prefix), run)
    return pixels, labels, None if ok.all() else ok


def raw_labels(values: Sequence[bytes | memoryview], prefix: np.ndarray,
               shape: Sequence[int], lengths: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Which ``values`` are raw records of ``shape`` in Caffe's field order (the ones
    :func:`raw_chunk` takes), and their labels: ((k,) bool, (k,) int64), read from each
    record's first and last bytes only (no pixel is copied). A record's pixels are then its
    bytes ``len(prefix)`` .. ``len(prefix) + C*H*W``. ``lengths``: the records' lengths, where
    known."""
    k = len(values)
    if lengths is None:
        lengths = np.fromiter(map(len, values), np.int64, k)
    start, size = len(prefix), int(np.prod(shape))
    end = start + size  # the label's tag
    ok = lengths > end + 1  # room for the label's tag and a varint
    fit = np.flatnonzero(ok)
    heads = np.frombuffer(b"".join(values[i][:start] for i in fit.tolist()), np.uint8)
    ok[fit] = (heads.reshape(len(fit), start) == prefix).all(1)
    labels = np.zeros(k, np.int64)
    for length in np.unique(lengths[ok]).tolist():
        idx = np.flatnonzero(ok & (lengths == length))
        tails = np.frombuffer(b"".join(values[i][end:] for i in idx.tolist()), np.uint8)
        good, got = _label_tails(tails.reshape(len(idx), length - end))
        ok[idx[~good]] = False
        labels[idx[good]] = got[good]
    return ok, labels


SEPARATE_COPY_BYTES = 1 << 16
"""Records of at least this size are copied one by one by numpy, which releases the GIL for
each copy; smaller ones are joined in one copy that holds it. A join of a chunk of
ImageNet-sized records (8 MB) holds the GIL for a millisecond or more, stalling the training
thread; a release per small record would instead make the reader wait for the GIL (up to the
switch interval) once per record."""


def _joined(values: Sequence[bytes | memoryview], run: Run | None) -> np.ndarray:
    """The records, all of one length, one after another in one new uint8 array (big ones
    copied one by one, by ``run`` where given)."""
    if not values or len(values[0]) < SEPARATE_COPY_BYTES:
        return np.frombuffer(b"".join(values), np.uint8)
    joined = np.empty((len(values), len(values[0])), np.uint8)
    _copy_rows(joined, values, range(len(values)), 0, run)
    return joined.reshape(-1)


def _copy_rows(rows: np.ndarray, values: Sequence[bytes | memoryview],
               indices: Sequence[int], start: int, run: Run | None) -> None:
    """``rows[i]`` = the row's length of bytes of ``values[i]`` from ``start``, for every i of
    ``indices``: one copy each (numpy releases the GIL for it), by ``run`` where given."""
    size = rows.shape[1]

    def part(first: int, stop: int) -> None:
        for i in indices[first:stop]:
            rows[i] = np.frombuffer(values[i], np.uint8, size, start)

    if run is None:
        part(0, len(indices))
    else:
        run(part, len(indices))


def _pixels(joined: np.ndarray, length: int, k: int, prefix: np.ndarray,
            shape: tuple[int, int, int]) -> np.ndarray:
    """The (k, C, H, W) pixel view of k joined records of ``length`` bytes."""
    start = len(prefix)
    rows = joined.reshape(k, length)
    return rows[:, start:start + int(np.prod(shape))].reshape(k, *shape)


def _raw_rows(joined: np.ndarray, length: int, k: int, prefix: np.ndarray,
              shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Which of k joined records of ``length`` bytes are raw records of ``shape``
    (the prefix, then the pixels, then the label's field as :func:`_label_tails` reads it),
    and their labels: ((k,) bool, (k,) int64)."""
    end = len(prefix) + int(np.prod(shape))  # the label's tag
    if length - end < 2:
        return np.zeros(k, bool), np.zeros(k, np.int64)
    rows = joined.reshape(k, length)
    ok, labels = _label_tails(rows[:, end:])
    return ok & (rows[:, :len(prefix)] == prefix).all(1), labels


def _label_tails(tails: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``tails`` (k, T), each the bytes after a record's pixels, are field 5,
    the label, as a varint below 2^31, then nothing or encoded=false; and the labels."""
    k, tail = tails.shape[0], tails.shape[1] - 1  # the varint, and maybe encoded=false
    ok = tails[:, 0] == 0x28
    labels = np.zeros(k, np.int64)
    if tail == 1:  # a label below 128, the common case
        return ok & (tails[:, 1] < 0x80), tails[:, 1].astype(np.int64)
    varint = tails[:, 1:]
    any_form = np.zeros(k, bool)
    for width, trailer in ((tail, False), (tail - 2, True)):
        if not 1 <= width <= 5:
            continue
        form = _varint_ends_at(varint, width)
        if trailer:
            form &= (varint[:, width] == 0x38) & (varint[:, width + 1] == 0)
        values = ((varint[:, :width].astype(np.int64) & 0x7F)
                  << (7 * np.arange(width, dtype=np.int64))).sum(1)
        form &= values < 1 << 31
        labels = np.where(form, values, labels)
        any_form |= form
    return ok & any_form, labels


def _varint_ends_at(varint: np.ndarray, width: int) -> np.ndarray:
    """Rows whose varint is exactly ``width`` bytes long (continuation bits before the end)."""
    ends = varint[:, width - 1] < 0x80
    if width > 1:
        ends &= (varint[:, :width - 1] >= 0x80).all(1)
    return ends
