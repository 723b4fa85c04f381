"""Hostile inputs through the command line: truncated, bit-flipped, empty, wrong-typed and
malicious files, and a full disk. Every outcome is exit 1 and one line naming the file, or a
clean run; never a crash, a traceback or a silent wrong load."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from support import ROOT, error_line, snapshot_names, tiny_net, write_db, write_records

from caffe_py.commands.output import GLOG_PREFIX
from caffe_py.io.formats.datum import Datum
from caffe_py.solver import snapshot as snap

NET = tiny_net(data="""\
  - name: data
    type: Data
    top: [data, label]
    transform_param: {scale: 0.00390625}
    data_param: {source: db, batch_size: 4}
""")
SOLVER = """\
net: net.yaml
base_lr: 0.05
max_iter: {max_iter}
snapshot: {snapshot}
display: 0
snapshot_prefix: {prefix}
random_seed: 3
"""


def cpy(cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The run failed with exit 1 and exactly one line, 'Error: ...', on stderr, after the
    log lines (each with glog's prefix: the stream is a pipe)."""
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: "), done.stderr[-2000:]
    assert all(GLOG_PREFIX.match(line) for line in lines[:-1]), done.stderr[-2000:]
    return lines[-1]


@pytest.fixture
def work(tmp_path):
    write_records(tmp_path / "db", ((np.full((1, 3, 3), 9 * i % 256, np.uint8), i % 3)
                                    for i in range(40)))
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(
        SOLVER.format(max_iter=4, snapshot=0, prefix="snaps/tiny"))
    return tmp_path


def test_a_truncated_database_is_one_line_naming_it(work):
    data = work / "db" / "data.mdb"
    data.write_bytes(data.read_bytes()[:8192])
    for args in (["train", "--solver", "solver.yaml"], ["db-info", "db"],
                 ["compute-mean", "db", "mean.binaryproto"]):
        line = one_line_error(cpy(work, *args))
        assert "db: corrupt LMDB database (data.mdb is 8192 bytes but its pages reach 12288: " \
               "the file is truncated, e.g. an interrupted copy); copy it again, or delete it " \
               "and convert the data again" in line, line


def test_a_foreign_data_file_is_one_line(work):
    (work / "db" / "data.mdb").write_bytes(b"\x00" * 9000)
    line = one_line_error(cpy(work, "train", "--solver", "solver.yaml"))
    assert line.endswith(f"layer 'data' (Data): {work / 'db'}: corrupt LMDB database (data.mdb "
                         "has no LMDB meta page: not an LMDB file, or damaged); delete it and "
                         "convert the data again")


def test_records_without_data_are_refused(work):
    shutil.rmtree(work / "db")
    write_db(work / "db", [Datum(0, 0, 0, data=b"", label=0)] * 5)
    line = one_line_error(cpy(work, "train", "--solver", "solver.yaml"))
    assert line.endswith("db: record '00000000': holds no image (channels x height x width = "
                         "0 x 0 x 0); convert the data again (the records must hold the "
                         "images)")


@pytest.fixture
def trained(work):
    assert cpy(work, "train", "--solver", "solver.yaml").returncode == 0
    return work / "snaps" / "tiny_iter_4.pt"


def test_a_flipped_byte_in_a_snapshot_is_caught(work, trained):
    blob = bytearray(trained.read_bytes())
    with zipfile.ZipFile(trained) as zf:
        name = next(n for n in zf.namelist() if "/data/" in n)
    # flip one byte inside the first tensor record (its data, not the zip headers)
    at = blob.index(torch.load(trained, weights_only=True)["layers"]["ip"][0].numpy().tobytes())
    blob[at + 5] ^= 0x20
    trained.write_bytes(bytes(blob))
    line = one_line_error(cpy(work, "test", "--model", "net.yaml", "--weights", str(trained),
                              "--iterations", "1"))
    assert line == (f"Error: {trained}: checksum mismatch in its record '{name}'; the file is "
                    "damaged; use an earlier snapshot, or copy it again")


def test_an_empty_caffemodel_does_not_score_filler_weights(work):
    (work / "empty.caffemodel").write_bytes(b"")
    line = one_line_error(cpy(work, "test", "--model", "net.yaml", "--weights",
                              "empty.caffemodel", "--iterations", "1"))
    assert line == ("Error: empty.caffemodel: holds no layers (an empty or foreign file); none "
                    "of the net's 1 learnable layers got weights: give the weights of this net")


