"""ReaderPool: rc3's round-robin DataReader, wrap-around, streams, bounds, state and failures.

No test sleeps to show that something does not happen: the producer is observed at rest with
``pool.settle()`` (it returns once the producer has looked for room after the call and found
none), and a consumer is known to be blocked once its thread enters ``Condition.wait``.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch
from support import write_db, write_records

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.io.formats.datum import datum_from_array, encode_datum
from caffe_py.io.reader import FeedSpec
from caffe_py.io.reader.reader import Detached
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

SHAPE = (1, 4, 4)


pytestmark = pytest.mark.usefixtures("no_stray_threads")


def make_db(path, n: int, corrupt: int | None = None) -> str:
    """Record i: every pixel i % 256, label i; key %08d. ``corrupt`` stores garbage there."""
    return write_records(path, ((np.full(SHAPE, i % 256, np.uint8), i) for i in range(n)),
                         {corrupt: b"\xff\xff\xff"} if corrupt is not None else None)


def labels(queue, n: int) -> list[int]:
    return queue.get_batch(n, timeout=5).labels.tolist()


def subscribe(pool, db, replica=0, stream="TRAIN/data", batch_size=2, prefetch=4):
    return pool.subscribe(FeedSpec(db, batch_size, prefetch, SHAPE), stream, replica=replica)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_round_robin_one_record_per_replica_in_turn(tmp_path, n):
    db = make_db(tmp_path / "db", 100)
    with ReaderPool(replicas=n) as pool:
        queues = [subscribe(pool, db, replica=i) for i in range(n)]
        pool.start()
        got = [labels(q, 6) for q in queues]
    assert got == [[i + n * k for k in range(6)] for i in range(n)]


def test_two_pools_read_one_database_at_once(tmp_path):
    """A TRAIN pool and a separate TEST pool on one database (LMDB allows one open per
    process; the environment is shared), and both still read it from the start."""
    db = make_db(tmp_path / "db", 10)
    with ReaderPool(replicas=1) as train, ReaderPool(replicas=1) as test:
        a = subscribe(train, db, stream="TRAIN/data")
        b = subscribe(test, db, stream="TEST/data")
        train.start()
        test.start()
        assert labels(a, 4) == [0, 1, 2, 3]
        assert labels(b, 3) == [0, 1, 2]


def test_wraps_to_the_first_record(tmp_path):
    db = make_db(tmp_path / "db", 5)
    with ReaderPool(replicas=2) as pool:
        a, b = subscribe(pool, db, 0), subscribe(pool, db, 1)
        pool.start()
        assert labels(a, 6) == [0, 2, 4, 1, 3, 0]
        assert labels(b, 6) == [1, 3, 0, 2, 4, 1]


def test_two_layers_on_one_source_each_read_it_alone(tmp_path):
    db = make_db(tmp_path / "db", 7)
    with ReaderPool(replicas=1) as pool:
        data = subscribe(pool, db, stream="TRAIN/data", batch_size=3)
        other = subscribe(pool, db, stream="TRAIN/label_only", batch_size=2)
        pool.start()
        # one stream racing ahead never blocks the other
        assert labels(data, 20) == [i % 7 for i in range(20)]
        assert labels(other, 9) == [i % 7 for i in range(9)]
        assert len(list(pool.threads())) == 1  # one producer for the database


def test_queue_bound_is_prefetch_times_batch(tmp_path):
    db = make_db(tmp_path / "db", 50)
    with ReaderPool(replicas=2) as pool:
        a = subscribe(pool, db, 0, batch_size=3, prefetch=2)
        b = subscribe(pool, db, 1, batch_size=3, prefetch=2)
        pool.start()
        position = pool.settle(timeout=5)[db]["TRAIN/data"]  # the producer waits for room
        assert (len(a), len(b), position) == (6, 6, 12)
        assert labels(a, 1) == [0]
        # one slot freed: exactly record 12 (replica 0's turn) is read; a freed slot below
        # half the queue does not wake the producer, it finds the room within a wait slice
        position = pool.settle(timeout=5)[db]["TRAIN/data"]
        assert (len(a), len(b), position) == (6, 6, 13)


def test_settle_waits_for_the_producer_to_rest_and_names_every_stream(tmp_path):
    db = make_db(tmp_path / "db", 50)
    with ReaderPool() as pool:
        a = subscribe(pool, db, stream="TRAIN/data", batch_size=2)
        b = subscribe(pool, db, stream="TRAIN/label_only", batch_size=3)
        with pytest.raises(DataError, match="^start the data readers before waiting for them$"):
            pool.settle()
        pool.start()
        assert pool.settle(timeout=5) == {db: {"TRAIN/data": 8, "TRAIN/label_only": 12}}
        a.detach()
        b.detach()
        # every queue taken off the producer: it has returned, where it stopped
        assert pool.settle(timeout=5) == {db: {"TRAIN/data": 8, "TRAIN/label_only": 12}}
        with pytest.raises(Detached, match="TRAIN/data"):
            a.get_batch(9, timeout=5)


def test_corrupt_record_reaches_the_consumer_naming_the_key(tmp_path):
    db = make_db(tmp_path / "db", 6, corrupt=3)
    with ReaderPool() as pool:
        q = subscribe(pool, db, batch_size=2, prefetch=4)
        pool.start()
        assert labels(q, 3) == [0, 1, 2]
        with pytest.raises(DataError, match=f"^{db}: record '00000003' is not a Caffe Datum"):
            q.get_batch(1, timeout=5)
        with pytest.raises(DataError, match="record '00000003'"):  # and stays failed
            q.get_batch(1, timeout=5)


def test_a_stalled_consumer_raises_instead_of_hanging(tmp_path):
    db = make_db(tmp_path / "db", 10)
    with ReaderPool(replicas=2) as pool:
        a, _ = subscribe(pool, db, 0, batch_size=1, prefetch=1), subscribe(pool, db, 1,
                                                                          batch_size=1,
                                                                          prefetch=1)
        pool.start()
        assert labels(a, 1) == [0]
        # replica 1 never reads, so record 3 (replica 1's turn) blocks the round-robin
        assert labels(a, 1) == [2]
        with pytest.raises(DataError, match="no record arrived for 0 s .*another replica"):
            a.get_batch(1, timeout=0.3)


def announce_wait(event: threading.Event):
    """A profile function that sets ``event`` when its thread calls Condition.wait: a
    consumer that found no record and blocks."""
    wait = threading.Condition.wait.__code__

    def profile(frame, what, arg):
        if what == "call" and frame.f_code is wait:
            event.set()

    return profile


def test_closed_pool_wakes_consumers(tmp_path):
    db = make_db(tmp_path / "db", 10)
    pool = ReaderPool(replicas=2)
    a = subscribe(pool, db, 0, batch_size=1, prefetch=1)
    subscribe(pool, db, 1, batch_size=1, prefetch=1)
    pool.start()
    errors, blocked = [], threading.Event()

    def take_five():  # replica 1 never reads: replica 0 gets records 0 and 2, then blocks
        sys.setprofile(announce_wait(blocked))
        try:
            a.get_batch(5, timeout=30)
        except DataError as exc:
            errors.append(exc)
        finally:
            sys.setprofile(None)

    waiter = threading.Thread(target=take_five)
    waiter.start()
    assert blocked.wait(5)
    pool.close()
    pool.close()  # idempotent
    waiter.join(5)
    assert not waiter.is_alive()
    assert [str(e) for e in errors] == [f"{db}: the data reader was closed"]


def test_missing_database_fails_at_start(tmp_path):
    pool = ReaderPool()
    subscribe(pool, str(tmp_path / "nope"))
    with pytest.raises(DataError, match="nope: database not found; create it with `cpy convert`"):
        pool.start()
    assert list(pool.threads()) == []


# --- through Data layers: state and resume --------------------------------------------------
class FakeNet:
    def __init__(self, *layers):
        self.layers = layers

    def data_layers(self):
        return list(self.layers)


def data_layer(db, name="data", batch_size=3, crop=2):
    spec = parse_layer({"name": name, "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": batch_size},
                        "transform_param": {"crop_size": crop, "mirror": True}},
                       Source(), "layer")
    return lookup("Data")(spec, [], BuildContext())


def run(pools_nets, steps):
    """Labels (and data) of ``steps`` forwards of every replica."""
    out = []
    for _ in range(steps):
        for layer in pools_nets:
            data, label = layer()
            out.append((label.tolist(), data))
    return out


def straight_run(db, seed: int, steps: int):
    """``steps`` batches of one replica reading ``db`` alone: the order others are held to."""
    layer = data_layer(db)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(layer), pool, seed=seed)
        pool.start()
        return run([layer], steps)


def test_state_resumes_the_exact_sequence(tmp_path):
    db = make_db(tmp_path / "db", 11)
    expected = straight_run(db, 5, 6)
    first = data_layer(db)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(first), pool, seed=5)
        pool.start()
        head = run([first], 4)
        state = pool.state_dict()
    assert state == {db: {"TRAIN/data": {"replicas": 1, "origin": 0, "next": [12]}}}
    resumed = data_layer(db)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(resumed), pool, seed=5)
        pool.load_state_dict(state)
        pool.start()
        tail = run([resumed], 2)
    for (want_label, want), (got_label, got) in zip(expected, head + tail, strict=True):
        assert want_label == got_label
        assert torch.equal(want, got)  # the same crops and flips too


def test_n_replicas_of_b_read_what_one_replica_of_n_b_reads(tmp_path):
    db = make_db(tmp_path / "db", 13)
    one = data_layer(db, batch_size=6)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(one), pool, seed=1)
        pool.start()
        big = run([one], 3)
    layers = [data_layer(db, batch_size=2) for _ in range(3)]
    with ReaderPool(replicas=3) as pool:
        for i, layer in enumerate(layers):
            attach_feeds(FakeNet(layer), pool, replica=i, seed=1)
        pool.start()
        small = run(layers, 3)
    for step in range(3):
        parts = small[3 * step:3 * step + 3]
        merged = sorted(zip(sum((p[0] for p in parts), []),
                            torch.cat([p[1] for p in parts]), strict=True),
                        key=lambda t: t[0])
        want = sorted(zip(big[step][0], big[step][1], strict=True), key=lambda t: t[0])
        assert [m[0] for m in merged] == [w[0] for w in want]
        assert all(torch.equal(m[1], w[1]) for m, w in zip(merged, want, strict=True))


def test_state_moves_to_another_replica_count(tmp_path):
    db = make_db(tmp_path / "db", 40)
    layers = [data_layer(db, batch_size=2) for _ in range(2)]
    with ReaderPool(replicas=2) as pool:
        for i, layer in enumerate(layers):
            attach_feeds(FakeNet(layer), pool, replica=i, seed=0)
        pool.start()
        run(layers, 3)  # 12 records read
        state = pool.state_dict()
    assert state[db]["TRAIN/data"]["next"] == [12, 13]
    single = data_layer(db, batch_size=4)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(single), pool, seed=0)
        pool.load_state_dict(state)
        pool.start()
        assert single()[1].tolist() == [12, 13, 14, 15]
    uneven = {db: {"TRAIN/data": {"replicas": 2, "origin": 0, "next": [12, 15]}}}
    with ReaderPool() as pool:
        attach_feeds(FakeNet(data_layer(db)), pool, seed=0)
        with pytest.raises(DataError, match="for 2 replicas that had read unequal amounts"):
            pool.load_state_dict(uneven)


@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
@pytest.mark.parametrize("n", [2, 3])
def test_batch_turns_hand_each_replica_the_batches_one_replica_reads(tmp_path, monkeypatch,
                                                                     cache_bytes, n):
    """In turns of a batch (a test pass split over N replicas) replica r reads batches r,
    r + N, ... whole: batch g, taken by replica g mod N, is one replica's batch g, records,
    crops and flips alike, on the threads and from the decoded database (passes after the
    first, past the wrap at 11 records). The state is a prefix of the stream: one replica
    resumes right after it."""
    import caffe_py.io.reader.reader as reader

    monkeypatch.setattr(reader, "CACHE_BYTES", cache_bytes)
    db = make_db(tmp_path / "db", 11)
    expected = straight_run(db, 3, 12)
    layers = [data_layer(db) for _ in range(n)]
    with ReaderPool(replicas=n) as pool:
        for r, layer in enumerate(layers):
            attach_feeds(FakeNet(layer), pool, replica=r, seed=3, by_batch=True)
        pool.start()
        queues = [layer.feed.records for layer in layers]
        got = []
        for g in range(10):
            assert min(range(n), key=lambda r: queues[r].next_position) == g % n
            got.append(run([layers[g % n]], 1)[0])
        state = pool.state_dict()
        gathered = [layer.feed.gathers_in_loop for layer in layers]
    assert gathered == [bool(cache_bytes)] * n
    for (want_label, want), (got_label, data) in zip(expected, got, strict=False):
        assert want_label == got_label
        assert torch.equal(want, data)
    saved = state[db]["TRAIN/data"]
    assert saved["unit"] == 3 and saved["replicas"] == n
    resumed = data_layer(db)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(resumed), pool, seed=3)
        pool.load_state_dict(state)
        pool.start()
        # the records of batches 10 and 11 (a resume with another count numbers positions
        # from there, so a TRAIN crop is drawn anew; a TEST pass has none)
        assert [label for label, _ in run([resumed], 2)] == [lab for lab, _ in expected[10:]]


def test_state_for_an_unknown_stream_is_an_error(tmp_path):
    db = make_db(tmp_path / "db", 4)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(data_layer(db)), pool, seed=0)
        with pytest.raises(DataError, match="stream TEST/x, which no attached Data layer reads"):
            pool.load_state_dict({db: {"TEST/x": {"replicas": 1, "origin": 0, "next": [0]}}})


@pytest.mark.parametrize("saved", [{"replicas": 2, "origin": 0, "next": [12, 14]},
                                   {"replicas": 1, "origin": 0},
                                   {"replicas": 0, "origin": 0, "next": [0]}])
def test_a_state_that_no_round_robin_wrote_is_one_line(tmp_path, saved):
    db = make_db(tmp_path / "db", 4)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(data_layer(db)), pool, seed=0)
        with pytest.raises(DataError, match=f"^{db}: the saved data state of TRAIN/data is not "
                                            r"a read state of a round-robin \(.*\); resume "
                                            "from an unchanged solver state$"):
            pool.load_state_dict({db: {"TRAIN/data": saved}})


def test_records_the_fast_path_leaves_to_the_full_decoder(tmp_path):
    """Negative labels, an explicit encoded=false and float records read back exactly."""
    path = write_db(tmp_path / "db", [
        datum_from_array(np.full(SHAPE, i, np.uint8), -i if i % 2 else 1000 * i,
                         encoded=False if i < 2 else None) for i in range(4)])
    with ReaderPool() as pool:
        q = subscribe(pool, path)
        pool.start()
        got = q.get_batch(4, timeout=5)
    assert got.labels.tolist() == [0, -1, 2000, -3]
    assert [int(array.max()) for array in got.pixels] == [0, 1, 2, 3]


def test_a_record_of_another_size_names_its_key(tmp_path):
    path = write_db(tmp_path / "db", [datum_from_array(np.zeros(SHAPE, np.uint8), 0),
                                      datum_from_array(np.zeros((1, 5, 4), np.uint8), 0)],
                    keys=[b"a", b"b"])
    with ReaderPool() as pool:
        q = subscribe(pool, path)
        pool.start()
        with pytest.raises(DataError, match=r"record 'b' is uint8 \[1, 5, 4\] but the first "
                                            r"record is uint8 \[1, 4, 4\]; a Data layer needs"):
            q.get_batch(2, timeout=5)


CHILD = """
import signal, sys, threading
# what a terminal's Ctrl-C meets, whatever this child inherited from the test process
sys.stderr.write(f"SIGINT inherited: {signal.getsignal(signal.SIGINT)!r}, blocked: "
                 f"{signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])}\\n")
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
from caffe_py.io.reader import FeedSpec, ReaderPool
pool = ReaderPool(replicas=2)
q = pool.subscribe(FeedSpec(sys.argv[1], 1, 1, (1, 4, 4)), "s", replica=0)
pool.subscribe(FeedSpec(sys.argv[1], 1, 1, (1, 4, 4)), "s", replica=1)
pool.start()
q.get_batch(1)
if sys.argv[2] == "exit":
    print("waiting", flush=True)
    sys.exit(3)  # the pool is left open: its threads must not hold the process
