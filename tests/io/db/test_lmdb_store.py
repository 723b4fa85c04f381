"""LmdbWriter / LmdbReader: key order, batched commits, map growth, .partial and resume."""
from __future__ import annotations

import numpy as np
import pytest

from caffe_py.errors import DataError
from caffe_py.io.db.lmdb_store import (
    LmdbReader,
    LmdbWriter,
    StoredFiles,
    open_db,
    partial_path,
)


def _records(n: int, size: int = 10) -> list[tuple[bytes, bytes]]:
    return [(b"%08d" % i, bytes([i % 256]) * size) for i in range(n)]


def test_round_trip_in_key_order(tmp_path):
    db = tmp_path / "db"
    records = _records(25)
    with LmdbWriter(db, commit_every=7) as writer:
        for key, value in reversed(records):
            writer.put(key, value)
    assert writer.summary().records == 25 and writer.bytes == 25 * 18
    assert db.is_dir() and not partial_path(db).exists()
    with open_db(db) as reader:
        assert len(reader) == 25
        assert list(reader) == records
        assert list(reader.records(start_key=b"00000020")) == records[20:]
        assert reader.first() == records[0]
        assert reader.get(b"00000003") == records[3][1]


def test_map_grows_past_a_tiny_start(tmp_path):
    db = tmp_path / "db"
    records = _records(300, size=4000)  # 1.2 MB of values into a 64 KiB map
    with LmdbWriter(db, map_size=64 << 10, commit_every=100) as writer:
        for key, value in records:
            writer.put(key, value)
    assert writer.map_size >= 2 << 20 and writer.map_size % (64 << 10) == 0
    with open_db(db) as reader:
        assert list(reader) == records


def test_interrupted_write_leaves_partial_and_is_refused(tmp_path):
    db = tmp_path / "db"
    records = _records(25)
    with pytest.raises(KeyboardInterrupt):
        with LmdbWriter(db, commit_every=10) as writer:
            for key, value in records[:17]:
                writer.put(key, value)
            raise KeyboardInterrupt
    assert not db.exists() and partial_path(db).is_dir()
    with pytest.raises(DataError) as info:
        LmdbWriter(db)
    assert str(info.value) == (f"{db}.partial is left from an interrupted conversion; delete it, "
                               "or pass --resume to continue it")
    with pytest.raises(DataError) as info:
        open_db(db)
    assert str(info.value) == (f"{db}: database not found; the conversion into {db}.partial was "
                               "interrupted: run it again with --resume, or delete it and "
                               "convert again")


def test_resume_continues_after_the_last_committed_key(tmp_path):
    db = tmp_path / "db"
    records = _records(25)
    writer = LmdbWriter(db, commit_every=10)
    for key, value in records[:17]:
        writer.put(key, value)
    writer.abandon()  # commits the 17 put so far
    resumed = LmdbWriter(db, resume=True)
    assert (resumed.resumed, resumed.last_key) == (17, b"00000016")
    for key, value in records[resumed.resumed:]:
        resumed.put(key, value)
    summary = resumed.finish()
    assert (summary.records, summary.written) == (25, 8)
    with open_db(db) as reader:
        assert list(reader) == records


