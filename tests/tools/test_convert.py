"""Converters: records read back byte for byte, Caffe's keys and layouts, bad input, resume."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from synthetic import random_idx, write_cifar_batch, write_idx, write_png

from caffe_py.errors import DataError
from caffe_py.io.db.lmdb_store import open_db, partial_path
from caffe_py.io.formats.datum import (
    Datum,
    datum_to_array,
    decode_datum,
    decode_image,
    encode_datum,
)
from caffe_py.tools.convert import (
    ImagesetOptions,
    convert_cifar,
    convert_idx,
    convert_imageset,
    read_image_list,
)

FASHION = Path("/usr/share/datasets/fashion-mnist")


def _read_all(db: Path) -> list[tuple[bytes, bytes]]:
    with open_db(db) as reader:
        return list(reader)


# ------------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    images_path, labels_path, images, labels = random_idx(tmp_path, 5, gz=gz)
    result = convert_idx(images_path, labels_path, tmp_path / "db")
    assert (result.records, result.written) == (5, 5)
    assert result.bytes == 5 * (8 + 2 + 2 + 2 + 2 + 12 + 2)  # key, then the fields
    records = _read_all(tmp_path / "db")
    assert [k for k, _ in records] == [b"%08d" % i for i in range(5)]
    for (_, value), image, label in zip(records, images, labels, strict=True):
        # channels 1, height 3, width 4, data (12 bytes), label: Caffe's convert_mnist_data.
        assert value == (b"\x08\x01\x10\x03\x18\x04\x22\x0c" + image.tobytes()
                         + b"\x28" + bytes([label]))
    assert result.line().startswith(f"{tmp_path}/db: 5 records, 150 bytes, ")


def test_idx_limit_takes_the_first_records(tmp_path):
    images_path, labels_path, images, _ = random_idx(tmp_path, 5)
    convert_idx(images_path, labels_path, tmp_path / "db", limit=2)
    records = _read_all(tmp_path / "db")
    assert len(records) == 2
    assert decode_datum(records[1][1]).data == images[1].tobytes()


def test_idx_arguments_swapped(tmp_path):
    images_path, labels_path, *_ = random_idx(tmp_path, 3)
    with pytest.raises(DataError) as info:
        convert_idx(labels_path, images_path, tmp_path / "db")
    assert str(info.value) == (f"{labels_path}: not an IDX images file (magic number 2049, "
                               "expected 2051); check the argument order: IMAGES LABELS DB")
    assert not (tmp_path / "db").exists() and not partial_path(tmp_path / "db").exists()


def test_idx_counts_must_match(tmp_path):
    rng = np.random.default_rng(1)
    images_path, _ = write_idx(tmp_path, rng.integers(0, 256, (4, 2, 2)), np.zeros(4))
    other = tmp_path / "other"
    other.mkdir()
    _, labels_path = write_idx(other, rng.integers(0, 256, (3, 2, 2)), np.zeros(3))
    with pytest.raises(DataError) as info:
        convert_idx(images_path, labels_path, tmp_path / "db")
    assert str(info.value) == (f"{images_path} holds 4 images but {labels_path} holds 3 "
                               "labels; pass the matching pair of files")


def test_idx_truncated_file(tmp_path):
    images_path, labels_path, *_ = random_idx(tmp_path, 5, gz=False)
    images_path.write_bytes(images_path.read_bytes()[:40])
    with pytest.raises(DataError) as info:
        convert_idx(images_path, labels_path, tmp_path / "db")
    assert str(info.value) == (f"{images_path}: truncated IDX file: its header says 5 images "
                               "of 3x4 (76 bytes) but it has 40 bytes; download it again")
    images_path.write_bytes(images_path.read_bytes()[:10])
    with pytest.raises(DataError, match=r"truncated IDX file \(10 bytes, shorter than its "
                                        r"16-byte header\)"):
        convert_idx(images_path, labels_path, tmp_path / "db")


@pytest.mark.parametrize("count,rows,cols,want", [
    (3, 0xFFFFFFFF, 0xFFFFFFFF, "{i}: its header says each image is 4294967295 x 4294967295 "
                                "pixels, which no image is (1 to 2147483647 each); the file is "
                                "damaged, download it again"),
    (3, 0, 5, "{i}: its header says each image is 0 x 5 pixels, which no image is (1 to "
              "2147483647 each); the file is damaged, download it again"),
    (0, 2, 2, "{i}: its header says it holds no images; pass a file with images"),
    (0xFFFFFFFF, 2, 2, "{i}: truncated IDX file: its header says 4294967295 images of 2x2 "
                       "(17179869196 bytes) but it has 28 bytes; download it again"),
])
def test_an_idx_header_is_read_unsigned_and_checked(tmp_path, count, rows, cols, want):
    """Caffe reads the header's numbers unsigned: 0xFFFFFFFF rows is not -1 (which made
    records of -1 x -1 pixels that every later reader failed on)."""
    import struct

    images, labels = tmp_path / "i", tmp_path / "l"
    images.write_bytes(struct.pack(">IIII", 2051, count, rows, cols) + bytes(12))
    labels.write_bytes(struct.pack(">II", 2049, count) + bytes(3))
    with pytest.raises(DataError) as info:
        convert_idx(images, labels, tmp_path / "db")
    assert str(info.value) == want.format(i=images)
    assert not (tmp_path / "db").exists()


def test_idx_truncated_gzip(tmp_path):
    images_path, labels_path, *_ = random_idx(tmp_path, 50)
    images_path.write_bytes(images_path.read_bytes()[:-30])
    with pytest.raises(DataError, match=r"images-idx3-ubyte.gz: truncated or corrupt gzip file"):
        convert_idx(images_path, labels_path, tmp_path / "db")


def test_idx_missing_file(tmp_path):
    with pytest.raises(DataError) as info:
        convert_idx(tmp_path / "nope.gz", tmp_path / "labels.gz", tmp_path / "db")
    assert str(info.value) == f"{tmp_path}/nope.gz: file not found"


class _StopAfter:
    """A progress bar that interrupts the conversion after ``n`` records (a Ctrl-C)."""

    def __init__(self, n: int):
        self.n, self.seen = n, 0

    def __call__(self, total: int, description: str):
        return self

    def update(self, n: int) -> None:
        self.seen += n
        if self.seen >= self.n:
            raise KeyboardInterrupt

    def close(self) -> None:
        pass


def test_interrupted_conversion_resumes_to_the_same_bytes(tmp_path):
    images_path, labels_path, *_ = random_idx(tmp_path, 2500, rows=2, cols=2)
    fresh = tmp_path / "fresh"
    convert_idx(images_path, labels_path, fresh)
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        convert_idx(images_path, labels_path, db, progress=_StopAfter(2100))
    assert not db.exists()
    with open_db(partial_path(db)) as reader:
        # Two batches of 1000 committed as they filled, the last 100 on the way out.
        assert len(reader) == 2100
    with pytest.raises(DataError, match=r"db.partial is left from an interrupted conversion"):
        convert_idx(images_path, labels_path, db)
    result = convert_idx(images_path, labels_path, db, resume=True)
    assert (result.records, result.written) == (2500, 400)
    assert result.line().endswith("(resumed after 2100)")
    assert _read_all(db) == _read_all(fresh)


def test_resume_refuses_a_partial_from_other_input(tmp_path):
    images_path, labels_path, *_ = random_idx(tmp_path, 2500, rows=2, cols=2)
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        convert_idx(images_path, labels_path, db, progress=_StopAfter(1500))
    with pytest.raises(DataError) as info:
        convert_idx(images_path, labels_path, db, resume=True, limit=500)
    assert str(info.value) == (f"{db}.partial: cannot resume: it ends with record 1500 (key "
                               "'00001499') which is not record 1500 of this input (500 "
                               "records); delete it and convert again")


@pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(),
                    reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist_first_records(tmp_path):
    result = convert_idx(FASHION / "t10k-images-idx3-ubyte.gz",
                         FASHION / "t10k-labels-idx1-ubyte.gz", tmp_path / "db", limit=200)
    assert result.records == 200
    raw = gzip.decompress((FASHION / "t10k-images-idx3-ubyte.gz").read_bytes())
    labels = gzip.decompress((FASHION / "t10k-labels-idx1-ubyte.gz").read_bytes())
    records = _read_all(tmp_path / "db")
    for i in (0, 1, 199):
        datum = decode_datum(records[i][1])
        assert (datum.channels, datum.height, datum.width) == (1, 28, 28)
        assert datum.data == raw[16 + 784 * i:16 + 784 * (i + 1)]
        assert datum.label == labels[8 + i]
    assert labels[8] == 9  # the first test image is an ankle boot


# -------------------------------------------------------------------------------- imageset


@pytest.fixture
def imageset(tmp_path):
    """Three 4x5 colour PNGs (one in a folder with a space), one 4x5 gray PNG, a list."""
    rng = np.random.default_rng(3)
    root = tmp_path / "images"
    arrays = {
        "a.png": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
        "sub dir/b.png": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
        "c.png": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
        "g.png": rng.integers(0, 256, (4, 5), dtype=np.uint8),
    }
    for name, array in arrays.items():
        write_png(root / name, array)
    listfile = tmp_path / "list.txt"
    listfile.write_text("a.png 0\nsub dir/b.png 1\n\nc.png 2\ng.png 3\n")
    return root, listfile, arrays


def test_image_list_splits_at_the_last_space(imageset):
    _, listfile, _ = imageset
    entries = read_image_list(listfile)
    assert [(e.path, e.label, e.line) for e in entries] == [
        ("a.png", 0, 1), ("sub dir/b.png", 1, 2), ("c.png", 2, 4), ("g.png", 3, 5)]


def test_imageset_raw_is_bgr_with_encoded_false(imageset, tmp_path):
    root, listfile, arrays = imageset
    result = convert_imageset(root, listfile, tmp_path / "db")
    assert result.records == 4
    records = _read_all(tmp_path / "db")
    assert [k for k, _ in records] == [b"00000000_a.png", b"00000001_sub dir/b.png",
                                       b"00000002_c.png", b"00000003_g.png"]
    bgr = arrays["sub dir/b.png"][..., ::-1].transpose(2, 0, 1)
    expected = Datum(3, 4, 5, bgr.tobytes(), 1, encoded=False)
    assert records[1][1] == encode_datum(expected)
    gray_as_colour = datum_to_array(decode_datum(records[3][1]))
    assert gray_as_colour.shape == (3, 4, 5)
    np.testing.assert_array_equal(gray_as_colour[1], arrays["g.png"])


def test_imageset_gray(imageset, tmp_path):
    root, listfile, arrays = imageset
    convert_imageset(root, listfile, tmp_path / "db", ImagesetOptions(gray=True))
    datum = decode_datum(_read_all(tmp_path / "db")[3][1])
    assert (datum.channels, datum.data) == (1, arrays["g.png"].tobytes())
    rgb = arrays["a.png"].astype(np.float64)
    expected = np.rint(rgb @ [0.299, 0.587, 0.114])
    a = datum_to_array(decode_datum(_read_all(tmp_path / "db")[0][1]))[0]
    assert np.abs(a - expected).max() <= 1


def test_imageset_resize_and_check_size(imageset, tmp_path):
    root, listfile, _ = imageset
    options = ImagesetOptions(resize_width=3, resize_height=2, check_size=True)
    convert_imageset(root, listfile, tmp_path / "db", options)
    for _, value in _read_all(tmp_path / "db"):
        datum = decode_datum(value)
        assert (datum.channels, datum.height, datum.width) == (3, 2, 3)


def kept(db, n):
    """What a conversion's bad-input error adds once records were written before it."""
    partial = f"{db}.partial"
    return (f"; {partial} keeps the {n} record{'s' * (n != 1)} before it: fix that input and "
            f"run the same command with --resume to continue, or delete {partial} to start "
            "again")