q.get_batch(1)
WAIT = threading.Condition.wait.__code__
def announce(frame, what, arg):
    if what == "call" and frame.f_code is WAIT:
        sys.setprofile(None)
        print("blocked", flush=True)
sys.setprofile(announce)
q.get_batch(1)  # replica 1 never reads: blocks until Ctrl-C
"""


@pytest.mark.parametrize("how", ["exit", "sigint"])
def test_no_hang_at_exit_or_on_ctrl_c(tmp_path, how):
    import signal
    import subprocess

    db = make_db(tmp_path / "db", 10)
    child = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", CHILD, db, how],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # "blocked": the main thread is in the consumer's wait when Ctrl-C arrives
    assert child.stdout.readline() == ("waiting\n" if how == "exit" else "blocked\n")
    if how == "sigint":
        # "blocked" is printed by a profile hook at the wait's call; a SIGINT landing inside
        # that hook can be lost with it, so a child still waiting 2 s later gets another
        for _ in range(5):
            child.send_signal(signal.SIGINT)
            try:
                child.wait(2)
                break
            except subprocess.TimeoutExpired:
                pass
    try:
        _, err = child.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        pytest.fail(f"the child hung; its threads:\n{child.communicate()[1][-6000:]}")
    if how == "exit":
        assert child.returncode == 3
    else:
        # an uncaught KeyboardInterrupt ends Python by SIGINT, after the traceback
        assert child.returncode == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt")


def test_one_chunk_of_mixed_records_reads_back_exactly(tmp_path):
    """Labels of 1 to 5 varint bytes, encoded=false, a negative label and a record with an
    unknown field in one chunk: the numpy fast path groups them by length, and whatever it
    leaves goes through the full decoder."""
    path = tmp_path / "db"
    wanted = [0, 127, 128, 300, 16383, 16384, 2**21, 2**28, 2**31 - 1, -5, 7, 99]
    values = [encode_datum(datum_from_array(np.full(SHAPE, i, np.uint8), label,
                                            encoded=False if i % 3 == 0 else None))
              for i, label in enumerate(wanted)]
    values[10] += b"\x48\x01"  # field 9
    write_db(path, values)
    with ReaderPool() as pool:
        q = subscribe(pool, str(path), batch_size=12, prefetch=1)
        pool.start()
        got = q.get_batch(12, timeout=5)
    assert got.labels.tolist() == wanted
    assert [a.tolist() for a in got.pixels] == [np.full(SHAPE, i).tolist() for i in range(12)]
    assert list(got.keys) == [b"%08d" % i for i in range(12)]
    assert got.positions.tolist() == list(range(12))


@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
def test_passes_after_the_first_equal_it_with_or_without_the_cache(tmp_path, monkeypatch,
                                                                   cache_bytes):
    """A small database is kept decoded after the first pass; later passes (and replicas,
    and a resumed origin) read exactly what the database holds."""
    import caffe_py.io.reader.reader as reader

    monkeypatch.setattr(reader, "CACHE_BYTES", cache_bytes)
    db = make_db(tmp_path / "db", 11)
    with ReaderPool(replicas=2) as pool:
        queues = [subscribe(pool, db, replica=i, batch_size=5, prefetch=2) for i in range(2)]
        pool.load_state_dict({db: {"TRAIN/data": {"replicas": 2, "origin": 3, "next": [0, 1]}}})
        pool.start()
        got: list[list] = [[], []]
        for _ in range(6):  # the replicas take turns, a batch each (the round-robin)
            for replica, q in enumerate(queues):
                batch = q.get_batch(5, timeout=5)
                got[replica] += [(int(label), int(array[0, 0, 0]), key) for label, array, key
                                 in zip(batch.labels, batch.pixels, batch.keys, strict=True)]
        # kept decoded (and complete) exactly when the database fits in CACHE_BYTES
        assert (queues[0].decoded() is not None) == bool(cache_bytes)
    for replica in range(2):
        indices = [(3 + replica + 2 * k) % 11 for k in range(30)]
        assert got[replica] == [(i, i, b"%08d" % i) for i in indices]


# --- a slice of a larger round-robin (one pool per host) -------------------------------------
@pytest.mark.parametrize("local, total", [(1, 2), (2, 4), (1, 3), (2, 6)])
def test_pools_of_slices_hand_out_what_one_pool_of_all_replicas_does(tmp_path, local, total):
    """Pool k of total/local holds global replicas k*local ..: replica g gets g, g+G, ...
    (wrapping at 7 records), and the others' records are skipped, never queued."""
    db = make_db(tmp_path / "db", 7)
    got = {}
    for offset in range(0, total, local):
        with ReaderPool(replicas=local, replica_offset=offset, total_replicas=total) as pool:
            queues = [subscribe(pool, db, replica=i, prefetch=3) for i in range(local)]
            pool.start()
            for i, q in enumerate(queues):
                got[offset + i] = labels(q, 5)
    assert got == {g: [(g + total * k) % 7 for k in range(5)] for g in range(total)}


