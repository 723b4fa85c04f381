"""Converters into Caffe's databases (LMDB or LevelDB), record for record and byte for byte
what Caffe's tools write: ``convert_mnist_data`` (IDX files), ``convert_imageset`` (an image
list, or a folder per class as torchvision's ImageFolder reads them: :func:`folder_list`) and
``convert_cifar_data`` (CIFAR-10 binary batches).

Each input is a :class:`RecordSource`: a count, the key of record ``i``, and the records from index
``start`` on. :func:`write_source` puts them through the backend's writer
(:func:`~caffe_py.io.db.db.open_writer`), so every converter shares the ``DB.partial`` rename and
``resume`` (continue after the last committed record, once its key is checked against the input's).
"""
from __future__ import annotations

import gzip
import logging
import os
import struct
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from ..errors import DataError
from ..io.db.db import open_writer
from ..io.db.image_list import ListEntry, read_image_list
from ..io.db.partial import PartialWriter, partial_path
from ..io.formats.datum import Datum, encode_datum, format_key
from ..io.formats.images import (
    ENCODE_TYPES,
    check_image_file,
    encode_image,
    extension_type,
    largest_image_pixels,
    load_image,
    resize_linear,
)

log = logging.getLogger(__name__)

MAX_KEY_BYTES = 511  # LMDB's default key size limit


class Progress(Protocol):
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


ProgressFactory = Callable[[int, str], Progress]  # (total, description) -> bar


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def no_progress(total: int, description: str) -> Progress:
    return _NoProgress()


def terminal_progress() -> ProgressFactory:
    """tqdm bars on stderr when it is a terminal; none when it is a file or a pipe, so logs
    hold only the summary lines."""
    if not sys.stderr.isatty():
        return no_progress
    from tqdm import tqdm

    def make(total: int, description: str) -> Progress:
        return tqdm(total=total, desc=description, unit="rec", unit_scale=True, leave=False,
                    file=sys.stderr, mininterval=0.3)

    return make


@dataclass
class ConvertResult:
    """One database written: how many records (this run and in all), bytes, seconds."""

    path: Path
    records: int  # records in the finished database
    written: int  # records this run wrote (records - resumed)
    bytes: int  # key + value bytes this run wrote
    seconds: float
    skipped: bool = False  # the database was already complete (CIFAR --resume)

    def line(self) -> str:
        """The summary line the commands print: the records the database holds, and, after a
        resume, how many of them this run wrote."""
        if self.skipped:
            return f"{self.path}: already complete ({self.records} records), skipped"
        resumed = self.records - self.written
        if not resumed:
            return f"{self.path}: {self.records} records, {self.bytes} bytes, " \
                f"{self.seconds:.1f} s"
        return (f"{self.path}: {self.records} records ({self.written} written now, "
                f"{self.bytes} bytes), {self.seconds:.1f} s (resumed after {resumed})")


Record = TypeVar("Record", covariant=True)


class RecordSource(Protocol[Record]):
    count: int
    inputs: list[Path]
    """The files the records come from (a resume checks it continues the same ones)."""

    def key(self, index: int) -> bytes: ...

    def records(self, start: int) -> Iterator[tuple[bytes, Record]]: ...


def write_source(source: RecordSource[Any], db: str | Path, *, resume: bool = False,
                 progress: ProgressFactory = no_progress, backend: str = "lmdb",
                 encode: Callable[[Any], bytes] = encode_datum) -> ConvertResult:
    """Write every record of ``source`` into ``db``, a ``backend`` database (through
    ``db.partial``), each as ``encode`` makes its bytes (a Datum's by default)."""
    began = time.perf_counter()
    writer = open_writer(db, backend, resume=resume)
    started = False   # past the resume checks, writing records
    try:
        writer.record_inputs(source.inputs)
        _check_resume_point(source, writer)
        started = True
        bar = progress(source.count, Path(db).name)
        bar.update(writer.resumed)
        try:
            for key, datum in source.records(writer.resumed):
                writer.put(key, encode(datum))
                bar.update(1)
        finally:
            bar.close()
    except DataError as exc:   # a bad input: say what was kept and how to go on from it
        kept = writer.abandon(discard_if_empty=True)
        if not (started and kept.records):
            raise
        partial = partial_path(db)
        n = kept.records
        raise DataError(f"{exc}; {partial} keeps the {n} record{'s' * (n != 1)} before it: "
                        "fix that input and run the same command with --resume to continue, "
                        f"or delete {partial} to start again") from None
    except BaseException:
        writer.abandon(discard_if_empty=True)  # nothing worth resuming: leave no trace
        raise
    summary = writer.finish()
    return ConvertResult(summary.path, summary.records, summary.written, summary.bytes,
                         time.perf_counter() - began)


