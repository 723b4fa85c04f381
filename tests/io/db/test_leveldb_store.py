"""LevelDB: the writer and reader (key order, batches, .partial and resume, one shared handle),
the database interface both backends share (open_db, detection, cursors) and the one-line
errors for the other kind, a missing or locked database and a missing plyvel."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool
from caffe_py.io.db.db import detect, open_db, open_writer
from caffe_py.io.db.partial import partial_path
from caffe_py.io.formats.datum import datum_from_array, encode_datum
from caffe_py.io.reader import FeedSpec

pytest.importorskip("plyvel")


def fill(path, n: int, backend: str = "leveldb", commit_every: int = 1000):
    writer = open_writer(path, backend)
    writer.commit_every = commit_every
    with writer:
        for i in range(n):
            value = encode_datum(datum_from_array(np.full((1, 2, 2), i, np.uint8), i))
            writer.put(b"%08d" % i, value)
    return path


def test_writer_and_reader_round_trip_in_key_order(tmp_path):
    db = fill(tmp_path / "db", 23, commit_every=5)
    assert detect(db) == "leveldb" and not partial_path(db).exists()
    with open_db(db, "LEVELDB") as reader:
        assert len(reader) == 23
        keys = [k for k, _ in reader]
        assert keys == [b"%08d" % i for i in range(23)]
        assert [k for k, _ in reader.records(b"00000020")] == [b"00000020", b"00000021",
                                                                 b"00000022"]
        assert reader.first()[0] == b"00000000"


def test_interrupted_write_resumes_after_the_last_batch(tmp_path):
    db = tmp_path / "db"
    writer = open_writer(db, "leveldb")
    writer.commit_every = 4
    for i in range(10):
        writer.put(b"%08d" % i, b"v")
    writer.abandon()  # commits the pending 2 as well
    assert not db.exists() and partial_path(db).is_dir()
    with pytest.raises(DataError, match=r"db\.partial is left from an interrupted conversion"):
        open_writer(db, "leveldb")
    resumed = open_writer(db, "leveldb", resume=True)
    assert (resumed.resumed, resumed.last_key) == (10, b"00000009")
    resumed.put(b"00000010", b"v")
    assert resumed.finish().records == 11
    with open_db(db, "leveldb") as reader:
        assert len(reader) == 11


def test_cursor_reads_runs_and_wraps_for_both_backends(tmp_path):
    for backend in ("lmdb", "leveldb"):
        with open_db(fill(tmp_path / backend, 5, backend), backend) as reader:
            cursor = reader.cursor()
            cursor.seek(13)  # 13 mod 5: record 3
            keys, values = cursor.read(2)
            assert keys == (b"00000003", b"00000004") and len(values) == 2
            assert cursor.read(3)[0] == (b"00000000", b"00000001", b"00000002")
            cursor.close()


def test_the_other_kind_is_named_in_one_line(tmp_path):
    lev, lm = fill(tmp_path / "lev", 2), fill(tmp_path / "lm", 2, "lmdb")
    with pytest.raises(DataError) as err:
        open_db(lev, "lmdb")
    assert str(err.value) == f"{lev}: is a LevelDB database, not LMDB; pass --backend leveldb"
    with pytest.raises(DataError) as err:
        open_db(lm, "leveldb", switch=lambda kind: f"set data_param.backend: {kind.upper()}")
    assert str(err.value) == f"{lm}: is an LMDB database, not LevelDB; set data_param.backend: " \
                             "LMDB"


def test_missing_and_foreign_directories(tmp_path):
    with pytest.raises(DataError, match=r"nope: database not found; create it with `cpy "
                                        r"convert` or fix data_param.source$"):
        open_db(tmp_path / "nope", "leveldb")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: not a LevelDB database \(no CURRENT file\)"):
        open_db(tmp_path / "empty", "leveldb")


def test_one_handle_per_process_is_shared(tmp_path):
    db = fill(tmp_path / "db", 3)
    first, second = open_db(db, "leveldb"), open_db(db, "leveldb")
    assert len(first) == len(second) == 3
    first.close()
    assert [k for k, _ in second][-1] == b"00000002"  # still open for the other reader
    second.close()
    with open_db(db, "leveldb") as again:  # the last close released it; it opens anew
        assert len(again) == 3


def test_a_database_another_process_holds_is_refused_in_one_line(tmp_path):
    db = fill(tmp_path / "db", 2)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import plyvel, sys; d = plyvel.DB(sys.argv[1]); "
         "print('held', flush=True); sys.stdin.read()", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DataError, match=r"db: the LevelDB database is open in another "
                                            r"process \(LevelDB lets one process read it at a "
                                            r"time\); stop that process"):
            open_db(db, "leveldb")
    finally:
        holder.communicate("")


def test_without_plyvel_the_error_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plyvel", None)  # import plyvel raises ImportError
    with pytest.raises(DataError) as err:
        open_writer(tmp_path / "db", "leveldb")
    assert str(err.value) == ("LevelDB databases need the plyvel package; install it with "
                              "`pip install plyvel` (or `pip install caffe-py[leveldb]`)")


def test_reader_pool_gives_the_same_records_and_state_from_either_backend(tmp_path):
    """One producer for both: round-robin, wrap-around, saved positions and resume."""
    got = {}
    for backend in ("lmdb", "leveldb"):
        db = str(fill(tmp_path / backend, 7, backend))
        opener = lambda db=db, backend=backend: open_db(db, backend)  # noqa: E731
        with ReaderPool(replicas=2) as pool:
            spec = FeedSpec(db, 2, 2, (1, 2, 2), opener=opener)
            queues = [pool.subscribe(spec, "TRAIN/d", replica=r) for r in (0, 1)]
            pool.start()
            first = [q.get_batch(4, timeout=5).labels.tolist() for q in queues]
            for q in queues:
                q.mark_consumed(4)
            state = pool.state_dict()[db]
        with ReaderPool(replicas=1) as pool:
            queue = pool.subscribe(spec, "TRAIN/d", replica=0)
            pool.load_state_dict({db: state})
            pool.start()
            got[backend] = (first, state, queue.get_batch(3, timeout=5).labels.tolist())
    assert got["lmdb"] == got["leveldb"] == (
        [[0, 2, 4, 6], [1, 3, 5, 0]], {"TRAIN/d": {"replicas": 2, "origin": 0, "next": [8, 9]}},
        [1, 2, 3])


def test_a_damaged_log_is_refused_and_left_as_it_was(tmp_path):
    """LevelDB's recovery at open used to drop the damaged records and rewrite the log into a
    table: db-info then counted fewer records, said every record decodes, and the records were
    gone for good. Opened with paranoid checks, the database is refused in one line and its
    files are left as they were."""
    db = fill(tmp_path / "db", 250)
    logs = [p for p in db.iterdir() if p.suffix == ".log" and p.stat().st_size > 1000]
    assert logs, sorted(p.name for p in db.iterdir())
    data = bytearray(logs[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    logs[0].write_bytes(bytes(data))
    with pytest.raises(DataError) as info:
        open_db(db, "leveldb")
    assert str(info.value) == (f"{db}: corrupt LevelDB database (checksum mismatch); restore a "
                               "copy, or delete it and convert the data again")
    assert logs[0].read_bytes() == bytes(data)
