"""Atomic writes: the target holds the old bytes or the new ones, and no temp file is left."""
from __future__ import annotations

import pytest

from caffe_py.fileio import atomic_write, atomic_write_bytes


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
