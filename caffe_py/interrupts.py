"""Waits a signal may cut short, and what a thread is busy with, for the watchdogs' messages.

A signal handler runs in the main thread between bytecodes, and Caffe's signal handling acts
only between iterations: a read that stalls (a FIFO in an image list, a hung network
filesystem) would keep a stop or a preemption snapshot waiting forever. The data pipeline
marks the waits that take nothing yet (:func:`interruptible`); the run's signal handler raises
:class:`Interrupted` there for a stopping effect, so the run stops at once with the state of
the last finished iteration (no batch of the unfinished one was taken).

:func:`busy` records, per thread, the user code it is running (a Python layer), so that a
watchdog that finds a replica stuck can say where.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

_waiting = 0  # the main thread's depth of interruptible waits
_busy: dict[str, tuple[str, float]] = {}  # thread name -> (what it runs, since when)


class Interrupted(BaseException):
    """A signal's stopping effect, raised into an interruptible wait of the main thread (a
    BaseException: no ``except Exception`` on the way swallows it)."""

    def __init__(self, effect: str):
        super().__init__(effect)
        self.effect = effect


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Mark a wait of the main thread that a stopping signal may cut short (in other threads,
    nothing): the waiter must have taken nothing yet."""
    global _waiting
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _waiting += 1
    try:
        yield
    finally:
        _waiting -= 1


def waiting() -> bool:
    """Whether the main thread is in an interruptible wait (a signal handler asks)."""
    return _waiting > 0


@contextlib.contextmanager
def busy(what: str) -> Iterator[None]:
    """Record that the current thread runs ``what`` (e.g. a Python layer's forward)."""
    name = threading.current_thread().name
    _busy[name] = (what, time.monotonic())
    try:
        yield
    finally:
        _busy.pop(name, None)


def busy_with(thread_names: list[str]) -> list[str]:
    """``<thread> has been running <what> for N s`` for each of ``thread_names`` that is."""
    now = time.monotonic()
    return [f"{name} has been running {what} for {now - since:.0f} s"
            for name in thread_names if (entry := _busy.get(name)) is not None
            for what, since in [entry]]