def test_a_slice_must_fit_in_the_total():
    with pytest.raises(ValueError, match=r"replicas 3..4 do not fit in total_replicas 4"):
        ReaderPool(replicas=2, replica_offset=3, total_replicas=4)


def test_a_slice_needs_every_local_replica_attached(tmp_path):
    db = make_db(tmp_path / "db", 7)
    with ReaderPool(replicas=2, replica_offset=2, total_replicas=4) as pool:
        subscribe(pool, db, replica=0)
        with pytest.raises(DataError, match="has 1 of this pool's 2 replicas attached"):
            pool.start()


def test_slice_state_is_global_and_resumes_in_any_layout(tmp_path):
    """Two pools of 2 of 4 replicas save global positions; the second pool's state resumes a
    slice, and one pool of 4 or of 1 replica, at the same record."""
    db = make_db(tmp_path / "db", 40)
    states = []
    for offset in (0, 2):
        layers = [data_layer(db, batch_size=2) for _ in range(2)]
        with ReaderPool(replicas=2, replica_offset=offset, total_replicas=4) as pool:
            for i, layer in enumerate(layers):
                attach_feeds(FakeNet(layer), pool, replica=i, seed=0)
            pool.start()
            run(layers, 3)  # 3 batches of 2 per replica: 24 records of the 4 replicas
            states.append(pool.state_dict())
    assert states[0][db]["TRAIN/data"] == {"replicas": 4, "origin": 0, "next": [24, 25],
                                           "offset": 0}
    assert states[1][db]["TRAIN/data"] == {"replicas": 4, "origin": 0, "next": [26, 27],
                                           "offset": 2}
    # the slice of rank 1 resumed from rank 0's state (what a resumed run on two hosts does)
    layers = [data_layer(db, batch_size=2) for _ in range(2)]
    with ReaderPool(replicas=2, replica_offset=2, total_replicas=4) as pool:
        for i, layer in enumerate(layers):
            attach_feeds(FakeNet(layer), pool, replica=i, seed=0)
        pool.load_state_dict(states[0])
        pool.start()
        assert [layer()[1].tolist() for layer in layers] == [[26, 30], [27, 31]]
    single = data_layer(db, batch_size=4)
    with ReaderPool() as pool:
        attach_feeds(FakeNet(single), pool, seed=0)
        pool.load_state_dict(states[1])
        pool.start()
        assert single()[1].tolist() == [24, 25, 26, 27]


