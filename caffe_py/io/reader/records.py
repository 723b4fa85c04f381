"""What a consumer asks the reader for (:class:`FeedSpec`, one data layer's stream) and what
the reader hands it: runs of records (decoded, or image files the feeds decode), and the
decoded database.

No threads and no torch here: the data layers write the specs, the reader fills the records,
the feeds read them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..db.lmdb_store import StoredFiles

if TYPE_CHECKING:
    from ...spec.layer_params.data import TransformationParameter
    from ..db.db import Database

ImageFiles = tuple
"""The image files (JPEG, PNG) of encoded records, one bytes-like object per record."""


def image_files(files: ImageFiles | StoredFiles | None) -> ImageFiles:
    """The files themselves (those left in the database read here; None: none)."""
    if files is None:
        return ()
    return files.read() if isinstance(files, StoredFiles) else files


def _no_transform() -> TransformationParameter:
    from ...spec.layer_params.data import TransformationParameter

    return TransformationParameter()


@dataclass(frozen=True)
class FeedSpec:
    """What a data layer's feed reads: ``source`` (the path the reader groups streams by),
    ``batch_size``, ``prefetch`` (batches buffered per replica), ``rand_skip``, the records'
    ``record_shape`` (C, H, W), ``dtype`` and ``color``, the effective ``transform``, how the
    database opens (``opener``; None: ``source`` as an LMDB of Datum records) and what decodes
    its records (``decoder`` makes a decoder; None: Datum records), and whether the records
    are ``encoded`` image files. The reader reads all but ``transform``, which the feed
    applies (default: none, as a layer without transform_param)."""

    source: str
    batch_size: int
    prefetch: int
    record_shape: tuple[int, int, int]
    dtype: np.dtype = np.dtype(np.uint8)
    transform: TransformationParameter = field(default_factory=_no_transform)
    color: bool | None = None
    rand_skip: int = 0
    opener: Callable[[], Database] | None = None
    decoder: Callable[[], Any] | None = None
    encoded: bool = False
    """The records are image files (JPEG/PNG Datums): decoded in parallel, in the reader or,
    for a database too big to keep decoded, in each replica's feed (CPU threads or nvJPEG)."""
    make_feed: Callable[[Any, Any, int, str], Any] | None = None
    """Builds the layer's own feed from its record queue (queue, device, seed, name) instead
    of a Prefetcher (AnnotatedData: images and box lists,
    :mod:`caffe_py.io.feed.annotated_feed`)."""


@dataclass
class RecordBatch:
    """Records of one replica in stream order: positions first, first + step, ... (step: every
    replica of the round-robin in turns of a record; 1 in turns of a batch, whose runs are
    parts of one turn), labels (n,) int64, and either pixels (n, C, H, W) or, for
    encoded records the reader does not decode, their image ``files`` (the feed decodes them;
    ``pixels`` is None; :class:`StoredFiles` where the decode processes read them from the
    database themselves). The arrays may be read-only views of the bytes read from the
    database: copy before writing."""

    first: int
    step: int
    pixels: np.ndarray | None
    labels: np.ndarray
    keys: tuple[bytes, ...]
    files: ImageFiles | StoredFiles | None = None

    @classmethod
    def of(cls, first: int, step: int, rows: np.ndarray | ImageFiles | StoredFiles,
           labels: np.ndarray, keys: tuple[bytes, ...]) -> RecordBatch:
        """A batch of decoded rows (an array of pixels) or of image files (a tuple, or files
        left in the database)."""
        if isinstance(rows, np.ndarray):
            return cls(first, step, rows, labels, keys)
        return cls(first, step, None, labels, keys, rows)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def rows(self) -> np.ndarray | ImageFiles | StoredFiles:
        """The pixels, or the image files."""
        if self.pixels is not None:
            return self.pixels
        return self.files if self.files is not None else ()

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.first, self.first + self.step * len(self), self.step)

    def split(self, n: int) -> tuple[RecordBatch, RecordBatch]:
        """The first ``n`` records and the rest (views, no copy)."""
        rows = self.rows
        return (RecordBatch.of(self.first, self.step, rows[:n], self.labels[:n], self.keys[:n]),
                RecordBatch.of(self.first + self.step * n, self.step, rows[n:],
                               self.labels[n:], self.keys[n:]))


