"""``cpy compute-mean``: the mean image of a database as a Caffe mean file (compute_image_mean).

The file is a BlobProto with num=1 and the records' channels, height and width in the legacy
fields, then the (1, C, H, W) mean as packed floats: what compute_image_mean writes and what
``transform_param.mean_file`` reads.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io.db.db import open_db
from ..io.formats.blobproto import blob_from_array, write_blob_file
from ..io.formats.datum import format_key
from .convert import ProgressFactory, no_progress
from .dbinfo import scan_records


@dataclass
class MeanResult:
    path: Path
    records: int
    mean: np.ndarray  # (C, H, W) float32
    seconds: float

    @property
    def channel_means(self) -> list[float]:
        """Per-channel means of the mean image, as compute_image_mean prints them."""
        return [float(v) for v in self.mean.reshape(self.mean.shape[0], -1).mean(axis=1)]

    def lines(self) -> list[str]:
        c, h, w = self.mean.shape
        rows = [f"{self.path}: mean of {self.records} records, {c} x {h} x {w}, "
                f"{self.seconds:.1f} s"]
        rows += [f"mean_value channel [{i}]: {v:.6g}" for i, v in enumerate(self.channel_means)]
        return rows


def compute_mean(db: str | os.PathLike, out: str | os.PathLike | None, *,
                 progress: ProgressFactory = no_progress, backend: str = "lmdb") -> MeanResult:
    """Average every record of ``db`` (decoded, in key order) and write the mean file (none
    when ``out`` is None: Caffe's compute_image_mean without OUTPUT_FILE only prints)."""
    began = time.perf_counter()
    total: np.ndarray | None = None
    count = 0
    with open_db(db, backend) as reader:
        for key, _, array in scan_records(reader, progress=progress):
            if array.dtype != np.uint8 and not np.isfinite(array).all():
                bad = array[~np.isfinite(array)][0]
                raise DataError(f"{reader.source}: record {format_key(key)} holds a non-finite "
                                f"value ({bad}) in its float_data, which would make the whole "
                                "mean non-finite; fix or drop that record (nothing was written)")
            # Sums in float64: exact for any realistic count of uint8 images.
            if total is None:
                total = array.astype(np.float64)
            else:
                np.add(total, array, out=total)
            count += 1
    if total is None:
        raise DataError(f"{db}: the database is empty; there is no mean to compute")
    mean = (total / count).astype(np.float32)
    if out is not None:
        write_blob_file(out, blob_from_array(mean[None], legacy=True))
    return MeanResult(Path(out if out is not None else db), count, mean,
                      time.perf_counter() - began)
