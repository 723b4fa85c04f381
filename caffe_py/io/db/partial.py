"""Writing a database safely, whatever its backend: into ``DB.partial``, renamed to ``DB`` when
complete, so ``DB`` either does not exist or holds every record.

:class:`PartialWriter` holds what LMDB and LevelDB writers share: the checks on the target, the
batch of pending records committed ``commit_every`` at a time (as Caffe's converters commit),
the counts, ``finish`` (flush, close, rename) and ``abandon`` (keep ``DB.partial`` for a later
``resume``). A backend supplies opening, writing one batch, and closing.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...errors import DataError
from ...fileio import fsync_dir

COMMIT_EVERY = 1000
PARTIAL_SUFFIX = ".partial"


def partial_path(path: str | os.PathLike) -> Path:
    """Where a database is written until it is complete: ``DB.partial`` beside ``DB``."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def remove_partial(path: str | os.PathLike) -> None:
    """Delete a leftover ``DB.partial`` (for callers that restart a conversion from scratch)."""
    partial = partial_path(path)
    if partial.exists():
        shutil.rmtree(partial)


def cannot_create(partial: Path, exc: OSError) -> DataError:
    """The error for a ``DB.partial`` whose folder cannot be made."""
    blocker = next((p for p in partial.parents if p.exists()), None)
    why = (f"{blocker} is a file, not a folder" if blocker and not blocker.is_dir()
           else exc.strerror)
    return DataError(f"{partial}: cannot create ({why}); choose a writable path")


@dataclass
class WriteSummary:
    """What a finished (or interrupted) writer put into its database."""

    path: Path
    records: int  # records in the database, resumed ones included
    written: int  # records this writer put
    bytes: int  # key + value bytes this writer put
    map_size: int  # the LMDB map size it ended with (0 for LevelDB)


class PartialWriter:
    """Writes ``(key, value)`` records in batches into ``DB.partial``; :meth:`finish` renames it
    to ``DB``. Keys must come in increasing order for the database to read back in the same
    order (the converters' zero-padded keys do).

    With ``resume=True`` a leftover ``DB.partial`` is reopened: :attr:`resumed` records are
    already there, the last of them under :attr:`last_key`, and the caller puts the rest.
    Subclasses open the store in :meth:`_open` (setting ``resumed`` and ``last_key``) and
    implement :meth:`_write` and :meth:`_close`.
    """

    map_size = 0

    def __init__(self, path: str | os.PathLike, *, resume: bool = False,
                 commit_every: int = COMMIT_EVERY):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.commit_every = commit_every
        self._check_target(resume)
        self.resumed = 0
        self.last_key: bytes | None = None
        self._open()
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

    # --- what a backend implements ------------------------------------------------------------
    def _open(self) -> None:
        raise NotImplementedError

    def _write(self, pending: list[tuple[bytes, bytes]]) -> None:
        """Write one batch atomically (or raise a DataError that says how to go on)."""
        raise NotImplementedError

    def _close(self, *, sync: bool) -> None:
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------------
    def put(self, key: bytes, value: bytes) -> None:
        self._pending.append((key, value))
        if len(self._pending) >= self.commit_every:
            self.commit()

    def commit(self) -> None:
        """Write the pending batch in one transaction."""
        if not self._pending:
            return
        self._write(self._pending)
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
        self._close_once(sync=True)
        os.replace(self.partial, self.path)
        fsync_dir(self.path.parent)
        return self.summary()

    def abandon(self) -> WriteSummary:
        """Commit what was put and close, leaving ``DB.partial`` for a later resume."""
        try:
            self.commit()
        finally:
            self._close_once(sync=False)
        return self.summary()

    def _close_once(self, *, sync: bool) -> None:
        if not self._closed:
            self._closed = True
            self._close(sync=sync)

    def __enter__(self) -> PartialWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.finish()
        else:
            self.abandon()
