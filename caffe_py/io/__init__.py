"""The data pipeline: Caffe's Datum records in LMDB, the converters that write them, and (in
the reader modules) the threads that read them into nets."""
from .datum import (
    Datum,
    datum_from_array,
    datum_to_array,
    decode_datum,
    decode_record,
    encode_datum,
)
from .lmdb_store import LmdbReader, LmdbWriter, open_db, partial_path

__all__ = [
    "Datum", "LmdbReader", "LmdbWriter", "datum_from_array", "datum_to_array", "decode_datum",
    "decode_record", "encode_datum", "open_db", "partial_path", "ReaderPool", "attach_feeds",
    "feed_of", "swap_feed",
]

# The reading side (threads, queues, feeds) needs torch; importing it lazily keeps the
# converters and `make data` free of torch's two-second import.
_LAZY = {"ReaderPool": "reader", "attach_feeds": "feeds", "feed_of": "feeds",
         "swap_feed": "feeds"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
