"""Decode workers: threads that decode encoded images for the reader and the feeds, and copy
big raw records out of the database's map for the reader.

A caller hands :meth:`DecodeWorkers.run` a function over a range of records (decode records
``start .. stop-1`` into their rows of an output array) and the number of records; the range is
cut into contiguous parts, the threads run the parts, and ``run`` returns when all are done, so
the rows come out in record order whatever order the parts finish in. Several callers (the
producer, one feed per replica) may run at once: their parts share the threads.

Threads, not processes: PIL's JPEG and PNG decoders and numpy's copies release the GIL, so the
threads decode in parallel; the Python around each image (opening the file, the array
interface) holds it for about a fifth of a 256 x 256 JPEG's decode. With one worker nothing is
started and ``run`` decodes in the calling thread.
"""
from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ...errors import DataError

WAIT_SLICE_S = 0.2
"""A caller waiting for its parts looks for close() this often."""
JOIN_TIMEOUT_S = 10.0
MAX_AUTO_WORKERS = 4
"""The automatic worker count with PIL as the JPEG decoder is the usable cores less two (the
training loop and the reader threads), at least 1 and at most this: on a 16-core and a 64-core
machine PIL's threads peaked at 4 (decode and crop alone: 2,085 and 5,462 images/s) and fell
with more (16 threads: 1,379 and 2,762; docs/data_pipeline.md). PIL's decode releases the GIL;
the Python around each image holds it, and more threads contend for it."""
MAX_AUTO_LIBJPEG_WORKERS = 16
"""The same with torchvision's decoder (:mod:`.libjpeg`), which releases the GIL for the whole
decode: its threads scale further but stop near 8,000 images/s and fall with more (decode and
crop alone, 16-core H100 machine: 1 thread 1,486 images/s, 8 7,648, 12 8,420, 16 8,313; 64-core
machine: 16 threads 8,007, 32 6,553, 62 6,504)."""
PARTS_PER_WORKER = 2
"""A run is cut into up to this many parts per worker: images differ in size, and a worker
that finishes early takes another part."""
WORKERS_ENV = "CPY_DECODE_WORKERS"
GPU_ENV = "CPY_GPU_DECODE"
GPU_CHOICES = ("auto", "on", "off")
THREADS_OVER_NVJPEG = 8
"""With torchvision's CPU decoder on this many threads a feed or more, "auto" leaves nvJPEG out:
on a 16-core H100 machine training ResNet-50 (4,170 images/s with DummyData) 8, 11 and 14
threads fed 4,081-4,084 images/s, nvJPEG 3,432 (its per-image waits queue behind the training
kernels); 4 threads decode 3,981 images/s with nothing training, below the step's rate. Four
GPUs' feeds sharing 48 threads trained at 0.310 of DummyData, nvJPEG at 0.556."""
PROCESSES_ENV = "CPY_DECODE_PROCESSES"
PROCESS_CHOICES = ("auto", "on", "off")
PROCESSES_MIN_CORES = 10
"""With this many usable cores or more, "auto" decodes the feeds' image files in processes
(:mod:`.decode_processes`): threads stop near 3,000 (PIL) or 8,000 (torchvision) images/s
however many cores there are (docs/data_pipeline.md)."""
CPU_ENV = "CPY_CPU_DECODE"
CPU_CHOICES = ("auto", "torchvision", "pil")


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class DecodeOptions:
    """How encoded images (JPEG, PNG records) are decoded. The defaults are automatic; the
    command line reads them from the environment (:meth:`from_env`)."""

    workers: int | None = None
    """Decode threads shared by the reader and the feeds (None: the usable cores less two, at
    least 1 and at most 16 with torchvision's JPEG decoder, 4 with PIL's; 1 decodes in the
    reader's or feed's own thread), and the count of decode processes where they are used
    (:attr:`process_count`)."""
    gpu: str = "auto"
    """JPEG records on a CUDA feed: "auto" decodes them on the GPU (nvJPEG through
    torchvision.io.decode_jpeg) when torchvision is installed, unless the decode processes
    decode them, or torchvision's decoder on at least :data:`THREADS_OVER_NVJPEG` threads a
    feed (either is faster beside a training GPU); "on" requires nvJPEG, "off" decodes with
    the CPU workers."""
    cpu: str = "auto"
    """The CPU workers' JPEG decoder: "auto" is torchvision's (libjpeg-turbo, the GIL released
    for the whole decode) when torchvision is installed, else PIL's; "torchvision" requires
    it; "pil" always uses PIL. Other files (PNG) and unusual JPEGs (gray, CMYK) are PIL's."""

    processes: str = "auto"
    """Where the feeds' image files (a database too large to keep decoded) are decoded on the
    CPU: "on" in worker processes (:mod:`.decode_processes`: PIL, no GIL shared), "off" in the
    decode threads, "auto" in processes on machines of at least :data:`PROCESSES_MIN_CORES`
    usable cores. A database kept decoded is decoded by the threads either way (once)."""

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise DataError(f"decode workers must be >= 1, got {self.workers}; leave it unset "
                            "for the automatic count")
        if self.gpu not in GPU_CHOICES:
            raise DataError(f"GPU decode must be one of {', '.join(GPU_CHOICES)}, got "
                            f"{self.gpu!r}")
        if self.processes not in PROCESS_CHOICES:
            raise DataError(f"decode processes must be one of {', '.join(PROCESS_CHOICES)}, "
                            f"got {self.processes!r}")
        if self.cpu not in CPU_CHOICES:
            raise DataError(f"CPU decode must be one of {', '.join(CPU_CHOICES)}, got "
                            f"{self.cpu!r}")

    @property
    def threads(self) -> int:
        """The worker count, resolved."""
        if self.workers is not None:
            return self.workers
        from . import libjpeg

        most = (MAX_AUTO_LIBJPEG_WORKERS if self.cpu != "pil" and libjpeg.installed()
                else MAX_AUTO_WORKERS)
        return max(1, min(most, usable_cores() - 2))

    @property
    def use_processes(self) -> bool:
        """Whether the feeds decode in processes, resolved."""
        if self.processes == "auto":
            return usable_cores() >= PROCESSES_MIN_CORES
        return self.processes == "on"

    @property
    def process_count(self) -> int:
        """The decode processes: ``workers``, else the usable cores less two (the training
        loop and the feed and reader threads), at least 1."""
        return self.workers if self.workers is not None else max(1, usable_cores() - 2)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DecodeOptions:
        """``CPY_DECODE_WORKERS`` (a count, or "auto"), ``CPY_GPU_DECODE`` (auto, on, off),
        ``CPY_CPU_DECODE`` (auto, torchvision, pil) and ``CPY_DECODE_PROCESSES`` (auto, on,
        off); unset or empty: automatic."""
        text = environ.get(WORKERS_ENV, "").strip()
        workers = None
        if text and text != "auto":
            try:
                workers = int(text)
            except ValueError:
                workers = 0
            if workers < 1:
                raise DataError(f"{WORKERS_ENV}={text!r} is not a worker count; set a whole "
                                "number >= 1, or auto")
        allowed_of = {GPU_ENV: GPU_CHOICES, CPU_ENV: CPU_CHOICES,
                      PROCESSES_ENV: PROCESS_CHOICES}
        choices = {name: environ.get(name, "").strip().lower() or "auto" for name in allowed_of}
        for name, allowed in allowed_of.items():
            if choices[name] not in allowed:
                raise DataError(f"{name}={choices[name]!r} is not one of {', '.join(allowed)}; "
                                "unset it for auto")
        return cls(workers, choices[GPU_ENV], choices[CPU_ENV], choices[PROCESSES_ENV])