def test_a_slice_resumes_its_part_of_a_one_pool_state(tmp_path):
    db = make_db(tmp_path / "db", 40)
    state = {db: {"TRAIN/data": {"replicas": 4, "origin": 0, "next": [8, 9, 14, 11]}}}
    layers = [data_layer(db, batch_size=1) for _ in range(2)]
    with ReaderPool(replicas=2, replica_offset=2, total_replicas=4) as pool:
        for i, layer in enumerate(layers):
            attach_feeds(FakeNet(layer), pool, replica=i, seed=0)
        pool.load_state_dict(state)
        pool.start()
        assert [layer()[1].tolist() for layer in layers] == [[14], [11]]


def test_a_slice_decodes_only_its_own_records_without_the_cache(tmp_path, monkeypatch):
    """Without the cache each pool decodes only its replicas' records: a corrupt record is
    reported by the slice it belongs to, naming its key (record 3 of 9 is replica 1's on the
    first pass, position 3, and replica 0's on the second, position 12)."""
    import caffe_py.io.reader.reader as reader

    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    db = make_db(tmp_path / "db", 9, corrupt=3)
    with ReaderPool(replicas=1, replica_offset=0, total_replicas=2) as pool:
        queue = subscribe(pool, db, prefetch=4)
        pool.start()
        assert labels(queue, 5) == [0, 2, 4, 6, 8]  # past 3: the other slice's, not decoded
        with pytest.raises(DataError, match="00000003"):
            labels(queue, 2)
    with ReaderPool(replicas=1, replica_offset=1, total_replicas=2) as pool:
        queue = subscribe(pool, db, prefetch=4)
        pool.start()
        assert labels(queue, 1) == [1]
        with pytest.raises(DataError, match="00000003"):
            labels(queue, 2)


