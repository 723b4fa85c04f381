"""ImageData's source as a database: the lines of a list file (``path label``), in list order or
in Caffe's shuffled order, and the decoder that reads their image files.

Caffe's ImageDataLayer shuffles the list once at setup and again after every pass, in place,
with ``caffe::shuffle`` on an mt19937 seeded by one ``caffe_rng_rand()`` draw
(:mod:`.caffe_rng`). Pass ``e`` is therefore the list after ``e + 1`` shuffles: a cursor that
seeks into pass ``e`` replays them (a resume far into a run costs one shuffle per pass).

Paths: with ``root_folder`` a line's path is relative to it; without, relative to the list
file's folder, or (when the first image is not there but is in the current directory: Caffe
reads relative paths from where it runs) to the current directory.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import DataError
from ..formats.images import load_image, resize_linear
from .caffe_rng import Mt19937, caffe_shuffle
from .db import PartialChunk


@dataclass
class ListEntry:
    path: str
    label: int
    line: int  # 1-based line in the list file, for messages


DECIMAL = re.compile(r"[+-]?[0-9]+")
"""A list label: ASCII decimal digits with an optional sign (what Caffe's atoi reads whole)."""
LABEL_MIN, LABEL_MAX = -(2 ** 31), 2 ** 31 - 1
"""A Datum's label is an int32 (Caffe reads list labels with atoi)."""


def read_list_text(listfile: Path) -> str:
    """A list file's text: a missing file, or one that is not UTF-8, is one line."""
    try:
        return listfile.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{listfile}: list file not found") from None
    except IsADirectoryError:
        raise DataError(f"{listfile}: is a directory; the source names a list file, one "
                        "'path label' line per image") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{listfile}: not UTF-8 text ({exc.reason} at byte {exc.start})") \
            from None


def last_space_lines(listfile: Path, *, form: str, missing: str,
                     strip: bool = False) -> Iterator[tuple[int, str, str]]:
    """The non-blank lines of a list file as (line number, what comes before the last space,
    what comes after it): paths may hold spaces. ``strip`` trims the line first (SSD's annoset
    tools), else the line is split as it stands (Caffe's ImageData, ``find_last_of(' ')``). A
    line with nothing before its last space is one line saying it ``missing`` (e.g. "has no
    label"), an empty list one line too, both with the lines' ``form`` ('path label')."""
    text = read_list_text(listfile)
    count = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        head, space, last = (line.strip() if strip else line).rpartition(" ")
        if not space or not head:
            raise DataError(f"{listfile}:{number}: {line.strip()!r} {missing}; each line is "
                            f"'{form}'")
        count += 1
        yield number, head, last
    if not count:
        raise DataError(f"{listfile}: the list is empty; each line is '{form}'")


def read_image_list(listfile: str | Path) -> list[ListEntry]:
    """Lines ``path label``, split at the last space (paths may hold spaces); blank lines are
    skipped."""
    listfile = Path(listfile)
    entries = []
    for number, path, label in last_space_lines(listfile, form="path label",
                                                missing="has no label"):
        if not DECIMAL.fullmatch(label):   # int() also takes '1_000' and other digits
            why = "the line ends with a space (the label is what follows the last space)" \
                if not label else f"label {label!r} is not a decimal integer"
            raise DataError(f"{listfile}:{number}: {why}; each line is 'path label'")
        value = int(label)
        if not LABEL_MIN <= value <= LABEL_MAX:
            raise DataError(f"{listfile}:{number}: label {label} does not fit a Datum's 32-bit "
                            f"label; use labels from {LABEL_MIN} to {LABEL_MAX}")
        entries.append(ListEntry(path, value, number))
    return entries


class ImageListDatabase:
    """The entries of an image list file: ``len()``, ``cursor()``; shuffled as Caffe shuffles
    when ``shuffle_seed`` is given (the seed of ImageData's prefetch_rng)."""

    def __init__(self, listfile: str | os.PathLike, *, root_folder: str = "",
                 shuffle_seed: int | None = None, start: int = 0):
        self.source = str(listfile)
        self.start = start  # rand_skip's skip: stream position 0 is this entry of pass 0
        self.entries = read_image_list(Path(listfile))
        self.root = image_root(Path(listfile), root_folder, self.entries[0].path)
        self.shuffle_seed = shuffle_seed
        self.fixed_order = shuffle_seed is None

    def __len__(self) -> int:
        return len(self.entries)

    def path(self, entry: ListEntry) -> Path:
        return self.root / entry.path

    def cursor(self) -> ImageListCursor:
        return ImageListCursor(self)

    def close(self) -> None:
        pass


def image_root(listfile: Path, root_folder: str, first: str) -> Path:
    """The folder a list's relative paths start from (see the module docstring)."""
    if root_folder:
        return Path(root_folder)
    beside = listfile.parent
    if not (beside / first).exists() and Path(first).exists():
        return Path(".")
    return beside


class ImageListCursor:
    """A position in an image list's read order (see :class:`ImageListDatabase`)."""

    def __init__(self, db: ImageListDatabase):
        self.db = db
        self.size = len(db)
        self.index = 0
        self.order: list[ListEntry] = list(db.entries)
        self._rng: Mt19937 | None = None
        self.seek(0)

    def seek(self, index: int) -> None:
        """Stand on record ``index`` counted from the first record of pass 0."""
        passes, self.index = divmod(index + self.db.start, self.size)
        if self.db.shuffle_seed is None:
            return
        self.order = list(self.db.entries)
        self._rng = Mt19937(self.db.shuffle_seed)
        for _ in range(passes + 1):  # setup shuffles once, every pass's end once more
            caffe_shuffle(self.order, self._rng)

    def read(self, count: int) -> tuple[Sequence[bytes], Sequence[tuple[Path, int]]]:
        """The next ``count`` entries of this pass: keys (the listed paths) and (file, label)."""
        picked = self.order[self.index:self.index + count]
        self.index += len(picked)
        if self.index >= self.size:
            self.index = 0
            if self._rng is not None:  # Caffe reshuffles when a pass ends
                caffe_shuffle(self.order, self._rng)
        keys = [entry.path.encode() for entry in picked]
        return keys, [(self.db.path(entry), entry.label) for entry in picked]

    def close(self) -> None:
        pass


class ImageDecoder:
    """Reads image files into (C, H, W) uint8 records as Caffe's ReadImageToCVMat does: BGR
    (``color``) or 1 channel, resized to ``resize`` (H, W) with cv::resize's INTER_LINEAR when
    given. Every record must have ``record_shape``."""

    dtype = np.dtype(np.uint8)

    def __init__(self, source: str, record_shape: Sequence[int], *, color: bool,
                 resize: tuple[int, int] | None):
        self.path = source
        c, h, w = (int(d) for d in record_shape)
        self.record_shape = (c, h, w)
        self.color, self.resize = color, resize
        self.reading: Path | None = None
        """The file being read now (None between chunks)."""

    @property
    def record_bytes(self) -> int:
        return int(np.prod(self.record_shape))

    def load(self, file: Path) -> np.ndarray:
        """One image as (C, H, W) uint8, resized."""
        array = load_image(file, color=self.color)
        return resize_linear(array, *self.resize) if self.resize else array

    def decode(self, keys: Sequence[bytes], values: Sequence[tuple[Path, int]],
               wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pixels (k, C, H, W) and labels (k,) of the images ``values`` name (only the
        ``wanted`` ones, when given); a failing image raises :class:`PartialChunk`."""
        pixels = np.empty((len(values), *self.record_shape), np.uint8)
        labels = np.array([label for _, label in values], np.int64)
        for i, (file, _) in enumerate(values):
            if wanted is not None and not wanted[i]:
                continue
            self.reading = file   # what a stalled read is stuck on (the reader's watchdog)
            try:
                array = self.load(file)
                if array.shape != self.record_shape:
                    raise DataError(f"{self.path}: {keys[i].decode()} is "
                                    f"{_shape(array.shape)} but the first image is "
                                    f"{_shape(self.record_shape)}; images of one batch need "
                                    "one size: set new_height and new_width")
            except DataError as exc:
                raise PartialChunk((pixels[:i], labels[:i]), exc) from None
            pixels[i] = array
        self.reading = None
        return pixels, labels


def _shape(shape: Sequence[int]) -> str:
    return " x ".join(str(n) for n in shape)
