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

import errno
import logging
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, cast

import lmdb
import numpy as np

from ...errors import DataError
from ..formats.datum import format_key
from .partial import (  # noqa: F401 (partial_path, remove_partial, WriteSummary: re-exported)
    COMMIT_EVERY,
    PartialWriter,
    WriteSummary,
    cannot_create,
    partial_path,
    remove_partial,
)

INITIAL_MAP_SIZE = 64 << 20

log = logging.getLogger(__name__)


def missing_fix(path: str | os.PathLike) -> str:
    """How to create a database that is not there."""
    if "fashion_mnist" in Path(path).as_posix():
        return "run `make data`"
    return "create it with `cpy convert` or fix data_param.source"


class LmdbWriter(PartialWriter):
    """A :class:`~.partial.PartialWriter` into an LMDB: each batch is one write transaction;
    the map starts at ``map_size`` and doubles whenever LMDB reports it full (the batch is
    retried)."""

    own_files = ("data.mdb", "lock.mdb")

    def __init__(self, path: str | os.PathLike, *, resume: bool = False,
                 map_size: int = INITIAL_MAP_SIZE, commit_every: int = COMMIT_EVERY):
        self.map_size = map_size
        super().__init__(path, resume=resume, commit_every=commit_every)

    def _open(self) -> None:
        try:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self._env = lmdb.open(str(self.partial), map_size=self.map_size, subdir=True,
                                  readahead=False, meminit=False, max_dbs=0)
        except OSError as exc:
            raise cannot_create(self.partial, exc) from None
        except lmdb.Error as exc:
            raise DataError(f"{self.partial}: cannot open for writing ({_reason(exc)}); "
                            "delete it and convert again") from None
        self.map_size = int(self._env.info()["map_size"])
        self.resumed = int(self._env.stat()["entries"])
        with self._env.begin() as txn, txn.cursor() as cursor:
            self.last_key = bytes(cursor.key()) if cursor.last() else None

    def _write(self, pending: list[tuple[bytes, bytes]]) -> None:
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in pending:
                        txn.put(key, value, overwrite=True)
                return
            except lmdb.MapFullError:
                # The transaction was aborted on the way out of `with`; double and retry.
                self.map_size *= 2
                self._env.set_mapsize(self.map_size)
            except lmdb.Error as exc:
                raise DataError(f"{self.partial}: cannot write ({_reason(exc)}); free disk "
                                "space or fix the folder's permissions, then run the same "
                                "command with --resume") from None

    def _close(self, *, sync: bool) -> None:
        if sync:
            self._env.sync(True)
        self._env.close()

    def __enter__(self) -> LmdbWriter:
        return self


class LmdbCursor:
    """One reader's position in an LMDB (key order, in its own read transaction):
    ``seek(index)``, then ``read(count)`` runs of records, wrapping to the first record after
    the last.

    Values come back as memoryviews of the database's map (no copy per record): they are
    valid while the cursor is open, so the reader decodes (copies) them before it hands
    anything on."""

    def __init__(self, env: lmdb.Environment, size: int):
        self.size = size
        self._txn = begin(env, buffers=True)
        self._cursor = self._txn.cursor()
        self._cursor.first()

    def seek(self, index: int) -> None:
        """Stand on record ``index`` (mod the size), stepping over keys only."""
        cursor = self._cursor
        cursor.first()
        for _ in range(index % self.size):
            if not cursor.next():
                cursor.first()

    def read(self, count: int) -> tuple[Sequence[bytes], Sequence[memoryview]]:
        """The next ``count`` records (fewer at the end of the database): keys (bytes) and
        values (views of the map, valid while the cursor is open)."""
        items = list(islice(self._cursor.iternext(), count))  # leaves the cursor on the last
        if not self._cursor.next():
            self._cursor.first()  # the end of the database: wrap to the first record
        if not items:
            return (), ()
        keys, values = zip(*items, strict=True)
        return tuple(map(bytes, keys)), values

    def close(self) -> None:
        self._txn.abort()


