"""LMDB readers take LMDB's lock, as Caffe's do: a real writer process appending to, updating or
rewriting a database while caffe-py's cursor reads it (one read transaction, as a Data layer's
producer holds for the run) leaves the reader a consistent snapshot. Without the lock the
writer reused the reader's pages: MDB_PAGE_NOTFOUND, records that were not Datums, or an
assertion in LMDB that aborted the process. Where the lock cannot be taken (read-only media,
no permission) the reader goes on without it, with one warning, as Caffe does."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import ROOT, bare_lines, tiny_net, write_records

WRITER = """\
import sys
import lmdb
import numpy as np
from caffe_py.io.formats.datum import datum_from_array, encode_datum

path, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = lmdb.open(path, map_size=1 << 32, subdir=True)
n = env.stat()["entries"]
rng = np.random.default_rng(1)


def value(i):
    return encode_datum(datum_from_array(np.full((1, 16, 16), i % 256, np.uint8), i % 3))


for r in range(rounds):
    with env.begin(write=True) as txn:
        if mode == "append":
            for _ in range(50):
                txn.put(b"%08d" % n, value(n))
                n += 1
        elif mode == "update":
            for i in rng.integers(0, n, 50):
                txn.put(b"%08d" % i, value(int(i) + r + 1))
        else:  # rewrite: every record deleted and put again
            keys = [bytes(k) for k in txn.cursor().iternext(values=False)]
            for key in keys:
                txn.delete(key)
            for i, key in enumerate(keys):
                txn.put(key, value(i + r + 1))
print("written", flush=True)
"""

READER = """\
import sys
from pathlib import Path
from caffe_py.io.db.db import open_db
from caffe_py.io.formats.datum import datum_to_array, decode_record

path, stop = sys.argv[1], Path(sys.argv[2])
cursor = open_db(path).cursor()   # one read transaction, as a Data layer's producer holds
reads = errors = 0
first = ""
print("reading", flush=True)
while not stop.exists() or reads < 200_000:
    try:
        keys, values = cursor.read(64)
        for key, value in zip(keys, values):
            shape = datum_to_array(decode_record(bytes(value), source=path, key=key)).shape
            assert shape == (1, 16, 16), shape
            reads += 1
    except Exception as exc:
        errors += 1
        first = first or f"{type(exc).__name__}: {exc}"
print(f"{reads}|{errors}|{first}", flush=True)
"""


def python(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> Path:
    """20,000 Datum records of 1 x 16 x 16 (a 9 MB data.mdb, several levels of B-tree)."""
    path = tmp_path_factory.mktemp("lmdb") / "db"
    write_records(path, ((np.full((1, 16, 16), i % 256, np.uint8), i % 3) for i in range(20000)))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode, rounds", [("append", 200), ("update", 200), ("rewrite", 4)])
def test_a_reader_survives_a_writer(tmp_path, database, mode, rounds):
    db = tmp_path / "db"
    db.mkdir()
    (db / "data.mdb").write_bytes((database / "data.mdb").read_bytes())
    stop = tmp_path / "stop"
    reader = python(READER, str(db), str(stop), cwd=tmp_path)
    try:
        assert reader.stdout.readline().strip() == "reading", reader.stderr.read()
        writer = python(WRITER, str(db), mode, str(rounds), cwd=tmp_path)
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0 and out.strip() == "written", err
        stop.touch()
        out, err = reader.communicate(timeout=120)
    finally:
        reader.kill()
    assert reader.returncode == 0, (reader.returncode, err[-2000:])  # -6: LMDB's abort
    reads, errors, first = out.strip().split("|", 2)
    assert (int(errors), first) == (0, ""), out
    assert int(reads) >= 200_000


def test_read_only_media_are_read_without_the_lock_with_one_warning(tmp_path):
    """A database on a read-only mount with no lock.mdb (as Caffe's MDB_NOLOCK fallback):
    db-info reads it and says once that it reads without the lock."""
    media = tmp_path / "media"
    media.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(media)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        write_records(media / "db", ((np.full((1, 2, 2), i, np.uint8), i % 3) for i in range(9)))
        (media / "db" / "lock.mdb").unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(media)], check=True)
        done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "db-info",
                               str(media / "db")], capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["umount", str(media)], capture_output=True)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in bare_lines(done.stdout + done.stderr) if "lock" in line]
    assert warnings == [f"Warning: {media / 'db'}: reading the database without LMDB's reader "
                        "lock: it is on read-only media; as in Caffe, it must not be written "
                        "while it is read"]
    assert "records   9" in done.stdout


def test_no_permission_for_the_lock_reads_without_it_with_one_warning(tmp_path, monkeypatch,
                                                                     caplog):
    """EACCES on lock.mdb (another user's database, read as Caffe's ALLOW_LMDB_NOLOCK reads
    it): the environment is opened again without the lock, and one warning says so. (Root
    is never refused, so LMDB's refusal is stood in for here.)"""
    import lmdb

    from caffe_py.io.db import lmdb_store

    write_records(tmp_path / "db", ((np.full((1, 2, 2), i, np.uint8), i % 3) for i in range(5)))
    real = lmdb.open

    def refused(path, **kwargs):
        if kwargs.get("lock", True):
            raise lmdb.Error(f"{path}: Permission denied")
        return real(path, **kwargs)

    monkeypatch.setattr(lmdb, "open", refused)
    caplog.set_level("WARNING", "caffe_py")
    with lmdb_store.open_db(tmp_path / "db") as reader:
        assert len(reader) == 5 and reader.first()[0] == b"00000000"
    assert caplog.messages == [f"Warning: {tmp_path / 'db'}: reading the database without "
                               "LMDB's reader lock: no permission to take its reader lock "
                               "(Permission denied); as in Caffe, it must not be written while "
                               "it is read"]


def test_inspecting_a_database_creates_no_lock_file(tmp_path):
    """cpy net reads the first record for the shapes; without a lock.mdb (no writer has the
    database open) it creates none. Training creates it, as Caffe's readers do."""
    write_records(tmp_path / "db", ((np.full((1, 2, 2), i, np.uint8), i % 3) for i in range(5)))
    (tmp_path / "db" / "lock.mdb").unlink()
    (tmp_path / "net.yaml").write_text(tiny_net(data="""\
  - name: data
    type: Data
    top: [data, label]
    data_param: {source: db, batch_size: 2}
"""))
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "net", "net.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "data   Data" in done.stdout
    assert sorted(p.name for p in (tmp_path / "db").iterdir()) == ["data.mdb"]
