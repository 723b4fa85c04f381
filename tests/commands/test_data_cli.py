"""`cpy convert`, `cpy compute-mean`, `cpy db-info`: output lines and exact error messages."""
from __future__ import annotations

import gzip
import os
import re
import signal
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from caffe_py.cli import cli


def _run(*args: str):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output + result.stderr
    return result


@pytest.fixture
def idx(tmp_path):
    """Four 2x3 images and their labels as gzipped IDX files."""
    images = np.arange(24, dtype=np.uint8).reshape(4, 2, 3)
    image_path, label_path = tmp_path / "images.gz", tmp_path / "labels.gz"
    image_path.write_bytes(gzip.compress(struct.pack(">4i", 2051, 4, 2, 3) + images.tobytes()))
    label_path.write_bytes(gzip.compress(struct.pack(">2i", 2049, 4) + bytes([1, 0, 1, 1])))
    return image_path, label_path


def test_convert_idx_then_db_info_and_mean(idx, tmp_path):
    db = tmp_path / "db"
    result = _run("convert", "idx", *idx, db)
    assert result.exit_code == 0, result.output
    assert re.fullmatch(rf"{db}: 4 records, 96 bytes, \d+\.\d s\n", result.output)

    info = _run("db-info", db)
    assert info.exit_code == 0
    assert info.output.splitlines()[:-1] == [
        f"database  {db} (LMDB)", "records   4", "shape     1 x 2 x 3 (C x H x W), uint8, raw",
        "keys      '00000000' .. '00000003'", "labels    2 distinct",
        "  0         1   25.0%", "  1         3   75.0%"]

    mean = _run("compute-mean", db, tmp_path / "mean.binaryproto")
    assert mean.exit_code == 0
    # Pixel k of image i is 6 i + k: the mean of pixel k is 9 + k, its average 11.5.
    assert mean.output.splitlines()[1:] == ["mean_value channel [0]: 11.5"]


def test_swapped_idx_arguments(idx, tmp_path):
    images, labels = idx
    result = _run("convert", "idx", labels, images, tmp_path / "db")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: {labels}: not an IDX images file (magic number 2049, "
                             "expected 2051); check the argument order: IMAGES LABELS DB\n")


def test_existing_and_partial_databases_are_refused(idx, tmp_path):
    db = tmp_path / "db"
    assert _run("convert", "idx", *idx, db).exit_code == 0
    result = _run("convert", "idx", *idx, db)
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {db} already exists; delete it or write to another path\n")
    db.rename(tmp_path / "db2.partial")
    result = _run("convert", "idx", *idx, tmp_path / "db2")
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {tmp_path}/db2.partial is left from an interrupted conversion; delete it, "
           "or pass --resume to continue it\n")
    result = _run("convert", "idx", *idx, tmp_path / "db2", "--resume")
    assert result.exit_code == 0
    assert result.output.endswith(" s (resumed after 4)\n")
    assert result.output.startswith(f"{tmp_path}/db2: 4 records (0 written now, 0 bytes), ")


def test_imageset_errors(tmp_path):
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(tmp_path / "a.png")
    listfile = tmp_path / "list.txt"
    listfile.write_text("a.png 0\nb.png\n")
    result = _run("convert", "imageset", tmp_path, listfile, tmp_path / "db")
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {listfile}:2: 'b.png' has no label; each line is 'path label'\n")
    listfile.write_text("a.png 0\nb.png 1\n")
    result = _run("convert", "imageset", tmp_path, listfile, tmp_path / "db")
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {listfile}:2: {tmp_path}/b.png: image not found; {tmp_path}/db.partial "
           "keeps the 1 record before it: fix that input and run the same command with "
           f"--resume to continue, or delete {tmp_path}/db.partial to start again\n")
    result = _run("convert", "imageset", tmp_path, listfile, tmp_path / "x", "--encode-type",
                  "png")
    assert result.exit_code == 1 and "--encode-type needs --encoded" in result.stderr


