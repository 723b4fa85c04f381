"""Atomic writes: the target holds the old bytes or the new ones, and no temp file is left; a
device or a pipe is written through, never replaced by a plain file."""
from __future__ import annotations

import fcntl
import os
import stat
import threading

import pytest

from caffe_py.errors import WriteError
from caffe_py.fileio import Busy, PathLock, atomic_write, atomic_write_bytes, is_stream


def test_writes_and_replaces(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.bin"]


def test_a_failure_mid_write_keeps_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    def half_then_crash(file):
        file.write(b"new but tor")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_then_crash)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_a_fifo_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    # a daemon: were the pipe replaced, its reader would wait forever, not the test run
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    atomic_write_bytes(fifo, b"through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_a_full_device_is_a_one_line_error_and_stays_a_device(tmp_path):
    full = tmp_path / "full"
    try:
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))   # what /dev/full is
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here ({exc})")
    with pytest.raises(WriteError) as err:
        atomic_write_bytes(full, b"x" * 100)
    assert str(err.value) == (f"no space left on device writing {full}; free space or write "
                              "elsewhere (nothing was replaced)")
    assert stat.S_ISCHR(os.stat(full).st_mode)


@pytest.mark.parametrize("path,want", [
    ("/dev/null", True), ("/dev/stdout", True), ("/dev/fd/1", True), ("/proc/self/fd/1", True),
    ("relative/new.bin", False), ("/dev/shm/caffe_py_no_such_snapshot.pt", False),
])
def test_which_paths_are_streams(path, want):
    assert is_stream(path) is want


def test_a_regular_file_and_a_new_name_are_not_streams(tmp_path):
    (tmp_path / "f").write_bytes(b"")
    assert not is_stream(tmp_path / "f") and not is_stream(tmp_path / "new")
    assert not is_stream(tmp_path)


def test_a_refusal_names_a_holder_that_writes_its_pid_late(tmp_path):
    """The holder takes the lock, then writes its pid: a second process refused in between
    reads an empty file, and waits for the pid rather than naming no one."""
    lock = tmp_path / "snaps.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # held, pid not yet written
    late = threading.Timer(0.2, lambda: os.write(fd, b"4242\n"))
    late.start()
    try:
        with pytest.raises(Busy) as err:
            PathLock(tmp_path / "snaps", "snapshot_prefix snaps", "wait").acquire()
    finally:
        late.join()
        os.close(fd)
    assert str(err.value) == (f"snapshot_prefix snaps is in use by another process (pid 4242, "
                              f"holding {lock}); wait")