def _check_resume_point(source: RecordSource[Any], writer: PartialWriter) -> None:
    done = writer.resumed
    if not done:
        return
    expected = source.key(done - 1) if done <= source.count else None
    if expected != writer.last_key:
        theirs = format_key(writer.last_key or b"")
        raise DataError(
            f"{writer.partial}: cannot resume: it ends with record {done} (key {theirs}) which "
            f"is not record {done} of this input"
            + (f" (key {format_key(expected)})" if expected else f" ({source.count} records)")
            + "; delete it and convert again")


# ---------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST): convert_mnist_data


IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 2051, 2049


def read_idx_bytes(path: Path) -> bytes:
    """A whole IDX file, gunzipped when it is gzip (by content, not by name)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not an IDX file") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"{path}: truncated or corrupt gzip file ({exc}); download it "
                        "again") from None


def _idx_header(path: Path, data: bytes, magic: int, dims: int, what: str) -> tuple[int, ...]:
    size = 4 * (1 + dims)
    found = struct.unpack(">I", data[:4])[0] if len(data) >= 4 else None
    if found is not None and found != magic:
        raise DataError(f"{path}: not an IDX {what} file (magic number {found}, expected "
                        f"{magic}); check the argument order: IMAGES LABELS DB")
    if len(data) < size:
        raise DataError(f"{path}: truncated IDX file ({len(data)} bytes, shorter than its "
                        f"{size}-byte header); download it again")
    return struct.unpack(f">{dims}I", data[4:size])   # unsigned, as Caffe's reader


INT32_MAX = 2**31 - 1


class IdxSource:
    """MNIST-format images and labels: keys ``%08d``, Datum (1, rows, cols), no encoded."""

    def __init__(self, images: str | Path, labels: str | Path, *, limit: int | None = None):
        images, labels = Path(images), Path(labels)
        self.inputs = [images, labels]
        image_bytes, label_bytes = read_idx_bytes(images), read_idx_bytes(labels)
        count, self.rows, self.cols = _idx_header(images, image_bytes, IDX_IMAGES_MAGIC, 3,
                                                  "images")
        (label_count,) = _idx_header(labels, label_bytes, IDX_LABELS_MAGIC, 1, "labels")
        if count != label_count:
            raise DataError(f"{images} holds {count} images but {labels} holds {label_count} "
                            "labels; pass the matching pair of files")
        if count == 0:
            raise DataError(f"{images}: its header says it holds no images; pass a file "
                            "with images")
        if not (1 <= self.rows <= INT32_MAX and 1 <= self.cols <= INT32_MAX):
            raise DataError(f"{images}: its header says each image is {self.rows} x "
                            f"{self.cols} pixels, which no image is (1 to {INT32_MAX} each); "
                            "the file is damaged, download it again")
        pixels = self.rows * self.cols
        _check_length(images, len(image_bytes), 16 + count * pixels,
                      f"{count} images of {self.rows}x{self.cols}")
        _check_length(labels, len(label_bytes), 8 + count, f"{count} labels")
        self.count = count if limit is None else min(count, limit)
        self._images = memoryview(image_bytes)[16:]
        self._labels = label_bytes[8:]

    def key(self, index: int) -> bytes:
        return b"%08d" % index

    def records(self, start: int) -> Iterator[tuple[bytes, Datum]]:
        pixels = self.rows * self.cols
        for i in range(start, self.count):
            data = bytes(self._images[i * pixels:(i + 1) * pixels])
            yield self.key(i), Datum(1, self.rows, self.cols, data, self._labels[i])


def _check_length(path: Path, actual: int, expected: int, holds: str) -> None:
    if actual < expected:
        raise DataError(f"{path}: truncated IDX file: its header says {holds} ({expected} "
                        f"bytes) but it has {actual} bytes; download it again")


def convert_idx(images: str | Path, labels: str | Path, db: str | Path, *, resume: bool = False,
                limit: int | None = None, progress: ProgressFactory = no_progress,
                backend: str = "lmdb") -> ConvertResult:
    """``cpy convert idx``: an IDX image file and its label file into one database."""
    return write_source(IdxSource(images, labels, limit=limit), db, resume=resume,
                        progress=progress, backend=backend)


# ---------------------------------------------------------------------------------------------
# Image lists: convert_imageset


@dataclass
class ImagesetOptions:
    """convert_imageset's flags."""

    gray: bool = False  # store 1 channel instead of 3 (BGR)
    shuffle: bool = False  # shuffle the list (deterministically, with seed)
    seed: int = 0  # the shuffle's seed
    resize_width: int = 0  # with resize_height: resize every image (OpenCV INTER_LINEAR)
    resize_height: int = 0
    check_size: bool = False  # every image must have the first image's shape
    encoded: bool = False  # store the image file (PNG/JPEG) instead of raw pixels
    encode_type: str = ""  # png | jpg: re-encode to this; empty: keep each file's own

    def check(self) -> None:
        check_image_options(self.resize_width, self.resize_height, self.encode_type)