def test_weights_of_another_net_and_nan_weights_are_refused(work, trained):
    snap.save_weights({"fc": [torch.ones(3, 9)], "conv": [torch.ones(2)]}, work / "other.pt")
    line = one_line_error(cpy(work, "test", "--model", "net.yaml", "--weights", "other.pt",
                              "--iterations", "1"))
    assert line == ("Error: other.pt: holds 2 layer(s), none of them named as the net's (fc, "
                    "conv); none of the net's 1 learnable layers got weights: give the weights "
                    "of this net")
    layers = snap.load_weights(trained)
    layers["ip"][0][1, 2] = float("nan")
    snap.save_weights(layers, work / "nan.pt")
    line = one_line_error(cpy(work, "test", "--model", "net.yaml", "--weights", "nan.pt",
                              "--iterations", "1"))
    assert line == ("Error: nan.pt: layer 'ip' blob 0 holds NaN or infinite values; the file "
                    "is damaged or was saved from a diverged run: use an earlier snapshot")


def test_a_malicious_pickle_never_runs(work):
    (work / "evil.pt").write_bytes(
        b"\x80\x04\x95\x1f\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93"
        b"\x94\x8c\x05touch\x94\x85\x94R\x94.")
    line = one_line_error(cpy(work, "test", "--model", "net.yaml", "--weights", "evil.pt",
                              "--iterations", "1"))
    assert line.startswith("Error: evil.pt: not a caffe-py snapshot that loads safely (")
    assert not (work / "touch").exists()


def test_a_full_disk_stops_with_the_previous_snapshot_intact(work, monkeypatch):
    """ENOSPC in the middle of the second snapshot (torch.save fails as a real full disk
    makes it fail); the first snapshot is whole and resumes."""
    from click.testing import CliRunner

    from caffe_py.cli import cli

    monkeypatch.chdir(work)
    (work / "solver.yaml").write_text(SOLVER.format(max_iter=8, snapshot=2, prefix="snaps/t"))
    real_save, calls = torch.save, []

    def full_disk(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # the weights and state of iteration 2 fit; then the disk is full
            f.write(b"PK\x03\x04")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(snap.torch, "save", full_disk)
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml"])
    assert result.exit_code == 1
    state = work / "snaps" / "t_iter_2.solverstate.pt"
    assert error_line(result.stderr) == (
        f"Error: no space left on device writing {work / 'snaps' / 't_iter_4.pt'}; free space "
        f"or write elsewhere (nothing was replaced); the previous snapshot {state} is intact "
        f"(resume with --snapshot {state})")
    monkeypatch.setattr(snap.torch, "save", real_save)
    assert snapshot_names(work / "snaps") == [
        "t_iter_2.pt", "t_iter_2.solverstate.pt"]
    assert snap.load_state(work / "snaps" / "t_iter_2.solverstate.pt")["iter"] == 2


def test_writing_into_an_impossible_place_is_one_line(work):
    (work / "file.txt").write_text("x")
    target = work / "file.txt" / "mean.binaryproto"
    line = one_line_error(cpy(work, "compute-mean", "db", str(target)))
    assert line == (f"Error: cannot write {target} ({work / 'file.txt'} is a file, not a "
                    "directory); check the directory exists and is writable, or write elsewhere")
    prototxt = ROOT / "tests/fixtures/prototxts/bvlc/examples/mnist/lenet.prototxt"
    target = work / "file.txt" / "lenet.yaml"
    line = one_line_error(cpy(work, "import-prototxt", str(prototxt), str(target)))
    assert line == (f"Error: cannot write {target} ({work / 'file.txt'} is a file, not a "
                    "directory); check the directory exists and is writable, or write elsewhere")


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (root only; skipped where it cannot be mounted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.parametrize("fmt,ext", [("pt", ".pt"), ("HDF5", ".h5")])
def test_a_real_full_disk_stops_with_the_previous_snapshot_intact(tmp_path, tiny_disk, fmt, ext):
    """The same on a real full filesystem: snapshots of about 150 KB into 256 KiB. HDF5's
    (written by HDF5 into the temporary, before) ended in a traceback, or a segfault."""
    (tmp_path / "net.yaml").write_text(tiny_net(extra="").replace(
        "num_output: 3", "num_output: 3000"))
    (tmp_path / "solver.yaml").write_text(
        SOLVER.format(max_iter=8, snapshot=2, prefix=str(tiny_disk / "t"))
        .replace("net: net.yaml", f"net: net.yaml\nmomentum: 0.9\nsnapshot_format: {fmt}"))
    line = one_line_error(cpy(tmp_path, "train", "--solver", "solver.yaml"))
    state = tiny_disk / f"t_iter_2.solverstate{ext}"
    assert line.startswith("Error: no space left on device writing ")
    assert line.endswith(f"(nothing was replaced); the previous snapshot {state} is intact "
                         f"(resume with --snapshot {state})")
    assert snap.load_state(state)["iter"] == 2
    assert not [p.name for p in tiny_disk.iterdir() if p.name.endswith(".tmp")]
