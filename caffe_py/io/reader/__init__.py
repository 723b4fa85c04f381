"""The reader: one producer thread per database, each chunk of records decoded and handed
round-robin to one bounded queue per (stream, replica); a small database kept decoded after
its first pass. No torch (README.md)."""
from .reader import Detached, ReaderPool, RecordQueue
from .records import DecodedView, FeedSpec, RecordBatch

__all__ = ["DecodedView", "Detached", "FeedSpec", "ReaderPool", "RecordBatch", "RecordQueue"]