class LmdbReader:
    """A database opened read-only: ``len()``, iteration in key order, ``records(start_key)``,
    ``cursor()`` (the reader's producer).

    Opens with LMDB's lock, as Caffe's readers do: each read transaction is registered in
    ``lock.mdb``, so a process writing into the database meanwhile (appending, updating,
    rewriting records) leaves the pages a reader sees alone, and the reader reads the database
    as it was when its transaction began. Where the lock cannot be taken (no permission to
    write ``lock.mdb``, or read-only media) it reads without it, with one warning, as Caffe
    does; the database must then not be written while it is read. ``create_lock=False`` (an
    inspection) creates no ``lock.mdb``: without one, no writer has the database open, and
    it is read without the lock. Readahead is on: records are read sequentially.
    """

    fixed_order = True
    rereadable = True
    """Another process may read its records again by key (:func:`read_files`): the decode
    processes read the image files of encoded records themselves."""

    def __init__(self, path: str | os.PathLike, *, fix: str | None = None,
                 create_lock: bool = True):
        self.path = Path(path)
        self.source = str(path)
        self._env: lmdb.Environment | None = acquire_readonly(
            self.path, fix or missing_fix(self.path), create_lock=create_lock)
        self._count = int(self._env.stat()["entries"])

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.records()

    def records(self, start_key: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order, from the first key >= ``start_key``."""
        assert self._env is not None  # open until close()
        try:
            with begin(self._env, buffers=False) as txn, txn.cursor() as cursor:
                found = cursor.set_range(start_key) if start_key is not None else cursor.first()
                if not found:
                    return
                yield from cast(Iterator[tuple[bytes, bytes]], cursor)  # buffers=False
        except lmdb.Error as exc:
            raise DataError(f"{self.source}: corrupt LMDB database ({_reason(exc)}); delete it "
                            "and convert the data again") from None

    def get(self, key: bytes) -> bytes | None:
        assert self._env is not None  # open until close()
        with begin(self._env, buffers=False) as txn:
            return cast("bytes | None", txn.get(key))  # buffers=False: bytes

    def first(self) -> tuple[bytes, bytes]:
        """The first record; a :class:`DataError` if the database is empty."""
        for item in self.records():
            return item
        raise DataError(f"{self.source}: the database is empty; convert the data again")

    def cursor(self) -> LmdbCursor:
        assert self._env is not None  # open until close()
        return LmdbCursor(self._env, self._count)

    def close(self) -> None:
        if self._env is not None:
            release_readonly(self._env)
            self._env = None

    def __enter__(self) -> LmdbReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_db(path: str | os.PathLike, *, fix: str | None = None,
            create_lock: bool = True) -> LmdbReader:
    """Open a database for reading; a missing or corrupt one is a one-line :class:`DataError`."""
    return LmdbReader(path, fix=fix, create_lock=create_lock)


def begin(env: lmdb.Environment, **kwargs: Any) -> lmdb.Transaction:
    """A read transaction; when a writer has grown the map past this process's view of it
    (MDB_MAP_RESIZED), the view is grown to the file's size and the transaction begun again."""
    try:
        return env.begin(**kwargs)
    except lmdb.MapResizedError:
        env.set_mapsize(0)
        return env.begin(**kwargs)


@dataclass(frozen=True)
class StoredFiles:
    """The image files of encoded records left in their LMDB ``database``, for decoders that
    read them again by key themselves (the decode processes, each from its own environment):
    the reader copies nothing out of the map for them. ``spans`` (n, 3) int64: where each
    record's file starts and ends in it, and the record's size (a check that it is the record
    the reader read). :meth:`read` copies the files out here, for the other decoders."""

    database: str
    keys: tuple[bytes, ...]
    spans: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, rows: slice) -> StoredFiles:
        if not isinstance(rows, slice):  # not a sequence of files: nothing reads one by chance
            raise TypeError("stored files are read with read(), not one by one")
        return StoredFiles(self.database, self.keys[rows], self.spans[rows])

    def read(self) -> tuple[bytes, ...]:
        """The files, as bytes."""
        return stored_files(self.database, self.keys, self.spans)

    @staticmethod
    def join(parts: Sequence[StoredFiles]) -> StoredFiles:
        """Consecutive runs of one database's files as one."""
        return StoredFiles(parts[0].database, tuple(k for p in parts for k in p.keys),
                           np.concatenate([p.spans for p in parts]))


def read_files(txn: lmdb.Transaction, source: str, keys: Sequence[bytes],
               spans: np.ndarray) -> Iterator[bytes | memoryview]:
    """The image files of encoded records ``keys`` of database ``source``, read again by
    key: file k is bytes ``spans[k, 0] .. spans[k, 1] - 1`` of a record of ``spans[k, 2]``
    bytes (views of the map with a ``buffers=True`` transaction, valid while it is open). A
    record that is gone, or is not the size it was, raises: the database was written after
    the reader read it."""
    for key, (start, stop, size) in zip(keys, spans.tolist(), strict=True):
        value = txn.get(key)
        if value is None or len(value) != size:
            raise DataError(
                f"{source}: record {format_key(key)} "
                f"{'is gone' if value is None else 'changed'} since the data reader read it: "
                "the database was written while training read it; write a new database "
                "instead (cpy convert into another path)")
        yield value[start:stop]


def stored_files(source: str, keys: Sequence[bytes], spans: np.ndarray) -> tuple[bytes, ...]:
    """:func:`read_files` in this process (its shared environment of ``source``), as
    bytes."""
    env = acquire_readonly(source)
    try:
        with begin(env, buffers=False) as txn:
            return tuple(bytes(file) for file in read_files(txn, source, keys, spans))
    except lmdb.Error as exc:
        raise DataError(f"{source}: corrupt LMDB database ({_reason(exc)}); delete it and "
                        "convert the data again") from None
    finally:
        release_readonly(env)


