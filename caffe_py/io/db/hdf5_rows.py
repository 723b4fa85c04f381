"""HDF5Data's source as a database: the rows of the .h5 files a list file names, in Caffe's
order, each row the concatenation (float32) of one row of every top's dataset.

Caffe's HDF5DataLayer reads one whole file at a time. Without ``shuffle`` it goes through the
files in list order and each file's rows in order. With ``shuffle`` it draws from glibc's
``rand()`` through ``std::random_shuffle`` (:mod:`.caffe_rng`; Caffe never seeds it, so the
order is the same in every run): the file order once at setup and again whenever the list
wraps, a file's rows whenever it is loaded, and the rows once more whenever a file's last row
has been read (in place: with one file the previous pass's order is shuffled again). A cursor
replays those shuffles to find any position.

Datasets may be float or integer (Caffe reads both as float); every file must hold every top's
dataset, with equal row counts and the first file's per-row shapes.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataError
from .caffe_rng import GlibcRand, std_random_shuffle

INSTALL_FIX = "install it with `pip install h5py` (or `pip install caffe-py[hdf5]`)"


def h5py_module() -> Any:
    """The h5py module, or a one-line DataError naming the package to install."""
    try:
        import h5py
    except ImportError:
        raise DataError(f"HDF5 files need the h5py package; {INSTALL_FIX}") from None
    return h5py


def read_file_list(listfile: Path) -> list[Path]:
    """The .h5 files a list names (whitespace-separated, as Caffe reads them), relative to the
    list's folder, or to the current directory where Caffe would find them."""
    try:
        names = listfile.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        raise DataError(f"{listfile}: HDF5 file list not found; fix hdf5_data_param.source") \
            from None
    except IsADirectoryError:
        raise DataError(f"{listfile}: is a directory; hdf5_data_param.source names a text "
                        "file listing the .h5 files, one per line") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{listfile}: not a text file ({exc.reason} at byte {exc.start}); "
                        "hdf5_data_param.source lists .h5 files, one per line") from None
    if not names:
        raise DataError(f"{listfile}: lists no HDF5 file; write one .h5 path per line")
    files = []
    for name in names:
        beside = listfile.parent / name
        files.append(beside if beside.exists() or not Path(name).exists() else Path(name))
    return files


@dataclass(frozen=True)
class RowLayout:
    """Where each top's values lie in a row: the per-row shapes, in top order."""

    tops: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def sizes(self) -> list[int]:
        return [int(np.prod(s)) for s in self.shapes]

    @property
    def width(self) -> int:
        return sum(self.sizes)


class Hdf5RowsDatabase:
    """The rows of an HDF5 file list for ``tops`` (dataset names): ``len()``, ``cursor()``,
    ``layout`` (per-row shapes), ``fixed_order`` (False with ``shuffle``)."""

    def __init__(self, listfile: str | os.PathLike, tops: Sequence[str], *, shuffle: bool):
        self.source = str(listfile)
        self.files = read_file_list(Path(listfile))
        self.tops, self.shuffle = tuple(tops), shuffle
        self.fixed_order = not shuffle
        self.rows: list[int] = []
        layout = None
        for file in self.files:
            rows, shapes = self._inspect(file)
            if layout is None:
                layout = RowLayout(self.tops, shapes)
            elif shapes != layout.shapes:
                raise DataError(f"{file}: rows of {_shapes(self.tops, shapes)} but "
                                f"{self.files[0]} has {_shapes(self.tops, layout.shapes)}; "
                                "every file of an HDF5Data list needs the same row shapes")
            self.rows.append(rows)
        assert layout is not None
        self.layout = layout

    def _inspect(self, file: Path) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """(rows, per-row shape of each top) of one file, checking what Caffe checks."""
        h5py = h5py_module()
        with open_h5(file, "r", h5py) as f:
            counts, shapes = set(), []
            for top in self.tops:
                dataset = f.get(top)
                if not isinstance(dataset, h5py.Dataset):
                    raise DataError(f"{file}: no dataset '{top}'; HDF5Data reads one dataset "
                                    "per top, named as the top")
                if dataset.ndim < 1 or dataset.dtype.kind not in "fiub":
                    raise DataError(f"{file}: dataset '{top}' is {dataset.dtype} with shape "
                                    f"{list(dataset.shape)}; HDF5Data reads numeric datasets "
                                    "of at least one axis")
                counts.add(int(dataset.shape[0]))
                shapes.append(tuple(int(d) for d in dataset.shape[1:]))
        if len(counts) != 1:
            raise DataError(f"{file}: its datasets {', '.join(self.tops)} have different row "
                            "counts; give every top's dataset the same first dimension")
        return counts.pop(), tuple(shapes)

    def __len__(self) -> int:
        return sum(self.rows)

    def load(self, index: int) -> np.ndarray:
        """File ``index``'s rows as one (rows, width) float32 array (tops side by side)."""
        h5py = h5py_module()
        with open_h5(self.files[index], "r", h5py) as f:
            parts = [np.asarray(f[top], dtype=np.float32).reshape(self.rows[index], -1)
                     for top in self.tops]
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def cursor(self) -> Hdf5RowsCursor:
        return Hdf5RowsCursor(self)

    def close(self) -> None:
        pass


