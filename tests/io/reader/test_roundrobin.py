"""The round-robin arithmetic against a brute-force oracle, over every small layout.

The oracle is the definition: position p belongs to global replica (p // unit) mod G; a pool's
slot s is global replica offset + s and takes its records from starts[s] on.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from caffe_py.errors import DataError
from caffe_py.io.reader.roundrobin import RoundRobin, record_index, resume


def owner(rr: RoundRobin, position: int) -> int | None:
    """The local slot that takes the record at ``position``, by the definition."""
    slot = position // rr.unit % rr.total - rr.offset
    if 0 <= slot < rr.slots and position >= rr.starts[slot]:
        return slot
    return None


def owned(rr: RoundRobin, slot: int, n: int) -> list[int]:
    """The first ``n`` positions ``slot`` takes, by walking every position."""
    out, p = [], 0
    while len(out) < n:
        if owner(rr, p) == slot:
            out.append(p)
        p += 1
    return out


def layouts(max_total: int = 5, shifts: tuple[int, ...] = (0, 1, 2),
            units: tuple[int, ...] = (1,)):
    """Every round-robin of up to ``max_total`` replicas: each slice (offset, slots), each
    slot's start moved on by 0, 1 or 2 rounds (a resume), in turns of each of ``units``
    records (longer turns: starts also inside a turn)."""
    for unit in units:
        for total in range(1, max_total + 1):
            for offset in range(total):
                for slots in range(1, total - offset + 1):
                    for moved in itertools.product(shifts, repeat=slots):
                        for inside in ((0,) if unit == 1 else (0, unit - 1)):
                            yield RoundRobin(total, offset, tuple(
                                (offset + s + total * m) * unit + inside
                                for s, m in enumerate(moved)), unit)


def test_layouts_cover_every_slice_and_resumed_start():
    assert len(list(layouts(max_total=2))) == 3 + (3 + 9) + 3
    assert len(list(layouts(max_total=2, units=(3,)))) == 2 * (3 + (3 + 9) + 3)


def test_fresh_is_each_replica_from_its_own_index():
    assert RoundRobin.fresh(3) == RoundRobin(3, 0, (0, 1, 2))
    assert RoundRobin.fresh(2, offset=2, total=5) == RoundRobin(5, 2, (2, 3))
    assert RoundRobin.fresh(3, unit=4) == RoundRobin(3, 0, (0, 4, 8), 4)
    # batch turns: replica 1 of 3 reads batches 1, 4, 7 (of 4 records) whole
    rr = RoundRobin.fresh(3, unit=4)
    assert [rr.position(1, k) for k in range(9)] == [4, 5, 6, 7, 16, 17, 18, 19, 28]
    assert rr.step == 1 and RoundRobin.fresh(3).step == 3


@pytest.mark.parametrize("args, message", [
    ((0, 0, ()), "do not fit in a round-robin of 0"),
    ((4, 3, (3, 4)), "slots 3..4 do not fit in a round-robin of 4"),
    ((4, 1, (1, 3)), "slot 1 \\(global replica 2 of 4\\) cannot start at position 3"),
    ((2, 0, (-2,)), "slot 0 \\(global replica 0 of 2\\) cannot start at position -2"),
    ((2, 0, (0, 2), 3), "slot 1 \\(global replica 1 of 2\\) cannot start at position 2"),
    ((2, 0, (0, 3), 0), "a turn of 0 records"),
])
def test_a_layout_that_cannot_be_is_refused(args, message):
    with pytest.raises(ValueError, match=message):
        RoundRobin(*args)


def test_first_index_runs_and_wanted_match_the_oracle():
    for rr in [*layouts(), *layouts(max_total=3, shifts=(0, 1), units=(2, 3))]:
        for position in range(0, 4 * rr.total * rr.unit + 2):
            take = [owner(rr, position + j) for j in range(4 * rr.total * rr.unit + 1)]
            for slot in range(rr.slots):
                assert rr.first_index(slot, position) == take.index(slot), (rr, position)
                for count in range(0, 2 * rr.total * rr.unit + 2):
                    runs = rr.runs(slot, position, count)
                    rows = [j for run in runs for j in range(count)[run]]
                    assert rows == [j for j in range(count) if take[j] == slot]
                    # each run is the records' positions at the round-robin's step
                    assert all(run.step in (None, rr.step) for run in runs)
            count = 3 * rr.total
            assert rr.wanted(position, count).tolist() == [t is not None for t in take[:count]]


def oracle_readable(rr: RoundRobin, position: int, rooms, limit: int) -> int:
    """Walk the records from ``position``: stop before the first whose slot is full."""
    if all(room is None for room in rooms):
        return 0
    left = list(rooms)
    for j in range(limit):
        slot = owner(rr, position + j)
        if slot is None or left[slot] is None:
            continue
        if left[slot] == 0:
            return j
        left[slot] -= 1
    return limit


def test_readable_matches_the_oracle():
    for rr in [*layouts(max_total=4, shifts=(0, 2)),
               *layouts(max_total=3, shifts=(0, 1), units=(2, 3))]:
        for rooms in itertools.product((None, 0, 1, 3), repeat=rr.slots):
            for position in range(0, 2 * rr.total * rr.unit + 1):
                for limit in (1, 4, 64):
                    assert rr.readable(position, rooms, limit) == \
                        oracle_readable(rr, position, rooms, limit), (rr, rooms, position)


def test_state_counts_each_slots_next_position():
    for rr in [*layouts(max_total=4), *layouts(max_total=3, units=(3,))]:
        for taken in itertools.product(range(3), repeat=rr.slots):
            state = rr.state(7, taken)
            want = [owned(rr, s, n + 1)[n] for s, n in enumerate(taken)]
            assert state["next"] == want and state["replicas"] == rr.total
            assert state["origin"] == 7
            # the slot count and offset are saved only for a slice of a larger round-robin
            assert ("offset" in state) == (rr.offset > 0 or rr.slots < rr.total)
            assert state.get("unit", 1) == rr.unit


def test_record_index_wraps_at_the_end_of_the_database():
    assert [record_index(3, p, 5) for p in range(6)] == [3, 4, 0, 1, 2, 3]


def simulate(rr: RoundRobin, capacity: int, steps: int, seed: int) -> list[list[int]]:
    """A producer and consumers driven step by step (no threads): each step the producer
    reads what ``readable`` allows (at most a chunk of 3) and hands each slot its ``rows``;
    then each slot, in a random order, takes a random number of its queued records. The
    positions each slot took, in order."""
    rng = np.random.default_rng(seed)
    queues: list[list[int]] = [[] for _ in range(rr.slots)]
    taken: list[list[int]] = [[] for _ in range(rr.slots)]
    position = min(rr.starts)
    for _ in range(steps):
        count = rr.readable(position, [capacity - len(q) for q in queues], 3)
        chunk = list(range(position, position + count))
        for slot, queue in enumerate(queues):
            for run in rr.runs(slot, position, count):
                queue += chunk[run]
        position += count
        for slot in rng.permutation(rr.slots).tolist():
            n = int(rng.integers(len(queues[slot]) + 1))
            taken[slot] += queues[slot][:n]
            del queues[slot][:n]
    return taken


def test_a_producer_driven_by_the_arithmetic_hands_each_slot_its_own_records():
    for rr in [*layouts(max_total=4, shifts=(0, 1)),
               *layouts(max_total=3, shifts=(0, 1), units=(2, 3))]:
        for capacity in (1, 2, 5):
            taken = simulate(rr, capacity, steps=40 * rr.unit,
                             seed=rr.total * 100 + capacity)
            for slot, got in enumerate(taken):
                assert got == owned(rr, slot, len(got)), (rr, capacity, slot)
            assert all(taken), (rr, capacity)  # every slot got records


# --- resume -----------------------------------------------------------------------------------
def saved_run(total: int, offset: int, slots: int, taken: list[int], origin: int = 0,
              unit: int = 1):
    """The state of a pool slice (offset, slots of total) whose slot s took taken[s]."""
    return RoundRobin.fresh(slots, offset=offset, total=total, unit=unit).state(origin, taken)


def test_resume_in_the_same_round_robin_goes_on_where_each_replica_stopped():
    """Saved by one pool of all G replicas (unequal amounts allowed), resumed by every slice:
    each global replica reads next what it would have read next."""
    for total in range(1, 6):
        for taken in itertools.product(range(3), repeat=total):
            saved = saved_run(total, 0, total, list(taken), origin=4)
            for offset in range(total):
                for slots in range(1, total - offset + 1):
                    origin, starts = resume(saved, slots=slots, offset=offset, total=total,
                                            where="db: s")
                    rr = RoundRobin(total, offset, starts)
                    assert origin == 4
                    for s in range(slots):
                        g = offset + s
                        want = owned(RoundRobin.fresh(total), g, taken[g] + 3)[taken[g]:]
                        assert owned(rr, s, 3) == want


def test_resume_from_another_slice_or_replica_count_starts_after_everything_read():
    """Saved by one slice (equal amounts: replicas run in lockstep): any layout of any count
    reads, in its round-robin, exactly the records after the saved run's G x reads."""
    for saved_total, saved_offset, saved_slots in [(1, 0, 1), (2, 0, 2), (4, 2, 2), (3, 1, 1),
                                                   (5, 0, 5), (6, 3, 3)]:
        for reads in range(3):
            saved = saved_run(saved_total, saved_offset, saved_slots, [reads] * saved_slots,
                              origin=2)
            for total in range(1, 6):
                for offset in range(total):
                    slots = total - offset
                    origin, starts = resume(saved, slots=slots, offset=offset, total=total,
                                            where="db: s")
                    rr = RoundRobin(total, offset, starts)
                    for s in range(slots):
                        # stream positions of the saved run's numbering
                        got = [origin - 2 + p for p in owned(rr, s, 3)]
                        base = saved_total * reads
                        want = [base + offset + s + total * k for k in range(3)]
                        assert got == want, (saved, total, offset, s)


