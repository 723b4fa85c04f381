"""Prefetch: a thread per feed assembles the next batches while the training loop computes.

Per batch the thread takes ``batch_size`` records from its reader queue (a slice of the
producer's chunks). On CUDA it crops them into one slot of a ring of pinned host buffers (the
records' own dtype, uint8 for pixels, with the labels after them), copies the slot to its
device buffer on a side CUDA stream (``non_blocking``) and runs the rest of the transform there
(float conversion, mean, scale; new tensors every batch); an event marks the batch ready.
:meth:`Prefetcher.next` makes the compute stream wait on it and records the tensors on that
stream, so the caching allocator never hands their memory out early. A slot is refilled only
after its event. On the CPU the thread runs the whole transform with numpy (a torch CPU op
there would start a second OpenMP team spinning against the loop's).

The training loop of a small net is in Python nearly all the time, and any Python this thread
runs, and every wake-up, takes the GIL from it: so nothing here is done per record, the
hand-overs are C queues, and while the loop has batches waiting the thread refills two slots
per wake (docs/data_pipeline.md, "The training thread's GIL").

Encoded records of a database too big to keep decoded reach the feed as image files: the
thread has them decoded and cropped (:mod:`.image_batch`) by the decode workers into the slot,
or on CUDA by nvJPEG on the device, and goes on as for decoded records. Big raw records of such
an LMDB reach it as files too where there are decode processes (the reader says so before the
feed starts: :attr:`~caffe_py.io.reader.reader.RecordQueue.raw_files`), and the processes crop
them. A batch of the decode processes is finished (waited for, sent to the device) only after
the thread has handed them the next one, so they are never idle while it works. On CUDA such a
feed's slots are shared buffers the processes map, page-locked for the device's copy
(``cudaHostRegister``): the processes write the crops straight into the slot and the thread
copies nothing (with no room in /dev/shm, or where the buffer cannot be page-locked, the slots
are pinned buffers of torch's and the crops are copied out of the processes' own).

Once the stream's database is kept decoded (the reader's cache, complete after the first pass)
and a batch of records is small (``DIRECT_BYTES``), or on CUDA the database stays on the device
(a fixed transform and a database small enough: :func:`~.gather.resides`; the gather is then
the device's, however big the batch), no thread is needed at all: :meth:`next` stops this
feed's thread, takes its queue off the producer, and from then on gathers each batch
in the training thread from the decoded database (:mod:`.gather`). This switch happens in the
middle of a run, at whatever iteration the first pass ends (see the comment in :meth:`next`
and README.md); the batches are the ones the threads would have made, bit for bit.

Records with random crops that are not much bigger than their crops (ImageNet's 256 x 256
records, 224 crops) cross to the device whole: the thread copies each run of records the
reader delivered into the slot in one call, and the device crops and flips them, subtracts the
mean and scales in one pass (:meth:`~.transformer.Transformer.device_transform`: on CUDA one
kernel), the same values the host path makes.

The feed reads its queue through the reader's consumer calls only: ``get_batch``,
``get_runs``, ``mark_consumed``, ``detach`` and ``decoded``.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing import shared_memory

import numpy as np
import torch

from ...errors import DataError
from ...interrupts import interruptible
from ..decoders.decode_processes import InFlight, NoSharedMemory, shared_buffer
from ..decoders.decode_processes import release as release_buffer
from ..reader.reader import JOIN_TIMEOUT_S, STALL_TIMEOUT_S, WAIT_SLICE_S, Detached, RecordQueue
from ..reader.records import DecodedView, RecordBatch
from .gather import HostGather, loop_gather, resides
from .image_batch import BatchImages
from .transformer import Choices, Transformer

log = logging.getLogger(__name__)

WHOLE_RATIO = 2.0
"""On CUDA, records with random crops cross to the device whole and are cropped there (one
gather) when a record is at most this many times its crop's bytes (ImageNet's 256 -> 224:
1.31x): the host then copies each run of records in one call, instead of one window copy per
record, each a GIL hand-over beside the training loop."""
HOST_REGISTER_PORTABLE = 1
"""cudaHostRegisterPortable: a shared slot is page-locked for every device's context."""
SLOTS = 4
"""Batches a feed assembles ahead of the training loop (its ring of host buffers on CUDA).
While two or more are ready the thread waits for two free slots and fills both in one wake:
every wake takes the GIL from the training loop, so it wakes about once per two batches."""
DIRECT_BYTES = 1 << 20
"""A feed whose batch of records is at most this many bytes gathers its batches in the training
thread once the database is kept decoded (a gather of up to a few hundred microseconds);
bigger batches stay on the threads, whose copies run outside the GIL beside the loop."""


