"""Caffe rc3's round-robin as arithmetic: which replica reads which record of a stream, and
where a resumed run goes on. No threads, no I/O, no torch: the reader and the feeds ask it.

Positions. A stream's records are numbered in read order: position p is database record
``(origin + p) mod size``, wrapping at the end of the database (``origin`` is where rand_skip, or
a resume with another replica count, put position 0).

Replicas. A run has G replicas in all (every pool's; one pool per host), which take the records
in turns of ``unit`` records: position p belongs to global replica ``(p // unit) mod G``. With
Caffe's turns of one record (training) replica g reads g, g + G, g + 2G, ..., so one iteration
of G replicas of batch B reads exactly the next G x B records, as one replica of batch G x B
would. With turns of a batch (a test pass split over the replicas) replica g reads batches g,
g + G, ... whole, each the batch one replica would have read there. A pool holds local slots
0 .. n-1, the global replicas offset .. offset + n - 1; slot s reads from position ``starts[s]``
on (the first position of its first turn on a fresh start, further on after a resume).

A saved state is ``{"replicas": G, "origin": o, "next": [p_0, ...]}`` (plus ``"offset"`` when
the pool was a slice of a larger round-robin, and ``"unit"`` for turns longer than a record):
``p_i`` is the position global replica offset + i reads next. These are the keys solver states
have always held.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import DataError


@dataclass(frozen=True)
class RoundRobin:
    """One stream's round-robin as a pool sees it: ``total`` replicas in all (G), the global
    replica of local slot 0 (``offset``), each local slot's first position (``starts``), and
    the records of a turn (``unit``: 1, or a batch)."""

    total: int
    offset: int
    starts: tuple[int, ...]
    unit: int = 1

    def __post_init__(self) -> None:
        if self.total < 1 or self.offset < 0 or self.offset + self.slots > self.total:
            raise ValueError(f"slots {self.offset}..{self.offset + self.slots - 1} do not fit "
                             f"in a round-robin of {self.total}")
        if self.unit < 1:
            raise ValueError(f"a turn of {self.unit} records")
        for slot, start in enumerate(self.starts):
            if start < 0 or (start // self.unit) % self.total != (self.offset + slot) % self.total:
                raise ValueError(f"slot {slot} (global replica {self.offset + slot} of "
                                 f"{self.total}) cannot start at position {start}")

    @classmethod
    def fresh(cls, slots: int, *, offset: int = 0, total: int | None = None,
              unit: int = 1) -> RoundRobin:
        """A round-robin from the first record: slot s starts at its global replica's first
        turn."""
        return cls(slots if total is None else total, offset,
                   tuple((offset + s) * unit for s in range(slots)), unit)

    @property
    def slots(self) -> int:
        return len(self.starts)

    @property
    def step(self) -> int:
        """Positions between a slot's consecutive records inside one of its runs: G for turns
        of a record, 1 for longer turns (a run is then part of one turn)."""
        return self.total if self.unit == 1 else 1

    def position(self, slot: int, taken: int) -> int:
        """The position of the record ``slot`` reads after it has taken ``taken`` records."""
        return self._after(self.starts[slot], taken)

    def _after(self, position: int, taken: int) -> int:
        """The position of the slot's record ``taken`` records after its record at
        ``position`` (one of its own)."""
        within = position % self.unit + taken
        return position - position % self.unit + (
            within // self.unit * self.total * self.unit + within % self.unit)

    def first_index(self, slot: int, position: int) -> int:
        """How far after ``position`` the first record ``slot`` takes lies (its records
        before its start, which a resume skips, do not count)."""
        turn = position // self.unit
        ahead = (self.offset + slot - turn) % self.total   # turns until the slot's next
        first = position if ahead == 0 else (turn + ahead) * self.unit
        return max(first, self.starts[slot]) - position

    def runs(self, slot: int, position: int, count: int) -> list[slice]:
        """The rows of ``count`` records read from ``position`` on that ``slot`` takes, as
        slices (empty list when none): one strided slice for turns of a record, one slice per
        turn (or part of one) otherwise."""
        i = self.first_index(slot, position)
        if i >= count:
            return []
        if self.unit == 1 or self.total == 1:
            return [slice(i, count, self.step)]
        out = []
        while i < count:
            end = min(count, i + self.unit - (position + i) % self.unit)
            out.append(slice(i, end))
            i = end + (self.total - 1) * self.unit   # the slot's next turn
        return out

    def wanted(self, position: int, count: int) -> np.ndarray:
        """Which of ``count`` records from ``position`` on any of this pool's slots takes
        (the others belong to other pools' replicas, or lie before a resumed start)."""
        mask = np.zeros(count, bool)
        for slot in range(self.slots):
            for run in self.runs(slot, position, count):
                mask[run] = True
        return mask

    def readable(self, position: int, rooms: Sequence[int | None], limit: int) -> int:
        """How many records from ``position`` on can be read now: up to the first one whose
        slot has no room left, at most ``limit``. ``rooms[s]`` is the free records of slot s's
        queue, None for a queue taken off the reader (detached: it takes nothing). Records of
        other pools' replicas take no room. 0 when every slot is detached."""
        attached = False
        for slot, room in enumerate(rooms):
            if room is None:
                continue
            attached = True
            first = position + self.first_index(slot, position)
            limit = min(limit, self._after(first, room) - position)
        return limit if attached else 0

    def state(self, origin: int, taken: Sequence[int]) -> dict[str, Any]:
        """The saved state after slot s has taken ``taken[s]`` records (global positions)."""
        nxt = [self.position(slot, n) for slot, n in enumerate(taken)]
        out: dict[str, Any] = {"replicas": self.total, "origin": origin, "next": nxt}
        if self.offset or self.slots != self.total:
            out["offset"] = self.offset
        if self.unit != 1:
            out["unit"] = self.unit
        return out


def record_index(origin: int, position: int, size: int) -> int:
    """The database record (0 .. size-1, key order) at stream ``position``."""
    return (origin + position) % size


def resume(saved: dict[str, Any], *, slots: int, offset: int, total: int, where: str,
           unit: int = 1) -> tuple[int, tuple[int, ...]]:
    """(origin, starts) that continue a saved state with ``slots`` local slots from global
    replica ``offset`` of ``total`` in turns of ``unit`` records; ``where`` names the
    database and stream in errors.

    The same round-robin (``total`` and ``unit`` equal): each slot goes on from its global
    replica's saved position, or, when the state is another pool's slice, right after what the
    saved replicas read. Another replica count with turns of a record on both sides: the new
    round-robin starts right after everything the saved replicas read, which needs them to have
    read equal amounts. Turns of a batch on either side (a split test pass): the saved replicas
    took the stream's batches in order, so what they read is the stream's first records, and
    the new round-robin starts right after them.
    """
    saved_n, saved_offset, origin, nxt, saved_unit = _checked(saved, where)
    lo = offset - saved_offset
    if saved_n == total and saved_unit == unit and 0 <= lo and lo + slots <= len(nxt):
        return origin, tuple(nxt[lo:lo + slots])   # the same round-robin
    fresh = tuple((offset + s) * unit for s in range(slots))
    if saved_unit != 1 or unit != 1:
        read = _prefix(saved_n, saved_offset, saved_unit, nxt)
        if read is None:
            raise DataError(f"{where} is for {saved_n} replicas whose records read are not the "
                            f"stream's first ones, and this run has {total}; resume with "
                            f"{saved_n} devices")
        return origin + read, fresh
    taken = {(p - saved_offset - i) // saved_n for i, p in enumerate(nxt)}
    if len(taken) != 1:
        raise DataError(f"{where} is for {saved_n} replicas that had read unequal amounts, "
                        f"and this run has {total}; resume with {saved_n} devices")
    # Every saved replica read ``reads`` records (replicas run in lockstep, so one pool's
    # slice stands for all of them): everything before position saved_n x reads was read.
    reads = taken.pop()
    if saved_n == total:  # another pool's slice of the same round-robin: positions stay global
        return origin, tuple(offset + s + total * reads for s in range(slots))
    return origin + saved_n * reads, fresh


def _prefix(n: int, offset: int, unit: int, nxt: Sequence[int]) -> int | None:
    """How many records the saved replicas (all ``n`` of a round-robin in turns of ``unit``)
    read when what they read is the stream's first records; None when it is not (or the state
    is a slice of a larger round-robin)."""
    if offset or len(nxt) != n:
        return None
    rr = RoundRobin.fresh(n, unit=unit)
    read = 0
    for slot, p in enumerate(nxt):
        turns, within = divmod(p, unit)
        read += (turns - slot) // n * unit + within
    if any(read + rr.first_index(slot, read) != p for slot, p in enumerate(nxt)):
        return None
    return read


def _checked(saved: dict[str, Any], where: str) -> tuple[int, int, int, list[int], int]:
    """replicas, offset, origin, next and unit of a saved state, or a DataError naming it."""
    problem = DataError(f"{where} is not a read state of a round-robin ({saved!r}); resume "
                        "from an unchanged solver state")
    try:
        saved_n, saved_offset = int(saved["replicas"]), int(saved.get("offset", 0))
        origin, nxt = int(saved["origin"]), [int(p) for p in saved["next"]]
        unit = int(saved.get("unit", 1))
    except (AttributeError, KeyError, TypeError, ValueError):
        raise problem from None
    if saved_n < 1 or unit < 1 or not nxt or not 0 <= saved_offset <= saved_n - len(nxt) or any(
            p < 0 or p // unit % saved_n != (saved_offset + i) % saved_n
            for i, p in enumerate(nxt)):
        raise problem
    return saved_n, saved_offset, origin, nxt, unit