def test_a_resume_follows_the_database_to_a_moved_folder(tmp_path):
    """Saved positions name the database's path; when no layer reads that path any more,
    the one database of the same name read by the saved layers takes them."""
    old = make_db(tmp_path / "run1" / "db", 10)
    with ReaderPool() as pool:
        queue = subscribe(pool, old)
        pool.start()
        assert labels(queue, 3) == [0, 1, 2]
        queue.mark_consumed(3)
        state = pool.state_dict()
    new = make_db(tmp_path / "run2" / "db", 10)
    with ReaderPool() as pool:
        queue = subscribe(pool, new)
        pool.load_state_dict(state)
        pool.start()
        assert labels(queue, 2) == [3, 4]
    with ReaderPool() as pool, pytest.raises(DataError, match="which no attached Data layer"):
        subscribe(pool, make_db(tmp_path / "other", 10))
        pool.load_state_dict(state)


def test_big_raw_records_are_copied_by_the_worker_threads(tmp_path, monkeypatch):
    """Raw records of SEPARATE_COPY_BYTES or more (ImageNet's) leave the map through the
    pool's worker threads, a chunk in parts of at least COPY_PART_BYTES; the records read
    back exactly. Small records start no worker."""
    from caffe_py.io.decoders.workers import DecodeOptions, DecodeWorkers
    from caffe_py.io.reader import decode

    shape = (3, 150, 150)
    path = tmp_path / "big"
    write_db(path, [encode_datum(datum_from_array(np.full(shape, i, np.uint8), i * 50))
                    for i in range(40)])
    parts = []
    run = DecodeWorkers.run

    def spy(self, part, n, *, where, **kw):
        parts.append((n, kw.get("parts")))
        return run(self, part, n, where=where, **kw)

    monkeypatch.setattr(DecodeWorkers, "run", spy)
    monkeypatch.setattr(decode, "COPY_PART_BYTES", 1 << 20)
    with ReaderPool(decode=DecodeOptions(workers=3)) as pool:
        q = pool.subscribe(FeedSpec(str(path), 40, 1, shape), "TRAIN/data", replica=0)
        pool.start()
        assert len(pool.workers.threads) == 3
        got = q.get_batch(40, timeout=5)
    assert got.labels.tolist() == [i * 50 for i in range(40)]
    assert [int(a.min()) for a in got.pixels] == [int(a.max()) for a in got.pixels] == \
        list(range(40))
    assert parts == [(40, 2)]   # 40 records of 67,500 bytes: 2.7 MB, two parts of 1 MB or more
    with ReaderPool(decode=DecodeOptions(workers=3)) as pool:
        q = subscribe(pool, make_db(tmp_path / "small", 8))
        pool.start()
        assert labels(q, 8) == list(range(8)) and pool.workers.threads == []