class Hdf5RowsCursor:
    """Caffe's walk through the files and rows (see the module docstring)."""

    def __init__(self, db: Hdf5RowsDatabase):
        self.db = db
        self.data: np.ndarray | None = None  # the current file's rows (width-wide)
        self.seek(0)

    def seek(self, index: int) -> None:
        """Stand on row ``index`` of the walk, replaying Caffe's shuffles up to it."""
        db = self.db
        self.rand = GlibcRand(1)
        self.file_order = list(range(len(db.files)))
        if db.shuffle:
            std_random_shuffle(self.file_order, self.rand)
        self.slot = 0  # Caffe's current_file_: the position in file_order
        self._enter_file(load=False)
        left = index
        while left >= self.db.rows[self.file_order[self.slot]] - self.row:
            left -= self.db.rows[self.file_order[self.slot]] - self.row
            self._next_file(load=False)
        self.row += left
        self.data = self.db.load(self.file_order[self.slot])

    def _enter_file(self, *, load: bool) -> None:
        """Caffe's LoadHDF5FileData: the rows in order, shuffled when asked."""
        rows = self.db.rows[self.file_order[self.slot]]
        self.row_order = list(range(rows))
        if self.db.shuffle:
            std_random_shuffle(self.row_order, self.rand)
        self.row = 0
        self.data = self.db.load(self.file_order[self.slot]) if load else None

    def _next_file(self, *, load: bool) -> None:
        """Caffe's Next() after a file's last row."""
        if len(self.db.files) > 1:
            self.slot += 1
            if self.slot == len(self.db.files):
                self.slot = 0
                if self.db.shuffle:
                    std_random_shuffle(self.file_order, self.rand)
            self._enter_file(load=load)
        self.row = 0
        if self.db.shuffle:
            std_random_shuffle(self.row_order, self.rand)

    def read(self, count: int) -> tuple[Sequence[bytes], np.ndarray]:
        """The next ``count`` rows (not past the end of the pass): keys ``file:row`` and a
        (count, width) float32 array."""
        keys, parts = [], []
        while count:
            file = self.file_order[self.slot]
            take = min(count, self.db.rows[file] - self.row)
            picked = self.row_order[self.row:self.row + take]
            assert self.data is not None  # loaded by seek() and on entering each file
            parts.append(self.data[picked])
            keys += [f"{self.db.files[file].name}:{r}".encode() for r in picked]
            self.row += take
            count -= take
            if self.row == self.db.rows[file]:
                self._next_file(load=True)
        return keys, np.concatenate(parts) if len(parts) > 1 else parts[0]

    def close(self) -> None:
        self.data = None


class RowDecoder:
    """The 'decoder' of HDF5 rows: they come decoded; (k, width) -> (k, 1, 1, width) float32
    and zero labels (HDF5Data's tops are all in the row)."""

    dtype = np.dtype(np.float32)

    def __init__(self, width: int):
        self.record_shape = (1, 1, int(width))

    @property
    def record_bytes(self) -> int:
        return 4 * self.record_shape[2]

    def decode(self, keys: Sequence[bytes], values: np.ndarray,
               wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(values, np.float32)
        return rows.reshape(len(rows), *self.record_shape), np.zeros(len(rows), np.int64)


def open_h5(path: Path, mode: str, h5py: Any) -> Any:
    """An h5py File; an unreadable one is a one-line DataError naming it."""
    try:
        return h5py.File(path, mode)
    except FileNotFoundError:
        raise DataError(f"{path}: HDF5 file not found") from None
    except OSError as exc:
        reason = str(exc).split("(")[0].strip() or type(exc).__name__
        raise DataError(f"{path}: not a readable HDF5 file ({reason})") from None


def _shapes(tops: Sequence[str], shapes: Sequence[Sequence[int]]) -> str:
    return ", ".join(f"{t} {list(s)}" for t, s in zip(tops, shapes, strict=True))