def join(parts: Sequence[RecordBatch]) -> RecordBatch:
    """Consecutive runs of one replica as one (a copy only when there are several)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    rows: np.ndarray | ImageFiles | StoredFiles
    if first.pixels is not None:
        rows = np.concatenate([p.pixels for p in parts])
    else:
        stored = [p.files for p in parts if isinstance(p.files, StoredFiles)]
        if len(stored) == len(parts):
            rows = StoredFiles.join(stored)
        else:  # a run of files the reader copied (another record layout) among them
            rows = tuple(f for p in parts for f in image_files(p.files))
    return RecordBatch.of(first.first, first.step, rows,
                          np.concatenate([p.labels for p in parts]),
                          tuple(k for p in parts for k in p.keys))


class DecodedDatabase:
    """Every record of a small database, decoded: pixels (N, C, H, W), labels (N,) int64 and
    keys, in key order; filled by a stream's first pass and complete after it."""

    def __init__(self, size: int, shape: tuple[int, int, int], dtype: np.dtype):
        self.pixels = np.empty((size, *shape), dtype)
        self.labels = np.empty(size, np.int64)
        self.keys: list[bytes] = [b""] * size
        self.size, self.stored = size, 0

    @property
    def complete(self) -> bool:
        return self.stored >= self.size

    def store(self, index: int, keys: Sequence[bytes], pixels: np.ndarray,
              labels: np.ndarray) -> None:
        """Records ``index`` .. of the database (each stored once: the first pass is
        sequential)."""
        end = index + len(labels)
        self.pixels[index:end] = pixels
        self.labels[index:end] = labels
        self.keys[index:end] = keys[:len(labels)]
        self.stored += len(labels)


STORED_INDEX_RECORDS = 20_000_000
"""A database of at most this many records has its stored files indexed on the first pass
(:class:`StoredIndex`: a key's bytes object, three spans and a label, about 110 bytes a
record with ImageNet's 40-character keys: 140 MB for its 1.28 million)."""


class StoredIndex:
    """Where each record's image file lies in an LMDB the decode processes read by key
    (:class:`~caffe_py.io.db.lmdb_store.StoredFiles`): every record's key, span and label, in
    key order, filled by a stream's first pass and complete after it. Later passes hand over
    slices of it and read no record: on a 4 x H200 host the reader's cursor spent 86.5% of its
    time in its steps, each one giving up the GIL and waiting to take it back."""

    def __init__(self, size: int, database: str):
        self.database = database
        self.keys: list[bytes] = [b""] * size
        self.spans = np.zeros((size, 3), np.int64)
        self.labels = np.empty(size, np.int64)
        self.size, self.stored = size, 0

    @property
    def complete(self) -> bool:
        return self.stored >= self.size

    def store(self, index: int, files: StoredFiles, labels: np.ndarray) -> None:
        """Records ``index`` .. of the database (each stored once: the first pass is
        sequential)."""
        end = index + len(labels)
        self.keys[index:end] = files.keys
        self.spans[index:end] = files.spans
        self.labels[index:end] = labels
        self.stored += len(labels)

    def files(self, index: int, count: int) -> StoredFiles:
        """Records ``index`` .. ``index + count - 1``'s files."""
        return StoredFiles(self.database, tuple(self.keys[index:index + count]),
                           self.spans[index:index + count])


@dataclass(frozen=True)
class DecodedView:
    """One consumer's view of its stream's decoded database, for gathering batches in the
    training thread: every record (``pixels`` (N, C, H, W), ``labels`` (N,) int64, key order)
    and where the consumer's records lie in it. Its record number c (counted over everything
    it consumed) is at stream position ``start + step c`` in turns of a record (``step``: the
    round-robin's replicas), ``start + step unit (c // unit) + c mod unit`` in turns of
    ``unit`` records; database record ``(origin + position) mod N``: exactly the record the
    reader would hand it."""

    pixels: np.ndarray
    labels: np.ndarray
    origin: int
    start: int
    step: int
    unit: int = 1

    @property
    def size(self) -> int:
        return len(self.labels)