@dataclass
class _Batch:
    data: torch.Tensor  # (B, C, h, w) float32 on the device
    label: torch.Tensor  # (B,) int64 on the device
    ready: torch.cuda.Event | None  # CUDA: the side stream's work for this batch
    records: int
    slot: int  # the ring slot (a token the loop hands back when it takes the batch)


@dataclass
class _Failure:
    error: BaseException


@dataclass
class _Pending:
    """A batch of image files the decode processes are decoding (the feed submits the next
    batch before it waits for this one: see :meth:`Prefetcher._run`)."""

    flight: InFlight
    make: Callable[[], _Batch]  # the batch, from the decoded crops

    def finish(self) -> _Batch:
        self.flight.wait()
        return self.make()


class _HostSlot:
    """One slot of the CUDA ring: a pinned host buffer holding a batch's records (B, C, h, w)
    and, after them, its labels (B,) int64, so one copy moves both; a device buffer of the
    same bytes it is copied into (read only by this slot's own transform, which is ordered
    after the copy on the side stream); and the event marking the batch done there.

    ``shared`` (the feed's database, for messages): the decode processes crop into this slot,
    so the host buffer is a shared one they map (:attr:`shared`, its name given with each
    batch), page-locked; where that cannot be made, one warning and torch's pinned memory
    (:attr:`shared` None)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, device: torch.device,
                 shared: str | None = None):
        count = int(np.prod(shape))
        data_bytes = -(-count * dtype.itemsize // 8) * 8  # the labels start 8-aligned
        size = data_bytes + 8 * shape[0]
        self.shared: shared_memory.SharedMemory | None = None
        host = self._shared_host(size, shared) if shared is not None else None
        self.host = host if host is not None else torch.empty(size, dtype=torch.uint8,
                                                                pin_memory=True)
        raw = self.host.numpy()
        self.data = raw[:count * dtype.itemsize].view(dtype).reshape(shape)
        self.label = raw[data_bytes:].view(np.int64)
        self.label_at = data_bytes
        self.device = torch.empty_like(self.host, device=device)
        tdtype = torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
        self.device_data = self.device[:count * dtype.itemsize].view(tdtype).view(shape)
        self.device_label = self.device[data_bytes:].view(torch.int64)
        self.done = torch.cuda.Event()
        self.used = False

    def _shared_host(self, size: int, where: str) -> torch.Tensor | None:
        """A page-locked shared buffer of ``size`` bytes as a tensor (:attr:`shared` set), or
        None (one warning) where /dev/shm cannot hold it or CUDA cannot lock it."""
        try:
            buffer = shared_buffer(size, where)
        except NoSharedMemory as exc:
            log.warning("%s; this feed's batch slots are pinned memory instead, and the crops "
                        "are copied out of the processes' buffers", exc)
            return None
        host = torch.frombuffer(buffer.buf, dtype=torch.uint8, count=size)
        error = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), size,
                                                     HOST_REGISTER_PORTABLE)
        if int(error) != 0:
            del host
            release_buffer(buffer)
            log.warning("%s: cannot page-lock a shared batch buffer (CUDA error %d); this "
                        "feed copies the crops out of the processes' buffers", where,
                        int(error))
            return None
        self.shared = buffer
        return host

    def wait_free(self) -> None:
        """Block until the previous batch of this slot has left the host buffer."""
        if self.used and not self.done.query():
            self.done.synchronize()

    def release(self) -> None:
        """Let go of a shared host buffer once its last copy is done (torch frees a pinned
        one itself, after its copies); the slot is not used again. Where the device has
        failed (the run reports that error), the copy may never end: the buffer's name is
        removed, and it stays mapped until the process ends."""
        if self.shared is None:
            return
        buffer, self.shared = self.shared, None
        try:
            if self.used:
                self.done.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self.host.data_ptr())
        except RuntimeError:
            buffer.unlink()
            return
        del self.host, self.data, self.label  # the views of the buffer, before it goes
        release_buffer(buffer)


class Prefetcher:
    """The feed of one Data layer on one replica: ``next()`` -> (data, label) on ``device``.

    ``start`` and ``close`` are the reader pool's to call (:meth:`ReaderPool.manage`)."""

    def __init__(self, records: RecordQueue, transformer: Transformer, batch_size: int, *,
                 device: torch.device, name: str = "feed",
                 stop: threading.Event | None = None, images: BatchImages | None = None):
        self.records, self.transformer, self.batch_size = records, transformer, batch_size
        self.images = images
        """Decodes batches of image files (encoded records the reader hands over as files)."""
        self.device, self.name = _with_index(torch.device(device)), name
        self.stop = stop if stop is not None else threading.Event()
        self.thread: threading.Thread | None = None
        self.delivered = 0
        """Batches handed to the training loop."""
        self.mean: torch.Tensor | None = None
        """The transform's mean on the device (set by :meth:`start`)."""
        # C-implemented queues: a hand-over is one call, no Python lock or condition.
        self._ready: queue.SimpleQueue[_Batch | _Failure] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._cuda = self.device.type == "cuda"
        self._slots: list[_HostSlot] = []
        self._side: torch.cuda.Stream | None = None
        self._record_bytes = int(np.prod(records.record_shape)) * np.dtype(records.dtype).itemsize
        self._small = batch_size * self._record_bytes <= DIRECT_BYTES
        """A batch small enough to gather in the training thread from a database on the host."""
        self._may_gather = self._small or (self._cuda and not transformer.random)
        """Whether this feed may gather in the training thread once its database is kept
        decoded (a big batch only from a database that stays on the device: next() decides)."""
        self._whole = False
        """Decoded records cross whole and are cropped on the device (see WHOLE_RATIO; fixed
        by :meth:`start`)."""
        self._loop: HostGather | None = None  # set once the loop gathers its own batches
        self._elsewhere: dict[torch.device, HostGather] = {}
        """In-loop gathers on other devices (:meth:`next_on`)."""
        self._halt = False  # tells the thread to stop (the loop gathers from now on)
        self._pending: _Pending | None = None  # the thread's batch in the decode processes

    # --- lifetime -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.images is not None and self.images.raw and not self.records.raw_files:
            self.images.close()  # the reader hands this stream's raw records over decoded
            self.images = None
        self._whole = self._crosses_whole()
        self.mean = self.transformer.device_mean(self.device)
        if self._cuda:
            self._slots = self._ring()
            self._side = torch.cuda.Stream(self.device)
            self._side.wait_stream(torch.cuda.current_stream(self.device))  # the mean's copy
        for slot in range(SLOTS):
            self._free.put(slot)
        self.thread = threading.Thread(target=self._run, name=f"cpy-prefetch:{self.name}",
                                       daemon=True)
        self.thread.start()

    def _ring(self) -> list[_HostSlot]:
        """The CUDA ring's slots: shared ones where the decode processes crop into them (one
        warning and pinned ones from the first that cannot be made)."""
        crops = (self.images is not None and self.images.crops is not None
                 and self.records.hands_files and not self._whole)
        shared = self.records.path if crops else None
        slots = []
        for _ in range(SLOTS):
            slots.append(_HostSlot(self._host_shape(), self._host_dtype(), self.device,
                                   shared=shared))
            if slots[-1].shared is None:
                shared = None
        return slots

    def _release_ring(self) -> None:
        for slot in self._slots:
            slot.release()
        self._slots = []

    def _crosses_whole(self) -> bool:
        """Whether decoded records cross whole and are cropped on the device."""
        transformer = self.transformer
        crop_bytes = int(np.prod(transformer.out_shape)) * np.dtype(self.records.dtype).itemsize
        return (self._cuda and self.images is None and transformer.random
                and bool(transformer.tp.crop_size)
                and self._record_bytes <= WHOLE_RATIO * crop_bytes)

    def _host_shape(self) -> tuple[int, ...]:
        shape = self.transformer.record_shape if self._whole else self.transformer.out_shape
        return (self.batch_size, *shape)

    def _host_dtype(self) -> np.dtype:
        """The records' own dtype: uint8 pixels cross to the device as bytes."""
        return np.dtype(self.records.dtype)

    def close(self) -> None:
        self.stop.set()
        self._free.put(-1)  # wakes a thread waiting for a slot now, not a wait slice later
        if self.thread is not None:
            self.thread.join(JOIN_TIMEOUT_S)
        if self.thread is None or not self.thread.is_alive():
            if self.images is not None:
                self.images.close()
            self._release_ring()

    # --- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._cuda:
                torch.cuda.set_device(self.device)
                # This thread's current stream, once: no stream context per batch.
                assert self._side is not None  # made by start() on CUDA
                torch.cuda.set_stream(self._side)
            while not self._halt:
                slots = [self._take_free()]
                if self._ready.qsize() >= 2:  # the loop has batches: refill two at once
                    slots.append(self._take_free())
                if None in slots:
                    return
                for slot in slots:
                    assert slot is not None  # None in slots: returned above
                    # A batch of the decode processes is finished only after the next one is
                    # theirs: they decode while this thread writes files and copies crops.
                    item = self._assemble(slot)
                    self._finish_pending()
                    if isinstance(item, _Pending):
                        self._pending = item
                    else:
                        self._ready.put(item)
        except Detached:
            return  # the training loop gathers its own batches now
        except BaseException as exc:  # noqa: BLE001 (re-raised in the training loop)
            self._ready.put(_Failure(exc))
        finally:
            if self._pending is not None:  # stopped: the loop never takes it
                self._pending.flight.cancel()
                self._pending = None

    def _finish_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._ready.put(pending.finish())

    def _take_free(self) -> int | None:
        """A ring slot the training loop has taken the batch of (None once stopped)."""
        if self._pending is not None:
            try:
                slot = self._free.get_nowait()
            except queue.Empty:  # the loop has every other slot: it waits for this batch
                self._finish_pending()
            else:
                return None if slot < 0 else slot
        while not (self.stop.is_set() or self._halt):
            try:
                slot = self._free.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                continue
            return None if slot < 0 else slot
        return None

    def _assemble(self, index: int) -> _Batch | _Pending:
        if self._whole:
            return self._assemble_whole(self.records.get_runs(self.batch_size), index)
        batch = self.records.get_batch(self.batch_size)
        transformer = self.transformer
        choices = transformer.choices_for(batch.first, batch.step, len(batch))
        pixels = batch.pixels
        if pixels is None:
            return self._assemble_files(batch, choices, index)
        if not self._cuda:
            # The whole transform by numpy, into a fresh array per batch (the loop keeps the
            # last one): numpy releases the GIL in its loops, and a torch CPU op here would
            # start a second OpenMP team that spins against the training loop's.
            values = transformer.numpy(pixels, choices)
            return _Batch(torch.from_numpy(values), torch.from_numpy(batch.labels.copy()),
                          None, len(batch), index)
        slot = self._slots[index]
        slot.wait_free()
        # uint8 flips are cheaper on the GPU than strided host copies
        transformer.host(pixels, choices, slot.data, mirror=False)
        slot.label[:] = batch.labels
        # Four calls on the side stream (this thread's current one): one copy of records and
        # labels, the transform (float, mean, scale: one op without a mean), fresh tensors
        # for the loop (it may keep them), and the event.
        slot.device.copy_(slot.host, non_blocking=True)
        data = transformer.device(slot.device_data, choices, self.mean, mirror=True)
        return self._sent(slot, data, len(batch), index)

    def _assemble_whole(self, runs: list[RecordBatch], index: int) -> _Batch:
        """A batch of whole records: each run copied into the slot in one call, one copy to
        the device, crops and flips there in one gather, then the transform's values."""
        transformer, first = self.transformer, runs[0]
        n = sum(len(run) for run in runs)
        choices = transformer.choices_for(first.first, first.step, n)
        slot = self._slots[index]
        slot.wait_free()
        at = 0
        for run in runs:
            assert run.pixels is not None  # whole records: never image files
            np.copyto(slot.data[at:at + len(run)], run.pixels)
            slot.label[at:at + len(run)] = run.labels
            at += len(run)
        slot.device.copy_(slot.host, non_blocking=True)
        data = transformer.device_transform(slot.device_data, choices, self.mean)
        return self._sent(slot, data, n, index)

    def _assemble_files(self, batch: RecordBatch, choices: Choices,
                        index: int) -> _Batch | _Pending:
        """A batch of image files: decoded and cropped (and mirrored) by the decode workers,
        into the slot on CUDA, or by nvJPEG on the device; then the transform's values. With
        the decode processes, the batch is :class:`_Pending` until they are done."""
        transformer, images = self.transformer, self.images
        if images is None:
            raise DataError(f"{self.records.path}: the data feed {self.name} got image files "
                            "but its records are not encoded")
        if not self._cuda:
            host = np.empty((len(batch), *transformer.out_shape), np.uint8)
            finish = partial(self._host_values, host, batch, choices, index)
            flight = images.start_host(batch, choices, host)
            return finish() if flight is None else _Pending(flight, finish)
        slot = self._slots[index]
        slot.wait_free()
        slot.label[:] = batch.labels
        decoded = images.on_device(batch)  # on the side stream (this thread's)
        if decoded is None:  # the CPU workers: crops into the slot, one copy with the labels
            finish = partial(self._slot_values, slot, len(batch), choices, index)
            flight = images.start_host(batch, choices, slot.data,
                                       slot.shared.name if slot.shared is not None else None)
            return finish() if flight is None else _Pending(flight, finish)
        # whole images (RGB or gray): crop, mirror, BGR, mean and scale in one pass
        at = slot.label_at
        slot.device[at:].copy_(slot.host[at:], non_blocking=True)
        data = transformer.device_transform(decoded, choices, self.mean,
                                            reverse_channels=images.rgb)
        return self._sent(slot, data, len(batch), index)

    def _host_values(self, host: np.ndarray, batch: RecordBatch, choices: Choices,
                     index: int) -> _Batch:
        """CPU: the transform's values of a batch of crops."""
        values = self.transformer.numpy_values(host, choices)
        return _Batch(torch.from_numpy(values), torch.from_numpy(batch.labels.copy()),
                      None, len(batch), index)

    def _slot_values(self, slot: _HostSlot, records: int, choices: Choices,
                     index: int) -> _Batch:
        """CUDA: the slot's crops and labels to the device in one copy, then the values."""
        slot.device.copy_(slot.host, non_blocking=True)
        data = self.transformer.device(slot.device_data, choices, self.mean, mirror=False)
        return self._sent(slot, data, records, index)

    def _sent(self, slot: _HostSlot, data: torch.Tensor, records: int, index: int) -> _Batch:
        """The batch whose values ``data`` the side stream is making: its labels' copy and
        the slot's event (the slot is refilled after it)."""
        label = slot.device_label.clone()
        slot.done.record(self._side)
        slot.used = True
        return _Batch(data, label, slot.done, records, index)

    # --- the consumer -------------------------------------------------------------------------
    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch: data (B, C, h, w) float32 and labels (B,) int64 on the device."""
        if self._loop is not None:
            return self._gathered()
        if self.thread is None:
            raise DataError(f"{self.records.path}: the data feed {self.name} has not "
                            "started; call ReaderPool.start() before the first forward")
        if self._may_gather:
            # The switch to the in-loop gather, once and mid-run: the first next() after the
            # reader has kept this stream's database decoded (a small database, once its first
            # pass is read: whatever iteration that is) stops this feed's thread, takes the
            # queue off the producer and from then on makes each batch here, in the training
            # thread (_go_direct). The batches and the saved positions are the thread's, bit
            # for bit; what changes is who runs: no feed thread, no producer reads for this
            # replica, and on CUDA the batches are made on the compute stream.
            view = self.records.decoded()
            if view is not None:
                if self._small or resides(view, self.transformer, self.device):
                    self._go_direct(view)
                    return self._gathered()
                self._may_gather = False  # a big batch, a database kept on the host: the thread's
        item = self._take()
        if isinstance(item, _Failure):
            self._ready.put(item)  # every next() after a failure raises the same error
            raise item.error
        if item.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.ready)
            item.data.record_stream(current)
            item.label.record_stream(current)
        self._free.put(item.slot)
        self.records.mark_consumed(item.records)
        self.delivered += 1
        return item.data, item.label

    # --- gathering in the training thread ----------------------------------------------------
    @property
    def gathers_in_loop(self) -> bool:
        """Whether batches are now gathered in the training thread (no feed thread)."""
        return self._loop is not None

    @property
    def gatherer(self) -> HostGather | None:
        """The in-loop gather once :attr:`gathers_in_loop` (its ``k``: batches per stage)."""
        return self._loop

    def _go_direct(self, view: DecodedView) -> None:
        """Stop the thread, take the queue off the producer, and gather from ``view`` (the
        stream's decoded database) from now on. What the thread assembled ahead is dropped:
        the positions count only what the loop took, so nothing is skipped or repeated."""
        self._halt = True
        self.records.detach()  # wakes the thread if it waits for records
        self._free.put(-1)  # ... or for a free slot
        assert self.thread is not None  # started: next() checks
        self.thread.join(JOIN_TIMEOUT_S)
        if self.thread.is_alive():
            raise DataError(f"{self.records.path}: the data feed {self.name} did not "
                            f"stop within {JOIN_TIMEOUT_S:.0f} s")
        while not self._ready.empty():
            item = self._ready.get_nowait()
            if isinstance(item, _Failure):  # it failed before it stopped: report that
                self._ready.put(item)
                raise item.error
        if self._cuda:  # the tensors the thread handed out were made on the side stream
            assert self._side is not None  # made by start() on CUDA
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            self._release_ring()  # the thread's (the pinned allocator waits for its copies)
        self._loop = loop_gather(view, self.batch_size, self.transformer, self.device,
                                 self.mean)

    def next_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch, made on ``device`` instead of this feed's (another replica computes
        it): where this feed gathers in the loop, gathered there from the decoded database
        (a gather of that device's, made once; nothing crosses between devices), else made
        here and copied."""
        device = _with_index(torch.device(device))
        if device == self.device:
            return self.next()
        if self._loop is None:   # on the thread (next() switches, or says it has not started)
            data, label = self.next()
            return data.to(device, non_blocking=True), label.to(device, non_blocking=True)
        gather = self._elsewhere.get(device)
        if gather is None:
            gather = self._elsewhere[device] = loop_gather(
                self._loop.view, self.batch_size, self.transformer, device,
                self.transformer.device_mean(device))
        data, label = gather.next(self.records.consumed)
        self.records.mark_consumed(self.batch_size)
        self.delivered += 1
        return data, label

    def _gathered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch from the decoded database, in this (the training) thread."""
        if self.stop.is_set():
            raise DataError(f"{self.records.path}: the data feed {self.name} "
                            "stopped (the data reader was closed)")
        records, loop = self.records, self._loop
        assert loop is not None  # next() calls this once the loop gathers
        data, label = loop.next(records.consumed)
        records.mark_consumed(self.batch_size)
        self.delivered += 1
        return data, label

    def _take(self) -> _Batch | _Failure:
        try:
            return self._ready.get_nowait()  # the usual case: the batch is waiting
        except queue.Empty:
            pass
        waited_since = time.monotonic()
        assert self.thread is not None  # started: next() checks
        while True:
            try:
                # nothing is taken yet: a stopping signal may cut a stalled wait short
                with interruptible():
                    return self._ready.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                pass
            if not self.thread.is_alive() and self._ready.empty():
                raise DataError(f"{self.records.path}: the data feed {self.name} "
                                "stopped (the data reader was closed)")
            if time.monotonic() - waited_since > STALL_TIMEOUT_S + 5 * WAIT_SLICE_S:
                raise DataError(f"{self.records.path}: no batch for the data feed "
                                f"{self.name} in {STALL_TIMEOUT_S:.0f} s")


def _with_index(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:<current>``: the feed thread sets its device, which needs an index."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
