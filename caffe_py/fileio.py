"""Atomic file writes: a crash mid-write leaves the old file or the new one, never a torn one.

The payload goes to a temporary file in the target's directory, is flushed and fsynced, then
renamed over the target (atomic on POSIX); the directory is fsynced so the rename itself
survives a power loss. The file gets the mode a plain ``open`` would give it (0666 less the
umask). A write that fails (a full disk, a read-only or missing place, no permission) removes
its temporary file and is a one-line :class:`~caffe_py.errors.WriteError`.

A target that is not a regular file (``/dev/null``, ``/dev/stdout``, a FIFO, a terminal) is
written through instead: a rename would replace the device or the pipe with a plain file
(:func:`is_stream`).
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from .errors import CaffePyError, WriteError, one_line_reason

TEMP_SUFFIX = ".tmp"
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """Run ``write`` on a temporary binary file beside ``path``, then move it onto ``path``; a
    stream (:func:`is_stream`) is written directly."""
    path = Path(path)
    if is_stream(path):
        _write_through(path, write)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException as exc:
        # whether the disk is full is judged before the temporary goes: removing it frees
        # the space the write had filled
        failed = _write_failed(exc)
        full = failed and getattr(exc, "errno", None) is None and _full(path)
        Path(tmp).unlink(missing_ok=True)
        if failed:
            raise write_error(path, exc, full=full) from None
        raise
    fsync_dir(path.parent)


def is_stream(path: str | os.PathLike) -> bool:
    """Whether ``path`` names something other than a regular file or a new one: a device, a
    FIFO, a socket, or one of the process's descriptors reached through /proc (``/dev/stdout``,
    ``/dev/fd/1``, ``/proc/self/fd/1``), which stays a stream even where it resolves to a
    regular file (a redirected stdout). A new file in /dev/shm is a file."""
    where = os.path.abspath(path)
    folder = os.path.dirname(where)
    if os.path.realpath(folder).startswith("/proc/"):
        return True
    if os.path.islink(where) and os.path.join(folder, os.readlink(where)).startswith("/proc/"):
        return True
    try:
        mode = os.stat(where).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _write_through(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """``write`` straight into ``path`` (a device or a pipe: nothing to keep atomic)."""
    try:
        with open(path, "wb") as file:
            write(file)
            file.flush()
    except BaseException as exc:
        if _write_failed(exc):
            raise write_error(path, exc, full=False) from None
        raise


def _write_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the write failing (the system's error, or torch.save's zip writer
    reporting one: a full disk included), not the writer's own error or an interrupt.
    torch.save reports a failed write of its file as a RuntimeError about the position it
    expected (``unexpected pos 960 vs 854``)."""
    return isinstance(exc, OSError) or (isinstance(exc, RuntimeError) and (
        "unexpected pos" in str(exc) or "inline_container" in str(exc)
        or "file write failed" in str(exc)))


def write_error(path: Path, exc: BaseException, *, full: bool | None = None) -> WriteError:
    """The one-line error of a failed write of ``path`` (``full``: whether the disk was found
    full while the failed write still held its space; judged now when not given)."""
    code = getattr(exc, "errno", None)
    if full is None:
        full = code is None and _full(path)
    if code in FULL or full:
        return WriteError(str(path), f"no space left on device writing {path}; free space or "
                          "write elsewhere (nothing was replaced)", disk_full=True)
    reason = (getattr(exc, "strerror", None) or one_line_reason(exc)).lower()
    blocking = blocking_file(path)
    if blocking is not None:
        reason = f"{blocking} is a file, not a directory"
    return WriteError(str(path), f"cannot write {path} ({reason}); check the directory "
                      "exists and is writable, or write elsewhere")


def blocking_file(path: Path) -> Path | None:
    """The first folder on ``path``'s way that is a file instead (nothing can be written under
    it), or None."""
    return next((p for p in path.parents if p.exists() and not p.is_dir()), None)


def _full(path: Path) -> bool:
    """Whether the filesystem of ``path`` has (next to) no space left."""
    try:
        return shutil.disk_usage(path.parent).free < (1 << 20)
    except OSError:
        return False


def remove_stale_temporaries(path_stem: str | os.PathLike) -> list[Path]:
    """Delete the temporaries that writes of files named ``<stem>*`` left behind when killed
    (``.<name>.XXXX.tmp`` beside them); returns what was removed."""
    stem = Path(path_stem)
    removed = []
    for tmp in stem.parent.glob(f".{glob_escape(stem.name)}*{TEMP_SUFFIX}"):
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass
    return removed


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def atomic_write_bytes(path: str | os.PathLike, payload: bytes) -> None:
    atomic_write(path, lambda file: file.write(payload))


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def exists(path: str | os.PathLike) -> bool:
    """Path.exists, where a name the system refuses (too long, say) does not exist."""
    try:
        return Path(path).exists()
    except OSError:
        return False


def is_file(path: str | os.PathLike) -> bool:
    """Path.is_file, where a name the system refuses is not a file."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


def is_dir(path: str | os.PathLike) -> bool:
    """Path.is_dir, where a name the system refuses is not a directory."""
    try:
        return Path(path).is_dir()
    except OSError:
        return False


class Busy(CaffePyError):
    """A path another live process holds the lock of (another run or conversion)."""


LOCK_SUFFIX = ".lock"
HOLDER_WAIT_S = 1.0
"""How long a refused process waits for the holder's pid: a holder writes it just after taking
the lock, so a refusal in between finds the file still empty."""


class PathLock:
    """An exclusive lock on ``<path>.lock`` for as long as it is held: one process at a time
    writes under a snapshot prefix or into a database. ``flock`` ties the lock to the open
    file, so the kernel releases it when the process dies, however it dies; a lock file left
    by a dead process is simply taken over. The holder's pid is written into the file, for
    the refusal of a second process to name it. On release the file is removed (a process
    that opened it just before finds its inode gone and tries again, so two processes never
    both hold the lock)."""

    def __init__(self, path: str | os.PathLike, what: str, fix: str):
        self.path = Path(f"{os.fspath(path)}{LOCK_SUFFIX}")
        self.what, self.fix = what, fix
        """``what`` names the locked thing in a refusal (``snapshot_prefix snaps/lenet``);
        ``fix`` says what the second process can do."""
        self._fd: int | None = None

    def acquire(self) -> PathLock:
        """Take the lock, or raise :class:`Busy` naming the live holder's pid."""
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             _file_mode())
            except OSError as exc:
                raise write_error(self.path, exc) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise write_error(self.path, exc) from None
                holder = self._holder()
                raise Busy(f"{self.what} is in use by another process ({holder}, holding "
                           f"{self.path}); {self.fix}") from None
            if self._same_file(fd):
                break
            os.close(fd)   # the holder removed it as we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and let the lock go (idempotent)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _holder(self) -> str:
        """The holder as a refusal names it, its pid read from the lock file (read again for
        up to :data:`HOLDER_WAIT_S` while the holder has yet to write it)."""
        deadline = time.monotonic() + HOLDER_WAIT_S
        while True:
            try:
                text = self.path.read_text().strip()
            except OSError:
                text = ""
            if text.isdigit() or time.monotonic() >= deadline:
                return f"pid {text}" if text.isdigit() else "pid unknown"
            time.sleep(0.02)

    def _same_file(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
        except OSError:
            return False

    def __enter__(self) -> PathLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

