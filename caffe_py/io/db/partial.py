"""Writing a database safely, whatever its backend: into ``DB.partial``, renamed to ``DB`` when
complete, so ``DB`` either does not exist or holds every record.

:class:`PartialWriter` holds what LMDB and LevelDB writers share: the checks on the target, the
batch of pending records committed ``commit_every`` at a time (as Caffe's converters commit),
the counts, ``finish`` (flush, close, rename) and ``abandon`` (keep ``DB.partial`` for a later
``resume``). A backend supplies opening, writing one batch, and closing.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from ...errors import DataError
from ...fileio import PathLock, fsync_dir

COMMIT_EVERY = 1000
PARTIAL_SUFFIX = ".partial"
INPUTS_FILE = "caffe_py_inputs.json"
"""Inside ``DB.partial``: the inputs the conversion was begun from (name, size, a hash of the
first MiB), checked by a resume; removed before the rename to ``DB``."""
HEAD_BYTES = 1 << 20


def partial_path(path: str | os.PathLike) -> Path:
    """Where a database is written until it is complete: ``DB.partial`` beside ``DB``. A
    path with no name of its own (``.``, ``..``, ``/``, empty) is a DataError."""
    path = Path(path)
    if path.name in ("", ".."):
        raise DataError(f"{str(path)!r} is not a database path (it names no folder of its "
                        "own); give a new folder name such as train_lmdb")
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
    own_files: tuple[str, ...] = ()
    """fnmatch patterns of the files the backend keeps in its database folder: a ``DB.partial``
    holding anything else is not a leftover conversion, and a resume refuses it."""

    def __init__(self, path: str | os.PathLike, *, resume: bool = False,
                 commit_every: int = COMMIT_EVERY):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.commit_every = commit_every
        # one writer per database: a second conversion is refused naming the live one's pid
        # before it looks at DB.partial (whose "left from an interrupted conversion" would
        # otherwise invite deleting a live conversion's records)
        try:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_create(self.partial, exc) from None
        self.lock = PathLock(self.path, f"database {self.path}",
                             "wait for that conversion to end, or write to another path")
        self.lock.acquire()
        try:
            self._check_target(resume)
            self.resumed = 0
            self.last_key: bytes | None = None
            self._open()
        except BaseException:
            self.lock.release()
            raise
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
        if resume and (self.partial.exists() or self.partial.is_symlink()):
            self._check_leftover()

    def _check_leftover(self) -> None:
        """A resume continues only what a conversion left: a real folder (a link would be
        renamed to ``DB`` with the records elsewhere) holding the backend's files alone."""
        if self.partial.is_symlink():
            raise DataError(f"{self.partial} is a link, and conversions write their own "
                            "folder; remove the link and convert again")
        if not self.partial.is_dir():
            return   # the backend's open names it (a file where its folder should be)
        theirs = sorted(p.name for p in self.partial.iterdir()
                        if not any(fnmatch(p.name, own) for own in
                                   (*self.own_files, INPUTS_FILE)))
        if theirs:
            shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more"
                                              if len(theirs) > 3 else "")
            raise DataError(f"{self.partial} holds {shown}, which no conversion writes: it is "
                            "not one left by an interrupted conversion; move it away, or "
                            "convert to another path")

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
        try:
            self.commit()
            self._close_once(sync=True)
            (self.partial / INPUTS_FILE).unlink(missing_ok=True)
            os.replace(self.partial, self.path)
        except FileNotFoundError:
            raise DataError(f"{self.partial} was removed while this conversion wrote it; "
                            "convert again") from None
        finally:
            self.lock.release()
        fsync_dir(self.path.parent)
        return self.summary()

    def abandon(self, *, discard_if_empty: bool = False) -> WriteSummary:
        """Commit what was put and close, leaving ``DB.partial`` for a later resume (removed
        instead when it holds no record and ``discard_if_empty``: nothing worth resuming)."""
        try:
            self.commit()
        finally:
            self._close_once(sync=False)
            if discard_if_empty and self.records == 0:
                remove_partial(self.path)
            self.lock.release()
        return self.summary()

    def record_inputs(self, inputs: Sequence[Path]) -> None:
        """Remember the conversion's inputs inside ``DB.partial`` (a fresh one), or check
        them against those it was begun from (a resumed one that remembers them)."""
        found = [fingerprint(path) for path in inputs]
        record = self.partial / INPUTS_FILE
        if self.resumed or record.exists():
            saved = _saved_inputs(record)
            if saved is not None and saved != found:
                raise DataError(f"{self.partial}: cannot resume: it was begun from "
                                f"{_differ(saved, found)}; delete it and convert again, or "
                                "resume with the inputs it was begun from")
            if saved is not None or self.resumed:
                return
        record.write_text(json.dumps(found, indent=1))

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


def fingerprint(path: Path) -> dict[str, Any]:
    """An input as a resume checks it: its absolute name, size and the hash of its first MiB."""
    try:
        with path.open("rb") as f:
            head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()[:16]
        size = path.stat().st_size
    except OSError:
        head, size = "", -1
    return {"name": str(path.resolve()), "size": size, "head": head}


def _saved_inputs(record: Path) -> list[dict[str, Any]] | None:
    try:
        saved = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, list) else None


def _differ(saved: list[dict[str, Any]], found: list[dict[str, Any]]) -> str:
    """Which input differs, in words: ``a.idx (47,040,016 bytes), not b.idx (...)``."""
    def shown(item: dict[str, Any]) -> str:
        return f"{item.get('name')} ({item.get('size', 0):,} bytes)"

    for theirs, ours in zip(saved, found, strict=False):
        if theirs != ours:
            if theirs.get("name") == ours.get("name") and theirs.get("size") == ours.get("size"):
                return f"{shown(theirs)} as it was then (its first bytes have changed since)"
            return f"{shown(theirs)}, not {shown(ours)}"
    return f"{len(saved)} input file(s), not {len(found)}"