def check_image_options(resize_width: int, resize_height: int, encode_type: str) -> None:
    """The flags convert_imageset and convert_annoset share: the resize pair and the format."""
    if (resize_width > 0) != (resize_height > 0):
        raise DataError("--resize-width and --resize-height go together: give both "
                        "(or neither)")
    if resize_width < 0 or resize_height < 0:
        raise DataError("--resize-width and --resize-height must be positive")
    if resize_width * resize_height > (most := largest_image_pixels()):
        raise DataError(f"--resize-width x --resize-height = {resize_width} x {resize_height} "
                        f"is over the {most / 1e6:.0f}-megapixel limit of an image; resize "
                        "smaller")
    if encode_type and encode_type not in ENCODE_TYPES:
        raise DataError(f"--encode-type {encode_type!r} is not one of "
                        f"{', '.join(ENCODE_TYPES)}")


Entry = TypeVar("Entry")


def list_in_order(entries: list[Entry], name: Callable[[Entry], str], line: Callable[[Entry], int],
                  listfile: Path, shuffle: bool, seed: int) -> list[Entry]:
    """A list file's entries in writing order (shuffled with ``seed`` when ``shuffle``), each
    key ``%08d_<name>`` (:func:`list_key`) checked against LMDB's key size first."""
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(entries))
        entries = [entries[i] for i in order]
    for index, entry in enumerate(entries):
        if len(list_key(index, name(entry))) > MAX_KEY_BYTES:
            raise DataError(f"{listfile}:{line(entry)}: the key for {name(entry)!r} is longer "
                            f"than LMDB's {MAX_KEY_BYTES} bytes; shorten the path")
    return entries


def list_key(index: int, name: str) -> bytes:
    """Caffe's key of a list's record: ``%08d_<name>`` (convert_imageset, convert_annoset)."""
    return f"{index:08d}_{name}".encode()


class ImagesetSource:
    """Images named by a list file: keys ``%08d_<path>``; raw BGR Datums with encoded=false,
    or encoded Datums holding the file (or its re-encoding)."""

    def __init__(self, root: str | Path, listfile: str | Path, options: ImagesetOptions):
        options.check()
        self.root, self.listfile, self.options = Path(root), Path(listfile), options
        self.inputs = [self.listfile]
        self.entries = list_in_order(read_image_list(listfile), lambda e: e.path,
                                     lambda e: e.line, self.listfile, options.shuffle,
                                     options.seed)
        self.count = len(self.entries)

    def key(self, index: int) -> bytes:
        return list_key(index, self.entries[index].path)

    def records(self, start: int) -> Iterator[tuple[bytes, Datum]]:
        reference = None
        if start and self.options.check_size:  # resuming: the first image sets the size
            reference = self._pixels(self.entries[0])[1].shape
        shapes: dict[tuple[int, ...], ListEntry] = {}
        for index in range(start, self.count):
            entry = self.entries[index]
            datum, array = self._pixels(entry)
            if len(shapes) < 2:
                shapes.setdefault(array.shape, entry)
                if len(shapes) == 2:
                    self._several_shapes(shapes)
            if self.options.check_size:
                if reference is None:
                    reference = array.shape
                elif array.shape != reference:
                    raise DataError(
                        f"{self.listfile}:{entry.line}: {entry.path} is "
                        f"{_shape_text(array.shape)} but the first image is "
                        f"{_shape_text(reference)}; resize with --resize-width/--resize-height "
                        "or drop --check-size")
            yield self.key(index), datum

    def _several_shapes(self, shapes: dict[tuple[int, ...], ListEntry]) -> None:
        """Caffe writes such a database; a Data layer then fails on the first odd record."""
        if self.options.check_size:
            return  # the check stops the conversion instead
        (a, first), (b, other) = shapes.items()
        log.warning(f"Warning: {self.listfile}:{other.line}: {other.path} is {_shape_text(b)} "
                    f"but {first.path} is {_shape_text(a)}; the records have several shapes, "
                    "which a Data layer cannot batch: resize with --resize-width/"
                    "--resize-height (or crop every record with transform_param.crop_size)")

    def _pixels(self, entry: ListEntry) -> tuple[Datum, np.ndarray]:
        """The record for one list entry, and its pixels (C, H, W) for the size check."""
        opts = self.options
        file = self.root / entry.path
        try:
            check_image_file(file)
            array = load_image(file, color=not opts.gray)
        except DataError as exc:
            raise DataError(f"{self.listfile}:{entry.line}: {exc}") from None
        resized = opts.resize_height > 0
        if resized:
            array = resize_linear(array, opts.resize_height, opts.resize_width)
        if not opts.encoded:
            c, h, w = array.shape
            return Datum(c, h, w, array.tobytes(), entry.label, encoded=False), array
        wanted = opts.encode_type or extension_type(entry.path)
        if not resized and extension_type(entry.path) == wanted:
            data = file.read_bytes()  # Caffe's ReadFileToDatum: the file as it is
        else:
            data = encode_image(array, wanted if wanted in ENCODE_TYPES else "png")
        return Datum(data=data, label=entry.label, encoded=True), array


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in shape)


