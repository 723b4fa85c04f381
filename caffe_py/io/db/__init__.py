"""Sources of records as one interface, :class:`Database`: LMDB and LevelDB (Caffe's key-value
stores, written safely through ``DB.partial``), image lists, the rows of HDF5 files, sampled
R-CNN windows, in Caffe's orders (Caffe's random streams in :mod:`.caffe_rng`). No threads, no
torch (README.md)."""
from .db import (
    BACKENDS,
    Cursor,
    Database,
    KeyValueDatabase,
    PartialChunk,
    open_db,
    open_writer,
)
from .partial import partial_path

__all__ = [
    "BACKENDS", "Cursor", "Database", "KeyValueDatabase", "PartialChunk", "open_db",
    "open_writer", "partial_path",
]
