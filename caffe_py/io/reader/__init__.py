"""The reader: one producer thread per database, its records decoded (the decode threads and
processes) and handed round-robin to one bounded queue per (stream, replica). No torch
(README.md)."""
from .reader import Detached, ReaderPool, RecordQueue
from .records import DecodedView, FeedSpec, RecordBatch
from .workers import DecodeOptions

__all__ = [
    "DecodeOptions", "DecodedView", "Detached", "FeedSpec", "ReaderPool", "RecordBatch",
    "RecordQueue",
]
