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
    "decode_record", "encode_datum", "open_db", "partial_path", "ReaderPool",
]


def __getattr__(name: str):
    # The reading side (threads, queues, prefetch) needs torch; importing it lazily keeps the
    # converters and `make data` free of torch's two-second import.
    if name == "ReaderPool":
        from .reader import ReaderPool

        return ReaderPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
