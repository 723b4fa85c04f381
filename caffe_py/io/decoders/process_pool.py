"""A pool of forked worker processes with one pipe of tasks and one of results.

``concurrent.futures.ProcessPoolExecutor`` runs a manager thread in the calling process that,
on every wake-up (each task submitted, each result), registers every worker's sentinel and its
own pipes with a new selector before it waits: with 62 decode processes on a 4 x H200 host that
thread held the training process's GIL in 31% of the samples that held it, and the training
process's own CPU time per image grows with the process count (docs/data_pipeline.md, "The
decode processes' pool"). Here there is no manager: a submitting thread writes its task to the
task pipe itself (the processes take turns reading it), and one collector thread blocks on the
result pipe, one read a result. A process that dies is found by the collector, which looks at
every process's exit status a few times a second (a read that waits returns by then): the pool
is then broken, its processes are stopped, every task not yet done fails with
:class:`~concurrent.futures.process.BrokenProcessPool` saying which process died and how, and
later submits fail the same way.

After forking, the pool closes its own ends of the pipes that only the processes use: with
every process gone, a submit's write fails (no reader) instead of waiting, and the collector's
read ends (no writer). A task's future cancelled by its owner still runs (it is in the pipe
already); its end is dropped.
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures.process import BrokenProcessPool
from typing import Any

CHECK_S = 0.25
"""How often the collector looks at the processes' exit status."""


class WorkerPool:
    """``count`` processes of multiprocessing context ``context`` (forked now), each running
    ``initializer(*initargs)`` and then the tasks it reads; :meth:`submit` gives a
    :class:`~concurrent.futures.Future` per task, as the executor does."""

    def __init__(self, count: int, context: Any, initializer: Callable[..., None],
                 initargs: tuple = ()):
        self._tasks, self._results = context.SimpleQueue(), context.SimpleQueue()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._broken: str | None = None
        self._closing = False
        self.processes: list[Any] = []
        try:
            for _ in range(count):
                process = context.Process(target=_work, daemon=True,
                                          args=(self._tasks, self._results, initializer,
                                                initargs))
                process.start()
                self.processes.append(process)
        except BaseException:
            self._stop_processes()
            raise
        self._tasks._reader.close()    # the processes read the tasks ...
        self._results._writer.close()  # ... and write the results
        self._collector = threading.Thread(target=self._collect, name="cpy-decode-results",
                                           daemon=True)
        self._collector.start()

    def submit(self, fn: Callable[[Any], None], arg: Any) -> Future:
        """Run ``fn(arg)`` in a process (``fn`` a module-level function)."""
        future: Future = Future()
        with self._lock:
            if self._broken is not None:
                raise BrokenProcessPool(self._broken)
            task, self._next = self._next, self._next + 1
            self._pending[task] = future
        try:
            self._tasks.put((task, fn, arg))
        except OSError:   # no process reads the tasks any more
            with self._lock:
                self._pending.pop(task, None)
            raise BrokenProcessPool(self._broken or "every process has ended") from None
        return future

    def shutdown(self, timeout: float) -> None:
        """End the processes (a task still running is cut short: SIGTERM, then SIGKILL after
        ``timeout`` seconds) and fail what was not done."""
        with self._lock:
            self._closing = True
        self._stop_processes(timeout)
        self._collector.join(timeout)
        self._fail("the pool was closed")

    # --- the collector ------------------------------------------------------------------------
    def _collect(self) -> None:
        reader = self._results._reader
        checked = time.monotonic()
        while True:
            try:
                ready = reader.poll(CHECK_S)
                if ready:
                    task, error = self._results.get()
            except (EOFError, OSError):   # every process has ended
                self._check(ended=True)
                return
            if ready:
                with self._lock:
                    future = self._pending.pop(task, None)
                if future is not None:
                    _settle(future, error)
            if time.monotonic() - checked >= CHECK_S:
                checked = time.monotonic()
                if self._check():
                    return

    def _check(self, ended: bool = False) -> bool:
        """Whether a process has died (the pool is then broken)."""
        if self._closing:
            return ended
        for process in self.processes:
            code = process.exitcode
            if code is not None:
                self._break(f"decode process {process.pid} {_how(code)}")
                return True
        if ended:
            self._break("every decode process has ended")
        return ended

    def _break(self, why: str) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = why
        self._fail(why)
        self._stop_processes()

    def _fail(self, why: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            _settle(future, BrokenProcessPool(why))

    def _stop_processes(self, timeout: float = 5.0) -> None:
        for process in self.processes:
            if process.exitcode is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()


def _settle(future: Future, error: BaseException | None) -> None:
    """A task's end on its future, unless its owner cancelled it (a feed giving up a batch)."""
    try:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
    except InvalidStateError:   # cancelled
        pass


def _how(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def _work(tasks: Any, results: Any, initializer: Callable[..., None], initargs: tuple) -> None:
    """A process: the initializer, then each task it reads until the pool ends it."""
    initializer(*initargs)
    while True:
        task, fn, arg = tasks.get()
        try:
            fn(arg)
        except BaseException as exc:  # noqa: BLE001 (the task's own error, for its future)
            try:
                results.put((task, exc))
            except Exception:  # noqa: BLE001 (an error that does not pickle: its text)
                results.put((task, RuntimeError(f"{type(exc).__name__}: {exc}")))
        else:
            results.put((task, None))