def test_check_size_names_the_odd_image(imageset, tmp_path):
    root, listfile, _ = imageset
    write_png(root / "c.png", np.zeros((6, 5, 3), dtype=np.uint8))
    with pytest.raises(DataError) as info:
        convert_imageset(root, listfile, tmp_path / "db", ImagesetOptions(check_size=True))
    assert str(info.value) == (f"{listfile}:4: c.png is 3x6x5 but the first image is 3x4x5; "
                               "resize with --resize-width/--resize-height or drop --check-size"
                               + kept(tmp_path / "db", 2))


def test_shuffle_is_deterministic_with_the_seed(imageset, tmp_path):
    root, listfile, _ = imageset
    keys = []
    for run, seed in enumerate((7, 7, 8)):
        db = tmp_path / f"db{run}"
        convert_imageset(root, listfile, db, ImagesetOptions(shuffle=True, seed=seed))
        keys.append([k for k, _ in _read_all(db)])
    assert keys[0] == keys[1] and keys[0] != keys[2]
    names = sorted(k[9:] for k in keys[0])
    assert names == [b"a.png", b"c.png", b"g.png", b"sub dir/b.png"]
    assert [k[:9] for k in keys[0]] == [b"%08d_" % i for i in range(4)]


def test_encoded_stores_the_file(imageset, tmp_path):
    root, listfile, arrays = imageset
    convert_imageset(root, listfile, tmp_path / "db", ImagesetOptions(encoded=True))
    records = _read_all(tmp_path / "db")
    datum = decode_datum(records[0][1])
    assert datum == Datum(data=(root / "a.png").read_bytes(), label=0, encoded=True)
    # 04: data, 05: label, 07: encoded=true; no channels/height/width.
    assert records[0][1][:1] == b"\x22" and records[0][1][-2:] == b"\x38\x01"
    np.testing.assert_array_equal(datum_to_array(datum),
                                  arrays["a.png"][..., ::-1].transpose(2, 0, 1))


