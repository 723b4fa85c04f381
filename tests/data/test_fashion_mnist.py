"""`make data` (data/fashion_mnist.py) on small stand-in files: convert, skip, resume, errors."""
from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from support import load_script

from caffe_py.io.db.lmdb_store import LmdbWriter, open_db, partial_path

SCRIPT = Path(__file__).resolve().parents[2] / "data" / "fashion_mnist.py"


@pytest.fixture
def script(monkeypatch):
    module = load_script(SCRIPT)
    monkeypatch.setattr(module, "SPLITS", {
        "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 1200),
        "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 3)})
    return module


def _write_split(folder: Path, prefix: str, n: int) -> None:
    images = np.random.default_rng(n).integers(0, 256, (n, 2, 2), dtype=np.uint8)
    (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(struct.pack(">4i", 2051, n, 2, 2) + images.tobytes()))
    (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(struct.pack(">2i", 2049, n) + bytes(n)))


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    _write_split(folder, "train", 1200)
    _write_split(folder, "t10k", 3)
    return folder


def test_converts_then_skips(script, source, tmp_path, capsys):
    out = tmp_path / "out"
    assert script.main(["--source", str(source), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{out}/train_lmdb: 1200 records, ")
    assert lines[1].startswith(f"{out}/test_lmdb: 3 records, ")
    assert script.main(["--source", str(source), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        f"{out}/train_lmdb: complete (1200 records), skipped",
        f"{out}/test_lmdb: complete (3 records), skipped"]


def test_resumes_a_leftover_partial(script, source, tmp_path, capsys):
    out = tmp_path / "out"
    assert script.main(["--source", str(source), "--out", str(out)]) == 0
    # Keep the first 1000 records of train_lmdb as if the run had been interrupted there.
    with open_db(out / "train_lmdb") as reader:
        first = list(reader)[:1000]
    shutil.rmtree(out / "train_lmdb")
    writer = LmdbWriter(out / "train_lmdb")
    for key, value in first:
        writer.put(key, value)
    writer.abandon()
    assert partial_path(out / "train_lmdb").exists()
    capsys.readouterr()
    assert script.main(["--source", str(source), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("(resumed after 1000)")
    with open_db(out / "train_lmdb") as reader:
        assert len(reader) == 1200


def test_missing_files_and_wrong_counts(script, source, tmp_path, capsys):
    (source / "t10k-labels-idx1-ubyte.gz").unlink()
    assert script.main(["--source", str(source), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == (
        f"Error: {source}: missing t10k-labels-idx1-ubyte.gz; download them from "
        "https://github.com/zalandoresearch/fashion-mnist\n")
    _write_split(source, "t10k", 5)
    assert script.main(["--source", str(source), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == (
        f"Error: {tmp_path}/o/test_lmdb holds 5 records, not Fashion-MNIST's 3; check the "
        "files in --source\n")


def test_not_installed_and_not_root(script, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(script, "DEBIAN_DIR", tmp_path / "none")
    monkeypatch.setattr(script.os, "geteuid", lambda: 1000)
    assert script.main(["--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == (
        f"Error: Fashion-MNIST is not in {tmp_path}/none: run `sudo apt-get install "
        "dataset-fashion-mnist` then `make data` again, or download the four IDX .gz files "
        "from https://github.com/zalandoresearch/fashion-mnist and run "
        "`python3 data/fashion_mnist.py --source DIR`\n")
