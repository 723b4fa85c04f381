"""Several calls into the driver at once: every replica's graph launch from a thread of its own.

Launching a whole-iteration CUDA graph keeps the calling thread in the driver for about 0.8 ms
(ResNet-50: thousands of nodes). Issued one after another from the root's thread, the replicas'
launches reached their GPUs one after another too: on 4 x H100 each GPU idled before its graph
0.08, 0.36, 0.66 and 0.95 ms an iteration, in launch order, and the early GPUs waited for the
late ones at the first all-reduce (docs/parallel.md, "Where the N-GPU iteration's time goes").
Launched from a thread each, the GPUs start together: on 2 x H200 GPU 1's idle before its graph
fell from 0.36-0.56 to 0.08 ms an iteration. The host gains nothing it needs (it runs replays
ahead and waits for the device either way); the GPUs do.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor


class Launchers:
    """Runs a list of calls at once and returns when all have returned: the first in the
    caller's thread, each other on a worker thread (made on first use, ``len(calls) - 1`` of
    them, kept for the next list). The first exception, in the list's order, is raised after
    every call has returned, so nothing is still being launched while the caller unwinds."""

    def __init__(self, name: str = "launch"):
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._workers = 0

    def run(self, calls: Sequence[Callable[[], None]]) -> None:
        if len(calls) > 1 and self._workers != len(calls) - 1:
            self.close()
            self._workers = len(calls) - 1
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix=self.name)
        pending: list[Future[None]] = []
        if self._pool is not None and len(calls) > 1:
            pending = [self._pool.submit(call) for call in calls[1:]]
        errors: list[BaseException] = []
        if calls:
            try:
                calls[0]()
            except BaseException as exc:   # re-raised below, once every worker has returned
                errors.append(exc)
        for future in pending:
            error = future.exception()
            if error is not None:
                errors.append(error)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Ends the worker threads (a later :meth:`run` makes new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._pool, self._workers = None, 0
