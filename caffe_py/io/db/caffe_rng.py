"""Caffe's random streams, reproduced, so that the data layers whose order Caffe draws give the
same order for the same ``random_seed``.

- :class:`Mt19937`: boost::mt19937, Caffe's ``rng_t`` (numpy's MT19937 bit generator, seeded as
  ``init_genrand``; the state is set through numpy's public state API).
- :func:`caffe_shuffle`: ``caffe::shuffle`` (util/rng.hpp), Fisher-Yates from the back with
  ``boost::uniform_int`` (its bucket-and-reject rule) on an mt19937: ImageData's shuffle.
- :class:`GlibcRand` and :func:`std_random_shuffle`: glibc's ``rand()`` (the TYPE_3 additive
  feedback generator; Caffe never calls ``srand``, so its seed is 1) and libstdc++'s
  ``std::random_shuffle`` over it: HDF5Data's shuffle.
- :class:`GlobalDraws`: ``caffe_rng_rand()``, the process-wide mt19937 that
  ``Caffe::set_random_seed(random_seed)`` seeds and each data layer's setup draws from, in layer
  order (its transformer's seed, ImageData's shuffle seed, WindowData's sampling seed, rand_skip,
  the prefetch thread's seed).
"""
from __future__ import annotations

from collections.abc import MutableSequence
from typing import Any

import numpy as np

MASK32 = 0xFFFFFFFF
_CHUNK = 1 << 16


class Mt19937:
    """boost::mt19937 seeded with ``seed`` (mod 2^32): 32-bit draws in order."""

    def __init__(self, seed: int):
        state: Any = np.random.RandomState(int(seed) & MASK32).get_state(legacy=False)
        self._bits = np.random.MT19937()
        self._bits.state = state  # init_genrand(seed), as boost's and std's mt19937
        self.drawn = 0

    def draws(self, n: int) -> np.ndarray:
        """The next ``n`` draws, uint64 holding 32-bit values."""
        self.drawn += n
        return self._bits.random_raw(n)

    def __call__(self) -> int:
        self.drawn += 1
        return int(self._bits.random_raw())

    def uniform_ints(self, ranges: np.ndarray) -> np.ndarray:
        """``boost::uniform_int<long>(0, r)(rng)`` for each r (>= 1) of ``ranges`` in turn,
        drawn in bulk: one draw each, and a redraw wherever a draw falls in the rejected tail
        (a chance of at most r / 2^32), leaving the engine exactly where Caffe's would be."""
        out = np.empty(len(ranges), np.int64)
        done = 0
        while done < len(ranges):
            rest = ranges[done:]
            state = self._bits.state
            values = self._bits.random_raw(len(rest)) // _buckets(rest)
            bad = np.flatnonzero(values > rest.astype(np.uint64))
            take = len(rest) if len(bad) == 0 else int(bad[0])
            out[done:done + take] = values[:take]
            self.drawn += take
            if take < len(rest):  # draw `take` was rejected: go back to just after it, redraw
                self._bits.state = state
                self._bits.random_raw(take + 1)
                self.drawn += 1
                out[done + take] = self._redraw(int(rest[take]))
                take += 1
            done += take
        return out

    def _redraw(self, r: int) -> int:
        bucket = int(_buckets(np.array([r]))[0])
        while True:
            value = self() // bucket
            if value <= r:
                return value

    def skip(self, n: int) -> None:
        """Advance ``n`` draws (in chunks: a resume far into a run stays cheap in memory)."""
        while n > 0:
            step = min(n, _CHUNK)
            self.draws(step)
            n -= step


def _buckets(ranges: np.ndarray) -> np.ndarray:
    """boost::uniform_int's bucket size for uniform_int(0, r) on a 32-bit engine, each r."""
    brange = np.uint64(MASK32)
    r = ranges.astype(np.uint64)
    bucket = brange // (r + np.uint64(1))
    bucket += (brange % (r + np.uint64(1)) == r).astype(np.uint64)
    return bucket


def caffe_shuffle(items: MutableSequence, rng: Mt19937) -> None:
    """``caffe::shuffle(begin, end, rng)`` in place: for i from n-1 down to 1, swap item i with
    item ``uniform_int(0, i)``."""
    n = len(items)
    if n < 2:
        return
    picks = rng.uniform_ints(np.arange(n - 1, 0, -1, dtype=np.int64)).tolist()
    for i, j in zip(range(n - 1, 0, -1), picks, strict=True):
        items[i], items[j] = items[j], items[i]


class GlibcRand:
    """glibc's ``rand()`` after ``srand(seed)`` (seed 1: a process that never calls srand)."""

    def __init__(self, seed: int = 1):
        seed = int(seed) & MASK32 or 1
        r = [seed]
        for i in range(1, 31):
            r.append((16807 * r[i - 1]) % 2147483647)
        r += r[:3]  # r[31..33] = r[0..2]
        self._ring = r  # the last 34 values
        self.drawn = 0
        for _ in range(310):  # srand discards the first 310 outputs
            self._step()
        self.drawn = 0

    def _step(self) -> int:
        r = self._ring
        value = (r[-31] + r[-3]) & MASK32
        r.append(value)
        del r[0]
        return value

    def __call__(self) -> int:
        self.drawn += 1
        return self._step() >> 1


def std_random_shuffle(items: MutableSequence, rand: GlibcRand) -> None:
    """libstdc++'s ``std::random_shuffle(first, last)`` in place: for i from 1 to n-1, swap item
    i with item ``rand() % (i + 1)``."""
    for i in range(1, len(items)):
        j = rand() % (i + 1)
        if j != i:
            items[i], items[j] = items[j], items[i]


class GlobalDraws:
    """``caffe_rng_rand()`` after ``Caffe::set_random_seed(seed)``: the data layers of one net
    take their draws from one of these in layer order, as Caffe's setup does."""

    def __init__(self, seed: int):
        self._rng = Mt19937(seed)

    def draw(self) -> int:
        return self._rng()

    @property
    def drawn(self) -> int:
        return self._rng.drawn

    def prefetching_layer(self, needs_rand: bool, own: int) -> list[int]:
        """The draws one prefetching data layer's setup takes, in Caffe's order: its
        transformer's InitRand (when it ``needs_rand``), ``own`` draws of its DataLayerSetUp,
        InitRand again, and its prefetch thread's seed. Returns the ``own`` draws."""
        if needs_rand:
            self.draw()
        mine = [self.draw() for _ in range(own)]
        if needs_rand:
            self.draw()
        self.draw()
        return mine


def needs_rand(mirror: bool, crop_size: int, phase: str) -> bool:
    """Whether Caffe's DataTransformer seeds a generator (DataTransformer::InitRand)."""
    return bool(mirror or (phase == "TRAIN" and crop_size))
