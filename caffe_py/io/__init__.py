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
from .reader import ReaderPool as ReaderPool  # the reading side: threads, queues, prefetch

__all__ = [
    "Datum", "LmdbReader", "LmdbWriter", "datum_from_array", "datum_to_array", "decode_datum",
    "decode_record", "encode_datum", "open_db", "partial_path",
]
