"""Caffe rc3's DataReader: one producer thread per database, records handed round-robin.

A *stream* is one Data layer (phase, layer name) read by every replica that attached it. The
stream has its own read position; record ``g`` of the stream (counted from its origin, wrapping
at the end of the database) goes to replica ``g % N``, so replica i of N gets records i, i+N,
i+2N, ... and one iteration of N replicas of batch B reads exactly the next N x B records.
A pool can also serve a slice of a larger round-robin (several hosts, one pool each):
``ReaderPool(replicas=n, replica_offset=k, total_replicas=G)`` holds global replicas k .. k+n-1
of G; record g goes to global replica ``g % G``, and records of the other pools' replicas are
read and skipped (never queued, and not decoded unless the database is cached), so the G
replicas of all pools together get exactly what one pool of G replicas hands out.

One thread per database serves every stream of that database: it reads the LMDB in key order a
chunk at a time, decodes the chunk (raw records by a few numpy operations for the whole chunk)
and appends each replica's rows of it (i, i+N, ...) to that replica's bounded queue, under one
lock (one queue per (stream, replica), holding ``prefetch x batch_size`` records). A database
small enough is kept decoded after the first pass, and later passes hand out views of it:
nothing per record runs in Python, which would take the GIL from a launch-bound training
loop. Two Data layers that
read the same database in one net (a data layer and a label-only one, say) are two streams with
two read positions, so each sees exactly the sequence it would see reading the database alone,
and a slow one never blocks the other.

The read positions that :meth:`ReaderPool.state` saves count what the training loop has
consumed (not what the threads have read ahead), so :meth:`ReaderPool.load_state` resumes the
exact record sequence.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import lmdb
import numpy as np
import torch

from ..errors import DataError
from ..spec.net_spec import TransformationParameter
from .datum import decode_record, format_key
from .lmdb_store import acquire_readonly, open_db, release_readonly
from .raw_records import raw_chunk, raw_prefix
from .transformer import record_array

WAIT_SLICE_S = 0.2
"""Every blocking wait sleeps at most this long before it checks for errors and stop."""
STALL_TIMEOUT_S = 60.0
"""A consumer that gets no record for this long raises instead of hanging."""
JOIN_TIMEOUT_S = 10.0
CHUNK = 256
"""The most records the producer reads and hands over at once (one lock, one notify)."""
CHUNK_BYTES = 8 << 20
"""...and the most bytes: big records go over in smaller chunks."""
CACHE_BYTES = 1 << 30
"""A stream whose decoded database fits in this many bytes keeps it in memory after the
first pass: later passes hand over views of it, with no read, decode or copy per record."""


@dataclass
class Record:
    """One decoded record: its position in the stream, key, pixels (C, H, W) and label."""

    position: int
    key: bytes
    array: np.ndarray
    label: int


@dataclass
class RecordBatch:
    """Records of one replica in stream order: positions first, first + step, ... (one per
    replica of the round-robin), pixels (n, C, H, W) and labels (n,) int64. The arrays may be
    read-only views of the bytes read from the database: copy before writing."""

    first: int
    step: int
    pixels: np.ndarray
    labels: np.ndarray
    keys: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.first, self.first + self.step * len(self), self.step)

    def split(self, n: int) -> tuple[RecordBatch, RecordBatch]:
        """The first ``n`` records and the rest (views, no copy)."""
        return (RecordBatch(self.first, self.step, self.pixels[:n], self.labels[:n],
                            self.keys[:n]),
                RecordBatch(self.first + self.step * n, self.step, self.pixels[n:],
                            self.labels[n:], self.keys[n:]))


class Detached(Exception):
    """Raised in a feed thread waiting on a queue its feed has taken off the producer (the
    feed now gathers its batches from the decoded database in the training thread)."""


def _join(parts: list[RecordBatch]) -> RecordBatch:
    if len(parts) == 1:
        return parts[0]
    return RecordBatch(parts[0].first, parts[0].step,
                       np.concatenate([p.pixels for p in parts]),
                       np.concatenate([p.labels for p in parts]),
                       tuple(k for p in parts for k in p.keys))


class RecordQueue:
    """A bounded queue of records for one (stream, replica); the consumer side. It holds the
    producer's chunks whole, so handing over a batch is a few operations, not one per record."""

    def __init__(self, source: _Source, stream: _Stream, capacity: int, replica: int = 0):
        self.source, self.stream, self.capacity = source, stream, capacity
        self.replica = replica
        self.detached = False
        """Set (under the lock) once the feed gathers its own batches from the stream's
        decoded database: the producer then reads nothing more for this queue."""
        self.chunks: deque[RecordBatch] = deque()
        self.count = 0
        """Records queued (the producer adds, the consumer takes, both under the lock)."""
        self.consumed = 0
        """Records handed to the training loop (advanced by :meth:`mark_consumed`)."""
        self.wake_room = max(1, capacity // 2)
        """The producer is woken once this much room is free (it reads in bigger chunks,
        and wakes, taking the GIL, half as often); otherwise it looks every WAIT_SLICE_S."""

    def __len__(self) -> int:
        return self.count

    def get_batch(self, n: int, timeout: float = STALL_TIMEOUT_S) -> RecordBatch:
        """The next ``n`` records, waiting for the producer (at most ``timeout`` s idle)."""
        parts: list[RecordBatch] = []
        need = n
        cond = self.source.cond
        idle_since = time.monotonic()
        with cond:
            while need:
                if self.chunks:
                    while self.chunks and need:
                        chunk = self.chunks.popleft()
                        if len(chunk) > need:
                            chunk, rest = chunk.split(need)
                            self.chunks.appendleft(rest)
                        parts.append(chunk)
                        need -= len(chunk)
                        self.count -= len(chunk)
                    if self.capacity - self.count >= self.wake_room:
                        cond.notify_all()  # room for the producer
                    idle_since = time.monotonic()
                    continue
                if self.detached:
                    raise Detached(self.stream.name)
                self.source.raise_if_failed()
                if time.monotonic() - idle_since > timeout:
                    raise DataError(f"{self.source.path}: no record arrived for {timeout:.0f} s "
                                    f"(stream {self.stream.name}); another replica may have "
                                    "stopped reading")
                cond.wait(WAIT_SLICE_S)
        return _join(parts)

    def get(self, n: int, timeout: float = STALL_TIMEOUT_S) -> list[Record]:
        """The next ``n`` records one by one (tests and tools; the feed uses get_batch)."""
        batch = self.get_batch(n, timeout)
        return [Record(int(p), k, a, int(label)) for p, k, a, label in
                zip(batch.positions, batch.keys, batch.pixels, batch.labels, strict=True)]

    def mark_consumed(self, n: int) -> None:
        self.consumed += n

    def detach(self) -> None:
        """Take this queue off the producer (see :attr:`detached`) and wake its waiters."""
        with self.source.cond:
            self.detached = True
            self.source.cond.notify_all()


@dataclass
class _Stream:
    """One Data layer's read position over a database, shared by its replicas."""

    name: str
    color: bool | None
    record_shape: tuple[int, int, int]
    dtype: np.dtype
    queues: dict[int, RecordQueue] = field(default_factory=dict)  # replica -> queue
    origin: int = 0  # database index of stream position 0
    starts: list[int] = field(default_factory=list)  # per replica slot: first position to send
    position: int = 0  # the next position the producer reads
    cursor: Any = None
    cache: _Cache | None = None

    order: list[int] = field(default_factory=list)  # the replicas, in round-robin order
    offset: int = 0  # the global round-robin slot of local slot 0 (several pools)
    total: int = 0  # slots of the whole round-robin (0: this pool's replicas only)
    raw_prefix: np.ndarray | None = None  # what every raw record of record_shape starts with
    size: int = 0  # values per record, C x H x W

    def __post_init__(self) -> None:
        c, h, w = self.record_shape
        self.size = c * h * w

    @property
    def step(self) -> int:
        """Records between two of one replica's records: every pool's replicas together."""
        return self.total or len(self.order)

    def first_index(self, slot: int, position: int) -> int:
        """How far after ``position`` the first record replica slot ``slot`` takes lies."""
        n = self.step
        j = (self.offset + slot - position) % n
        if position + j < self.starts[slot]:  # before this replica's start (a resume)
            j += -(-(self.starts[slot] - position - j) // n) * n
        return j

    def wanted(self, position: int, count: int) -> np.ndarray:
        """Which of the ``count`` records from ``position`` on this pool's replicas take."""
        mask = np.zeros(count, bool)
        for slot in range(len(self.order)):
            mask[self.first_index(slot, position)::self.step] = True
        return mask

    def readable(self, limit: int) -> int:
        """How many records from ``position`` on can be read now: up to the first one whose
        queue is full (records before a replica's start take no room, nor do other pools'
        records, which are skipped, nor do detached queues'), at most ``limit``; 0 once every
        queue is detached."""
        n, attached = self.step, False
        for slot, replica in enumerate(self.order):
            queue = self.queues[replica]
            if queue.detached:
                continue
            attached = True
            limit = min(limit, self.first_index(slot, self.position)
                        + n * (queue.capacity - queue.count))
        return limit if attached else 0

    @property
    def detached(self) -> bool:
        """Every replica's feed gathers its own batches: nothing is left to read."""
        return all(queue.detached for queue in self.queues.values())

    def state(self) -> dict[str, Any]:
        """Global positions: ``next[s]`` is the next record of global replica offset + s of
        ``replicas`` (``offset`` only saved when this pool is a slice of a larger round-robin)."""
        n = self.total or len(self.queues)
        starts = self.starts or [self.offset + s for s in range(len(self.queues))]
        nxt = [starts[s] + n * self.queues[r].consumed for s, r in enumerate(sorted(self.queues))]
        out: dict[str, Any] = {"replicas": n, "origin": self.origin, "next": nxt}
        if self.offset or len(nxt) != n:
            out["offset"] = self.offset
        return out


class _Cache:
    """Every record of a small database, decoded (pixels (n, C, H, W), labels (n,), keys),
    filled by the stream's first pass in key order and complete after it."""

    def __init__(self, size: int, shape: tuple[int, int, int], dtype: np.dtype):
        self.pixels = np.empty((size, *shape), dtype)
        self.labels = np.empty(size, np.int64)
        self.keys: list[bytes] = [b""] * size
        self.size, self.stored = size, 0

    @property
    def complete(self) -> bool:
        return self.stored >= self.size

    def store(self, index: int, keys: Sequence[bytes], pixels: np.ndarray,
              labels: np.ndarray) -> None:
        """Records ``index`` .. of the database (each stored once: the first pass is
        sequential)."""
        end = index + len(labels)
        self.pixels[index:end] = pixels
        self.labels[index:end] = labels
        self.keys[index:end] = keys[:len(labels)]
        self.stored += len(labels)


class _Source:
    """One database and its producer thread, serving every stream that reads it."""

    def __init__(self, path: str, stop: threading.Event):
        self.path = path
        self.stop = stop
        self.cond = threading.Condition()
        self.streams: dict[str, _Stream] = {}
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.env: lmdb.Environment | None = None
        self.size = 0

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.stop.is_set():
            raise DataError(f"{self.path}: the data reader was closed")
        if self.thread is not None and not self.thread.is_alive():
            raise DataError(f"{self.path}: the reading thread stopped")

    # --- the producer -------------------------------------------------------------------------
    def start(self) -> None:
        db = open_db(self.path)  # a missing or corrupt database fails here, in the caller
        self.size = len(db)
        db.close()
        if self.size == 0:
            raise DataError(f"{self.path}: the database is empty; convert the data again")
        self.env = acquire_readonly(self.path)
        self.thread = threading.Thread(target=self._run, name=f"cpy-reader:{self.path}",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        txn = self.env.begin(buffers=False)
        try:
            for stream in self.streams.values():
                if self.size * stream.size * stream.dtype.itemsize <= CACHE_BYTES:
                    stream.cache = _Cache(self.size, stream.record_shape, stream.dtype)
                stream.cursor = txn.cursor()
                self._seek(stream, (stream.origin + min(stream.starts)) % self.size)
                stream.position = min(stream.starts)
            self._produce()
        except BaseException as exc:  # noqa: BLE001 (handed to the consumers, never lost)
            with self.cond:
                self.error = exc if isinstance(exc, DataError) else DataError(
                    f"{self.path}: reading failed ({type(exc).__name__}: {exc})")
                self.cond.notify_all()
        finally:
            for stream in self.streams.values():
                stream.cursor = stream.cache = None
            txn.abort()
            release_readonly(self.env)

    def _seek(self, stream: _Stream, index: int) -> None:
        """Put the stream's cursor on the database's ``index``-th record (keys only)."""
        cursor = stream.cursor
        cursor.first()
        for _ in range(index):
            if not cursor.next():
                cursor.first()

    def _produce(self) -> None:
        streams = list(self.streams.values())
        limits = [max(1, min(CHUNK, CHUNK_BYTES // max(1, st.size * st.dtype.itemsize)))
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
                    self.cond.wait(WAIT_SLICE_S)
                    continue
            turn = (k + 1) % len(streams)
            self._read_chunk(streams[k], count)

    def _read_chunk(self, stream: _Stream, count: int) -> None:
        """Read ``count`` records of one stream (fewer at the end of the database), decode
        them and hand each replica its share under one lock (records read before a failing
        one are still delivered)."""
        index = (stream.origin + stream.position) % self.size
        count = min(count, self.size - index)
        cache, error = stream.cache, None
        if cache is not None and cache.complete:  # views: nothing per record
            keys = cache.keys[index:index + count]
            pixels, labels = cache.pixels[index:index + count], cache.labels[index:index + count]
        else:
            items = list(islice(stream.cursor.iternext(), count))  # leaves the cursor on the last
            if not stream.cursor.next():
                stream.cursor.first()  # the end of the database: wrap to the first record
            keys, values = zip(*items, strict=True)
            # a slice of a larger round-robin decodes only its own records, unless it keeps
            # the whole database decoded (the cache): the other hosts decode theirs
            wanted = stream.wanted(stream.position, len(values)) if (
                cache is None and stream.total) else None
            try:
                pixels, labels = self._decode(stream, keys, values, wanted)
            except _Partial as partial:
                (pixels, labels), error = partial.done, partial.error
            if cache is not None:
                cache.store(index, keys, pixels, labels)
        done = len(labels)
        first, n = stream.position, stream.step
        with self.cond:
            for slot, replica in enumerate(stream.order):
                j = stream.first_index(slot, first)
                queue = stream.queues[replica]
                if j < done and not queue.detached:
                    part = RecordBatch(first + j, n, pixels[j::n], labels[j::n], keys[j:done:n])
                    queue.chunks.append(part)
                    queue.count += len(part)
            stream.position += done
            self.cond.notify_all()
        if error is not None:
            raise error

    def _decode(self, stream: _Stream, keys: Sequence[bytes], values: Sequence[bytes],
                wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pixels (k, C, H, W) and labels (k,) of raw records, in as few numpy operations
        as the chunk allows; other records go one by one through the full decoder, only those
        ``wanted`` (when given; the rows of the others are left undefined)."""
        fast = None if stream.raw_prefix is None else raw_chunk(values, stream.raw_prefix,
                                                                   stream.record_shape)
        if fast is not None and fast[2] is None:
            return fast[0], fast[1]
        pixels = np.empty((len(values), *stream.record_shape), stream.dtype)
        labels = np.empty(len(values), np.int64)
        ok = np.zeros(len(values), bool)
        if fast is not None:
            pixels[...], labels[...], ok = fast
        for i in np.flatnonzero(~ok if wanted is None else ~ok & wanted).tolist():
            try:
                pixels[i], labels[i] = self._decode_one(stream, keys[i], values[i])
            except DataError as exc:
                raise _Partial((pixels[:i], labels[:i]), exc) from None
        return pixels, labels

    def _decode_one(self, stream: _Stream, key: bytes, value: bytes) -> tuple[np.ndarray, int]:
        datum = decode_record(value, source=self.path, key=key)
        try:
            array = record_array(datum, _color_param(stream.color))
        except DataError as exc:
            raise DataError(f"{self.path}: record {format_key(key)}: {exc}") from None
        if tuple(array.shape) != stream.record_shape or array.dtype != stream.dtype:
            raise DataError(f"{self.path}: record {format_key(key)} is {_describe(array)} but "
                            f"the first record is {_describe_shape(stream)}; a Data layer "
                            "needs records of one size and kind (resize when converting)")
        return array, int(datum.label)


class _Partial(Exception):
    """A chunk decoded up to a failing record: what was decoded, and the error."""

    def __init__(self, done: tuple[np.ndarray, np.ndarray], error: DataError):
        super().__init__(str(error))
        self.done, self.error = done, error


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype} {list(array.shape)}"


def _describe_shape(stream: _Stream) -> str:
    return f"{stream.dtype} {list(stream.record_shape)}"


def _color_param(color: bool | None) -> TransformationParameter:
    return TransformationParameter(force_color=color is True, force_gray=color is False)


class ReaderPool:
    """Readers for every Data layer of N replicas' nets; see the module docstring.

    ``attach`` every replica's net, optionally ``load_state``, then ``start``; ``close`` (or
    leaving the ``with`` block) stops and joins every thread.
    """

    def __init__(self, replicas: int = 1, *, replica_offset: int = 0,
                 total_replicas: int | None = None):
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
        self._stop = threading.Event()
        self._sources: dict[str, _Source] = {}
        self._feeds: list[Any] = []
        self._started = False
        self._closed = False
        _open_pools.add(self)

    # --- wiring -------------------------------------------------------------------------------
    def subscribe(self, source: str, stream: str, *, replica: int, batch_size: int,
                  prefetch: int, record_shape: Sequence[int], dtype: Any = np.uint8,
                  color: bool | None = None, rand_skip: int = 0, seed: int = 0) -> RecordQueue:
        """The record queue of ``replica`` for ``stream`` (a layer) over database ``source``."""
        if self._started:
            raise DataError(f"{source}: cannot attach a reader after the pool has started")
        if not 0 <= replica < self.replicas:
            raise ValueError(f"replica {replica} is outside 0..{self.replicas - 1}")
        src = self._sources.setdefault(source, _Source(source, self._stop))
        st = src.streams.get(stream)
        if st is None:
            st = src.streams[stream] = _Stream(stream, color, tuple(record_shape), np.dtype(dtype),
                                               offset=self.replica_offset)
            if rand_skip:  # Caffe skips up to rand_skip records once at the start
                st.origin = int(np.random.default_rng(seed).integers(0, rand_skip + 1))
        if replica in st.queues:
            raise DataError(f"{source}: stream {stream} already has replica {replica} attached")
        queue = RecordQueue(src, st, capacity=prefetch * batch_size, replica=replica)
        st.queues[replica] = queue
        return queue

    def attach(self, net: Any, *, replica: int = 0, device: str | torch.device = "cpu",
               seed: int = 0) -> list[Any]:
        """Attach a feed to every Data layer of ``net`` (``net.data_layers()``)."""
        return [self.attach_layer(layer, replica=replica, device=device, seed=seed)
                for layer in net.data_layers()]

    def attach_layer(self, layer: Any, *, replica: int = 0, device: str | torch.device = "cpu",
                     seed: int = 0) -> Any:
        """Attach a feed (a :class:`~caffe_py.io.prefetch.Prefetcher`) to one Data layer."""
        from .prefetch import Prefetcher
        from .transformer import Transformer

        dp, tp = layer.param("data_param"), layer.transform
        stream = f"{layer.phase}/{layer.name}"
        queue = self.subscribe(dp.source, stream, replica=replica, batch_size=dp.batch_size,
                               prefetch=dp.prefetch, record_shape=layer.record_shape,
                               dtype=layer.record_dtype, color=layer.color,
                               rand_skip=dp.rand_skip, seed=seed)
        where = f"layer '{layer.name}' ({dp.source}): "
        transformer = Transformer(tp, layer.phase, layer.record_shape, seed=seed, where=where)
        feed = Prefetcher(queue, transformer, dp.batch_size, device=torch.device(device),
                          name=f"{stream}#{replica}")
        layer.attach(feed)
        self._feeds.append(feed)
        return feed

    # --- state --------------------------------------------------------------------------------
    def state(self) -> dict[str, dict[str, Any]]:
        """Read positions, ``{source: {stream: {"replicas", "origin", "next": [...]}}}``:
        plain ints, for the solver state."""
        return {path: {name: st.state() for name, st in src.streams.items()}
                for path, src in self._sources.items()}

    def load_state(self, state: dict[str, dict[str, Any]]) -> None:
        """Resume from :meth:`state`'s output; call after attaching, before :meth:`start`."""
        if self._started:
            raise DataError("load the data reader state before the readers start")
        for path, streams in state.items():
            src = self._sources.get(path)
            for name, saved in streams.items():
                st = src.streams.get(name) if src else None
                if st is None:
                    raise DataError(f"{path}: the saved data state has stream {name}, which no "
                                    "attached Data layer reads; resume with the same nets")
                _restore(st, saved, path, self.total_replicas)

    # --- lifetime -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            for src in self._sources.values():
                for st in src.streams.values():
                    st.order = sorted(st.queues)
                    if self.total_replicas != self.replicas:
                        if len(st.order) != self.replicas:
                            raise DataError(
                                f"{src.path}: stream {st.name} has {len(st.order)} of this "
                                f"pool's {self.replicas} replicas attached; a slice of a larger "
                                "round-robin needs all of them (the others would block)")
                        st.total = self.total_replicas
                    if not st.starts:
                        st.starts = [st.offset + s for s in range(len(st.queues))]
                    if st.dtype == np.uint8:
                        st.raw_prefix = raw_prefix(st.record_shape)
                src.start()
            for feed in self._feeds:
                feed.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop and join every thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for feed in self._feeds:
            feed.close()
        for src in self._sources.values():
            with src.cond:
                src.cond.notify_all()
            if src.thread is not None:
                src.thread.join(JOIN_TIMEOUT_S)
        _open_pools.discard(self)

    def __enter__(self) -> ReaderPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def threads(self) -> Iterator[threading.Thread]:
        """Every thread this pool started (for tests and diagnostics)."""
        for src in self._sources.values():
            if src.thread is not None:
                yield src.thread
        for feed in self._feeds:
            if feed.thread is not None:
                yield feed.thread


def _restore(st: _Stream, saved: dict[str, Any], path: str, total: int) -> None:
    """Positions from a saved state; ``total`` is this pool's whole round-robin."""
    n, saved_n = len(st.queues), int(saved["replicas"])
    nxt = [int(v) for v in saved["next"]]
    saved_offset = int(saved.get("offset", 0))
    lo = st.offset - saved_offset
    if saved_n == total and 0 <= lo and lo + n <= len(nxt):  # the same round-robin: our slice
        st.origin, st.starts = int(saved["origin"]), nxt[lo:lo + n]
        return
    consumed = {(p - saved_offset - slot) // saved_n for slot, p in enumerate(nxt)}
    if len(consumed) != 1:
        raise DataError(f"{path}: the saved data state of {st.name} is for {saved_n} replicas "
                        f"that had read unequal amounts, and this run has {total}; resume "
                        f"with {saved_n} devices")
    # Every replica read ``reads`` records (replicas run in lockstep, so one pool's slice
    # stands for all of them): everything before position saved_n x reads was read.
    reads = consumed.pop()
    if saved_n == total:  # the same round-robin, another pool's slice: positions stay global
        st.origin = int(saved["origin"])
        st.starts = [st.offset + s + total * reads for s in range(n)]
        return
    # another replica count: continue from there with the new round-robin
    st.origin = int(saved["origin"]) + saved_n * reads
    st.starts = [st.offset + s for s in range(n)]


_open_pools: weakref.WeakSet[ReaderPool] = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    """Stop readers left open at exit (e.g. after Ctrl-C) before the interpreter tears down."""
    for pool in list(_open_pools):
        pool.close()
