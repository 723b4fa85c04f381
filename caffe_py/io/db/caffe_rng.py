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
- :func:`uniform_reals`, :func:`normals`, :func:`bernoullis`: ``caffe_rng_uniform``,
  ``caffe_rng_gaussian`` and ``caffe_rng_bernoulli`` (util/math_functions.cpp) on an mt19937:
  boost's ``uniform_real``, ``normal_distribution`` (the ziggurat of boost 1.74, whose tables
  :func:`ziggurat_tables` rebuilds) and ``bernoulli_distribution``, in float32 as Caffe's
  fillers and Dropout draw them.
"""
from __future__ import annotations

import functools
from collections.abc import MutableSequence
from decimal import Decimal, localcontext
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

    def snapshot(self) -> tuple[Any, int]:
        """Where the engine is (its state and count), for :meth:`rewind`."""
        return self._bits.state, self.drawn

    def rewind(self, snapshot: tuple[Any, int]) -> None:
        """Go back to where :meth:`snapshot` was taken."""
        self._bits.state, self.drawn = snapshot

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

    def __init__(self, seed: int = 0, rng: Mt19937 | None = None):
        self._rng = rng if rng is not None else Mt19937(seed)

    @classmethod
    def on(cls, rng: Mt19937) -> GlobalDraws:
        """Draws taken from ``rng`` itself (a stream other code draws from too)."""
        return cls(rng=rng)

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


# --- the distributions of Caffe's fillers and Dropout ---------------------------------------
_TWO32 = np.float32(4294967296.0)  # float(2^32 - 1) + 1 in float: boost's divisor


class _Draws:
    """A run of an mt19937's draws taken in bulk and handed out in order; :meth:`close` leaves
    the engine exactly after the draws handed out (the rest are given back)."""

    def __init__(self, rng: Mt19937, expected: int):
        self.rng = rng
        self.start = rng.snapshot()
        self.buf = rng.draws(max(expected, 1))
        self.pos = 0

    def ensure(self, n: int) -> None:
        """At least ``n`` draws left in the buffer."""
        short = self.pos + n - len(self.buf)
        if short > 0:
            more = self.rng.draws(max(short, len(self.buf)))
            self.buf = np.concatenate([self.buf, more])

    def take(self) -> int:
        self.ensure(1)
        value = int(self.buf[self.pos])
        self.pos += 1
        return value

    def close(self) -> None:
        self.rng.rewind(self.start)
        self.rng.skip(self.pos)


def uniform_reals(rng: Mt19937, n: int, a: float, b: float) -> np.ndarray:
    """``caffe_rng_uniform<float>(n, a, b)``: boost's ``uniform_real<float>(a, nextafter(b))``
    on a 32-bit engine: ``u / 2^32 * (b' - a) + a`` in float, a value not below ``b'`` drawn
    again."""
    lo = np.float32(a)
    hi = np.nextafter(np.float32(b), np.float32(np.inf))
    width = np.float32(hi - lo)
    out = np.empty(n, np.float32)
    draws = _Draws(rng, n)
    done = 0
    while done < n:
        draws.ensure(n - done)
        raw = draws.buf[draws.pos:draws.pos + n - done]
        values = (raw.astype(np.float32) / _TWO32) * width + lo
        bad = np.flatnonzero(~(values < hi))
        take = len(values) if len(bad) == 0 else int(bad[0])
        out[done:done + take] = values[:take]
        done += take
        draws.pos += take + (0 if len(bad) == 0 else 1)  # skip the rejected draw
    draws.close()
    return out


def bernoullis(rng: Mt19937, n: int, p: float, *, double: bool = False) -> np.ndarray:
    """``caffe_rng_bernoulli(n, p)``: boost's ``bernoulli_distribution``, ``u <= p * (2^32 -
    1)`` in the precision of ``p`` (float for a filler's sparsity, double for Dropout's
    ``1. - threshold_``); no draw at all when ``p`` is 0. Returns a bool array."""
    if p == 0:
        return np.zeros(n, bool)
    raw = rng.draws(n)
    if double:
        return raw.astype(np.float64) <= float(p) * 4294967295.0
    return raw.astype(np.float32) <= np.float32(np.float32(p) * _TWO32)


@functools.cache
def ziggurat_tables(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) tables of boost's ziggurats (boost/random/normal_distribution.hpp: 128
    layers of exp(-x^2/2); exponential_distribution.hpp: 256 layers of exp(-x)), rebuilt
    from their definition: x[1] = R starts the tail, every layer has the area V of the base
    strip (R f(R) plus the tail), x[0] = V / f(R), y[i+1] = y[i] + V / x[i], x = f^-1(y),
    and R is the root that makes the last layer end at y = 1; computed in 40 digits, they
    round to boost's doubles."""
    normal = kind == "normal"
    layers = 128 if normal else 256
    with localcontext() as ctx:
        ctx.prec = 40
        f = (lambda x: (-(x * x) / 2).exp()) if normal else (lambda x: (-x).exp())
        f_inv = (lambda y: (-2 * y.ln()).sqrt()) if normal else (lambda y: -y.ln())

        def area(r: Decimal) -> Decimal:
            if not normal:
                return (r + 1) * f(r)
            return r * f(r) + (_PI / 2).sqrt() * _erfc(r / Decimal(2).sqrt())

        def walk(r: Decimal) -> tuple[list[Decimal], list[Decimal], Decimal]:
            v = area(r)
            xs, ys = [v / f(r), r], [Decimal(0), f(r)]
            for _ in range(1, layers - 1):
                y = ys[-1] + v / xs[-1]
                if y >= 1:  # the layers reach the top too soon: R is too small
                    return xs, ys, Decimal(2)
                ys.append(y)
                xs.append(f_inv(y))
            return xs, ys, ys[-1] + v / xs[-1]

        lo, hi = (Decimal(3), Decimal(4)) if normal else (Decimal(7), Decimal(8))
        for _ in range(75):
            mid = (lo + hi) / 2
            if walk(mid)[2] > 1:
                lo = mid
            else:
                hi = mid
        xs, ys, _ = walk((lo + hi) / 2)
    return (np.array([float(x) for x in xs] + [0.0]),
            np.array([float(y) for y in ys] + [1.0]))