def convert_imageset(root: str | Path, listfile: str | Path, db: str | Path,
                     options: ImagesetOptions | None = None, *, resume: bool = False,
                     progress: ProgressFactory = no_progress,
                     backend: str = "lmdb") -> ConvertResult:
    """``cpy convert imageset``: the images a list file names, under ``root``."""
    source = ImagesetSource(root, listfile, options or ImagesetOptions())
    return write_source(source, db, resume=resume, progress=progress, backend=backend)


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""The files a class folder's walk takes: torchvision's IMG_EXTENSIONS (any case)."""


@dataclass
class FolderList:
    """What :func:`folder_list` wrote: the class names (label k is ``classes[k]``), the
    ``labels.txt`` beside the database and the list file of ``path label`` lines."""

    classes: list[str]
    images: int
    labels_file: Path
    list_file: Path

    def line(self) -> str:
        return (f"{self.list_file}: {self.images} images of {len(self.classes)} classes "
                f"(labels 0..{len(self.classes) - 1} in {self.labels_file})")


def folder_entries(root: str | Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision ImageFolder's rule: the sorted sub-folders of ``root`` are the classes,
    labels 0..K-1; each class's images are the files with an image extension anywhere under
    its folder (links followed), walked in sorted order. Returns (classes, [(path relative to
    root, label)])."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder; give the folder whose sub-folders are the classes "
                        "(ROOT/cat/1.jpg, ROOT/dog/2.jpg)")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise DataError(f"{root}: no class folders; put each class's images in a sub-folder "
                        "(ROOT/cat/1.jpg, ROOT/dog/2.jpg)")
    entries: list[tuple[str, int]] = []
    empty = []
    for label, name in enumerate(classes):
        before = len(entries)
        for directory, _, files in sorted(os.walk(root / name, followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith(IMAGE_EXTENSIONS):
                    path = (Path(directory) / file).relative_to(root).as_posix()
                    if "\n" in path or "\r" in path:
                        raise DataError(f"{root / path!r}: a file name with a line break "
                                        "cannot go into a list file; rename it")
                    entries.append((path, label))
        if len(entries) == before:
            empty.append(name)
    if empty:
        raise DataError(f"{root}: no image in the class folder(s) {', '.join(empty)} (image "
                        f"files end in {', '.join(IMAGE_EXTENSIONS)}); add images or remove "
                        "the folder")
    return classes, entries


def folder_list(root: str | Path, db: str | Path) -> FolderList:
    """The list file ``<DB>_list.txt`` (``path label`` lines, paths relative to ``root``: an
    ImageData layer reads it with ``root_folder: ROOT/``) and ``labels.txt`` (class k's
    folder name on line k) beside the database ``db``, from the class folders of ``root``
    (:func:`folder_entries`). A ``labels.txt`` already there that names other classes (another
    dataset's) is refused, not replaced."""
    classes, entries = folder_entries(root)
    db = Path(db)
    labels_file = db.parent / "labels.txt"
    list_file = db.parent / f"{db.name}_list.txt"
    text = "".join(f"{name}\n" for name in classes)
    if labels_file.is_file():
        found = labels_file.read_text(encoding="utf-8", errors="replace")
        if found != text:
            raise DataError(f"{labels_file} lists other classes ({len(found.splitlines())} "
                            f"lines, the folders of {root} make {len(classes)}); convert into "
                            "another directory, or remove it")
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        list_file.write_text("".join(f"{path} {label}\n" for path, label in entries),
                             encoding="utf-8")
        labels_file.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot write {list_file} ({(exc.strerror or str(exc)).lower()}); "
                        "check the directory is writable") from None
    return FolderList(classes, len(entries), labels_file, list_file)


