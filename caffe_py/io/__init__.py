"""The data pipeline, in five rooms (each with a README.md; README.md here is the map):
``formats`` (Caffe's bytes: Datum, BlobProto, the wire format, image files), ``db`` (the sources
of records: LMDB, LevelDB, image lists, HDF5 rows, R-CNN windows), ``decoders`` (image files
decoded: threads, processes, libjpeg, nvJPEG), ``reader`` (the producer threads and the
round-robin queues) and ``feed`` (the data layers' batches, transformed on the device). The
converters that write databases are ``caffe_py.tools.convert``."""
from .db.lmdb_store import LmdbReader, LmdbWriter, open_db, partial_path
from .formats.datum import (
    Datum,
    datum_from_array,
    datum_to_array,
    decode_datum,
    decode_record,
    encode_datum,
)

__all__ = [
    "Datum", "LmdbReader", "LmdbWriter", "datum_from_array", "datum_to_array", "decode_datum",
    "decode_record", "encode_datum", "open_db", "partial_path", "ReaderPool", "attach_feeds",
    "feed_of", "swap_feed",
]

# The reading side (threads, queues, feeds) needs torch; importing it lazily keeps the
# converters and `make data` free of torch's two-second import.
_LAZY = {"ReaderPool": "reader", "attach_feeds": "feed", "feed_of": "feed",
         "swap_feed": "feed"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
