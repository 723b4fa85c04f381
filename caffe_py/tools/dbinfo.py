"""Reading a whole database once: every record decoded and shape-checked (``cpy db-info``),
shared with the mean computation (``cpy compute-mean``)."""
from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io.db.db import DISPLAY, KeyValueDatabase, open_db
from ..io.formats.datum import Datum, datum_to_array, decode_record, format_key
from .convert import ProgressFactory, no_progress


def shape_text(shape: tuple[int, ...]) -> str:
    return " x ".join(str(n) for n in shape)


def scan_records(reader: KeyValueDatabase, *, progress: ProgressFactory = no_progress
                 ) -> Iterator[tuple[bytes, Datum, np.ndarray]]:
    """Every record in key order as (key, datum, (C, H, W) pixels); a record that does not
    parse or has a different shape from the first is a DataError naming its key."""
    first: tuple[bytes, tuple[int, ...]] | None = None
    bar = progress(len(reader), reader.path.name)
    try:
        for key, value in reader:
            datum = decode_record(value, source=reader.source, key=key)
            try:
                array = datum_to_array(datum)
            except DataError as exc:
                raise DataError(f"{reader.source}: record {format_key(key)}: {exc}; rebuild "
                                "the database with `cpy convert`") from None
            if first is None:
                first = (key, array.shape)
            elif array.shape != first[1]:
                raise DataError(
                    f"{reader.source}: record {format_key(key)} is {shape_text(array.shape)} "
                    f"but the first record ({format_key(first[0])}) is "
                    f"{shape_text(first[1])}; every record of a database needs one shape: "
                    "convert with --resize-width/--resize-height or --check-size")
            yield key, datum, array
            bar.update(1)
    finally:
        bar.close()


@dataclass
class DbInfo:
    """What ``cpy db-info`` reports about a database."""

    path: Path
    records: int
    backend: str = "lmdb"
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    encoded: int = 0  # records holding a PNG/JPEG file
    first_key: bytes | None = None
    last_key: bytes | None = None
    labels: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        rows = [f"database  {self.path} ({DISPLAY[self.backend]})", f"records   {self.records}"]
        if not self.records:
            return rows + ["(empty)"]
        storage = (f"encoded images ({self.encoded} of {self.records})" if self.encoded
                   else "raw")
        rows += [f"shape     {shape_text(self.shape or ())} (C x H x W), {self.dtype}, "
                 f"{storage}",
                 f"keys      {format_key(self.first_key or b'')} .. "
                 f"{format_key(self.last_key or b'')}",
                 f"labels    {len(self.labels)} distinct"]
        width = max(len(str(label)) for label in self.labels)
        for label in sorted(self.labels):
            count = self.labels[label]
            rows.append(f"  {label:>{width}}  {count:>8}  {100.0 * count / self.records:5.1f}%")
        rows.append(f"checked   every record decodes, {self.seconds:.1f} s")
        return rows


def db_info(path: str | os.PathLike, *, progress: ProgressFactory = no_progress,
            backend: str = "lmdb") -> DbInfo:
    began = time.perf_counter()
    with open_db(path, backend) as reader:
        info = DbInfo(Path(path), len(reader), backend=backend)
        for key, datum, array in scan_records(reader, progress=progress):
            if info.first_key is None:
                info.first_key, info.shape, info.dtype = key, array.shape, str(array.dtype)
            info.last_key = key
            info.labels[datum.label] += 1
            info.encoded += bool(datum.encoded)
    info.seconds = time.perf_counter() - began
    return info
