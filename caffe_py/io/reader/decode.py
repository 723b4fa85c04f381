"""Decoding a chunk of one stream's records into arrays.

Raw uint8 records take a fast path of a few numpy operations for the whole chunk
(:mod:`~caffe_py.io.formats.raw_records`; big records, ImageNet's, are copied out of the map by the
worker threads, a chunk in parts: one thread's copy stops near 4 GB/s); anything else (encoded
images, float_data, negative labels, other field orders) goes through the full Datum decoder,
record by record, split between the decode workers (:mod:`~caffe_py.io.decoders.workers`) when
there are several. The reader's producer hands a :class:`ChunkDecoder` the keys and values it read,
in key order, and gets pixels and labels back in the same order.

Encoded records of a stream the reader does not keep decoded are not decoded here: the chunk comes
back as the records' image files (:mod:`~caffe_py.io.formats.envelope`: a few byte comparisons per
record), and each replica's feed decodes its own share, on its GPU or with the workers
(:mod:`~caffe_py.io.feed.image_batch`). Where the feeds decode in processes and the database is an
LMDB, the files are not even copied out of the map: the chunk comes back as
:class:`~.records.StoredFiles` (keys, and where each file lies in its record), and each decode
process reads its records again by key (on a 64-core machine, copying every file out of the map
and again into the processes' buffers held the training process's GIL more than anything
else). Big raw records of such an LMDB go the same way (:attr:`ChunkDecoder.raw_files`): a
record's "file" is then its pixels, which the processes crop; a chunk holding a record in
another layout goes over as the full decoder's pixels, one buffer a record."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...errors import DataError
from ..db.db import PartialChunk
from ..decoders.file_crops import check_record
from ..decoders.workers import DecodeWorkers
from ..formats.datum import datum_to_array, decode_record, format_key
from ..formats.envelope import file_span, image_file
from ..formats.raw_records import SEPARATE_COPY_BYTES, raw_chunk, raw_labels, raw_prefix
from .records import ImageFiles, StoredFiles

COPY_PART_BYTES = 1 << 20
"""The least a worker copies of a chunk of raw records (a hand-over to a thread costs tens of
microseconds; a megabyte's copy about a quarter of a millisecond)."""
RAW_FILES_BYTES = SEPARATE_COPY_BYTES
"""Raw records of at least this size, of an LMDB too big to keep decoded, are cropped by the
feeds' decode processes where there are some (:attr:`ChunkDecoder.raw_files`): a record the
reader would copy out of the map in a worker thread (ImageNet's, 196 KB) is then read and
cropped in a process, and the training process copies only the crops."""


class ChunkDecoder:
    """Decodes records of database ``path`` that must all be ``dtype`` ``record_shape``
    (C, H, W); ``color`` forces encoded images to 3 channels (True) or 1 (False). ``encoded``:
    the records are image files (the first one is); ``workers`` decode them in parallel.
    ``leave_files``: the feeds decode the files in processes, which may read them from an LMDB
    themselves (see :attr:`stored_in`); ``raw_processes``: the feeds have decode processes to
    crop big raw records (see :attr:`raw_files`)."""

    def __init__(self, path: str, record_shape: Sequence[int], dtype: np.dtype,
                 color: bool | None, *, encoded: bool = False,
                 workers: DecodeWorkers | None = None, leave_files: bool = False,
                 raw_processes: bool = False):
        self.path = path
        c, h, w = (int(d) for d in record_shape)
        self.record_shape = (c, h, w)
        self.dtype = np.dtype(dtype)
        self.color = color
        self.encoded = encoded
        self.workers = workers
        self.leave_files = leave_files
        self.raw_processes = raw_processes
        self.keep_encoded = False
        """Hand encoded records over as their image files (the feeds decode them): set by the
        reader for a stream it does not keep decoded."""
        self.stored_in: str | None = None
        """With :attr:`keep_encoded`: the LMDB the feeds' decode processes read the files from
        themselves (the files go over as :class:`~.records.StoredFiles`); set by the reader.
        None: the files are copied out of the map."""
        self.raw_prefix = raw_prefix(self.record_shape) if self.dtype == np.uint8 else None
        """What every raw record of record_shape starts with (None: no fast path)."""
        self.raw_files = False
        """Hand raw records over as files for the decode processes to crop (the stream's
        LMDB, :attr:`stored_in`, is too big to keep decoded; :attr:`leaves_raw`): set by the
        reader."""

    takes_views = True
    """:meth:`decode` accepts values that are views of the database's map (it copies what it
    keeps); the reader hands other decoders bytes."""

    @property
    def record_bytes(self) -> int:
        c, h, w = self.record_shape
        return c * h * w * self.dtype.itemsize

    @property
    def leaves_raw(self) -> bool:
        """Whether this stream's records may go over as raw files (:attr:`raw_files`): raw
        uint8 records of at least :data:`RAW_FILES_BYTES`, and decode processes to crop them."""
        return (self.raw_processes and not self.encoded and self.raw_prefix is not None
                and self.record_bytes >= RAW_FILES_BYTES)

    @property
    def uses_workers(self) -> bool:
        """Whether this stream's records need the pool's worker threads: encoded images (the
        decode), or raw records big enough that their copy out of the map is shared out
        (:data:`~caffe_py.io.formats.raw_records.SEPARATE_COPY_BYTES`)."""
        return self.encoded or (self.raw_prefix is not None
                                and self.record_bytes >= SEPARATE_COPY_BYTES)

    def _copy(self, part: Callable[[int, int], None], n: int) -> None:
        """The raw fast path's copy of ``n`` records, shared out over the workers in parts of
        at least :data:`COPY_PART_BYTES` (one thread's copy out of the map stops near 4 GB/s,
        under 20,000 ImageNet records/s: less than four GPUs train on)."""
        if self.workers is None:
            part(0, n)
            return
        self.workers.run(part, n, where=self.path,
                         parts=min(self.workers.count, n * self.record_bytes // COPY_PART_BYTES))

    def decode(self, keys: Sequence[bytes], values: Sequence[bytes],
               wanted: np.ndarray | None = None
               ) -> tuple[np.ndarray | ImageFiles | StoredFiles, np.ndarray]:
        """Pixels (k, C, H, W) and labels (k,) of ``values`` (with :attr:`keep_encoded`, the
        image files (k,) instead of pixels); only the records ``wanted`` (when given; the rows
        of the others are left undefined). A record that fails raises :class:`PartialChunk`
        carrying the records before it."""
        if self.keep_encoded:
            stored = self._stored(keys, values, wanted) if self.stored_in else None
            if stored is not None:
                return stored
            # the files outlive the chunk: copies, not views of the map
            return self._files(keys, _owned(values), wanted)
        if self.raw_files:
            stored = self._stored_raw(keys, values, wanted)
            if stored is not None:
                return stored
            try:
                pixels, labels = self._pixels(keys, values, wanted)
            except PartialChunk as partial:
                done, labels = partial.done
                assert isinstance(done, np.ndarray)  # _pixels' records: pixels, never files
                raise PartialChunk((_pixel_files(done), labels), partial.error) from None
            return _pixel_files(pixels), labels
        return self._pixels(keys, values, wanted)

    def _pixels(self, keys: Sequence[bytes], values: Sequence[bytes],
                wanted: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Pixels (k, C, H, W) and labels (k,) of the records ``wanted`` (all: None)."""
        fast = None if self.raw_prefix is None else raw_chunk(values, self.raw_prefix,
                                                               self.record_shape, self._copy)
        if fast is not None and fast[2] is None:
            return fast[0], fast[1]
        values = _owned(values)
        pixels = np.empty((len(values), *self.record_shape), self.dtype)
        labels = np.empty(len(values), np.int64)
        ok = np.zeros(len(values), bool)
        if fast is not None:
            pixels[...], labels[...], fast_ok = fast
            assert fast_ok is not None  # None: every record took the fast path (returned above)
            ok = fast_ok
        todo = np.flatnonzero(~ok if wanted is None else ~ok & wanted).tolist()
        failures: dict[int, DataError] = {}

        def part(start: int, stop: int) -> None:  # records todo[start:stop], until one fails
            for i in todo[start:stop]:
                try:
                    pixels[i], labels[i] = self._decode_one(keys[i], values[i])
                except DataError as exc:
                    failures[i] = exc
                    return

        if self.workers is None:
            part(0, len(todo))
        else:
            self.workers.run(part, len(todo), where=self.path)
        if failures:
            first = min(failures)
            raise PartialChunk((pixels[:first], labels[:first]), failures[first])
        return pixels, labels

    def _stored(self, keys: Sequence[bytes], values: Sequence[bytes | memoryview],
                wanted: np.ndarray | None) -> tuple[StoredFiles, np.ndarray] | None:
        """Where each record's image file lies in it, and the labels; None where a record is
        not in Caffe's layout (the full decoder then reads the chunk)."""
        assert self.stored_in is not None
        rows = [(0, 0, 0, 0)] * len(values)  # start, stop, size, label (unwanted: zeros)
        for i in _rows(len(values), wanted):
            found = file_span(values[i])
            if found is None:
                return None
            rows[i] = (found[0], found[1], len(values[i]), found[2])
        table = np.array(rows, np.int64).reshape(len(values), 4)
        spans = np.ascontiguousarray(table[:, :3])
        return StoredFiles(self.stored_in, tuple(keys), spans), table[:, 3].copy()

    def _stored_raw(self, keys: Sequence[bytes], values: Sequence[bytes | memoryview],
                    wanted: np.ndarray | None) -> tuple[StoredFiles, np.ndarray] | None:
        """Where each raw record's pixels lie in it, and the labels; None where a record is
        not a raw record in Caffe's layout (the full decoder then reads the chunk)."""
        assert self.stored_in is not None and self.raw_prefix is not None  # raw_files' terms
        lengths = np.fromiter(map(len, values), np.int64, len(values))
        ok, labels = raw_labels(values, self.raw_prefix, self.record_shape, lengths)
        if not (ok if wanted is None else ok[wanted]).all():
            return None
        start = len(self.raw_prefix)
        spans = np.empty((len(values), 3), np.int64)
        spans[:, 0], spans[:, 1], spans[:, 2] = start, start + self.record_bytes, lengths
        if wanted is not None:  # the others' rows: zeros, as _stored leaves them
            spans[~wanted] = 0
            labels[~wanted] = 0
        return StoredFiles(self.stored_in, tuple(keys), spans), labels

    def _files(self, keys: Sequence[bytes], values: Sequence[bytes],
               wanted: np.ndarray | None) -> tuple[ImageFiles, np.ndarray]:
        """The image files and labels of encoded records (views of ``values``)."""
        files: list = [None] * len(values)
        labels = np.zeros(len(values), np.int64)
        for i in _rows(len(values), wanted):
            found = image_file(values[i])
            try:
                files[i], labels[i] = found if found is not None else self._file_of(
                    keys[i], values[i])
            except DataError as exc:
                raise PartialChunk((tuple(files[:i]), labels[:i]), exc) from None
        return tuple(files), labels

    def _file_of(self, key: bytes, value: bytes) -> tuple[bytes, int]:
        """The full Datum decoder's way to a record's image file (other field layouts)."""
        datum = decode_record(value, source=self.path, key=key)
        if not datum.encoded:
            raise DataError(f"{self.path}: record {format_key(key)} holds raw pixels but the "
                            "first record is an encoded image; a Data layer reads records of "
                            "one kind (convert the database again)")
        return datum.data, int(datum.label)

    def _decode_one(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        datum = decode_record(value, source=self.path, key=key)
        try:
            array = datum_to_array(datum, color=self.color)
        except DataError as exc:
            raise DataError(f"{self.path}: record {format_key(key)}: {exc}") from None
        check_record(self.path, key, array, self.record_shape, self.dtype)
        return array, int(datum.label)


def _pixel_files(pixels: np.ndarray) -> ImageFiles:
    """Decoded records (k, C, H, W) uint8 as raw files: one buffer of each one's pixels."""
    return tuple(memoryview(row.data).cast("B") for row in pixels.reshape(len(pixels), -1))


def _rows(n: int, wanted: np.ndarray | None) -> list[int] | range:
    """The records of a chunk of ``n`` to hand over: all, or those ``wanted``."""
    return range(n) if wanted is None else np.flatnonzero(wanted).tolist()


def _owned(values: Sequence[bytes | memoryview]) -> Sequence[bytes]:
    """``values`` as bytes objects (a copy of each view of the database's map)."""
    if not any(isinstance(v, memoryview) for v in values):
        return values  # type: ignore[return-value]
    return [bytes(v) if isinstance(v, memoryview) else v for v in values]