_PI = Decimal("3.141592653589793238462643383279502884197")


def _erfc(z: Decimal) -> Decimal:
    """erfc(z) for z > 2 by its continued fraction (ample digits for z near 2.43)."""
    t = z
    for k in range(300, 0, -1):
        t = z + Decimal(k) / 2 / t
    return (-(z * z)).exp() / _PI.sqrt() / t


def _int_float_pair(u: int) -> tuple[np.float32, int]:
    """boost's ``generate_int_float_pair<float, 8>`` on one 32-bit draw: (the top 24 bits as
    a float in [0, 1), the low 8 bits)."""
    return np.float32(u >> 8) * np.float32(2.0 ** -24), u & 0xFF


def _uniform01(draws: _Draws) -> np.float32:
    """boost's ``uniform_01<float>``: u / 2^32, a value of 1 (rounding) drawn again."""
    while True:
        value = np.float32(np.float32(draws.take()) / _TWO32)
        if value < np.float32(1):
            return value


def _exponential(draws: _Draws, rate: np.float32) -> np.float32:
    """boost's ``exponential_distribution<float>(rate)`` (its ziggurat) on ``draws``."""
    tx, ty = ziggurat_tables("exponential")
    shift = np.float32(0)
    while True:
        r, i = _int_float_pair(draws.take())
        x = np.float32(r * np.float32(tx[i]))
        if x < np.float32(tx[i + 1]):
            return np.float32(np.float32(shift + x) / rate)
        if i == 0:
            shift = np.float32(shift + np.float32(tx[1]))
            continue
        y01 = _uniform01(draws)
        y = np.float32(np.float32(ty[i]) + y01 * np.float32(ty[i + 1] - ty[i]))
        above_upper = np.float32(np.float32(tx[i] - tx[i + 1]) * y01
                                 - np.float32(np.float32(tx[i]) - x))
        above_lower = np.float32(y - np.float32(np.float32(ty[i + 1]) + np.float32(
            np.float32(tx[i + 1]) - x) * np.float32(ty[i + 1])))
        if above_upper < 0 and (above_lower < 0 or y < np.exp(-x)):
            return np.float32(np.float32(x + shift) / rate)


def _normal_slow(draws: _Draws, r: np.float32, bucket: int) -> np.float32:
    """The rest of boost's unit normal after the first draw missed the fast case."""
    tx, ty = ziggurat_tables("normal")
    while True:
        sign = np.float32((bucket & 1) * 2 - 1)
        i = bucket >> 1
        x = np.float32(r * np.float32(tx[i]))
        if float(x) < tx[i + 1]:
            return np.float32(x * sign)
        if i == 0:
            tail = np.float32(tx[1])
            while True:
                ex = _exponential(draws, tail)
                ey = _exponential(draws, np.float32(1))
                if np.float32(2) * ey > np.float32(ex * ex):
                    return np.float32(np.float32(ex + tail) * sign)
        y01 = _uniform01(draws)
        y = np.float32(np.float32(ty[i]) + y01 * np.float32(ty[i + 1] - ty[i]))
        part = np.float32(np.float32(tx[i] - tx[i + 1]) * y01 - np.float32(np.float32(tx[i]) - x))
        other = np.float32(y - np.float32(np.float32(ty[i]) + np.float32(np.float32(tx[i]) - x)
                                          * np.float32(ty[i]) * np.float32(tx[i])))
        above_upper, above_lower = (part, other) if tx[i] >= 1 else (other, part)
        if above_upper < 0 and (above_lower < 0 or y < np.exp(-np.float32(x * x / np.float32(2)))):
            return np.float32(x * sign)
        r, bucket = _int_float_pair(draws.take())


def normals(rng: Mt19937, n: int, mean: float, std: float) -> np.ndarray:
    """``caffe_rng_gaussian<float>(n, mean, std)``: boost's ``normal_distribution<float>``
    (its unit normal times std plus mean, in float); the usual case, one draw accepted at
    once, runs vectorised, the rest one value at a time."""
    tx, _ = ziggurat_tables("normal")
    tx32 = tx.astype(np.float32)
    mean32, std32 = np.float32(mean), np.float32(std)
    out = np.empty(n, np.float32)
    draws = _Draws(rng, n + n // 64 + 16)
    done = 0
    while done < n:
        draws.ensure(n - done)
        raw = draws.buf[draws.pos:draws.pos + n - done]
        bucket = (raw & np.uint64(0xFF)).astype(np.int64)
        r = (raw >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -24)
        i = bucket >> 1
        x = r * tx32[i]
        fast = x.astype(np.float64) < tx[i + 1]
        slow = np.flatnonzero(~fast)
        take = len(raw) if len(slow) == 0 else int(slow[0])
        sign = ((bucket[:take] & 1) * 2 - 1).astype(np.float32)
        out[done:done + take] = (x[:take] * sign) * std32 + mean32
        done += take
        draws.pos += take
        if done < n:
            u = draws.take()
            first, b = _int_float_pair(u)
            out[done] = _normal_slow(draws, first, b) * std32 + mean32
            done += 1
    draws.close()
    return out
