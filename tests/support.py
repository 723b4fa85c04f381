"""Helpers the suite's modules share (importable as ``support``: tests/ is on the path)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from caffe_py.io.datum import datum_from_array, encode_datum
from caffe_py.io.lmdb_store import LmdbWriter


def write_records(path: str | Path, records: Iterable[tuple[np.ndarray, int]],
                  replace: Mapping[int, bytes] | None = None) -> str:
    """An LMDB of Datum records as Caffe's converters write them: record i is (array (C, H, W),
    label), key ``%08d``; ``replace`` stores other bytes at some indices (corrupt records).
    Returns the path as a string, as specs name it."""
    with LmdbWriter(path) as writer:
        for i, (array, label) in enumerate(records):
            value = encode_datum(datum_from_array(array, label))
            writer.put(b"%08d" % i, (replace or {}).get(i, value))
    return str(path)
