"""LevelDB databases in Caffe's layout (``backend: LEVELDB``, Caffe's default): a directory
holding CURRENT, LOCK, MANIFEST-* and the table files, one record per key, read in key order.

Reading and writing go through plyvel (an optional dependency: ``pip install plyvel``, or
``pip install caffe-py[leveldb]``). Writing uses the options Caffe's ``db_leveldb.cpp`` opens
with (64 KiB blocks, a 256 MiB write buffer, 100 open files) and the same ``DB.partial``
protocol as LMDB (:mod:`.partial`): batches of 1000 records, each one atomic ``WriteBatch``.

LevelDB lets one process hold a database at a time (its LOCK file), and one handle per
process: every reader of a database in this process shares one handle, with a reference count,
as the LMDB readers share an environment. A database Caffe is reading is refused with a line
that says so.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from ...errors import DataError
from .partial import COMMIT_EVERY, PartialWriter, cannot_create, partial_path

BLOCK_SIZE = 65536
WRITE_BUFFER = 256 << 20
MAX_OPEN_FILES = 100
INSTALL_FIX = "install it with `pip install plyvel` (or `pip install caffe-py[leveldb]`)"


def plyvel_module() -> Any:
    """The plyvel module, or a one-line DataError naming the package to install."""
    try:
        import plyvel
    except ImportError:
        raise DataError(f"LevelDB databases need the plyvel package; {INSTALL_FIX}") from None
    return plyvel


class LeveldbWriter(PartialWriter):
    """A :class:`~.partial.PartialWriter` into a LevelDB: each batch is one ``WriteBatch``."""

    own_files = ("CURRENT", "LOCK", "LOG", "LOG.old", "MANIFEST-*", "*.ldb", "*.log", "*.sst",
                 "*.dbtmp")

    def __init__(self, path: str | os.PathLike, *, resume: bool = False,
                 commit_every: int = COMMIT_EVERY):
        super().__init__(path, resume=resume, commit_every=commit_every)

    def _open(self) -> None:
        plyvel = plyvel_module()
        try:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self._db = plyvel.DB(str(self.partial), create_if_missing=True,
                                 block_size=BLOCK_SIZE, write_buffer_size=WRITE_BUFFER,
                                 max_open_files=MAX_OPEN_FILES)
        except OSError as exc:
            raise cannot_create(self.partial, exc) from None
        except plyvel.Error as exc:
            raise DataError(f"{self.partial}: cannot open for writing ({_reason(exc)}); "
                            "delete it and convert again") from None
        for key in self._db.iterator(include_value=False):
            self.resumed += 1
            self.last_key = key

    def _write(self, pending: list[tuple[bytes, bytes]]) -> None:
        plyvel = plyvel_module()
        try:
            with self._db.write_batch() as batch:
                for key, value in pending:
                    batch.put(key, value)
        except plyvel.Error as exc:
            raise DataError(f"{self.partial}: cannot write ({_reason(exc)}); free disk space "
                            "or fix the folder's permissions, then run the same command with "
                            "--resume") from None

    def _close(self, *, sync: bool) -> None:
        self._db.close()  # closing flushes the log; the rename that follows is fsynced

    def __enter__(self) -> LeveldbWriter:
        return self


class LeveldbCursor:
    """One reader's position in a LevelDB (key order; a snapshot taken when it was made):
    ``seek(index)``, then ``read(count)`` runs of records, wrapping to the first record after
    the last."""

    def __init__(self, db: Any, size: int):
        self._db, self.size = db, size
        self._it = db.iterator()
        self.index = 0

    def seek(self, index: int) -> None:
        """Stand on record ``index`` (mod the size), stepping over keys only."""
        self.index = index % self.size
        self._it.seek_to_start()
        if self.index:
            keys = self._db.iterator(include_value=False)
            key = next(islice(keys, self.index, None))
            keys.close()
            self._it.seek(key)

    def read(self, count: int) -> tuple[Sequence[bytes], Sequence[bytes]]:
        """The next ``count`` records (fewer at the end of the database), keys and values."""
        items = list(islice(self._it, min(count, self.size - self.index)))
        self.index += len(items)
        if self.index >= self.size:
            self._it.seek_to_start()
            self.index = 0
        keys, values = zip(*items, strict=True) if items else ((), ())
        return keys, values

    def close(self) -> None:
        self._it.close()


class LeveldbReader:
    """A LevelDB opened for reading: ``len()``, iteration in key order, ``records(start_key)``,
    ``cursor()`` (the reader's producer). The handle is shared within the process."""

    fixed_order = True

    def __init__(self, path: str | os.PathLike, *, fix: str):
        self.path = Path(path)
        self.source = str(path)
        self._entry: _Shared | None = _acquire(self.path, fix)
        self._db = self._entry.db
        self._count = self._entry.count()

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.records()

    def records(self, start_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order, from the first key >= ``start_key``."""
        plyvel = plyvel_module()
        try:
            with self._db.iterator(start=start_key) as it:
                yield from it
        except plyvel.Error as exc:
            raise DataError(f"{self.source}: corrupt LevelDB database ({_reason(exc)}); delete "
                            "it and convert the data again") from None

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def first(self) -> tuple[bytes, bytes]:
        """The first record; a :class:`DataError` if the database is empty."""
        for item in self.records():
            return item
        raise DataError(f"{self.source}: the database is empty; convert the data again")

    def cursor(self) -> LeveldbCursor:
        return LeveldbCursor(self._db, len(self))

    def close(self) -> None:
        if self._entry is not None:
            _release(self._entry)
            self._entry = None

    def __enter__(self) -> LeveldbReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Shared:
    """One process-wide handle of a database, its reference count and its record count."""

    def __init__(self, key: str, db: Any):
        self.key, self.db, self.references = key, db, 0
        self._count: int | None = None

    def count(self) -> int:
        if self._count is None:  # LevelDB keeps no count: step over the keys once
            self._count = sum(1 for _ in self.db.iterator(include_value=False))
        return self._count


_SHARED: dict[str, _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _acquire(path: Path, fix: str) -> _Shared:
    key = os.path.realpath(path)
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            entry = _SHARED[key] = _Shared(key, _open_readonly(path, fix))
        entry.references += 1
        return entry


def _release(entry: _Shared) -> None:
    with _SHARED_LOCK:
        entry.references -= 1
        if entry.references == 0:
            _SHARED.pop(entry.key, None)
            entry.db.close()


def _open_readonly(path: Path, fix: str) -> Any:
    plyvel = plyvel_module()
    if not path.exists():
        partial = partial_path(path)
        if partial.exists():
            raise DataError(f"{path}: database not found; the conversion into {partial} was "
                            "interrupted: run it again with --resume, or delete it and convert "
                            "again")
        raise DataError(f"{path}: database not found; {fix}")
    try:
        # paranoid_checks: a damaged log is an error at open. Without it LevelDB's recovery
        # drops the damaged records and rewrites the log into a table, so that reading the
        # database lost records silently, and for good.
        return plyvel.DB(str(path), create_if_missing=False, max_open_files=MAX_OPEN_FILES,
                         paranoid_checks=True)
    except plyvel.IOError as exc:
        if "lock" in str(exc).lower():
            raise DataError(f"{path}: the LevelDB database is open in another process (LevelDB "
                            "lets one process read it at a time); stop that process, or "
                            "convert the data to LMDB (cpy convert ... --backend lmdb) to "
                            "share it") from None
        raise DataError(f"{path}: cannot open the LevelDB database ({_reason(exc)}); {fix}") \
            from None
    except plyvel.Error as exc:
        raise DataError(f"{path}: corrupt LevelDB database ({_reason(exc)}); restore a copy, "
                        "or delete it and convert the data again") from None


def _reason(exc: BaseException) -> str:
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = str(text).strip()
    return text.split(": ", 1)[-1] if text.startswith(("IO error", "Corruption", "Invalid")) \
        else text