def test_imageset_flags(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png", "c.png"):
        Image.fromarray(rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)).save(tmp_path / name)
    listfile = tmp_path / "list.txt"
    listfile.write_text("a.png 0\nb.png 1\nc.png 2\n")
    db = tmp_path / "db"
    result = _run("convert", "imageset", tmp_path, listfile, db, "--gray", "--shuffle",
                  "--seed", "3", "--resize-width", "3", "--resize-height", "2", "--check-size")
    assert result.exit_code == 0, result.stderr
    info = _run("db-info", db).output.splitlines()
    assert info[2] == "shape     1 x 2 x 3 (C x H x W), uint8, raw"
    encoded = _run("convert", "imageset", tmp_path, listfile, tmp_path / "enc", "--encoded",
                   "--encode-type", "jpg")
    assert encoded.exit_code == 0
    info = _run("db-info", tmp_path / "enc").output.splitlines()
    assert info[2] == "shape     3 x 4 x 6 (C x H x W), uint8, encoded images (3 of 3)"


def test_convert_cifar(tmp_path):
    folder = tmp_path / "cifar"
    folder.mkdir()
    record = bytes([7]) + bytes(3072)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (folder / name).write_bytes(record * 2)
    result = _run("convert", "cifar", folder, tmp_path / "cifar10")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{tmp_path}/cifar10_train_lmdb: 10 records, ")
    assert lines[1].startswith(f"{tmp_path}/cifar10_test_lmdb: 2 records, ")


def test_db_info_missing_and_corrupt(tmp_path):
    result = _run("db-info", tmp_path / "nope")
    assert (result.exit_code, result.stderr) == (
        1, f"Error: {tmp_path}/nope: database not found; create it with `cpy convert` or fix "
           "data_param.source\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "data.mdb").write_bytes(bytes(8192))
    result = _run("db-info", tmp_path / "bad")
    assert result.exit_code == 1
    assert re.fullmatch(rf"Error: {tmp_path}/bad: corrupt LMDB database \(.+\); delete it and "
                        r"convert the data again\n", result.stderr)


@pytest.mark.parametrize("calls, how, message", [
    (1, "int", "interrupted before any record of {db} was written; nothing was kept"),
    (3, "int", "interrupted: {db}.partial keeps the records written so far; run the same "
               "command with --resume to continue it"),
    (3, "term", "stopped by SIGTERM: {db}.partial keeps the records written so far; run the "
                "same command with --resume to continue it"),
    (1, "hup", "stopped by SIGHUP before any record of {db} was written; nothing was kept"),
])
def test_a_stop_says_how_to_resume(idx, tmp_path, monkeypatch, calls, how, message):
    """Ctrl-C, SIGTERM and SIGHUP (a job scheduler's stop, a closed terminal) each end a
    conversion in one line; SIGTERM used to end it with no word (status 143)."""
    from caffe_py.commands import data as commands
    from caffe_py.tools.convert import convert_idx

    def interrupted(*args, **kwargs):
        kwargs["progress"] = lambda total, name: _Interrupt(calls, how)
        return convert_idx(*args, **kwargs)

    monkeypatch.setattr(commands, "convert_idx", interrupted)
    db = tmp_path / "db"
    result = _run("convert", "idx", *idx, db)
    assert (result.exit_code, result.stderr) == (1, f"Error: {message.format(db=db)}\n")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # the handlers put back


def test_caffes_converter_resumes_with_its_resume_flag(idx, tmp_path, monkeypatch):
    """convert_mnist_data's advice to continue with --resume is a flag it takes."""
    from caffe_py.tools import convert

    original = convert.convert_idx

    def stopped(*args, **kwargs):
        kwargs["progress"] = lambda total, name: _Interrupt(3, "term")
        return original(*args, **kwargs)

    monkeypatch.setattr(convert, "convert_idx", stopped)
    db = tmp_path / "db"
    result = _run("convert_mnist_data", *idx, db)
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (
        1, f"Error: stopped by SIGTERM: {db}.partial keeps the records written so far; run the "
           "same command with --resume to continue it")
    monkeypatch.setattr(convert, "convert_idx", original)
    result = _run("convert_mnist_data", "-resume", *idx, db)
    assert result.exit_code == 0, result.stderr
    assert db.is_dir() and not Path(f"{db}.partial").exists()


class _Interrupt:
    """A progress bar that stops the conversion on its ``calls``-th update (the first update
    reports the resumed records, then one per record written): Ctrl-C's KeyboardInterrupt
    (``int``), or SIGTERM or SIGHUP sent to this process (``term``, ``hup``)."""

    def __init__(self, calls: int, how: str = "int"):
        self.left, self.how = calls, how

    def update(self, n: int) -> None:
        self.left -= 1
        if self.left:
            return
        if self.how == "int":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM if self.how == "term" else signal.SIGHUP)

    def close(self) -> None:
        pass


