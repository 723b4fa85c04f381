"""Atomic file writes: a crash mid-write leaves the old file or the new one, never a torn one.

The payload goes to a temporary file in the target's directory, is flushed and fsynced, then
renamed over the target (atomic on POSIX); the directory is fsynced so the rename itself
survives a power loss.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """Run ``write`` on a temporary binary file beside ``path``, then move it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


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
