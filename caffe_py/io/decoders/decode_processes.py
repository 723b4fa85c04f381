"""Decode processes: the feeds' image files decoded and cropped in worker processes.

Threads share one GIL. However little of an image's decode holds it (PIL: opening the file
and the array interface; torchvision's decoder: the call and the crop's copy), every image
hands it over a few times, and the threads together stop near a rate set by those hand-overs,
not by the cores: measured on a 16- and a 64-core machine, PIL's threads reach about 3,000
256 x 256 JPEGs/s and torchvision's about 8,000, and both fall with more threads. One GPU
trains ResNet-50 at about 4,000-5,000 images/s; four need about 19,000. Processes do not share
a GIL, so they scale with the cores.

How a batch goes (:meth:`ProcessCrops.submit`, called by a feed thread): the feed cuts the
batch into parts (the processes over the feeds) and submits them. From an LMDB the reader left
the files in the database (:class:`~caffe_py.io.db.lmdb_store.StoredFiles`): a part carries its
records' keys and where each file lies in its record, and each process reads them itself
(through the environment fork copied, :func:`~caffe_py.io.db.lmdb_store.forked_environment`);
on a 64-core machine the training process's copies of every file, out of the map and into the
processes, held its GIL more than anything else. From other databases the feed writes the
batch's files end to end into its shared input buffer (:mod:`multiprocessing.shared_memory`)
first. Each process decodes its records with PIL (the reader's decoder: the same pixels, bit
for bit), or torchvision's JPEG decoder where the feed's threads would use it (the same pixels
in about two-thirds of the time), or takes a raw record's pixels as they are (big raw records of
an LMDB: the reader indexes them as it does stored files, and neither it nor the feed copies
a record), and writes each crop window, mirrored where the transform flips it and in Caffe's BGR
order, into the feed's shared output buffer; the feed waits for every part and copies the crops
into its batch slot. A feed keeps two batches in the processes (:data:`IN_FLIGHT`, each with
its own buffers): it submits the next batch before it waits for the last, so the processes
decode while it writes files and copies crops. Only a few numbers and names cross the pipes. A
part that fails raises its record's error in the feed (the first by record order), as the
threads do.

The processes are forked at the first batch (see :func:`_context`) and use only numpy, PIL,
lmdb, this package's decode modules and, for torchvision's decoder, the torch the fork copied
(one thread, no CUDA). They ignore SIGINT (the training process handles Ctrl-C
and closes the pool), and each one ends itself when the process that started it is gone. A
process that dies (out of memory, killed) stops the run with one line naming the database.
"""
from __future__ import annotations

import logging
import mmap
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import pairwise
from multiprocessing import shared_memory

import lmdb
import numpy as np

from ...errors import DataError
from ..db.lmdb_store import StoredFiles, begin, forked_environment, read_files
from .file_crops import PIL, crop_record
from .process_pool import WorkerPool
from .workers import JOIN_TIMEOUT_S, WAIT_SLICE_S, as_data_error

log = logging.getLogger(__name__)

PARENT_POLL_S = 1.0
"""How often a decode process checks that the process which started it is alive."""
SHM_DIR = "/dev/shm"
"""Where POSIX shared memory (multiprocessing.shared_memory) lives on Linux."""
IN_FLIGHT = 2
"""Batches a feed keeps in the decode processes at once (see :class:`ProcessCrops`)."""
ATTACHED_BUFFERS = 64
"""Shared buffers a decode process keeps mapped (per feed: its batch slots on CUDA, or two per
batch in flight; the oldest are let go)."""


@dataclass(frozen=True)
class Part:
    """Records ``start .. stop-1`` of a feed's batch, for one decode process."""

    files: str  # the feed's input buffer (files end to end; "": the files are stored)
    crops: str  # the feed's output buffer: (batch, C, h, w) uint8
    batch_shape: tuple[int, int, int, int]
    start: int
    stop: int
    bounds: tuple[int, ...]  # the part's files: bytes bounds[k] .. bounds[k+1] of the input
    keys: tuple[bytes, ...]
    offsets: tuple[tuple[int, int], ...]
    flips: tuple[bool, ...]
    path: str
    record_shape: tuple[int, int, int]
    color: bool | None
    stored: str | None = None  # the LMDB the files are read from by key (else: the input)
    spans: np.ndarray | None = None  # with stored: StoredFiles.spans of the part's records
    reads: str = PIL  # what the files are and what reads them (file_crops.crop_record)