def forked_environment(source: str) -> lmdb.Environment:
    """The environment of ``source`` in a process forked from one that reads it: the parent's,
    where fork copied it open (py-lmdb refuses a second open of files open in the process, and
    its list of them was copied too; closing the copy would clear the parent's reader slots in
    lock.mdb, which carry the parent's pid), else one of its own, locked as the parent reads
    it. The shared environments are looked up without their lock, which another thread of the
    parent may have held at the fork (a copy of a held lock never opens)."""
    entry = _SHARED.get(os.path.realpath(source))
    if entry is not None:
        return cast(lmdb.Environment, entry[0])
    path = Path(source)
    return _open_readonly(path, missing_fix(path), create_lock=False)


# LMDB allows one environment per database per process (py-lmdb refuses a second open), yet
# several readers may want one database at once: a TRAIN and a TEST pool, db-info while a
# reader runs. Read-only environments are therefore shared, with a reference count.
_SHARED: dict[str, list] = {}  # real path -> [environment, references]
_SHARED_LOCK = threading.Lock()
_WARNED: set[str] = set()  # databases read without the lock, said once


def acquire_readonly(path: str | os.PathLike, fix: str | None = None, *,
                     create_lock: bool = True) -> lmdb.Environment:
    """The process's read-only environment of ``path``; hand it back with release_readonly.
    ``create_lock=False``: no ``lock.mdb`` is created (see :class:`LmdbReader`)."""
    path = Path(path)
    key = os.path.realpath(path)
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            entry = _SHARED[key] = [_open_readonly(path, fix or missing_fix(path),
                                                   create_lock), 0]
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


def _open_readonly(path: Path, fix: str, create_lock: bool = True) -> lmdb.Environment:
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
    check_data_file(path / "data.mdb")
    locked = create_lock or (path / "lock.mdb").exists()
    try:
        try:
            env = _open_env(path, lock=locked)
        except lmdb.Error as exc:
            if not (locked and _denied(exc)):
                raise
            _warn_unlocked(path, f"no permission to take its reader lock ({_reason(exc)})")
            return _open_env(path, lock=False)
    except lmdb.Error as exc:
        raise DataError(f"{path}: corrupt LMDB database ({_reason(exc)}); delete it and "
                        "convert the data again") from None
    if locked and _read_only_media(path):  # LMDB itself reads such a database unlocked
        _warn_unlocked(path, "it is on read-only media")
    return env


def _open_env(path: Path, *, lock: bool) -> lmdb.Environment:
    return lmdb.open(str(path), readonly=True, lock=lock, readahead=True, subdir=True,
                     max_readers=512)


def _denied(exc: lmdb.Error) -> bool:
    """EACCES (no write permission for lock.mdb or its directory): Caffe's MDB_NOLOCK case."""
    return isinstance(exc, lmdb.ReadonlyError) or "Permission denied" in str(exc) or \
        getattr(exc, "errno", None) == errno.EACCES


def _read_only_media(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _warn_unlocked(path: Path, why: str) -> None:
    if str(path) in _WARNED:
        return
    _WARNED.add(str(path))
    log.warning(f"Warning: {path}: reading the database without LMDB's reader lock: {why}; "
                "as in Caffe, it must not be written while it is read")


# data.mdb begins with two meta pages (LMDB's MDB_meta after a 16-byte page header, 64-bit
# layout): magic and version, the map address and size, two 48-byte database records (the
# free-page one's first 4 bytes hold the page size), the last used page and the transaction id.
_META = struct.Struct("<16xII8xQ I44x 48x QQ")
_MAGIC, _VERSION = 0xBEEFC0DE, 1


def check_data_file(data: Path) -> None:
    """Refuse a data.mdb that is not LMDB's or is shorter than its own newest meta page says
    (a truncated copy would be mapped and then fault: a bus error, not an exception)."""
    size = data.stat().st_size
    with data.open("rb") as f:
        head = f.read(_META.size)
        metas = [_META.unpack(head)] if len(head) == _META.size else []
        if metas and metas[0][0] == _MAGIC and 512 <= metas[0][3] <= 1 << 16:
            f.seek(metas[0][3])
            second = f.read(_META.size)
            if len(second) == _META.size:
                metas.append(_META.unpack(second))
    metas = [m for m in metas if m[0] == _MAGIC]
    where = f"{data.parent}: corrupt LMDB database"
    if not metas:
        raise DataError(f"{where} (data.mdb has no LMDB meta page: not an LMDB file, or "
                        "damaged); delete it and convert the data again")
    magic, version, _mapsize, psize, last_page, _txn = max(metas, key=lambda m: m[5])
    if version != _VERSION or not 512 <= psize <= 1 << 16:
        raise DataError(f"{where} (data.mdb meta page: version {version}, page size {psize}); "
                        "delete it and convert the data again")
    need = (last_page + 1) * psize
    if size < need:
        raise DataError(f"{where} (data.mdb is {size} bytes but its pages reach {need}: the "
                        "file is truncated, e.g. an interrupted copy); copy it again, or "
                        "delete it and convert the data again")


def _reason(exc: lmdb.Error) -> str:
    text = str(exc).strip()
    return text.split(": ", 1)[-1] if ": " in text else text
