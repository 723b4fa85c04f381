"""Caffe rc3's DataReader: one producer thread per database, records handed round-robin.

A *stream* is one Data layer (phase, layer name) read by every replica that subscribed to it.
The stream has its own read position; which replica gets which record, and where a resumed run
goes on, is :mod:`.roundrobin`'s arithmetic (replica i of N gets records i, i+N, ...; a pool may
hold a slice of a larger round-robin, one pool per host: records of the other pools' replicas
are read and skipped, never queued, and not decoded unless the database is cached).

One thread per database serves every stream of that database: it reads the LMDB in key order a
chunk at a time, decodes the chunk (:mod:`.decode`) and appends each replica's rows of it to that
replica's bounded :class:`RecordQueue`, under one lock. A small database is kept decoded after
the first pass, and later passes hand out views of it: nothing per record runs in Python, which
would take the GIL from a launch-bound training loop. Two Data layers that read one database are
two streams with two read positions: each sees what it would see reading the database alone.

Encoded records (JPEG, PNG files) are decoded by the pool's decode workers
(:mod:`~caffe_py.io.decoders.workers`), in order: in the chunk, for a database the reader keeps
decoded; otherwise the chunk goes over as the records' image files and each replica's feed decodes
its own share (on its GPU, or with the workers), so the queues, the round-robin and the state do not
change.

A consumer (a feed) uses its queue only through :meth:`RecordQueue.get_batch`,
:meth:`~RecordQueue.mark_consumed`, :meth:`~RecordQueue.detach` and
:meth:`~RecordQueue.decoded`. The positions :meth:`ReaderPool.state_dict` saves count what the
consumers marked consumed (not what the threads read ahead), so
:meth:`ReaderPool.load_state_dict` resumes the exact record sequence.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...errors import DataError
from ...interrupts import interruptible
from ..db.db import Database, PartialChunk, open_db
from ..decoders.decode_processes import DecodeProcesses
from ..decoders.workers import DecodeOptions, DecodeWorkers
from .decode import ChunkDecoder
from .records import (
    STORED_INDEX_RECORDS,
    DecodedDatabase,
    DecodedView,
    FeedSpec,
    ImageFiles,
    RecordBatch,
    StoredFiles,
    StoredIndex,
    join,
)
from .roundrobin import RoundRobin, resume

log = logging.getLogger(__name__)

WAIT_SLICE_S = 0.2
"""Every blocking wait sleeps at most this long before it checks for errors and stop."""
STALL_TIMEOUT_S = 60.0
"""A consumer that gets no record for this long raises instead of hanging."""
JOIN_TIMEOUT_S = 10.0
STUCK_JOIN_S = 0.5
CHUNK = 256
"""The most records the producer reads and hands over at once (one lock, one notify)."""
CHUNK_BYTES = 8 << 20
"""...and the most bytes: big records go over in smaller chunks."""
CACHE_BYTES = 1 << 30
"""A stream whose decoded database fits in this many bytes keeps it in memory after the
first pass: later passes hand over views of it, with no read, decode or copy per record."""


class Detached(Exception):
    """Raised to a consumer waiting on a queue it has taken off the producer (its feed now
    gathers batches from the decoded database in the training thread)."""


class Managed(Protocol):
    """What :meth:`ReaderPool.manage` starts and stops with the readers (a feed)."""

    thread: threading.Thread | None
    def start(self) -> None: ...
    def close(self) -> None: ...


class RecordQueue:
    """The bounded queue of records of one (stream, replica): the consumer's handle. It holds
    the producer's chunks whole, so handing over a batch is a few operations, not one per
    record. ``path``, ``name``, ``record_shape`` (C, H, W), ``dtype`` and ``capacity`` describe
    it; ``consumed`` counts the records marked consumed."""

    def __init__(self, source: _Source, stream: _Stream, capacity: int, replica: int):
        self._source, self._stream = source, stream
        self.path, self.name, self.replica = source.path, stream.name, replica
        self.record_shape = stream.decoder.record_shape
        self.dtype = stream.decoder.dtype
        self.capacity = capacity
        self.consumed = 0
        """Records handed to the training loop (advanced by :meth:`mark_consumed`)."""
        self._slot = 0  # this replica's slot of the stream's round-robin (set at start)
        self._detached = False  # set under the lock: the producer reads nothing more for it
        self._chunks: deque[RecordBatch] = deque()
        self._count = 0  # records queued (the producer adds, the consumer takes; the lock)
        # The producer is woken once this much room is free (it reads in bigger chunks, and
        # wakes, taking the GIL, half as often); otherwise it looks every WAIT_SLICE_S.
        self._wake_room = max(1, capacity // 2)

    def __len__(self) -> int:
        return self._count

    def get_batch(self, n: int, timeout: float = STALL_TIMEOUT_S) -> RecordBatch:
        """The next ``n`` records, waiting for the producer (at most ``timeout`` s idle)."""
        return join(self.get_runs(n, timeout))

    def get_runs(self, n: int, timeout: float = STALL_TIMEOUT_S) -> list[RecordBatch]:
        """The next ``n`` records as the runs the producer delivered them in (consecutive,
        together ``n``; no copy), waiting as :meth:`get_batch` does."""
        parts: list[RecordBatch] = []
        need = n
        cond = self._source.cond
        idle_since = time.monotonic()
        # nothing is taken until every record is there: a stopping signal may cut the wait
        with interruptible(), cond:
            while need:
                if self._chunks:
                    while self._chunks and need:
                        chunk = self._chunks.popleft()
                        if len(chunk) > need:
                            chunk, rest = chunk.split(need)
                            self._chunks.appendleft(rest)
                        parts.append(chunk)
                        need -= len(chunk)
                        self._count -= len(chunk)
                    if self.capacity - self._count >= self._wake_room:
                        cond.notify_all()  # room for the producer
                    idle_since = time.monotonic()
                    continue
                if self._detached:
                    raise Detached(self.name)
                self._source.raise_if_failed()
                if time.monotonic() - idle_since > timeout:
                    raise DataError(self._stalled(timeout))
                cond.wait(WAIT_SLICE_S)
        return parts

    def _stalled(self, timeout: float) -> str:
        """The watchdog's line: what the reader is stuck reading, or why it reads nothing."""
        where = f"{self.path}: no record arrived for {timeout:.0f} s (stream {self.name})"
        busy = self._source.busy()
        if busy is not None:
            what, seconds = busy
            return (f"{where}: the reader has been reading {what} for {seconds:.0f} s; a file "
                    "that never answers (a hung network file system, a FIFO): check it")
        if len(self._stream.slots) > 1:
            return f"{where}; another replica may have stopped reading"
        return f"{where}; the reader stopped"

    def mark_consumed(self, n: int) -> None:
        """``n`` more records reached the training loop (what the saved state counts)."""
        self.consumed += n

    def detach(self) -> None:
        """Take this queue off the producer: it reads nothing more for it, and a waiting
        :meth:`get_batch` raises :class:`Detached`."""
        with self._source.cond:
            self._detached = True
            self._source.cond.notify_all()

    def decoded(self) -> DecodedView | None:
        """The stream's database, decoded, with this replica's place in it, once the reader
        keeps it whole (a small database after its first pass); None until then."""
        stream = self._stream
        cache, plan = stream.cache, stream.plan
        if cache is None or not cache.complete or plan is None:
            return None
        return DecodedView(cache.pixels, cache.labels, stream.origin, plan.starts[self._slot],
                           plan.total, plan.unit)

    @property
    def leaves_raw(self) -> bool:
        """Whether this stream's raw records may go over as files (known at subscription:
        big raw records and decode processes); :attr:`raw_files` says whether they do."""
        return bool(getattr(self._stream.decoder, "leaves_raw", False))

    @property
    def raw_files(self) -> bool:
        """Whether the reader hands this stream's raw records over as files, for the decode
        processes to crop (a big LMDB's big records; fixed by :meth:`ReaderPool.start`,
        before the feeds start)."""
        return bool(getattr(self._stream.decoder, "raw_files", False))

    @property
    def hands_files(self) -> bool:
        """Whether the reader hands this stream's records over as image files (encoded records
        of a database too big to keep decoded) or raw files (:attr:`raw_files`); fixed by
        :meth:`ReaderPool.start`, before the feeds start."""
        decoder = self._stream.decoder
        return self.raw_files or bool(getattr(decoder, "encoded", False)
                                      and getattr(decoder, "keep_encoded", False))

    @property
    def next_position(self) -> int:
        """The stream position of the next record this replica takes (after
        :meth:`ReaderPool.start`)."""
        plan = self._stream.plan
        if plan is None:
            raise DataError(f"{self.path}: the data readers have not started")
        return plan.position(self._slot, self.consumed)