def test_encoded_reencodes_when_resizing_or_changing_type(imageset, tmp_path):
    root, listfile, _ = imageset
    options = ImagesetOptions(encoded=True, encode_type="jpg")
    convert_imageset(root, listfile, tmp_path / "jpg", options)
    data = decode_datum(_read_all(tmp_path / "jpg")[0][1]).data
    assert data[:2] == b"\xff\xd8" and decode_image(data).shape == (3, 4, 5)
    options = ImagesetOptions(encoded=True, resize_width=2, resize_height=3)
    convert_imageset(root, listfile, tmp_path / "small", options)
    data = decode_datum(_read_all(tmp_path / "small")[1][1]).data
    assert data[:4] == b"\x89PNG" and decode_image(data).shape == (3, 3, 2)


@pytest.mark.parametrize("second,problem", [
    ("b.png", "'b.png' has no label"),
    ("a.png x", "label 'x' is not a decimal integer"),
    # int() would take these; Caffe's atoi reads 1 of '1_000' and 0 of the Arabic-Indic 3
    ("a.png 1_000", "label '1_000' is not a decimal integer"),
    ("a.png \u0663", "label '\u0663' is not a decimal integer"),
    ("a.png 0x10", "label '0x10' is not a decimal integer"),
    ("a.png 1e3", "label '1e3' is not a decimal integer"),
    ("a.png 1 ", "the line ends with a space (the label is what follows the last space)"),
])
def test_a_list_line_without_a_decimal_label(imageset, tmp_path, second, problem):
    root, listfile, _ = imageset
    listfile.write_text(f"a.png 0\n{second}\n")
    with pytest.raises(DataError) as info:
        convert_imageset(root, listfile, tmp_path / "db")
    assert str(info.value) == f"{listfile}:2: {problem}; each line is 'path label'"


