"""AnnotatedData's feed: AnnotatedDatum records from the reader pool, through SSD's
augmentation, into batches of images and variable-length box lists.

The reader (:mod:`.reader`) reads the database as for a Data layer (one producer per
database, the round-robin over replicas, the saved positions): :class:`AnnotatedDecoder`
parses each chunk into :class:`~.annotated.AnnotatedDatum` objects. Each replica's
:class:`AnnotatedFeed` then runs the per-record pipeline (:mod:`.annotated_transform`) on its
own thread, ``prefetch`` batches ahead, with one random generator per record seeded by
(run seed, stream position): a record sees the same augmentation however many replicas read
the stream. ``next()`` gives data (B, C, h, w) float32 and the label top on the device: the
boxes as (1, 1, G, 8) rows [image, label, instance, xmin, ymin, xmax, ymax, difficult], or
(B,) labels for records without annotations (the fork's classification mode).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...errors import DataError
from ..db.db import PartialChunk
from ..formats.annotated import AnnotatedDatum, decode_annotated_record
from ..reader.reader import JOIN_TIMEOUT_S, STALL_TIMEOUT_S, WAIT_SLICE_S, RecordQueue
from .annotated_transform import AnnotatedTransformer, label_rows

_SEED_MASK = (1 << 63) - 1


class AnnotatedDecoder:
    """The reader's decoder for AnnotatedDatum records: a chunk -> an object array of parsed
    records (the images stay encoded until the feed's pipeline)."""

    dtype = np.dtype(object)
    record_shape: tuple[int, ...] = ()
    encoded = False
    takes_views = False

    def __init__(self, source: str, record_bytes: int):
        self.source = source
        self.record_bytes = max(1, record_bytes)
        """Bytes of one record (the first's): sizes the reader's chunks and its cache."""

    def decode(self, keys: Sequence[bytes], values: Sequence[bytes],
               wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        rows = np.empty(len(values), object)
        for i, (key, value) in enumerate(zip(keys, values, strict=True)):
            if wanted is not None and not wanted[i]:
                continue
            try:
                rows[i] = decode_annotated_record(value, source=self.source, key=key)
            except DataError as exc:
                raise PartialChunk((rows[:i], np.zeros(i, np.int64)), exc) from None
        return rows, np.zeros(len(values), np.int64)


class AnnotatedFeed:
    """One AnnotatedData layer's feed on one replica (started and closed by the reader pool).
    ``annotated``: output the box rows (else each record's datum label)."""

    def __init__(self, records: RecordQueue, transformer: AnnotatedTransformer,
                 batch_size: int, *, device: torch.device, seed: int, annotated: bool,
                 prefetch: int, name: str):
        self.records, self.transformer, self.batch_size = records, transformer, batch_size
        self.device, self.seed, self.annotated, self.name = device, seed, annotated, name
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._ready: queue.Queue[Any] = queue.Queue(maxsize=max(1, prefetch))

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"cpy-annotated:{self.name}",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(JOIN_TIMEOUT_S)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                batch = self.records.get_batch(self.batch_size)
                records = batch.pixels  # the decoder's AnnotatedDatum objects
                assert records is not None
                item = self.make_batch(list(records), batch.positions)
                while not self.stop.is_set():
                    try:
                        self._ready.put(item, timeout=WAIT_SLICE_S)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the training loop's next()
            if not self.stop.is_set():
                self._ready.put(exc)

    def make_batch(self, rows: list[AnnotatedDatum], positions: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """The records of one batch through the pipeline: data (B, C, h, w), labels."""
        images, boxes = [], []
        for record, position in zip(rows, positions, strict=True):
            rng = np.random.default_rng([self.seed & _SEED_MASK, int(position)])
            data, groups = self.transformer(record, rng)
            images.append(data)
            boxes.append(groups)
        shapes = {im.shape for im in images}
        if len(shapes) > 1:
            raise DataError(f"{self.records.path}: a batch holds images of sizes "
                            f"{sorted(shapes)}; give transform_param.resize_param (or a crop) "
                            "so that every image has one size")
        data = np.stack(images)
        if self.annotated:
            return data, label_rows(boxes)
        return data, np.asarray([r.datum.label for r in rows], np.float32)

    def next_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch on ``device`` (another replica computes it): made here, copied."""
        data, label = self.next()
        return data.to(device, non_blocking=True), label.to(device, non_blocking=True)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.thread is None:
            raise DataError(f"{self.records.path}: the data feed {self.name} has not started; "
                            "call ReaderPool.start() before the first forward")
        waited = 0.0
        while True:
            try:
                item = self._ready.get(timeout=WAIT_SLICE_S)
                break
            except queue.Empty:
                waited += WAIT_SLICE_S
                if not self.thread.is_alive() and self._ready.empty():
                    raise DataError(f"{self.records.path}: the feed {self.name} stopped") from None
                if waited > STALL_TIMEOUT_S:
                    raise DataError(f"{self.records.path}: no batch arrived for "
                                    f"{STALL_TIMEOUT_S:.0f} s (feed {self.name})") from None
        if isinstance(item, BaseException):
            if not isinstance(item, DataError):  # a bug, not bad data: name where it came from
                item = DataError(f"{self.records.path}: the feed {self.name} failed "
                                 f"({type(item).__name__}: {item})")
            self._ready.put(item)  # every later next() raises it too
            raise item
        data, labels = item
        self.records.mark_consumed(self.batch_size)
        return (torch.from_numpy(data).to(self.device, non_blocking=False),
                torch.from_numpy(labels).to(self.device))