@dataclass
class _Stream:
    """One Data layer's read position over a database, shared by its replicas."""

    name: str
    decoder: ChunkDecoder
    opener: Callable[[], Database]  # opens the stream's database (the source's path)
    queues: dict[int, RecordQueue] = field(default_factory=dict)  # replica -> queue
    origin: int = 0  # database index of stream position 0
    starts: tuple[int, ...] | None = None  # restored first positions (None: a fresh start)
    plan: RoundRobin | None = None  # the round-robin, fixed at start
    slots: list[RecordQueue] = field(default_factory=list)  # the queues in round-robin order
    sliced: bool = False  # a slice of a larger round-robin (several pools)
    unit: int = 1  # records a replica takes in a turn (1, or a batch: roundrobin.py)
    position: int = 0  # the next position the producer reads
    database: Database | None = None  # open from start() until the producer ends
    cursor: Any = None
    cache: DecodedDatabase | None = None
    stored: StoredIndex | None = None  # where the files left in an LMDB lie (later passes)

    @property
    def detached(self) -> bool:
        """Every replica's feed gathers its own batches: nothing is left to read."""
        return all(queue._detached for queue in self.slots)

    def readable(self, limit: int) -> int:
        """How many records from ``position`` on fit in the queues now (at most ``limit``)."""
        rooms = [None if q._detached else q.capacity - q._count for q in self.slots]
        assert self.plan is not None  # fixed by ReaderPool.start, before the producer starts
        return self.plan.readable(self.position, rooms, limit)