def test_a_list_label_past_int32(imageset, tmp_path):
    root, listfile, _ = imageset
    listfile.write_text("a.png 2147483647\nb.png 2147483648\n")
    with pytest.raises(DataError) as info:
        convert_imageset(root, listfile, tmp_path / "db")
    assert str(info.value) == (f"{listfile}:2: label 2147483648 does not fit a Datum's 32-bit "
                               "label; use labels from -2147483648 to 2147483647")


def test_a_fifo_listed_as_an_image_is_refused_instead_of_waited_on(imageset, tmp_path):
    import os

    from caffe_py.tools.annoset import write_image_sizes

    root, listfile, _ = imageset
    os.mkfifo(root / "pipe.png")
    listfile.write_text("a.png 0\npipe.png 1\n")
    want = f"{listfile}:2: {root}/pipe.png: not a regular file (a FIFO); list image files only"
    with pytest.raises(DataError) as info:
        convert_imageset(root, listfile, tmp_path / "db")
    assert str(info.value) == want + kept(tmp_path / "db", 1)
    with pytest.raises(DataError) as info:
        write_image_sizes(root, listfile, tmp_path / "sizes.txt")
    assert str(info.value) == want


def test_missing_image_is_named(imageset, tmp_path):
    root, listfile, _ = imageset
    listfile.write_text("a.png 0\nmissing.png 1\n")
    with pytest.raises(DataError) as info:
        convert_imageset(root, listfile, tmp_path / "db")
    assert str(info.value) == (f"{listfile}:2: {root}/missing.png: image not found"
                               + kept(tmp_path / "db", 1))
    # a.png was written: once the image is there, the conversion resumes after it.
    write_png(root / "missing.png", np.zeros((2, 2, 3), dtype=np.uint8))
    result = convert_imageset(root, listfile, tmp_path / "db", resume=True)
    assert (result.records, result.written) == (2, 1)


