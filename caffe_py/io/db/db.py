"""The database interface the reader and the tools read through, and the backends behind it.

A :class:`Database` is records in an order: ``len()``, and :meth:`~Database.cursor`, a position that
reads runs of records (:class:`Cursor`). Caffe's two key-value stores implement it
(:mod:`.lmdb_store`, :mod:`.leveldb_store`: key order, ``fixed_order``), and so do the sources of
the data layers that are not key-value stores (an image list, a list of HDF5 files, R-CNN windows),
whose order may change from pass to pass. The reader (:mod:`~caffe_py.io.reader.reader`) needs
nothing else: both backends share its producer, cursors, wrap-around, positions and resume.

``backend`` names are Caffe's: ``LMDB`` / ``LEVELDB`` in a spec, ``lmdb`` / ``leveldb`` on the
command line (either case is accepted). Opening a directory of the other kind is a one-line
error naming the kind it is.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import DataError
from .partial import PartialWriter

if TYPE_CHECKING:
    import numpy as np

BACKENDS = ("lmdb", "leveldb")
DISPLAY = {"lmdb": "LMDB", "leveldb": "LevelDB"}


class Cursor(Protocol):
    """A read position in a database, used by one thread."""

    def seek(self, index: int) -> None:
        """Stand on record ``index`` of the read order. ``index`` counts from the first record
        of the first pass: a database whose order changes per pass finds the pass
        ``index // len`` (a key-value store takes it mod ``len``)."""

    def read(self, count: int) -> tuple[Sequence[bytes], Any]:
        """The next ``count`` records, never past the end of a pass (the caller asks for at most
        what is left), as keys and values; after the last record of a pass the cursor stands
        on the first of the next. The values are whatever the source's decoder takes (bytes
        of Datum records; an array of HDF5 rows; ...)."""

    def close(self) -> None: ...


class Database(Protocol):
    """Records in an order, for the reader: ``fixed_order`` says every pass is the same (so a
    decoded copy may stand in for later passes)."""

    source: str
    fixed_order: bool

    def __len__(self) -> int: ...

    def cursor(self) -> Cursor: ...

    def close(self) -> None: ...


class KeyValueDatabase(Database, Protocol):
    """An LMDB or LevelDB: also iteration in key order (the tools read these)."""

    path: Path

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]: ...

    def records(self, start_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...

    def first(self) -> tuple[bytes, bytes]: ...

    def __enter__(self) -> KeyValueDatabase: ...

    def __exit__(self, *exc: object) -> None: ...


class PartialChunk(Exception):
    """What a source's decoder raises for a chunk decoded up to a failing record: the pixels
    (or, for records handed over undecoded, the image files) and labels of the records before
    it, and the error. The reader delivers the records before it, then fails the stream."""

    def __init__(self, done: tuple[np.ndarray | tuple, np.ndarray], error: DataError):
        super().__init__(str(error))
        self.done, self.error = done, error


def backend_of(name: str) -> str:
    """``lmdb`` or ``leveldb`` for a backend name in either case; a DataError otherwise."""
    key = str(name).lower()
    if key not in BACKENDS:
        raise DataError(f"the database backend {name!r} is not one of {', '.join(BACKENDS)}; "
                        "give lmdb or leveldb")
    return key


def detect(path: str | os.PathLike) -> str | None:
    """Which kind of database directory ``path`` is (``lmdb``, ``leveldb``), None if neither."""
    path = Path(path)
    if not path.is_dir():
        return None
    if (path / "data.mdb").is_file():
        return "lmdb"
    if (path / "CURRENT").is_file():
        return "leveldb"
    return None


def cli_switch(found: str) -> str:
    """The fix for the command-line tools: the flag that opens the other kind."""
    return f"pass --backend {found}"


def open_db(path: str | os.PathLike, backend: str = "lmdb", *, fix: str | None = None,
            switch: Callable[[str], str] = cli_switch,
            create_lock: bool = True) -> KeyValueDatabase:
    """Open a database of ``backend`` for reading; a missing or corrupt one, or a directory of
    the other kind (``switch(kind)`` says how to open it), is a one-line :class:`DataError`.
    ``create_lock=False`` (an inspection): an LMDB without ``lock.mdb`` is read without
    creating one (see :class:`~.lmdb_store.LmdbReader`)."""
    from .lmdb_store import LmdbReader, missing_fix

    backend = backend_of(backend)
    found = detect(path)
    if found is not None and found != backend:
        article = "an" if found == "lmdb" else "a"
        raise DataError(f"{path}: is {article} {DISPLAY[found]} database, not "
                        f"{DISPLAY[backend]}; {switch(found)}")
    if backend == "leveldb":
        from .leveldb_store import LeveldbReader

        if Path(path).exists() and found is None:
            raise DataError(f"{path}: not a LevelDB database (no CURRENT file); "
                            f"{fix or missing_fix(path)}")
        return LeveldbReader(path, fix=fix or missing_fix(path))
    return LmdbReader(path, fix=fix, create_lock=create_lock)


def open_writer(path: str | os.PathLike, backend: str = "lmdb", *,
                resume: bool = False) -> PartialWriter:
    """A writer of a new database of ``backend`` (through ``DB.partial``, see :mod:`.partial`)."""
    backend = backend_of(backend)
    if backend == "leveldb":
        from .leveldb_store import LeveldbWriter

        return LeveldbWriter(path, resume=resume)
    from .lmdb_store import LmdbWriter

    return LmdbWriter(path, resume=resume)
