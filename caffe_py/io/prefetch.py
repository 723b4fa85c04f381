"""Double-buffered prefetch: a thread per feed assembles the next batch while this one computes.

Per batch the thread takes ``batch_size`` records from its reader queue, crops and mirrors them
into one of two host buffers of the records' own dtype (uint8 for pixel records, pinned when
the device is CUDA), copies that to the device on a side CUDA stream (``non_blocking``), and
runs the rest of the transform there (float conversion, mean subtraction, scale). An event
marks the batch ready; :meth:`Prefetcher.next` makes the compute stream wait on it and records
the tensors on that stream, so the caching allocator never hands their memory out early. A host
buffer is refilled only after its previous copy has finished (its event). On the CPU the same
path runs without streams or pinning, and the float half runs in the training loop's thread
(a torch CPU op in the prefetch thread would start a second OpenMP team spinning against the
loop's).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DataError
from .reader import JOIN_TIMEOUT_S, STALL_TIMEOUT_S, WAIT_SLICE_S, RecordQueue
from .transformer import Choices, Transformer


@dataclass
class _Batch:
    data: torch.Tensor  # (B, C, h, w): float32 on CUDA; cropped records still to finish on CPU
    label: torch.Tensor  # (B,) int64 on the device
    ready: torch.cuda.Event | None
    records: int
    choices: Choices | None  # CPU only: the flips and offsets the float half needs


@dataclass
class _Failure:
    error: BaseException


class _HostSlot:
    """One host staging buffer: records (B, C, h, w) and labels (B,), and its copy's event."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, pin: bool):
        tdtype = torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
        self.data = torch.empty(shape, dtype=tdtype, pin_memory=pin)
        self.label = torch.empty(shape[0], dtype=torch.int64, pin_memory=pin)
        self.copied: torch.cuda.Event | None = None


class Prefetcher:
    """The feed of one Data layer on one replica: ``next()`` -> (data, label) on ``device``."""

    def __init__(self, records: RecordQueue, transformer: Transformer, batch_size: int, *,
                 device: torch.device, name: str = "feed",
                 stop: threading.Event | None = None):
        self.records, self.transformer, self.batch_size = records, transformer, batch_size
        self.device, self.name = _with_index(torch.device(device)), name
        self.stop = stop if stop is not None else records.source.stop
        self.thread: threading.Thread | None = None
        self.delivered = 0
        """Batches handed to the training loop."""
        self._ready: queue.Queue[_Batch | _Failure] = queue.Queue(maxsize=1)
        self._cuda = self.device.type == "cuda"
        self._slots: list[_HostSlot] = []
        self._side: torch.cuda.Stream | None = None
        self._mean: torch.Tensor | None = None

    # --- lifetime -----------------------------------------------------------------------------
    def start(self) -> None:
        self._mean = self.transformer.device_mean(self.device)
        if self._cuda:
            self._slots = [_HostSlot(self._host_shape(), self._host_dtype(), pin=True)
                           for _ in range(2)]
            self._side = torch.cuda.Stream(self.device)
            self._side.wait_stream(torch.cuda.current_stream(self.device))  # the mean's copy
        self.thread = threading.Thread(target=self._run, name=f"cpy-prefetch:{self.name}",
                                       daemon=True)
        self.thread.start()

    def _host_shape(self) -> tuple[int, ...]:
        return (self.batch_size, *self.transformer.out_shape)

    def _host_dtype(self) -> np.dtype:
        """The records' own dtype: uint8 pixels cross to the device as bytes."""
        return np.dtype(self.records.stream.dtype)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(JOIN_TIMEOUT_S)

    # --- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        if self._cuda:
            torch.cuda.set_device(self.device)
        slot = 0
        try:
            while not self.stop.is_set():
                batch = self._assemble(self._slots[slot] if self._cuda else None)
                if not self._put(batch):
                    return
                slot = 1 - slot
        except BaseException as exc:  # noqa: BLE001 (re-raised in the training loop)
            self._put(_Failure(exc))

    def _put(self, item: _Batch | _Failure) -> bool:
        while not self.stop.is_set():
            try:
                self._ready.put(item, timeout=WAIT_SLICE_S)
                return True
            except queue.Full:
                continue
        return False

    def _assemble(self, slot: _HostSlot | None) -> _Batch:
        records = self.records.get(self.batch_size)
        choices = self.transformer.choices([r.position for r in records])
        labels = np.fromiter((r.label for r in records), dtype=np.int64, count=len(records))
        if not self._cuda:
            # A fresh buffer per batch (the loop keeps the last one), filled by numpy only: a
            # torch CPU op here would start a second OpenMP team that spins against the
            # training loop's; next() runs the float half in the loop's thread.
            data = np.empty(self._host_shape(), dtype=self._host_dtype())
            self.transformer.host([r.array for r in records], choices, data)
            return _Batch(torch.from_numpy(data), torch.from_numpy(labels), None,
                          len(records), choices)
        assert slot is not None
        if slot.copied is not None:
            slot.copied.synchronize()  # the previous batch in this buffer has left it
        # uint8 flips are cheaper on the GPU than strided host copies
        self.transformer.host([r.array for r in records], choices, slot.data.numpy(),
                              mirror=False)
        slot.label.numpy()[:] = labels
        with torch.cuda.stream(self._side):
            raw = slot.data.to(self.device, non_blocking=True)
            label = slot.label.to(self.device, non_blocking=True)
            data = self.transformer.device(raw, choices, self._mean, mirror=True)
            slot.copied = torch.cuda.Event()
            slot.copied.record(self._side)
        return _Batch(data, label, slot.copied, len(records), None)

    # --- the consumer -------------------------------------------------------------------------
    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch: data (B, C, h, w) float32 and labels (B,) int64 on the device."""
        if self.thread is None:
            raise DataError(f"{self.records.source.path}: the data feed {self.name} has not "
                            "started; call ReaderPool.start() before the first forward")
        item = self._take()
        if isinstance(item, _Failure):
            self._put_back(item)
            raise item.error
        data = item.data
        if item.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.ready)
            data.record_stream(current)
            item.label.record_stream(current)
        else:
            data = self.transformer.device(data, item.choices, self._mean)
        self.records.mark_consumed(item.records)
        self.delivered += 1
        return data, item.label

    def _take(self) -> _Batch | _Failure:
        waited_since = time.monotonic()
        while True:
            try:
                return self._ready.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                pass
            if not self.thread.is_alive() and self._ready.empty():
                raise DataError(f"{self.records.source.path}: the data feed {self.name} "
                                "stopped (the data reader was closed)")
            if time.monotonic() - waited_since > STALL_TIMEOUT_S + 5 * WAIT_SLICE_S:
                raise DataError(f"{self.records.source.path}: no batch for the data feed "
                                f"{self.name} in {STALL_TIMEOUT_S:.0f} s")

    def _put_back(self, item: _Failure) -> None:
        """Keep a failure for later calls, so every next() after it raises the same error."""
        try:
            self._ready.put_nowait(item)
        except queue.Full:
            pass


def _with_index(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``: the feed thread sets its device, which needs an index."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