# ---------------------------------------------------------------------------------------------
# CIFAR-10 binary batches: convert_cifar_data

CIFAR_SIZE = 32
CIFAR_IMAGE_BYTES = 3 * CIFAR_SIZE * CIFAR_SIZE
CIFAR_RECORD_BYTES = 1 + CIFAR_IMAGE_BYTES  # label byte, then R, G, B planes
CIFAR_BATCH = 10000
CIFAR_CLASSES = 10
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILES = ("test_batch.bin",)


class CifarSource:
    """CIFAR-10 binary batch files: keys ``%05d`` of ``file_index * 10000 + item`` as Caffe's
    converter numbers them; Datum (3, 32, 32) in the file's RGB order, no encoded."""

    def __init__(self, files: list[Path]):
        self.files = self.inputs = files
        self.batches: list[bytes] = []
        for file in files:
            try:
                data = file.read_bytes()
            except FileNotFoundError:
                raise DataError(f"{file}: CIFAR-10 batch not found; download the binary "
                                "version (cifar-10-binary.tar.gz) and extract it") from None
            if not data or len(data) % CIFAR_RECORD_BYTES:
                raise DataError(f"{file}: {len(data)} bytes is not a whole number of "
                                f"{CIFAR_RECORD_BYTES}-byte CIFAR-10 records; download it "
                                "again")
            if len(data) // CIFAR_RECORD_BYTES > CIFAR_BATCH:
                raise DataError(f"{file}: holds more than {CIFAR_BATCH} records; not a "
                                "CIFAR-10 batch file")
            labels = data[::CIFAR_RECORD_BYTES]   # each record's first byte
            bad = next((i for i, label in enumerate(labels) if label >= CIFAR_CLASSES), None)
            if bad is not None:
                raise DataError(f"{file}: record {bad} has the label {labels[bad]}, past "
                                f"CIFAR-10's {CIFAR_CLASSES} classes; not a CIFAR-10 batch "
                                "(CIFAR-100's binary has two label bytes): download the "
                                "CIFAR-10 binary version again")
            self.batches.append(data)
        self._index = [(b, i) for b, data in enumerate(self.batches)
                       for i in range(len(data) // CIFAR_RECORD_BYTES)]
        self.count = len(self._index)

    def key(self, index: int) -> bytes:
        batch, item = self._index[index]
        return b"%05d" % (batch * CIFAR_BATCH + item)

    def records(self, start: int) -> Iterator[tuple[bytes, Datum]]:
        for index in range(start, self.count):
            batch, item = self._index[index]
            offset = item * CIFAR_RECORD_BYTES
            record = self.batches[batch][offset:offset + CIFAR_RECORD_BYTES]
            yield self.key(index), Datum(3, CIFAR_SIZE, CIFAR_SIZE, record[1:], record[0])


def convert_cifar(directory: str | Path, db_prefix: str | Path, *, resume: bool = False,
                  progress: ProgressFactory = no_progress,
                  backend: str = "lmdb") -> list[ConvertResult]:
    """``cpy convert cifar``: ``DB_PREFIX_train_<backend>`` from data_batch_1..5.bin and
    ``DB_PREFIX_test_<backend>`` from test_batch.bin (``_lmdb`` / ``_leveldb``, as Caffe's
    converter names them). With ``resume`` a finished one is skipped."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: not a directory; pass the folder holding "
                        "data_batch_1.bin .. data_batch_5.bin and test_batch.bin")
    results = []
    for split, names in (("train", CIFAR_TRAIN_FILES), ("test", CIFAR_TEST_FILES)):
        db = Path(f"{db_prefix}_{split}_{backend.lower()}")
        source = CifarSource([directory / name for name in names])
        if resume and db.exists() and not partial_path(db).exists():
            results.append(ConvertResult(db, source.count, 0, 0, 0.0, skipped=True))
            continue
        results.append(write_source(source, db, resume=resume, progress=progress,
                                    backend=backend))
    return results