class DecodeProcesses:
    """``count`` worker processes shared by a pool's feeds (started at the first batch)."""

    def __init__(self, count: int):
        self.count = count
        self.feeds = 0
        """The feeds sharing the processes (each cuts its batches into count // feeds parts:
        every process busy, no part waiting for one, and as few parts as that takes, since
        each costs the training process a pickle, a pipe's write and read, and a wake-up)."""
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def submit(self, part: Part, where: str) -> Future:
        with self._lock:
            if self._closed.is_set():
                raise DataError(f"{where}: the decode processes were closed")
            if self._pool is None:
                self._pool = self._start(where)
            pool = self._pool
        try:
            return pool.submit(_decode_part, part)
        except BrokenProcessPool as exc:
            raise _died(where, exc) from None

    def _start(self, where: str) -> WorkerPool:
        # The processes are forked here with SIGINT blocked, so that a Ctrl-C reaching the
        # process group while one is still starting (before _process_start ignores it) is
        # discarded there instead of killing it (a broken pool).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return WorkerPool(self.count, _context(), _process_start, (os.getpid(),))
        except OSError as exc:  # the fork failed (memory, process limits)
            raise DataError(f"{where}: cannot start {self.count} decode processes "
                            f"({exc.strerror or exc}); set CPY_DECODE_WORKERS lower, or "
                            "CPY_DECODE_PROCESSES=off") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def wait(self, futures: list[Future], where: str) -> None:
        """Every part's end; the first failing part's error (by record order) is raised after
        the others have finished."""
        errors: dict[int, BaseException] = {}
        for index, future in enumerate(futures):
            while True:
                if self._closed.is_set():
                    raise DataError(f"{where}: the decode processes were closed")
                try:
                    future.result(timeout=WAIT_SLICE_S)
                except FutureTimeout:
                    continue
                except BrokenProcessPool as exc:
                    errors[index] = _died(where, exc)
                except BaseException as exc:  # noqa: BLE001 (the part's own error)
                    errors[index] = exc
                break
        if errors:
            raise as_data_error(errors[min(errors)], where)

    def close(self) -> None:
        """Stop the processes (idempotent); a waiting feed raises. A process stuck in a decode
        is killed after a while."""
        with self._lock:
            self._closed.set()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(JOIN_TIMEOUT_S)


class NoSharedMemory(DataError):
    """The shared-memory file system cannot hold a feed's buffers."""


def _context():
    """fork, as torch's DataLoader starts its workers: a decode process runs only the loop
    that decodes parts (never CUDA, never the training process's threads, which fork does not
    copy), and fork imports nothing again (spawn and forkserver import the program's main
    module in each process, which runs a script without a ``__main__`` guard again)."""
    return multiprocessing.get_context("fork")


def _died(where: str, exc: BaseException) -> DataError:
    return DataError(f"{where}: a decode process died ({' '.join(str(exc).split())}); see the "
                     "log for what killed it (memory?), or set CPY_DECODE_PROCESSES=off")