def test_resume_with_another_count_after_unequal_reads_is_refused():
    saved = {"replicas": 2, "origin": 0, "next": [12, 15]}
    with pytest.raises(DataError, match="^db: s is for 2 replicas that had read unequal "
                                        "amounts, and this run has 3; resume with 2 devices$"):
        resume(saved, slots=3, offset=0, total=3, where="db: s")
    # the same round-robin takes each replica's own position
    assert resume(saved, slots=2, offset=0, total=2, where="db: s") == (0, (12, 15))


def prefix_takes(total: int, unit: int, read: int) -> list[int]:
    """What each of ``total`` replicas in turns of ``unit`` took when together they took the
    stream's first ``read`` records."""
    took = [0] * total
    for p in range(read):
        took[p // unit % total] += 1
    return took


def test_batch_turns_resume_after_the_first_records_read_in_any_layout():
    """Batches taken in stream order (a split test pass) leave a prefix of the stream read:
    the same round-robin goes on where each replica stopped, and any other count or turn
    (one replica of a one-GPU run, another batch size) starts right after the prefix."""
    for saved_total, saved_unit in [(1, 4), (2, 4), (3, 4), (3, 1), (2, 2)]:
        for read in range(0, 4 * saved_total * saved_unit + 1, 2):
            if saved_unit == 1 and len(set(prefix_takes(saved_total, 1, read))) != 1:
                continue   # turns of a record on both sides: the equal amounts of lockstep
            took = prefix_takes(saved_total, saved_unit, read)
            saved = saved_run(saved_total, 0, saved_total, took, origin=5, unit=saved_unit)
            for total, unit in [(1, 1), (2, 4), (3, 4), (2, 3), (saved_total, saved_unit)]:
                if unit == saved_unit == 1:
                    continue
                origin, starts = resume(saved, slots=total, offset=0, total=total,
                                        where="db: s", unit=unit)
                rr = RoundRobin(total, 0, starts, unit)
                if (total, unit) == (saved_total, saved_unit):   # the same round-robin
                    assert (origin, starts) == (5, tuple(saved["next"]))
                    continue
                assert origin == 5 + read and starts == tuple(s * unit for s in range(total))
                assert [rr.position(s, 0) for s in range(total)] == list(starts)


def test_batch_turns_that_are_not_a_prefix_are_refused():
    saved = {"replicas": 2, "origin": 0, "next": [8, 6], "unit": 2}   # 0 took 2 turns, 1 one
    assert resume(saved, slots=1, offset=0, total=1, where="db: s", unit=1) == (0 + 6, (0,))
    saved = {"replicas": 2, "origin": 0, "next": [4, 10], "unit": 2}  # 1 ran a turn ahead
    with pytest.raises(DataError, match="^db: s is for 2 replicas whose records read are not "
                                        "the stream's first ones, and this run has 1; resume "
                                        "with 2 devices$"):
        resume(saved, slots=1, offset=0, total=1, where="db: s", unit=1)


@pytest.mark.parametrize("saved", [
    {"replicas": 2, "origin": 0, "next": [1, 2]},  # positions of the wrong replicas
    {"replicas": 2, "origin": 0, "next": [0, 1, 2]},  # more replicas than the round-robin
    {"replicas": 4, "origin": 0, "next": [2, 3], "offset": 3},  # a slice that does not fit
    {"replicas": 2, "origin": 0, "next": []},
    {"replicas": 2, "next": [0, 1]},
    {"replicas": "two", "origin": 0, "next": [0, 1]},
    {"replicas": 2, "origin": 0, "next": [0, 1], "unit": 2},  # position 1: replica 0's turn
    {"replicas": 2, "origin": 0, "next": [0, 2], "unit": 0},
    [0, 1],
])
def test_a_state_no_round_robin_wrote_is_a_one_line_error(saved):
    with pytest.raises(DataError, match=r"^db: s is not a read state of a round-robin \(.*\); "
                                        "resume from an unchanged solver state$"):
        resume(saved, slots=1, offset=0, total=1, where="db: s")