def test_leveldb_backend_for_convert_db_info_and_mean(idx, tmp_path):
    pytest.importorskip("plyvel")
    db = tmp_path / "db"
    assert _run("convert", "idx", *idx, db, "--backend", "leveldb").exit_code == 0
    assert (db / "CURRENT").is_file()
    info = _run("db-info", db, "--backend", "leveldb")
    assert info.exit_code == 0
    assert info.output.splitlines()[:3] == [
        f"database  {db} (LevelDB)", "records   4", "shape     1 x 2 x 3 (C x H x W), uint8, raw"]
    mean = _run("compute-mean", db, tmp_path / "mean.binaryproto", "--backend", "leveldb")
    assert mean.output.splitlines()[1:] == ["mean_value channel [0]: 11.5"]
    wrong = _run("db-info", db)
    assert wrong.exit_code == 1
    assert wrong.stderr == f"Error: {db}: is a LevelDB database, not LMDB; pass --backend leveldb\n"


def test_imageset_of_several_shapes_is_written_with_a_warning(tmp_path):
    from PIL import Image

    for name, size in (("a.png", (10, 8)), ("b.png", (12, 8)), ("c.png", (10, 8))):
        Image.new("RGB", size).save(tmp_path / name)
    (tmp_path / "list.txt").write_text("a.png 0\nb.png 1\nc.png 0\n")
    result = CliRunner().invoke(cli, ["convert", "imageset", str(tmp_path),
                                      str(tmp_path / "list.txt"), str(tmp_path / "db")])
    assert result.exit_code == 0, result.output
    assert (f"Warning: {tmp_path / 'list.txt'}:2: b.png is 3x8x12 but a.png is 3x8x10; the "
            "records have several shapes, which a Data layer cannot batch: resize with "
            "--resize-width/--resize-height (or crop every record with "
            "transform_param.crop_size)") in result.output.splitlines()


def _class_folders(root):
    """ROOT/<class>/... as torchvision's ImageFolder reads them: nested files, upper-case
    extensions, a non-image file left out."""
    rng = np.random.default_rng(5)
    files = {"dog/b.png": 0, "dog/a.jpg": 0, "cat/z.PNG": 0, "cat/deep/m.png": 0,
             "cat/deep/a.bmp": 0, "emu/1.png": 0}
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).save(path)
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "stray.png").write_bytes(b"")  # files in ROOT itself are no class