def test_failure_before_any_record_leaves_nothing(imageset, tmp_path):
    root, listfile, _ = imageset
    listfile.write_text("missing.png 1\na.png 0\n")
    with pytest.raises(DataError, match="missing.png: image not found"):
        convert_imageset(root, listfile, tmp_path / "db")
    assert not partial_path(tmp_path / "db").exists() and not (tmp_path / "db").exists()


def test_resize_flags_go_together(imageset, tmp_path):
    root, listfile, _ = imageset
    with pytest.raises(DataError) as info:
        convert_imageset(root, listfile, tmp_path / "db", ImagesetOptions(resize_width=3))
    assert str(info.value) == ("--resize-width and --resize-height go together: give both "
                               "(or neither)")
    # OpenCV's allocation error (or minutes of work) before: now the limit of a decoded image
    with pytest.raises(DataError) as info:
        convert_imageset(root, listfile, tmp_path / "db",
                         ImagesetOptions(resize_width=100_000, resize_height=100_000))
    assert str(info.value) == ("--resize-width x --resize-height = 100000 x 100000 is over the "
                               "179-megapixel limit of an image; resize smaller")
    assert not (tmp_path / "db").exists()


# ----------------------------------------------------------------------------------- CIFAR


def _cifar_dir(tmp_path: Path, per_batch: int = 3):
    rng = np.random.default_rng(5)
    folder = tmp_path / "cifar"
    folder.mkdir()
    batches = {}
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        images = rng.integers(0, 256, (per_batch, 3, 32, 32), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch, dtype=np.uint8)
        write_cifar_batch(folder / name, images, labels)
        batches[name] = (images, labels)
    return folder, batches


def test_cifar_round_trip(tmp_path):
    folder, batches = _cifar_dir(tmp_path)
    train, test = convert_cifar(folder, tmp_path / "cifar10")
    assert (train.path.name, train.records) == ("cifar10_train_lmdb", 15)
    assert (test.path.name, test.records) == ("cifar10_test_lmdb", 3)
    records = _read_all(train.path)
    # Caffe numbers each batch from file_index * 10000.
    assert [k for k, _ in records[:4]] == [b"00000", b"00001", b"00002", b"10000"]
    images, labels = batches["data_batch_2.bin"]
    assert records[4][1] == encode_datum(Datum(3, 32, 32, images[1].tobytes(), int(labels[1])))
    images, labels = batches["test_batch.bin"]
    test_records = _read_all(test.path)
    assert [k for k, _ in test_records] == [b"00000", b"00001", b"00002"]
    assert decode_datum(test_records[2][1]).data == images[2].tobytes()  # RGB planes


def test_cifar_resume_skips_a_finished_database(tmp_path):
    folder, _ = _cifar_dir(tmp_path)
    train, _ = convert_cifar(folder, tmp_path / "c")
    import shutil
    shutil.rmtree(tmp_path / "c_test_lmdb")
    again = convert_cifar(folder, tmp_path / "c", resume=True)
    assert again[0].line() == f"{train.path}: already complete (15 records), skipped"
    assert again[1].records == 3


def test_cifar_bad_batches(tmp_path):
    folder, _ = _cifar_dir(tmp_path)
    (folder / "data_batch_3.bin").write_bytes(b"\x00" * 3074)
    with pytest.raises(DataError) as info:
        convert_cifar(folder, tmp_path / "c")
    assert str(info.value) == (f"{folder}/data_batch_3.bin: 3074 bytes is not a whole number "
                               "of 3073-byte CIFAR-10 records; download it again")
    (folder / "data_batch_3.bin").unlink()
    with pytest.raises(DataError) as info:
        convert_cifar(folder, tmp_path / "c")
    assert str(info.value) == (f"{folder}/data_batch_3.bin: CIFAR-10 batch not found; download "
                               "the binary version (cifar-10-binary.tar.gz) and extract it")
    # a label byte past the 10 classes (CIFAR-100's binary, say) was stored as it was
    write_cifar_batch(folder / "data_batch_3.bin", np.zeros((3, 3, 32, 32), np.uint8),
                      np.array([1, 200, 2]))
    with pytest.raises(DataError) as info:
        convert_cifar(folder, tmp_path / "c")
    assert str(info.value) == (f"{folder}/data_batch_3.bin: record 1 has the label 200, past "
                               "CIFAR-10's 10 classes; not a CIFAR-10 batch (CIFAR-100's binary "
                               "has two label bytes): download the CIFAR-10 binary version "
                               "again")