class _Source:
    """One database and its producer thread, serving every stream that reads it."""

    def __init__(self, path: str, stop: threading.Event):
        self.path = path
        self.stop = stop
        self.cond = threading.Condition()
        self.streams: dict[str, _Stream] = {}
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.size = 0
        self.idle = 0  # times the producer found nothing to read (under the lock)
        self.settling = 0  # callers of settle() waiting
        self.settled: dict[str, int] = {}  # the positions at the last idle look, if settling
        self._reading: tuple[_Stream, int, float] | None = None  # (stream, index, since)

    def busy(self) -> tuple[str, float] | None:
        """What the producer is reading now, in words, and for how long (None: not reading).
        A decoder that reads files names the file (``reading``)."""
        reading = self._reading
        if reading is None:
            return None
        stream, index, since = reading
        file = getattr(stream.decoder, "reading", None)
        what = str(file) if file else f"record {index} of {self.path}"
        return what, time.monotonic() - since

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.stop.is_set():
            raise DataError(f"{self.path}: the data reader was closed")
        if self.thread is not None and not self.thread.is_alive():
            raise DataError(f"{self.path}: the reading thread stopped")

    def settle(self, timeout: float) -> dict[str, int]:
        """Wait until the producer finds nothing to read (every queue full or detached);
        the streams' read positions then."""
        deadline = time.monotonic() + timeout
        with self.cond:
            self.settling += 1
            try:
                target = self.idle + 1  # a look that began after this call
                assert self.thread is not None  # started: ReaderPool.settle checks
                while self.idle < target:
                    if not self.thread.is_alive():  # every queue detached, or a failure
                        if self.error is not None or self.stop.is_set():
                            self.raise_if_failed()
                        return {name: st.position for name, st in self.streams.items()}
                    if time.monotonic() > deadline:
                        raise DataError(f"{self.path}: the reader did not come to rest "
                                        f"within {timeout:.0f} s")
                    self.cond.wait(WAIT_SLICE_S)
                return dict(self.settled)
            finally:
                self.settling -= 1

    # --- the producer -------------------------------------------------------------------------
    def start(self) -> None:
        try:  # a missing, corrupt or empty database fails here, in the caller
            sizes = set()
            for stream in self.streams.values():
                stream.database = database = stream.opener()
                sizes.add(len(database))
        except BaseException:
            self.close_databases()
            raise
        self.size = sizes.pop()
        if sizes:
            self.close_databases()
            raise DataError(f"{self.path}: its readers see different record counts; read one "
                            "source with one kind of layer")
        if self.size == 0:
            self.close_databases()
            raise DataError(f"{self.path}: the database is empty; convert the data again")
        for stream in self.streams.values():
            self._settle_hand_over(stream)
        self.thread = threading.Thread(target=self._run, name=f"cpy-reader:{self.path}",
                                       daemon=True)
        self.thread.start()

    def _settle_hand_over(self, stream: _Stream) -> None:
        """How the stream's records go over, fixed before its feeds start (each sets itself up
        for it):

        - decoded, and from a copy kept after the first pass where every pass is the same and
          the database is small;
        - else encoded records as their image files, left in an LMDB for the decode processes
          to read by key where those decode them;
        - big raw records of such an LMDB the same way, for the processes to crop;
        - files left in an LMDB are indexed by the first pass where every pass is the same."""
        decoder, database = stream.decoder, stream.database
        assert database is not None  # opened by start()
        if database.fixed_order and self.size * decoder.record_bytes <= CACHE_BYTES:
            stream.cache = DecodedDatabase(self.size, decoder.record_shape, decoder.dtype)
        leaves = getattr(database, "rereadable", False) and stream.cache is None
        if getattr(decoder, "encoded", False):
            decoder.keep_encoded = stream.cache is None
            if leaves and getattr(decoder, "leave_files", False):
                decoder.stored_in = database.source
        elif leaves and getattr(decoder, "leaves_raw", False):
            decoder.raw_files = True
            decoder.stored_in = database.source
            log.info("%s: its raw records are read and cropped by the decode processes (the "
                     "database is too big to keep decoded)", self.path)
        if getattr(decoder, "stored_in", None) and database.fixed_order and \
                not stream.sliced and self.size <= STORED_INDEX_RECORDS:
            stream.stored = StoredIndex(self.size, database.source)

    def close_databases(self) -> None:
        """Close every stream's cursor and database (idempotent)."""
        for stream in self.streams.values():
            if stream.cursor is not None:
                stream.cursor.close()
            if stream.database is not None:
                stream.database.close()
            stream.cursor = stream.cache = stream.database = stream.stored = None

    def _run(self) -> None:
        try:
            for stream in self.streams.values():
                plan, database = stream.plan, stream.database
                assert database is not None  # opened by start()
                assert plan is not None  # fixed by ReaderPool.start
                stream.cursor = database.cursor()
                stream.position = min(plan.starts)
                stream.cursor.seek(stream.origin + stream.position)
            self._produce()
        except BaseException as exc:  # noqa: BLE001 (handed to the consumers, never lost)
            with self.cond:
                self.error = exc if isinstance(exc, DataError) else DataError(
                    f"{self.path}: reading failed ({type(exc).__name__}: {exc})")
                self.cond.notify_all()
        finally:
            self.close_databases()

    def _produce(self) -> None:
        streams = list(self.streams.values())
        limits = [max(1, min(CHUNK, CHUNK_BYTES // max(1, st.decoder.record_bytes)))
                  for st in streams]
        turn = 0
        while not self.stop.is_set():
            with self.cond:
                for i in range(len(streams)):  # from ``turn``, in rotation
                    k = (turn + i) % len(streams)
                    count = streams[k].readable(limits[k])
                    if count:
                        break
                else:
                    if all(st.detached for st in streams):
                        return  # every feed gathers from the decoded database: never wake
                    self._idle()
                    self.cond.wait(WAIT_SLICE_S)
                    continue
            turn = (k + 1) % len(streams)
            self._read_chunk(streams[k], count)

    def _idle(self) -> None:
        """Count a look that found nothing to read; tell settle() (under the lock)."""
        self.idle += 1
        if self.settling:
            self.settled = {name: st.position for name, st in self.streams.items()}
            self.cond.notify_all()

    def _read_chunk(self, stream: _Stream, count: int) -> None:
        """Read ``count`` records of one stream (fewer at the end of the database), decode
        them and hand each replica its share (records read before a failing one are still
        delivered)."""
        index = (stream.origin + stream.position) % self.size
        count = min(count, self.size - index)
        cache, stored, error, plan = stream.cache, stream.stored, None, stream.plan
        assert plan is not None  # fixed by ReaderPool.start, before the producer starts
        rows: np.ndarray | ImageFiles | StoredFiles
        if cache is not None and cache.complete:  # views: nothing per record
            keys = cache.keys[index:index + count]
            rows, labels = cache.pixels[index:index + count], cache.labels[index:index + count]
        elif stored is not None and stored.complete:  # where the files lie: no record read
            keys = stored.keys[index:index + count]
            rows, labels = stored.files(index, count), stored.labels[index:index + count]
        else:
            self._reading = (stream, index, time.monotonic())
            try:
                keys, values = stream.cursor.read(count)  # wraps after the last record
                if not getattr(stream.decoder, "takes_views", False):  # copies of map views
                    values = [bytes(v) if isinstance(v, memoryview) else v for v in values]
                # a slice of a larger round-robin decodes only its own records, unless it
                # keeps the whole database decoded (the cache): the other hosts decode theirs
                wanted = plan.wanted(stream.position, len(values)) if (
                    cache is None and stream.sliced) else None
                try:
                    rows, labels = stream.decoder.decode(keys, values, wanted)
                except PartialChunk as partial:
                    (rows, labels), error = partial.done, partial.error
            finally:
                self._reading = None
            if cache is not None and isinstance(rows, np.ndarray):  # (files: never kept)
                cache.store(index, keys, rows, labels)
            elif stored is not None:
                if error is None and isinstance(rows, StoredFiles) and len(rows) == count:
                    stored.store(index, rows, labels)
                else:  # a run of another field layout, or a failure: later passes read too
                    stream.stored = None
        self._deliver(stream, keys, rows, labels)
        if error is not None:
            raise error

    def _deliver(self, stream: _Stream, keys: Sequence[bytes],
                 rows: np.ndarray | ImageFiles | StoredFiles, labels: np.ndarray) -> None:
        """Append each replica's rows of a decoded chunk (pixels, or image files) to its
        queue: one lock, one notify."""
        done, first, plan = len(labels), stream.position, stream.plan
        assert plan is not None  # fixed by ReaderPool.start, before the producer starts
        with self.cond:
            for slot, queue in enumerate(stream.slots):
                if queue._detached:
                    continue
                for run in plan.runs(slot, first, done):
                    part = RecordBatch.of(first + run.start, plan.step, rows[run],
                                          labels[run], tuple(keys[run]))
                    queue._chunks.append(part)
                    queue._count += len(part)
            stream.position += done
            self.cond.notify_all()


class ReaderPool:
    """Readers for the Data layers of N replicas' nets; see the module docstring.

    ``subscribe`` every (layer, replica) (:func:`caffe_py.io.attach_feeds` does, and hands the
    feeds it builds to :meth:`manage`), optionally ``load_state_dict``, then ``start``;
    ``close`` (or leaving the ``with`` block) stops and joins every thread. ``decode`` says
    how encoded images are decoded (default: :meth:`DecodeOptions.from_env`, automatic).
    """

    def __init__(self, replicas: int = 1, *, replica_offset: int = 0,
                 total_replicas: int | None = None, decode: DecodeOptions | None = None):
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        total = replicas if total_replicas is None else total_replicas
        if replica_offset < 0 or replica_offset + replicas > total:
            raise ValueError(f"replicas {replica_offset}..{replica_offset + replicas - 1} do not "
                             f"fit in total_replicas {total}")
        self.replicas = replicas
        self.replica_offset = replica_offset
        self.total_replicas = total
        """Global replica ``replica_offset + i`` of ``total_replicas`` is local replica i."""
        self._sliced = total != replicas  # a slice of a larger round-robin (one pool per host)
        self._stop = threading.Event()
        self.decode = decode if decode is not None else DecodeOptions.from_env()
        self.workers = DecodeWorkers(self.decode.threads)
        """The worker threads every stream's reader and feeds share: they decode encoded
        records and copy big raw ones (started only when a stream reads such records)."""
        self.processes = (DecodeProcesses(self.decode.process_count)
                          if self.decode.use_processes else None)
        """The decode processes the feeds share for image files (started at the first batch
        of image files; None: the threads decode them)."""
        self._sources: dict[str, _Source] = {}
        self._clients: list[Managed] = []
        self._started = False
        self._closed = False
        _open_pools.add(self)

    # --- wiring -------------------------------------------------------------------------------
    def subscribe(self, spec: FeedSpec, stream: str, *, replica: int,
                  seed: int = 0, by_batch: bool = False) -> RecordQueue:
        """The record queue of ``replica`` for ``stream`` (a layer) over the database
        ``spec.source``, holding ``spec.prefetch`` x ``spec.batch_size`` records. The stream's
        first subscriber fixes its records' shape, dtype, color and whether they are
        ``encoded`` image files, and (seeded by ``seed``) where ``rand_skip`` starts it; also
        how its database opens (``spec.opener``, default: ``source`` as an LMDB of Datum
        records) and what decodes its records (``spec.decoder`` makes one; default: a
        :class:`~.decode.ChunkDecoder` of Datum records), and whether its replicas take the
        records in turns of a whole batch (``by_batch``: a test pass split over the
        replicas, each batch the one a single replica reads there) instead of Caffe's turns
        of one record."""
        source = spec.source
        unit = spec.batch_size if by_batch else 1
        if self._started:
            raise DataError(f"{source}: cannot attach a reader after the pool has started")
        if not 0 <= replica < self.replicas:
            raise ValueError(f"replica {replica} is outside 0..{self.replicas - 1}")
        src = self._sources.setdefault(source, _Source(source, self._stop))
        st = src.streams.get(stream)
        if st is None:
            made = spec.decoder() if spec.decoder is not None else ChunkDecoder(
                source, spec.record_shape, np.dtype(spec.dtype), spec.color,
                encoded=spec.encoded, workers=self.workers,
                leave_files=self.processes is not None and self.decode.gpu != "on",
                raw_processes=self.processes is not None)
            if by_batch and self._sliced:
                raise ValueError("turns of a batch need the whole round-robin in one pool")
            st = src.streams[stream] = _Stream(
                stream, made, spec.opener or (lambda: open_db(source)), sliced=self._sliced,
                unit=unit)
            if spec.rand_skip:  # Caffe skips up to rand_skip records once at the start
                st.origin = int(np.random.default_rng(seed).integers(0, spec.rand_skip + 1))
        if replica in st.queues:
            raise DataError(f"{source}: stream {stream} already has replica {replica} attached")
        if st.unit != unit:
            raise ValueError(f"stream {stream}: every replica takes the same turns")
        queue = st.queues[replica] = RecordQueue(src, st, spec.prefetch * spec.batch_size,
                                                 replica)
        return queue

    def manage(self, client: Managed) -> None:
        """Start ``client`` (a feed of this pool's queues) after the readers, close it with
        them, and list its thread in :meth:`threads`."""
        if self._started:
            raise DataError("cannot add a data feed after the pool has started")
        self._clients.append(client)

    def _plan(self, st: _Stream) -> RoundRobin:
        """The stream's round-robin: this pool's slice of all replicas, or (one pool) the
        replicas that subscribed to it."""
        total = self.total_replicas if st.sliced else len(st.queues)
        starts = st.starts
        if starts is None:
            return RoundRobin.fresh(len(st.queues), offset=self.replica_offset, total=total,
                                    unit=st.unit)
        return RoundRobin(total, self.replica_offset, starts, st.unit)

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Read positions, ``{source: {stream: {"replicas", "origin", "next": [...]}}}``
        (:mod:`.roundrobin`): plain ints, for the solver state."""
        return {path: {name: self._state(st) for name, st in src.streams.items()}
                for path, src in self._sources.items()}

    def _state(self, st: _Stream) -> dict[str, Any]:
        plan = st.plan or self._plan(st)
        return plan.state(st.origin, [st.queues[r].consumed for r in sorted(st.queues)])

    def load_state_dict(self, state: dict[str, dict[str, Any]]) -> None:
        """Resume from :meth:`state_dict`'s output; call after subscribing, before
        :meth:`start`."""
        if self._started:
            raise DataError("load the data reader state before the readers start")
        for path, streams in state.items():
            src = self._sources.get(path) or self._moved(path, streams)
            for name, saved in streams.items():
                st = src.streams.get(name) if src else None
                if st is None:
                    raise DataError(f"{path}: the saved data state has stream {name}, which no "
                                    "attached Data layer reads; resume with the same nets")
                st.origin, st.starts = resume(
                    saved, slots=len(st.queues), offset=self.replica_offset,
                    total=self.total_replicas if st.sliced else len(st.queues),
                    where=f"{path}: the saved data state of {name}", unit=st.unit)

    def _moved(self, path: str, streams: dict[str, Any]) -> _Source | None:
        """The source a saved state's ``path`` stands for when no layer reads that path any
        more (the run's folder moved, or was copied): the one source of the same file name
        whose streams (layers) are the saved ones; None when there is not exactly one."""
        name = os.path.basename(os.path.normpath(path))
        found = [src for p, src in self._sources.items()
                 if os.path.basename(os.path.normpath(p)) == name and set(streams) <= set(
                     src.streams)]
        return found[0] if len(found) == 1 else None

    # --- lifetime -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            if any(getattr(st.decoder, "uses_workers", False) for src in self._sources.values()
                   for st in src.streams.values()):
                self.workers.start()
            for src in self._sources.values():
                for st in src.streams.values():
                    self._fix_round_robin(src, st)
                src.start()
            for client in self._clients:
                client.start()
        except BaseException:
            self.close()
            raise

    def _fix_round_robin(self, src: _Source, st: _Stream) -> None:
        if st.sliced and len(st.queues) != self.replicas:
            raise DataError(f"{src.path}: stream {st.name} has {len(st.queues)} of this pool's "
                            f"{self.replicas} replicas attached; a slice of a larger "
                            "round-robin needs all of them (the others would block)")
        st.plan = self._plan(st)
        st.slots = [st.queues[r] for r in sorted(st.queues)]
        for slot, queue in enumerate(st.slots):
            queue._slot = slot

    def settle(self, timeout: float = STALL_TIMEOUT_S) -> dict[str, dict[str, int]]:
        """Wait until every producer has read all it may for now (each queue full, or
        detached), at most ``timeout`` s; the read positions then, ``{source: {stream: p}}``
        (for tests and benchmarks: a deterministic point to look at the queues)."""
        if not self._started:
            raise DataError("start the data readers before waiting for them")
        return {path: src.settle(timeout) for path, src in self._sources.items()}

    def close(self) -> None:
        """Stop and join every thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for client in self._clients:
            client.close()
        for src in self._sources.values():
            with src.cond:
                src.cond.notify_all()
            if src.thread is not None:
                # a producer stuck in a read that never answers (it was the watchdog's, or a
                # signal's, reason to stop) is left to end with the process
                busy = src.busy()
                src.thread.join(STUCK_JOIN_S if busy and busy[1] > 1.0 else JOIN_TIMEOUT_S)
            else:
                src.close_databases()  # opened by a start() that failed on another source
        self.workers.close()
        if self.processes is not None:
            self.processes.close()
        _open_pools.discard(self)

    def __enter__(self) -> ReaderPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def threads(self) -> Iterator[threading.Thread]:
        """Every thread this pool and its feeds started (for tests and diagnostics)."""
        for src in self._sources.values():
            if src.thread is not None:
                yield src.thread
        for client in self._clients:
            if client.thread is not None:
                yield client.thread
        yield from self.workers.threads


_open_pools: weakref.WeakSet[ReaderPool] = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    """Stop readers left open at exit (e.g. after Ctrl-C) before the interpreter tears down."""
    for pool in list(_open_pools):
        pool.close()
