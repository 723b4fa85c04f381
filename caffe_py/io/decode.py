"""Decoding a chunk of one stream's records into arrays.

Raw uint8 records take a fast path of a few numpy operations for the whole chunk
(:mod:`.raw_records`); anything else (encoded images, float_data, negative labels, other field
orders) goes through the full Datum decoder, record by record. The reader's producer hands a
:class:`ChunkDecoder` the keys and values it read, in key order, and gets pixels and labels back
in the same order: the one place decoding happens, and where a pool of decode workers would
split a chunk.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import DataError
from ..spec.net_spec import TransformationParameter
from .datum import decode_record, format_key
from .raw_records import raw_chunk, raw_prefix
from .transformer import record_array


class PartialChunk(Exception):
    """A chunk decoded up to a failing record: the pixels and labels of the records before it,
    and the error."""

    def __init__(self, done: tuple[np.ndarray, np.ndarray], error: DataError):
        super().__init__(str(error))
        self.done, self.error = done, error


class ChunkDecoder:
    """Decodes records of database ``path`` that must all be ``dtype`` ``record_shape``
    (C, H, W); ``color`` forces encoded images to 3 channels (True) or 1 (False)."""

    def __init__(self, path: str, record_shape: Sequence[int], dtype: np.dtype,
                 color: bool | None):
        self.path = path
        self.record_shape: tuple[int, int, int] = tuple(int(d) for d in record_shape)
        self.dtype = np.dtype(dtype)
        self.color = color
        self.raw_prefix = raw_prefix(self.record_shape) if self.dtype == np.uint8 else None
        """What every raw record of record_shape starts with (None: no fast path)."""

    @property
    def record_bytes(self) -> int:
        c, h, w = self.record_shape
        return c * h * w * self.dtype.itemsize

    def decode(self, keys: Sequence[bytes], values: Sequence[bytes],
               wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pixels (k, C, H, W) and labels (k,) of ``values``; only the records ``wanted``
        (when given; the rows of the others are left undefined). A record that fails raises
        :class:`PartialChunk` carrying the records before it."""
        fast = None if self.raw_prefix is None else raw_chunk(values, self.raw_prefix,
                                                               self.record_shape)
        if fast is not None and fast[2] is None:
            return fast[0], fast[1]
        pixels = np.empty((len(values), *self.record_shape), self.dtype)
        labels = np.empty(len(values), np.int64)
        ok = np.zeros(len(values), bool)
        if fast is not None:
            pixels[...], labels[...], ok = fast
        for i in np.flatnonzero(~ok if wanted is None else ~ok & wanted).tolist():
            try:
                pixels[i], labels[i] = self._decode_one(keys[i], values[i])
            except DataError as exc:
                raise PartialChunk((pixels[:i], labels[:i]), exc) from None
        return pixels, labels

    def _decode_one(self, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        datum = decode_record(value, source=self.path, key=key)
        try:
            array = record_array(datum, _color_param(self.color))
        except DataError as exc:
            raise DataError(f"{self.path}: record {format_key(key)}: {exc}") from None
        if tuple(array.shape) != self.record_shape or array.dtype != self.dtype:
            raise DataError(f"{self.path}: record {format_key(key)} is {_describe(array)} but "
                            f"the first record is {self.dtype} {list(self.record_shape)}; a "
                            "Data layer needs records of one size and kind (resize when "
                            "converting)")
        return array, int(datum.label)


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype} {list(array.shape)}"


def _color_param(color: bool | None) -> TransformationParameter:
    return TransformationParameter(force_color=color is True, force_gray=color is False)