class ProcessCrops:
    """One feed's side of the decode processes: its shared buffers and its batches' parts.

    A feed keeps up to :data:`IN_FLIGHT` batches in the processes (:meth:`submit`, then
    :meth:`InFlight.wait` in submission order), each with its own pair of buffers: while the
    feed writes the next batch's files and copies the last one's crops, the processes decode.
    A submit while every pair is busy first collects the oldest batch into its ``out``."""

    def __init__(self, processes: DecodeProcesses, path: str,
                 record_shape: tuple[int, int, int], color: bool | None, reads: str = PIL):
        self.processes, self.path = processes, path
        self.record_shape, self.color = record_shape, color
        self.reads = reads
        """What the files are and what reads them (:func:`~.file_crops.crop_record`)."""
        processes.feeds += 1
        self._counted = True  # in processes.feeds, until close()
        self._buffers: list[dict[str, shared_memory.SharedMemory]] = [
            {} for _ in range(IN_FLIGHT)]
        """Per batch in flight: "files" (the batch's files end to end) and "crops"
        ((B, C, h, w) uint8)."""
        self._turn = 0  # the buffer pair the next batch takes
        self.depth = IN_FLIGHT
        """Batches kept in flight (1 where shared memory holds only one pair of buffers)."""
        self._flying: list[InFlight] = []  # submitted, not yet waited for (oldest first)
        self.seconds = {"send": 0.0, "wait": 0.0, "copy": 0.0}
        """Where the feed thread's time went, summed over :attr:`batches`: writing the files
        and submitting the parts, waiting for them, copying the crops out (for benchmarks)."""
        self.batches = 0

    def submit(self, files, keys, offsets: list, flips: list, out: np.ndarray,
               shared: str | None = None) -> InFlight:
        """Start decoding ``files`` (image files, or :class:`StoredFiles` the processes read
        themselves) into ``out`` (B, C, h, w) uint8, each record's crop window at ``offsets``
        (y, x), mirrored where ``flips``; the batch is in ``out`` after
        :meth:`InFlight.wait`. ``shared``: the name of the buffer (:func:`shared_buffer`)
        that ``out`` starts at: the processes write the crops there, and nothing is copied
        out. Raises :class:`NoSharedMemory` (nothing submitted) where the buffers cannot be
        made."""
        if len(self._flying) >= self.depth:  # every pair of buffers is busy: the oldest first
            self.collect(self._flying[0])
        started = time.perf_counter()
        n = len(files)
        stored = files if isinstance(files, StoredFiles) else None
        if stored is None:  # the files end to end into the input buffer
            sums = np.zeros(n + 1, np.int64)
            np.cumsum([len(f) for f in files], out=sums[1:])
            marks = sums.tolist()
            inputs, crops_buffer = self._pair(marks[-1], out.nbytes if shared is None else None)
            assert inputs is not None and inputs.buf is not None  # asked for; created
            into = inputs.buf
            for file, at, end in zip(files, marks, marks[1:], strict=False):
                into[at:end] = file
        else:  # each process reads its records from the database
            marks, keys = [], stored.keys
            inputs, crops_buffer = self._pair(None, out.nbytes if shared is None else None)
        # every feed's parts at once find a process each: with more parts than processes
        # (ceil), the parts left over run after a whole part's time, doubling their batch's wait
        count = max(1, min(n, self.processes.count // max(1, self.processes.feeds)))
        cuts = [n * i // count for i in range(count + 1)] if n else [0]
        shape = tuple(out.shape)
        crops = shared if crops_buffer is None else crops_buffer.name
        assert crops is not None  # a buffer was asked for where none was given
        futures = [self.processes.submit(Part(
            inputs.name if inputs is not None else "", crops, shape, a, b,
            tuple(marks[a:b + 1]), tuple(keys[a:b]), tuple(tuple(o) for o in offsets[a:b]),
            tuple(flips[a:b]), self.path, self.record_shape, self.color,
            stored.database if stored is not None else None,
            stored.spans[a:b] if stored is not None else None, self.reads), self.path)
            for a, b in zip(cuts, cuts[1:], strict=False)]
        self._turn = (self._turn + 1) % self.depth
        flight = InFlight(self, futures, crops_buffer, out)
        self._flying.append(flight)
        self.seconds["send"] += time.perf_counter() - started
        return flight

    def _pair(self, files_size: int | None, crops_size: int | None
              ) -> tuple[shared_memory.SharedMemory | None, shared_memory.SharedMemory | None]:
        """The next batch's buffers (pair :attr:`_turn`), grown where too small (``files_size``
        None: no input buffer, the files are read from the database; ``crops_size`` None: no
        output buffer, the crops go straight into the feed's). Where shared memory holds
        the first pair but not the second, the feed goes on with one batch in flight (one log
        line); where it cannot hold the first, :class:`NoSharedMemory`."""
        turn = self._turn
        try:
            return self._grown_pair(turn, files_size, crops_size)
        except NoSharedMemory as exc:
            if turn == 0:
                raise
            self._release_pair(turn)
            self.depth, self._turn = 1, 0
            log.warning("%s; this feed keeps one batch in the decode processes instead of %d "
                        "(give it more room, e.g. docker run --shm-size=1g)", exc, IN_FLIGHT)
            self.collect_all()  # their buffers are the ones the next batch takes
            return self._grown_pair(0, files_size, crops_size)

    def _grown_pair(self, turn: int, files_size: int | None, crops_size: int | None
                    ) -> tuple[shared_memory.SharedMemory | None,
                               shared_memory.SharedMemory | None]:
        files = self._grown(turn, "files", files_size) if files_size is not None else None
        crops = self._grown(turn, "crops", crops_size) if crops_size is not None else None
        return files, crops

    def summary(self) -> str:
        """Where the feed thread's time went per batch (:attr:`seconds`), in one line."""
        each = {k: 1e3 * v / max(1, self.batches) for k, v in self.seconds.items()}
        return (f"{self.batches} batches; per batch: write files and submit "
                f"{each['send']:.1f} ms, wait for the processes {each['wait']:.1f} ms, copy "
                f"the crops out {each['copy']:.1f} ms")

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet waited for (or cancelled)."""
        return len(self._flying)

    def collect(self, flight: InFlight) -> None:
        """Wait for every part of ``flight`` and copy its crops into its ``out``; the first
        failing part's error (by record order) is raised after the others have finished.
        Once: a later call returns at once, or raises the same error."""
        if flight.error is not None:
            raise flight.error
        if flight.done:
            return
        if flight not in self._flying:
            raise RuntimeError(f"{self.path}: a decode batch was waited for after it was "
                               "cancelled")
        self._flying.remove(flight)
        started = time.perf_counter()
        try:
            self.processes.wait(flight.futures, self.path)
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            self.seconds["wait"] += time.perf_counter() - started
        if flight.crops is not None:  # the crops are in the processes' buffer: copied out
            waited = time.perf_counter()
            crops = np.ndarray(flight.out.shape, np.uint8, buffer=flight.crops.buf)
            flight.out[...] = crops
            del crops
            self.seconds["copy"] += time.perf_counter() - waited
        self.batches += 1
        flight.done = True

    def collect_all(self) -> None:
        """:meth:`collect` every batch in flight, oldest first."""
        while self._flying:
            self.collect(self._flying[0])

    def drop(self, flight: InFlight) -> None:
        """Forget ``flight``: its parts not yet started are cancelled (the running ones finish
        into buffers no one reads)."""
        if flight in self._flying:
            self._flying.remove(flight)
            for future in flight.futures:
                future.cancel()

    def _grown(self, turn: int, kind: str, size: int) -> shared_memory.SharedMemory:
        """The ``kind`` buffer of pair ``turn``, made anew half as large again as ``size``
        where it is too small, its pages reserved: a shared-memory file system too small for it
        (a container's 64 MB /dev/shm) is a :class:`NoSharedMemory` error here, not a SIGBUS
        at the first write."""
        buffers = self._buffers[turn]
        buffer = buffers.get(kind)
        if buffer is not None and buffer.size >= size:
            return buffer
        if buffer is not None:
            release(buffers.pop(kind))
        created = shared_buffer(max(1, size + size // 2), self.path)
        buffers[kind] = created
        return created

    def close(self) -> None:
        """Let go of the buffers: batches still in flight are cancelled (their parts that
        are running finish into buffers no one reads)."""
        for flight in list(self._flying):
            self.drop(flight)
        if self._counted:
            self._counted = False
            self.processes.feeds -= 1
        for turn in range(IN_FLIGHT):
            self._release_pair(turn)

    def _release_pair(self, turn: int) -> None:
        buffers = self._buffers[turn]
        while buffers:
            release(buffers.popitem()[1])


class InFlight:
    """A batch submitted to the decode processes (:meth:`ProcessCrops.submit`): ``wait()``
    puts its crops in ``out`` (once; copied out of ``crops``, unless they were written into
    ``out``'s own shared buffer), ``cancel()`` drops it."""

    def __init__(self, owner: ProcessCrops, futures: list[Future],
                 crops: shared_memory.SharedMemory | None, out: np.ndarray):
        self.owner, self.futures, self.crops, self.out = owner, futures, crops, out
        self.done = False
        """Whether the crops are in ``out``."""
        self.error: BaseException | None = None
        """The error waiting for the batch raised (raised again by a later wait)."""

    def wait(self) -> None:
        self.owner.collect(self)

    def cancel(self) -> None:
        self.owner.drop(self)


def shared_buffer(size: int, where: str) -> shared_memory.SharedMemory:
    """A new shared buffer of ``size`` bytes the decode processes can write into, its pages
    reserved: a shared-memory file system too small for it (a container's 64 MB /dev/shm) is
    a :class:`NoSharedMemory` error here (naming ``where``), not a SIGBUS at the first write.
    Its owner lets go of it with :func:`release`."""
    created = None
    try:
        created = shared_memory.SharedMemory(create=True, size=size)
        fd = os.open(_path(created.name), os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError as exc:
        if created is not None:
            release(created)
        raise NoSharedMemory(
            f"{where}: the decode processes need {_mb(size)} of shared memory for a batch "
            f"and {SHM_DIR} cannot hold it ({exc.strerror}; {_mb(_free(SHM_DIR))} free)"
        ) from None
    return created


def release(buffer: shared_memory.SharedMemory) -> None:
    """Unmap and remove a buffer of :func:`shared_buffer`. A view of it that lives on (in a
    traceback) keeps it mapped until that goes; its name is removed at once."""
    try:
        buffer.close()
    except BufferError:
        pass
    buffer.unlink()


def _free(path: str) -> int:
    try:
        stat = os.statvfs(path)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


def _mb(size: int) -> str:
    return f"{size / 2**20:,.0f} MB"


# --- in a decode process ----------------------------------------------------------------------
_attached: OrderedDict[str, mmap.mmap] = OrderedDict()
_transactions: dict[str, lmdb.Transaction] = {}


def _process_start(parent: int) -> None:
    """A decode process: Ctrl-C is the parent's to handle, SIGTERM ends it (not the training
    process's handler, which fork copied); exit when the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the fork's caller
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch = sys.modules.get("torch")  # fork copied it (torchvision's decoder runs here)
    if torch is not None:
        torch.set_num_threads(1)  # no OpenMP team of the parent's in a fork

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)  # an orphan: nothing of its own to save

    threading.Thread(target=watch, name="cpy-decode-parent", daemon=True).start()


def _buffer(name: str) -> mmap.mmap:
    """A feed's shared buffer, mapped. Opened as a file of /dev/shm, not through
    SharedMemory: that registers each buffer with multiprocessing's resource tracker under a
    lock, which another thread of the training process may have held when this process was
    forked (a copy of a held lock never opens)."""
    buffer = _attached.get(name)
    if buffer is None:
        # a feed makes a buffer anew when a batch outgrows it and unlinks the old one: its
        # pages stay in use while mapped here, so those are let go first
        gone = [old for old in _attached if not os.path.exists(_path(old))]
        while gone or len(_attached) >= ATTACHED_BUFFERS:
            unmapped = _attached.pop(gone.pop()) if gone else _attached.popitem(last=False)[1]
            try:
                unmapped.close()
            except BufferError:  # an array of it lives on in a traceback: unmapped with it
                pass
        fd = os.open(_path(name), os.O_RDWR)
        try:
            buffer = _attached[name] = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
    else:
        _attached.move_to_end(name)
    return buffer


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name.lstrip("/"))


def _transaction(source: str) -> lmdb.Transaction:
    """This process's read transaction of the LMDB ``source``: begun at its first part and
    never ended (the process's end ends it). Each transaction takes a reader slot in lock.mdb,
    and py-lmdb never frees the slot of one ended in a forked process through the environment
    fork copied: a transaction per part would fill the table within seconds (MDB_READERS_FULL).
    The slot carries the training process's pid, and is freed when that process closes the
    database (LMDB frees every slot of its pid then), or ends.
    It sees the database as it was at this process's first part, as the training process's
    reader sees it as it was at its start; a record gone since, or of another size, is refused
    (:func:`~caffe_py.io.db.lmdb_store.read_files`)."""
    txn = _transactions.get(source)
    if txn is None:
        txn = _transactions[source] = begin(forked_environment(source), buffers=True)
    return txn


def _decode_part(part: Part) -> None:
    crops = np.ndarray(part.batch_shape, np.uint8, buffer=_buffer(part.crops))
    if part.stored is None:
        inputs = _buffer(part.files)
        _decode_files(part, crops, (inputs[a:b] for a, b in pairwise(part.bounds)))
        return
    assert part.spans is not None  # given with stored
    try:
        txn = _transaction(part.stored)
        _decode_files(part, crops, read_files(txn, part.stored, part.keys, part.spans))
    except lmdb.Error as exc:
        raise DataError(f"{part.stored}: cannot read the database in a decode process "
                        f"({' '.join(str(exc).split())}); set CPY_DECODE_PROCESSES=off") from None


def _decode_files(part: Part, crops: np.ndarray, files: Iterable[bytes | memoryview]) -> None:
    for k, (i, file) in enumerate(zip(range(part.start, part.stop), files, strict=True)):
        crop_record(part.path, part.record_shape, part.color, part.reads, file, part.keys[k],
                    crops[i], part.offsets[k], part.flips[k])