def test_convert_imageset_from_class_folders(tmp_path):
    """ImageFolder's rule: sorted folders -> labels 0..K-1, each class's images in sorted
    walk order; labels.txt and the list file beside the database; ImageData reads the list."""
    from caffe_py.io.db.lmdb_store import open_db
    from caffe_py.io.formats.datum import datum_to_array, decode_datum
    from caffe_py.io.formats.images import load_image

    root = tmp_path / "images"
    _class_folders(root)
    db = tmp_path / "out" / "train_lmdb"
    result = _run("convert", "imageset", "--from-folders", root, db)
    assert result.exit_code == 0, result.output
    listed = tmp_path / "out" / "train_lmdb_list.txt"
    lines = result.stdout.splitlines()
    assert lines[0] == (f"{listed}: 6 images of 3 classes (labels 0..2 in "
                        f"{tmp_path / 'out' / 'labels.txt'})")
    assert lines[1].startswith(f"{db}: 6 records, ")
    assert (tmp_path / "out" / "labels.txt").read_text() == "cat\ndog\nemu\n"
    # os.walk's (folder, files) tuples sorted: a folder's own files before its sub-folders'
    expected = [("cat/z.PNG", 0), ("cat/deep/a.bmp", 0), ("cat/deep/m.png", 0),
                ("dog/a.jpg", 1), ("dog/b.png", 1), ("emu/1.png", 2)]
    assert listed.read_text() == "".join(f"{p} {label}\n" for p, label in expected)
    with open_db(db) as reader:
        records = list(reader)
    assert [k for k, _ in records] == [f"{i:08d}_{p}".encode() for i, (p, _) in
                                       enumerate(expected)]
    for (_, value), (path, label) in zip(records, expected, strict=True):
        datum = decode_datum(value)
        assert datum.label == label
        np.testing.assert_array_equal(datum_to_array(datum), load_image(root / path, color=True))
    # the list serves an ImageData layer with root_folder: ROOT/
    from caffe_py.io import ReaderPool, attach_feeds
    from caffe_py.net import Net
    from caffe_py.spec.net_spec import parse_net
    from caffe_py.spec.schema import Source

    spec = parse_net({"name": "n", "layer": [{
        "name": "d", "type": "ImageData", "top": ["data", "label"],
        "image_data_param": {"source": str(listed), "root_folder": f"{root}/",
                             "batch_size": 6}}]}, Source())
    net = Net(spec, "TEST")
    with ReaderPool() as pool:
        attach_feeds(net, pool, seed=0)
        pool.start()
        batch = net().outputs
    assert batch["label"].tolist() == [0, 0, 0, 1, 1, 2]
    assert batch["data"][0].tolist() == load_image(root / "cat/z.PNG", color=True).tolist()


def test_from_folders_refuses_what_imagefolder_refuses(tmp_path):
    root = tmp_path / "images"
    _class_folders(root)
    (root / "empty").mkdir()
    result = _run("convert", "imageset", "--from-folders", root, tmp_path / "db")
    assert (result.exit_code, result.stderr) == (1, (
        f"Error: {root}: no image in the class folder(s) empty (image files end in .jpg, "
        ".jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp); add images or remove the folder\n"))
    (root / "empty").rmdir()
    (tmp_path / "labels.txt").write_text("airplane\n")
    result = _run("convert", "imageset", "--from-folders", root, tmp_path / "db")
    assert (result.exit_code, result.stderr) == (1, (
        f"Error: {tmp_path / 'labels.txt'} lists other classes (1 lines, the folders of {root} "
        "make 3); convert into another directory, or remove it\n"))
    result = _run("convert", "imageset", "--from-folders", root, "list.txt", tmp_path / "db")
    assert (result.exit_code, result.stderr) == (
        1, "Error: give ROOT DB with --from-folders\n")
    result = _run("convert", "imageset", root, tmp_path / "db")
    assert (result.exit_code, result.stderr) == (
        1, "Error: give ROOT LISTFILE DB (or ROOT DB with --from-folders)\n")
    result = _run("convert", "imageset", "--from-folders", tmp_path / "none", tmp_path / "db")
    assert (result.exit_code, result.stderr) == (1, (
        f"Error: {tmp_path / 'none'}: not a folder; give the folder whose sub-folders are the "
        "classes (ROOT/cat/1.jpg, ROOT/dog/2.jpg)\n"))
