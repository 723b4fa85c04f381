"""The decode processes' pool (io/decoders/process_pool.py): tasks and their errors reach their
futures, a process that dies breaks the pool with one line naming it, a pool that could not
fork every process leaves none, and shutting down ends every process, a stuck one too."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from caffe_py.io.decoders.process_pool import WorkerPool

FORK = multiprocessing.get_context("fork")


def children() -> list:
    return [p for p in multiprocessing.active_children() if p.is_alive()]


def started(marks: list) -> None:
    """The initializer: what it was given, in the process (its pid)."""
    os.environ["POOL_MARK"] = ",".join(map(str, marks))


def square_into_error(n: int) -> None:
    """A task: its result is its error (a pool's tasks return nothing)."""
    if n < 0:
        raise ValueError(f"{n} is negative; {os.environ['POOL_MARK']}")
    raise ArithmeticError(n * n)


def unpicklable(_: int) -> None:
    class Local(Exception):   # a class pickle cannot find
        pass

    raise Local("made here")


def nap(seconds: float) -> None:
    time.sleep(seconds)


def test_each_task_ends_on_its_own_future():
    pool = WorkerPool(2, FORK, started, ([3, 4],))
    try:
        futures = [pool.submit(square_into_error, n) for n in (2, -1, 5)]
        errors = [f.exception(timeout=10) for f in futures]
        assert [type(e) for e in errors] == [ArithmeticError, ValueError, ArithmeticError]
        assert [str(e) for e in errors] == ["4", "-1 is negative; 3,4", "25"]
        done = pool.submit(nap, 0.0)
        assert done.result(timeout=10) is None
        lost = pool.submit(unpicklable, 0).exception(timeout=10)
        assert type(lost) is RuntimeError and str(lost) == "Local: made here"
    finally:
        pool.shutdown(5.0)
    assert children() == []


def test_a_process_that_dies_breaks_the_pool_naming_it():
    pool = WorkerPool(2, FORK, started, ([],))
    try:
        pool.submit(nap, 0.0).result(timeout=10)
        victim = pool.processes[1]
        running = [pool.submit(nap, 30.0) for _ in range(2)]   # one a process
        time.sleep(0.3)
        os.kill(victim.pid, signal.SIGKILL)
        for future in running:
            error = future.exception(timeout=10)
            assert type(error) is BrokenProcessPool
            assert str(error) == f"decode process {victim.pid} was killed by SIGKILL"
        with pytest.raises(BrokenProcessPool, match=rf"^decode process {victim.pid} was "
                                                    "killed by SIGKILL$"):
            pool.submit(nap, 0.0)
        deadline = time.monotonic() + 10
        while children() and time.monotonic() < deadline:   # the others were stopped
            time.sleep(0.05)
        assert children() == []
    finally:
        pool.shutdown(5.0)


def test_shutdown_ends_a_stuck_process_and_fails_what_was_not_done():
    pool = WorkerPool(1, FORK, started, ([],))
    stuck = pool.submit(nap, 60.0)
    queued = pool.submit(nap, 0.0)
    time.sleep(0.2)
    began = time.monotonic()
    pool.shutdown(5.0)
    assert time.monotonic() - began < 3.0   # SIGTERM ends the nap
    assert children() == []
    for future in (stuck, queued):
        error = future.exception(timeout=1)
        assert type(error) is BrokenProcessPool and str(error) == "the pool was closed"


def test_a_fork_that_fails_leaves_no_process(monkeypatch):
    import errno

    forks = []
    fork = os.fork

    def second_fails():
        if forks:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        forks.append(1)
        return fork()

    monkeypatch.setattr(os, "fork", second_fails)
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
        WorkerPool(3, FORK, started, ([],))
    assert forks == [1] and children() == []


def test_a_cancelled_tasks_end_is_dropped_quietly():
    failures = []
    hook = threading.excepthook
    threading.excepthook = failures.append
    pool = WorkerPool(1, FORK, started, ([],))
    try:
        first = pool.submit(nap, 0.3)
        second = pool.submit(nap, 0.0)
        assert second.cancel()   # its owner gave it up; the process runs it all the same
        assert pool.submit(square_into_error, 3).exception(timeout=10).args == (9,)
        assert first.result(timeout=10) is None
    finally:
        pool.shutdown(5.0)
        threading.excepthook = hook
    assert failures == []
