"""The CPUs' time when the command started, read before torch loads (standard library only).

A training run on the CPU follows other processes' load (:mod:`caffe_py.cpu_threads`); its
first look at that load covers the command's start-up when there is a reading from then:
importing torch and the rest takes a second or more, long enough to see a process that keeps a
CPU busy, so that the net's construction and the first steps already run at the count the
CPUs left free. ``cpy`` (and ``python cli.py``) take the reading first thing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StartReading:
    """``/proc/stat`` as it read at the start, this process's CPU seconds and the
    ``time.perf_counter()`` then."""

    stat: str
    own: float
    wall: float


_reading: StartReading | None = None


def note() -> None:
    """Take the reading (where there is no /proc/stat, there is none)."""
    global _reading
    try:
        stat = Path("/proc/stat").read_text()
    except OSError:
        return
    _reading = StartReading(stat, time.process_time(), time.perf_counter())


def take() -> StartReading | None:
    """The reading :func:`note` took, if it did, once: the first run of the command uses it
    (a later one in the same process did not start with the command)."""
    global _reading
    taken, _reading = _reading, None
    return taken