def test_a_resume_refuses_a_folder_no_conversion_left(tmp_path):
    """--resume into a DB.partial that is some other folder (or a link to one) would write
    data.mdb among its files and rename it to DB: refused, nothing written."""
    db, other = tmp_path / "db", tmp_path / "photos"
    other.mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg", "d.jpg"):
        (other / name).write_bytes(b"jpeg")
    (tmp_path / "db.partial").symlink_to(other)
    with pytest.raises(DataError) as info:
        LmdbWriter(db, resume=True)
    assert str(info.value) == (f"{tmp_path / 'db.partial'} is a link, and conversions write "
                               "their own folder; remove the link and convert again")
    (tmp_path / "db.partial").unlink()
    other.rename(tmp_path / "db.partial")
    with pytest.raises(DataError) as info:
        LmdbWriter(db, resume=True)
    assert str(info.value) == (f"{tmp_path / 'db.partial'} holds a.jpg, b.jpg, c.jpg and 1 "
                               "more, which no conversion writes: it is not one left by an "
                               "interrupted conversion; move it away, or convert to another "
                               "path")
    assert sorted(p.name for p in (tmp_path / "db.partial").iterdir()) == [
        "a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    assert not db.exists()


def test_existing_database_is_not_overwritten(tmp_path):
    db = tmp_path / "db"
    with LmdbWriter(db) as writer:
        writer.put(b"a", b"1")
    with pytest.raises(DataError) as info:
        LmdbWriter(db)
    assert str(info.value) == f"{db} already exists; delete it or write to another path"


def test_missing_database_names_the_fix(tmp_path):
    with pytest.raises(DataError) as info:
        LmdbReader(tmp_path / "nope")
    assert str(info.value) == (f"{tmp_path}/nope: database not found; create it with "
                               "`cpy convert` or fix data_param.source")
    with pytest.raises(DataError) as info:
        open_db(tmp_path / "data/fashion_mnist/train_lmdb")
    assert str(info.value).endswith("database not found; run `make data`")


def test_not_a_database(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no data.mdb in this directory, not an LMDB "):
        open_db(tmp_path / "empty")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(DataError, match=r"file: not an LMDB database directory"):
        open_db(tmp_path / "file")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "data.mdb").write_bytes(b"\x00" * 10000)
    with pytest.raises(DataError) as info:
        open_db(corrupt)
    message = str(info.value)
    assert message.startswith(f"{corrupt}: corrupt LMDB database (")
    assert message.endswith("); delete it and convert the data again")


def test_empty_database_has_no_first_record(tmp_path):
    with LmdbWriter(tmp_path / "db"):
        pass
    with open_db(tmp_path / "db") as reader:
        assert len(reader) == 0 and list(reader) == []
        with pytest.raises(DataError, match="the database is empty"):
            reader.first()


def test_unwritable_location(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(DataError) as info:
        LmdbWriter(tmp_path / "file" / "db")
    assert str(info.value) == (f"{tmp_path}/file/db.partial: cannot create ({tmp_path}/file "
                               "is a file, not a folder); choose a writable path")


def test_two_readers_of_one_database_share_its_environment(tmp_path):
    with LmdbWriter(tmp_path / "db") as writer:
        for key, value in _records(3):
            writer.put(key, value)
    first, second = open_db(tmp_path / "db"), open_db(tmp_path / "db")
    first.close()
    assert len(second) == 3
    assert second.first() == _records(3)[0]
    second.close()
    with open_db(tmp_path / "db") as again:  # the last close released it; it opens anew
        assert len(again) == 3


def _stored(db, keys, spans) -> StoredFiles:
    return StoredFiles(str(db), tuple(keys), np.array(spans, np.int64).reshape(-1, 3))


def test_stored_files_are_read_again_by_key(tmp_path):
    db = tmp_path / "db"
    with LmdbWriter(db) as writer:
        for key, value in _records(6):
            writer.put(key, value)
    files = _stored(db, [b"%08d" % i for i in (4, 1, 5)],
                    [[2, 5, 10], [0, 10, 10], [9, 10, 10]])
    assert files.read() == (b"\x04" * 3, b"\x01" * 10, b"\x05")
    joined = StoredFiles.join([files[2:], files[::2]])  # split, strided, joined
    assert joined.read() == (b"\x05", b"\x04" * 3, b"\x05") and len(joined) == 3


@pytest.mark.parametrize(("key", "size", "what"), [(b"00000009", 10, "is gone"),
                                                    (b"00000002", 12, "changed")])
def test_a_stored_record_written_since_it_was_read_is_one_line(tmp_path, key, size, what):
    db = tmp_path / "db"
    with LmdbWriter(db) as writer:
        for k, value in _records(3):
            writer.put(k, value)
    with pytest.raises(DataError) as error:
        _stored(db, [b"00000000", key], [[0, 1, 10], [0, 1, size]]).read()
    assert str(error.value) == (
        f"{db}: record '{key.decode()}' {what} since the data reader read it: the database "
        "was written while training read it; write a new database instead (cpy convert into "
        "another path)")


def test_a_forked_process_reads_with_its_parents_environment_and_leaves_its_slots(tmp_path):
    """A child of a process reading the database reads it through the environment fork
    copied (a second open is refused in it) and leaves the parent's reader slot in lock.mdb
    alone; a database the parent had not open gets one of its own."""
    import os

    from caffe_py.io.db.lmdb_store import begin, forked_environment, read_files

    db, other = tmp_path / "db", tmp_path / "other"
    for path in (db, other):
        with LmdbWriter(path) as writer:
            for k, value in _records(3):
                writer.put(k, value)
    with open_db(db) as reader:
        cursor = reader.cursor()  # the parent's read transaction: one live reader slot
        parent = os.getpid()

        def live_slots() -> list[str]:
            env = forked_environment(str(db))  # the parent's own here
            return [row for row in env.readers().splitlines()[1:]
                    if row.split()[0] == str(parent) and row.split()[-1] != "-"]

        assert len(live_slots()) == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: any failure is a non-zero exit
            try:
                got = []
                for path in (db, other):
                    env = forked_environment(str(path))
                    with begin(env, buffers=True) as txn:
                        got += [bytes(f) for f in read_files(
                            txn, str(path), [b"00000001"], np.array([[0, 2, 10]]))]
                os.write(write, b"".join(got))
                os._exit(0)
            except BaseException:  # noqa: BLE001 (reported by the exit code)
                os._exit(3)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.read(read, 100) == b"\x01" * 4
        os.close(read)
        assert len(live_slots()) == 1  # still the parent's, still live
        cursor.close()


def test_runs_of_stored_and_copied_files_join_as_files(tmp_path):
    """A chunk the reader copied (a record in another field layout) next to stored ones: the
    batch's files are read, in order."""
    from caffe_py.io.reader.records import RecordBatch, join

    db = tmp_path / "db"
    with LmdbWriter(db) as writer:
        for key, value in _records(4):
            writer.put(key, value)
    stored = _stored(db, [b"00000001", b"00000002"], [[0, 2, 10], [0, 3, 10]])
    parts = [RecordBatch.of(0, 1, stored, np.array([1, 2]), stored.keys),
             RecordBatch.of(2, 1, (b"xyz",), np.array([9]), (b"00000003",)),
             RecordBatch.of(3, 1, stored[:1], np.array([1]), stored.keys[:1])]
    batch = join(parts)
    assert batch.files == (b"\x01" * 2, b"\x02" * 3, b"xyz", b"\x01" * 2)
    assert batch.labels.tolist() == [1, 2, 9, 1] and batch.keys[2] == b"00000003"
    alone = join([parts[0], parts[2]])
    assert isinstance(alone.files, StoredFiles) and alone.files.read() == (
        b"\x01" * 2, b"\x02" * 3, b"\x01" * 2)