Part = Callable[[int, int], None]


class DecodeWorkers:
    """``count`` daemon threads running parts of decode runs (see the module docstring).
    ``name`` names the threads; ``start`` and ``close`` are the reader pool's to call."""

    def __init__(self, count: int, name: str = "decode"):
        self.count, self.name = count, name
        self.threads: list[threading.Thread] = []
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()

    def start(self) -> None:
        if self.threads or self.count <= 1:
            return
        self.threads = [threading.Thread(target=self._work, name=f"cpy-{self.name}:{i}",
                                         daemon=True) for i in range(self.count)]
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        """Stop and join the threads (idempotent); a waiting :meth:`run` raises."""
        self._stop.set()
        for _ in self.threads:
            self._tasks.put(None)
        for thread in self.threads:
            thread.join(JOIN_TIMEOUT_S)

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            part, start, stop, index, done = task
            try:
                part(start, stop)
                done.put((index, None))
            except BaseException as exc:  # noqa: BLE001 (handed to the caller, never lost)
                done.put((index, exc))

    def run(self, part: Part, n: int, *, where: str, parts: int | None = None) -> None:
        """``part(start, stop)`` over records 0 .. n-1, cut into parts run by the threads (at
        most ``parts`` of them; default :data:`PARTS_PER_WORKER` a thread); returns when every
        part is done. A failing part's error is raised (the first by record order when several
        fail: a :class:`DataError` as it is, anything else as one line naming ``where``) after
        the others have finished."""
        if self._stop.is_set():
            raise DataError(f"{where}: the decode workers were closed")
        most = PARTS_PER_WORKER * self.count if parts is None else parts
        if not self.threads or n <= 1 or most <= 1:
            _call(part, 0, n, where)
            return
        bounds = _cuts(n, min(n, most))
        done: queue.SimpleQueue = queue.SimpleQueue()
        for index, (start, stop) in enumerate(zip(bounds, bounds[1:], strict=False)):
            self._tasks.put((part, start, stop, index, done))
        errors = {}
        for _ in range(len(bounds) - 1):
            index, error = self._next_result(done, where)
            if error is not None:
                errors[index] = error
        if errors:
            raise as_data_error(errors[min(errors)], where)

    def _next_result(self, done: queue.SimpleQueue, where: str):
        while True:
            try:
                return done.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                pass
            if self._stop.is_set():
                raise DataError(f"{where}: the decode workers were closed")
            if not any(thread.is_alive() for thread in self.threads):
                raise DataError(f"{where}: the decode workers stopped")


def _cuts(n: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` contiguous parts of n records, sizes differing by at most 1."""
    return [n * i // parts for i in range(parts + 1)]


def _call(part: Part, start: int, stop: int, where: str) -> None:
    try:
        part(start, stop)
    except BaseException as exc:  # noqa: BLE001 (re-raised as one line)
        raise as_data_error(exc, where) from None


def as_data_error(exc: BaseException, where: str) -> BaseException:
    """A decoder's error as the one-line error the training loop raises (the decode threads'
    and the decode processes')."""
    if isinstance(exc, DataError | KeyboardInterrupt | SystemExit):
        return exc
    text = " ".join(str(exc).split())
    return DataError(f"{where}: decoding failed ({type(exc).__name__}: {text})")
