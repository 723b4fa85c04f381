"""LMDB databases in Caffe's layout: a directory holding data.mdb and lock.mdb, one record per
key, read in key order.

Writing goes into ``DB.partial`` and is renamed to ``DB`` when complete, so ``DB`` either does
not exist or holds every record; nothing about the conversion's progress is stored among the
records, which Caffe reads in key order. A leftover ``DB.partial`` (an interrupted conversion)
is refused unless the caller resumes it: records are committed 1000 at a time, as Caffe's
converters do, and resuming continues after the last committed key.

The map starts small and doubles whenever LMDB reports it full (the batch is retried), so no
conversion fails with MDB_MAP_FULL and no database reserves a terabyte of address space.
"""
from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lmdb

from ..errors import DataError
from ..fileio import fsync_dir

INITIAL_MAP_SIZE = 64 << 20
COMMIT_EVERY = 1000
PARTIAL_SUFFIX = ".partial"


def partial_path(path: str | os.PathLike) -> Path:
    """Where a database is written until it is complete: ``DB.partial`` beside ``DB``."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def missing_fix(path: str | os.PathLike) -> str:
    """How to create a database that is not there."""
    if "fashion_mnist" in Path(path).as_posix():
        return "run `make data`"
    return "create it with `cpy convert` or fix data_param.source"


@dataclass
class WriteSummary:
    """What a finished (or interrupted) writer put into its database."""

    path: Path
    records: int  # records in the database, resumed ones included
    written: int  # records this writer put
    bytes: int  # key + value bytes this writer put
    map_size: int  # the LMDB map size it ended with


class LmdbWriter:
    """Writes ``(key, value)`` records in batches into ``DB.partial``; :meth:`finish` renames it
    to ``DB``. Keys must come in increasing order for the database to read back in the same
    order (the converters' zero-padded keys do).

    With ``resume=True`` a leftover ``DB.partial`` is reopened: :attr:`resumed` records are
    already there, the last of them under :attr:`last_key`, and the caller puts the rest.
    """

    def __init__(self, path: str | os.PathLike, *, resume: bool = False,
                 map_size: int = INITIAL_MAP_SIZE, commit_every: int = COMMIT_EVERY):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.commit_every = commit_every
        self._check_target(resume)
        try:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self._env = lmdb.open(str(self.partial), map_size=map_size, subdir=True,
                                  readahead=False, meminit=False, max_dbs=0)
        except OSError as exc:
            blocker = next((p for p in self.partial.parents if p.exists()), None)
            why = (f"{blocker} is a file, not a folder" if blocker and not blocker.is_dir()
                   else exc.strerror)
            raise DataError(f"{self.partial}: cannot create ({why}); choose a writable "
                            "path") from None
        except lmdb.Error as exc:
            raise DataError(f"{self.partial}: cannot open for writing ({_reason(exc)}); "
                            "delete it and convert again") from None
        self.map_size = int(self._env.info()["map_size"])
        self.resumed = int(self._env.stat()["entries"])
        self.last_key = self._last_key()
        self.written = 0
        self.bytes = 0
        self._pending: list[tuple[bytes, bytes]] = []
        self._closed = False

    def _check_target(self, resume: bool) -> None:
        if self.path.exists():
            raise DataError(f"{self.path} already exists; delete it or write to another path")
        if self.partial.exists() and not resume:
            raise DataError(f"{self.partial} is left from an interrupted conversion; delete it, "
                            "or pass --resume to continue it")

    def _last_key(self) -> bytes | None:
        with self._env.begin() as txn, txn.cursor() as cursor:
            return bytes(cursor.key()) if cursor.last() else None

    def put(self, key: bytes, value: bytes) -> None:
        self._pending.append((key, value))
        if len(self._pending) >= self.commit_every:
            self.commit()

    def commit(self) -> None:
        """Write the pending batch in one transaction, growing the map until it fits."""
        if not self._pending:
            return
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value, overwrite=True)
                break
            except lmdb.MapFullError:
                # The transaction was aborted on the way out of `with`; double and retry.
                self.map_size *= 2
                self._env.set_mapsize(self.map_size)
            except lmdb.Error as exc:
                raise DataError(f"{self.partial}: cannot write ({_reason(exc)}); free disk "
                                "space or fix the folder's permissions, then run the same "
                                "command with --resume") from None
        self.written += len(self._pending)
        self.bytes += sum(len(k) + len(v) for k, v in self._pending)
        self.last_key = self._pending[-1][0]
        self._pending.clear()

    @property
    def records(self) -> int:
        """Records committed so far, resumed ones included."""
        return self.resumed + self.written

    def summary(self) -> WriteSummary:
        return WriteSummary(self.path, self.records, self.written, self.bytes, self.map_size)

    def finish(self) -> WriteSummary:
        """Commit the rest, flush to disk and rename ``DB.partial`` to ``DB``."""
        self.commit()
        self._env.sync(True)
        self._close_env()
        os.replace(self.partial, self.path)
        fsync_dir(self.path.parent)
        return self.summary()

    def abandon(self) -> WriteSummary:
        """Commit what was put and close, leaving ``DB.partial`` for a later resume."""
        try:
            self.commit()
        finally:
            self._close_env()
        return self.summary()

    def _close_env(self) -> None:
        if not self._closed:
            self._env.close()
            self._closed = True

    def __enter__(self) -> LmdbWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.finish()
        else:
            self.abandon()


def remove_partial(path: str | os.PathLike) -> None:
    """Delete a leftover ``DB.partial`` (for callers that restart a conversion from scratch)."""
    partial = partial_path(path)
    if partial.exists():
        shutil.rmtree(partial)


class LmdbReader:
    """A database opened read-only: ``len()``, iteration in key order, ``records(start_key)``.

    Opens without the lock file (``lock=False``), so many readers and read-only filesystems
    work; the database must not be written while it is read. Readahead is on: records are read
    sequentially.
    """

    def __init__(self, path: str | os.PathLike, *, fix: str | None = None):
        self.path = Path(path)
        self.source = str(path)
        self._env = acquire_readonly(self.path, fix or missing_fix(self.path))
        self._count = int(self._env.stat()["entries"])

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.records()

    def records(self, start_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order, from the first key >= ``start_key``."""
        try:
            with self._env.begin(buffers=False) as txn, txn.cursor() as cursor:
                found = cursor.set_range(start_key) if start_key is not None else cursor.first()
                if not found:
                    return
                yield from cursor
        except lmdb.Error as exc:
            raise DataError(f"{self.source}: corrupt LMDB database ({_reason(exc)}); delete it "
                            "and convert the data again") from None

    def get(self, key: bytes) -> bytes | None:
        with self._env.begin(buffers=False) as txn:
            return txn.get(key)

    def first(self) -> tuple[bytes, bytes]:
        """The first record; a :class:`DataError` if the database is empty."""
        for item in self.records():
            return item
        raise DataError(f"{self.source}: the database is empty; convert the data again")

    def close(self) -> None:
        if self._env is not None:
            release_readonly(self._env)
            self._env = None

    def __enter__(self) -> LmdbReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_db(path: str | os.PathLike, *, fix: str | None = None) -> LmdbReader:
    """Open a database for reading; a missing or corrupt one is a one-line :class:`DataError`."""
    return LmdbReader(path, fix=fix)


# LMDB allows one environment per database per process (py-lmdb refuses a second open), yet
# several readers may want one database at once: a TRAIN and a TEST pool, db-info while a
# reader runs. Read-only environments are therefore shared, with a reference count.
_SHARED: dict[str, list] = {}  # real path -> [environment, references]
_SHARED_LOCK = threading.Lock()


def acquire_readonly(path: str | os.PathLike, fix: str | None = None) -> lmdb.Environment:
    """The process's read-only environment of ``path``; hand it back with release_readonly."""
    path = Path(path)
    key = os.path.realpath(path)
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            entry = _SHARED[key] = [_open_readonly(path, fix or missing_fix(path)), 0]
        entry[1] += 1
        return entry[0]


def release_readonly(env: lmdb.Environment) -> None:
    """Drop one reference to a shared environment; the last one closes it."""
    with _SHARED_LOCK:
        for key, entry in _SHARED.items():
            if entry[0] is env:
                entry[1] -= 1
                if entry[1] == 0:
                    del _SHARED[key]
                    env.close()
                return


def _open_readonly(path: Path, fix: str) -> lmdb.Environment:
    if not path.exists():
        partial = partial_path(path)
        if partial.exists():
            raise DataError(f"{path}: database not found; the conversion into {partial} was "
                            "interrupted: run it again with --resume, or delete it and convert "
                            "again")
        raise DataError(f"{path}: database not found; {fix}")
    if not path.is_dir():
        raise DataError(f"{path}: not an LMDB database directory (Caffe's LMDBs are "
                        f"directories holding data.mdb); {fix}")
    if not (path / "data.mdb").is_file():
        raise DataError(f"{path}: no data.mdb in this directory, not an LMDB database; {fix}")
    try:
        return lmdb.open(str(path), readonly=True, lock=False, readahead=True, subdir=True,
                         max_readers=512)
    except lmdb.Error as exc:
        raise DataError(f"{path}: corrupt LMDB database ({_reason(exc)}); delete it and "
                        "convert the data again") from None


def _reason(exc: lmdb.Error) -> str:
    text = str(exc).strip()
    return text.split(": ", 1)[-1] if ": " in text else text
