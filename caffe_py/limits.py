"""The limits a shared machine sets on a process, and the one-line errors of running into them.

Memory: the smallest of the machine's physical memory, the address-space limit (RLIMIT_AS,
``ulimit -v``) and the memory limit of the process's cgroup (v2 ``memory.max`` or v1
``memory.limit_in_bytes``, the tightest of its cgroup and their parents): what the memory
estimate compares blobs and tops with (:func:`memory_limit`). Open files: RLIMIT_NOFILE
(``ulimit -n``). :func:`resource_error` turns the exceptions of hitting one (EMFILE, a
MemoryError, the allocator's RuntimeError) into a :class:`ResourceError` naming the limit;
:func:`one_line_limits` applies it around a command or a run.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import CaffePyError


class ResourceError(CaffePyError):
    """A limit of the machine or the process was reached (memory, open files)."""


@dataclass(frozen=True)
class Limit:
    """A memory limit: its bytes and what sets it, as a message names it."""

    bytes: int
    what: str

    def described(self) -> str:
        return f"{self.bytes / 2**30:,.1f} GiB{self.what}"


PHYSICAL = ""
ADDRESS_SPACE = " under ulimit -v"
CGROUP = " under the cgroup's limit in {file}"


@functools.cache
def memory_limit() -> Limit | None:
    """The memory this process may use at most (the smallest limit), or None when no limit is
    known. Read once per process."""
    found = [limit for limit in (_physical(), _address_space(), cgroup_memory_limit())
             if limit is not None]
    return min(found, key=lambda limit: limit.bytes) if found else None


def _physical() -> Limit | None:
    try:
        return Limit(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), PHYSICAL)
    except (ValueError, OSError, AttributeError):
        return None


def _address_space() -> Limit | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else Limit(soft, ADDRESS_SPACE)


def cgroup_memory_limit(proc_cgroup: Path = Path("/proc/self/cgroup"),
                        mountinfo: Path = Path("/proc/self/mountinfo")) -> Limit | None:
    """The tightest memory limit of the process's cgroup and its parents (v2 ``memory.max``,
    v1 ``memory.limit_in_bytes``; "max" or a page-rounded 2^63 is none), or None."""
    try:
        memberships = proc_cgroup.read_text().splitlines()
        mounts = mountinfo.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in memberships:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        v2 = hierarchy == "0" and controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        mount = _cgroup_mount(mounts, v2)
        if mount is None:
            continue
        name = "memory.max" if v2 else "memory.limit_in_bytes"
        found += _limits_up(mount[0], mount[1], path, name)
    return min(found, key=lambda limit: limit.bytes) if found else None


def _cgroup_mount(mounts: list[str], v2: bool) -> tuple[Path, str] | None:
    """(mount point, the hierarchy's path at that mount) of the v2 or the v1 memory cgroup."""
    for line in mounts:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        kind = line.split(" - ", 1)[1].split()
        fstype, options = kind[0], kind[-1] if len(kind) > 2 else ""
        if (v2 and fstype == "cgroup2") or \
                (not v2 and fstype == "cgroup" and "memory" in options.split(",")):
            return Path(fields[4]), fields[3]
    return None


def _limits_up(mount: Path, root: str, path: str, name: str) -> list[Limit]:
    """The limits in ``name`` of the cgroup at ``path`` and of each parent seen at the mount."""
    relative = path[len(root):] if path.startswith(root) else path
    parts = [p for p in relative.split("/") if p]
    limits = []
    for depth in range(len(parts), -1, -1):
        file = mount.joinpath(*parts[:depth], name)
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 62):
            limits.append(Limit(int(text), CGROUP.format(file=file)))
    return limits


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def resource_error(exc: BaseException) -> ResourceError | None:
    """The one-line error of ``exc`` when it means a limit was reached, else None."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        what = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        if exc.errno == errno.ENFILE:
            return ResourceError(f"the system's table of open files is full{what}; close "
                                 "other programs, or ask for a larger fs.file-max")
        return ResourceError(f"too many open files{what}: this process may open "
                             f"{open_files_limit():,} (ulimit -n); raise it (e.g. ulimit -n "
                             "4096) or read fewer databases at once")
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _allocator(exc)):
        limit = memory_limit()
        within = f" (at most {limit.described()})" if limit is not None else ""
        return ResourceError(f"out of memory: an allocation failed{within}; make the net, "
                             "the batch or prefetch smaller, or raise the limit")
    return None


def _allocator(exc: RuntimeError) -> bool:
    text = str(exc)
    return "can't allocate memory" in text or "not enough memory" in text or \
        "Cannot allocate memory" in text


@contextlib.contextmanager
def one_line_limits() -> Iterator[None]:
    """Exceptions of a reached limit raised as their :class:`ResourceError`."""
    try:
        yield
    except (OSError, MemoryError, RuntimeError) as exc:
        error = resource_error(exc)
        if error is None:
            raise
        raise error from None
