"""The decode processes: the crops equal the reader decoder's; a process that dies, a closed
pool and a parent that dies each end cleanly (one line, no hang, no process or shared buffer
left behind); Ctrl-C is the training process's."""
from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from support import count_cursor_reads, data_net
from synthetic import image_file, write_encoded_db

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.io.db.lmdb_store import LmdbReader
from caffe_py.io.decoders import decode_processes
from caffe_py.io.decoders.decode_processes import SHM_DIR, DecodeProcesses, ProcessCrops
from caffe_py.io.decoders.workers import DecodeOptions
from caffe_py.io.formats.datum import Datum, decode_image, encode_datum
from caffe_py.io.reader import reader
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

pytestmark = [pytest.mark.usefixtures("no_stray_threads"),
              pytest.mark.skipif(not Path(SHM_DIR).is_dir(), reason="needs /dev/shm")]
H, W = 12, 10


def shared_buffers() -> set[str]:
    return {p.name for p in Path(SHM_DIR).iterdir() if p.name.startswith("psm_")}


def children() -> list:
    return [p for p in multiprocessing.active_children() if p.is_alive()]


def decode(crops: ProcessCrops, files, flips=None) -> np.ndarray:
    out = np.zeros((len(files), 3, 7, 7), np.uint8)
    crops.submit(files, [b"k%d" % i for i in range(len(files))],
                 [[i % 3, i % 4] for i in range(len(files))],
                 flips or [i % 2 == 1 for i in range(len(files))], out).wait()
    return out


def data_layer_over(tmp_path: Path, files: list[bytes], batch: int, **transform):
    """A TRAIN Data layer over an encoded LMDB of ``files`` in ``tmp_path``, and a net of it
    for attach_feeds (the decode processes read the files from it themselves, unless
    :func:`through_buffers`)."""
    return data_layer(write_encoded_db(tmp_path / "db", files), batch, **transform)


def data_layer(db: str, batch: int, **transform):
    """A TRAIN Data layer over the LMDB ``db``, and a net of it for attach_feeds."""
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": batch},
                        "transform_param": transform}, Source(), "layer")
    layer = lookup("Data")(spec, [], BuildContext(phase="TRAIN"))
    return layer, data_net(layer)


def record(file: bytes, label: int) -> bytes:
    """The value write_encoded_db stores for ``file``."""
    return encode_datum(Datum(data=file, label=label, encoded=True))


def through_buffers(monkeypatch) -> None:
    """The feeds copy the files into the processes' input buffers, as for a database the
    processes cannot read themselves (LevelDB)."""
    monkeypatch.setattr(LmdbReader, "rereadable", False)


def refused(count: int, message: str) -> None:
    """A batch for ``count`` processes fails with exactly ``message`` (a regex), and nothing
    is left behind."""
    before = shared_buffers()
    processes = DecodeProcesses(count)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    try:
        with pytest.raises(DataError, match=message):
            decode(crops, [image_file(0), image_file(1)])
    finally:
        crops.close()
        processes.close()
    assert children() == [] and shared_buffers() == before


def test_the_crops_are_the_reader_decoders_pixels():
    files = [image_file(i) for i in range(11)]
    before = shared_buffers()
    processes = DecodeProcesses(3)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    try:
        got = decode(crops, files)  # the first pair of buffers
        again = decode(crops, files[:4])  # the second pair
        same = decode(crops, files[:4])  # the first again: a smaller batch in its buffers
        grown = decode(crops, files + files)  # the second, made anew for a bigger batch
    finally:
        crops.close()
        processes.close()
    for i, file in enumerate(files):
        window = decode_image(file)[:, i % 3:i % 3 + 7, i % 4:i % 4 + 7]
        assert np.array_equal(got[i], window[:, :, ::-1] if i % 2 else window)
    assert np.array_equal(again, got[:4]) and np.array_equal(same, got[:4])
    assert np.array_equal(grown[:11], got)
    assert children() == [] and shared_buffers() == before
    assert crops.batches == 4 and sorted(crops.seconds) == ["copy", "send", "wait"]
    assert all(v > 0 for v in crops.seconds.values())
    assert re.fullmatch(r"4 batches; per batch: write files and submit \d+\.\d ms, wait for "
                        r"the processes \d+\.\d ms, copy the crops out \d+\.\d ms",
                        crops.summary())


def test_crops_go_straight_into_a_shared_buffer_the_feed_names():
    # a CUDA feed's batch slot: the processes write into it and nothing is copied out, and
    # the processes make no output buffer of their own (only the files' input buffers)
    from caffe_py.io.decoders.decode_processes import release, shared_buffer

    files = [image_file(i) for i in range(9)]
    before = shared_buffers()
    processes = DecodeProcesses(3)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    slots = [shared_buffer(9 * 3 * 7 * 7 + 72, "db") for _ in range(2)]
    outs = [np.ndarray((9, 3, 7, 7), np.uint8, buffer=slot.buf) for slot in slots]
    try:
        copied = decode(crops, files)
        copy_s = crops.seconds["copy"]
        for out in outs:
            out[...] = 0
        flights = [crops.submit(files, [b"k%d" % i for i in range(9)],
                                [[i % 3, i % 4] for i in range(9)],
                                [i % 2 == 1 for i in range(9)], out, slot.name)
                   for out, slot in zip(outs, slots, strict=True)]
        made = shared_buffers() - before - {s.name.lstrip("/") for s in slots}
        for flight in flights:
            flight.wait()
        assert [flight.crops for flight in flights] == [None, None]
        assert crops.batches == 3 and crops.seconds["copy"] == copy_s > 0
    finally:
        crops.close()
        processes.close()
    assert np.array_equal(outs[0], copied) and np.array_equal(outs[1], copied)
    assert len(made) == 3   # the first batch's two buffers, the second pair's files buffer
    del outs
    for slot in slots:
        release(slot)
    assert children() == [] and shared_buffers() == before


def test_two_batches_in_flight_each_get_their_own_crops():
    files = [image_file(i) for i in range(12)]
    want = [decode_image(f)[:, :7, :7] for f in files]
    before = shared_buffers()
    processes = DecodeProcesses(2)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    first, second = (np.zeros((6, 3, 7, 7), np.uint8) for _ in range(2))
    try:
        def submit(part, out):
            return crops.submit(part, [b"k"] * 6, [[0, 0]] * 6, [False] * 6, out)

        a, b = submit(files[:6], first), submit(files[6:], second)
        assert crops.in_flight == 2 and not a.done
        third = np.zeros_like(first)
        c = submit(files[:6], third)  # both pairs busy: a is collected first, c takes its pair
        assert a.done and not b.done and crops.in_flight == 2
        a.wait()  # once in out, a batch stays there
        b.wait()
        c.cancel()  # dropped (a stopped feed): its buffers are let go with the others
        with pytest.raises(RuntimeError, match=r"^db: a decode batch was waited for after it "
                                               r"was cancelled$"):
            c.wait()
    finally:
        crops.close()
        processes.close()
    assert np.array_equal(first, np.stack(want[:6]))
    assert np.array_equal(second, np.stack(want[6:]))
    assert crops.batches == 2 and children() == [] and shared_buffers() == before
    assert not third.any()  # c was cancelled before its crops were copied out


def test_a_feed_submits_its_next_batch_before_it_waits(tmp_path, monkeypatch):
    from caffe_py.io.decoders.decode_processes import InFlight

    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    layer, net = data_layer_over(tmp_path, [image_file(i) for i in range(10)], 2)
    flying, wait = [], InFlight.wait

    def counted(self):
        flying.append(self.owner.in_flight)
        wait(self)

    monkeypatch.setattr(InFlight, "wait", counted)
    with ReaderPool(decode=DecodeOptions(2, "off", processes="on")) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        labels = [layer()[1].tolist() for _ in range(7)]
    assert labels == [[7 * (2 * i % 10), 7 * ((2 * i + 1) % 10)] for i in range(7)]
    assert max(flying) == 2 and flying.count(2) >= 6


@pytest.mark.parametrize("stored", [True, False])
def test_the_processes_read_the_files_from_the_lmdb_themselves(tmp_path, monkeypatch, stored):
    """From an LMDB the feed sends the processes keys and spans, no files, and makes only the
    crops' buffers; the batches are the reader decoder's pixels either way."""
    from caffe_py.io.decoders import decode_processes

    if not stored:
        through_buffers(monkeypatch)
    parts, reserved = [], []
    submit, fallocate = DecodeProcesses.submit, decode_processes.os.posix_fallocate

    def recorded(self, part, where):
        parts.append(part)
        return submit(self, part, where)

    def counted(fd, offset, length):
        reserved.append(length)
        fallocate(fd, offset, length)

    monkeypatch.setattr(DecodeProcesses, "submit", recorded)
    monkeypatch.setattr(decode_processes.os, "posix_fallocate", counted)
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    files = [image_file(i) for i in range(10)]
    layer, net = data_layer_over(tmp_path, files, 4)
    with ReaderPool(decode=DecodeOptions(2, "off", processes="on")) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        batches = [layer() for _ in range(4)]
    for k, (data, label) in enumerate(batches):
        order = [(4 * k + i) % 10 for i in range(4)]
        assert np.array_equal(data.numpy(), np.stack([decode_image(files[i]) for i in order]))
        assert label.tolist() == [7 * i for i in order]
    assert len(parts) >= 8 and all(p.stop - p.start == 2 for p in parts)
    if stored:
        db = str(tmp_path / "db")
        assert all(p.stored == db and p.files == "" and p.bounds == () for p in parts)
        first = parts[0].spans.tolist()
        assert first == [[3, 3 + len(files[i]), len(record(files[i], 7 * i))] for i in (0, 1)]
        assert len(reserved) == 2  # the crops of two batches in flight, nothing else
    else:
        assert all(p.stored is None and p.spans is None and p.files for p in parts)
        assert len(reserved) == 4


@pytest.mark.parametrize("cpu", ["pil", "auto"])
def test_the_processes_decode_with_the_threads_jpeg_decoder(tmp_path, monkeypatch, cpu):
    """Where the threads would decode colour JPEGs with torchvision ("auto", installed), the
    processes do too (in the torch fork copied); with "pil", PIL. The pixels are PIL's."""
    from caffe_py.io.decoders import libjpeg

    if cpu == "auto" and libjpeg.unavailable() is not None:
        pytest.skip("needs torchvision")
    parts = []
    submit = DecodeProcesses.submit

    def recorded(self, part, where):
        parts.append(part)
        return submit(self, part, where)

    monkeypatch.setattr(DecodeProcesses, "submit", recorded)
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    files = [image_file(i) for i in range(10)]
    layer, net = data_layer_over(tmp_path, files, 4)
    with ReaderPool(decode=DecodeOptions(2, "off", cpu, processes="on")) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        batches = [layer() for _ in range(5)]
    assert {p.reads for p in parts} == {"torchvision" if cpu == "auto" else "pil"}
    for k, (data, _) in enumerate(batches):
        order = [(4 * k + i) % 10 for i in range(4)]
        assert np.array_equal(data.numpy(), np.stack([decode_image(files[i]) for i in order]))


@pytest.mark.parametrize("other_layout", [False, True])
def test_later_passes_take_the_stored_files_from_the_first_passes_index(tmp_path, monkeypatch,
                                                                         other_layout):
    """The reader indexes where each record's file lies on the first pass and reads no record
    after it (10 records, 10 batches of 4: four passes); the batches are the same. A record
    of another field layout (a Datum with its shape fields set) leaves its run to the reader's
    own decoder, and the index is dropped: every pass reads the database."""
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    read = count_cursor_reads(monkeypatch)
    files = [image_file(i) for i in range(10)]
    bad = {3: Datum(channels=3, height=H, width=W, data=files[3], label=21, encoded=True)} \
        if other_layout else None
    db = write_encoded_db(tmp_path / "db", files, bad=bad)
    layer, net = data_layer(db, 4)
    with ReaderPool(decode=DecodeOptions(2, "off", processes="on")) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        batches = [layer() for _ in range(10)]
        stream = pool._sources[db].streams[next(iter(pool._sources[db].streams))]
        indexed = stream.stored
    for k, (data, label) in enumerate(batches):
        order = [(4 * k + i) % 10 for i in range(4)]
        assert np.array_equal(data.numpy(), np.stack([decode_image(files[i]) for i in order]))
        assert label.tolist() == [7 * i for i in order]
    if other_layout:
        assert indexed is None and sum(read) >= 40
    else:
        assert sum(read) == 10 and indexed is not None and indexed.complete
        assert indexed.labels.tolist() == [7 * i for i in range(10)]
        assert indexed.spans[:, 1].tolist() == [3 + len(f) for f in files]


def test_a_slice_of_a_larger_round_robin_reads_its_own_stored_files(tmp_path, monkeypatch):
    """Pools of global replicas 0-1 and 2-3 of 4 (two hosts): each replica's batches are its
    own records, read by the processes from the LMDB (the other pool's records are left out
    of the chunk's spans, never read)."""
    from caffe_py.io.db import lmdb_store

    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    read_keys: list[bytes] = []
    stored_files = lmdb_store.read_files

    def counted(txn, source, keys, spans):  # in the training process: the threads' fallback
        read_keys.extend(keys)
        return stored_files(txn, source, keys, spans)

    monkeypatch.setattr(lmdb_store, "read_files", counted)
    parts, submit = [], DecodeProcesses.submit

    def recorded(self, part, where):
        parts.append(part)
        return submit(self, part, where)

    monkeypatch.setattr(DecodeProcesses, "submit", recorded)
    files = [image_file(i) for i in range(9)]
    db = write_encoded_db(tmp_path / "db", files)
    for offset in (0, 2):
        layers = []
        with ReaderPool(replicas=2, replica_offset=offset, total_replicas=4,
                        decode=DecodeOptions(2, "off", processes="on")) as pool:
            for replica in range(2):
                layer, net = data_layer(db, 2)
                attach_feeds(net, pool, replica=replica, seed=1)
                layers.append(layer)
            pool.start()
            for replica, layer in enumerate(layers):
                g = offset + replica
                order = [(g + 4 * k) % 9 for k in range(4)]
                batches = [layer() for _ in range(2)]
                assert [b[1].tolist() for b in batches] == [[7 * i for i in order[:2]],
                                                            [7 * i for i in order[2:]]]
                assert np.array_equal(np.concatenate([b[0].numpy() for b in batches]),
                                      np.stack([decode_image(files[i]) for i in order]))
    assert read_keys == []  # every file was read by the processes, none copied
    assert parts and all(p.stored == db and p.files == "" for p in parts)

def test_a_process_reads_a_database_opened_after_it_started(tmp_path):
    """A database the training process opens after the fork: the process opens it itself."""
    from caffe_py.io.db.lmdb_store import StoredFiles

    files = [image_file(i) for i in range(4)]
    processes = DecodeProcesses(2)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    try:
        want = decode(crops, files)  # forks the processes
        db = write_encoded_db(tmp_path / "db", files)
        spans = np.array([[3, 3 + len(f), len(record(f, 7 * i))] for i, f in enumerate(files)],
                         np.int64)
        keys = tuple(b"%08d_img%d.jpg" % (i, i) for i in range(4))
        assert np.array_equal(decode(crops, StoredFiles(db, keys, spans)), want)
    finally:
        crops.close()
        processes.close()

def test_a_process_reads_many_batches_in_one_reader_slot(tmp_path, monkeypatch):
    """py-lmdb leaves the reader slot of every transaction a forked process ends through its
    parent's environment taken: a process keeps one transaction, so 30 batches fit a table of
    8 slots (the parent's cursor holds one more)."""
    from caffe_py.io.db import lmdb_store
    from caffe_py.io.db.lmdb_store import StoredFiles, open_db

    monkeypatch.setattr(lmdb_store, "_open_env", lambda path, lock: lmdb_store.lmdb.open(
        str(path), readonly=True, lock=lock, subdir=True, max_readers=8))
    files = [image_file(i) for i in range(4)]
    db = write_encoded_db(tmp_path / "db", files)
    (tmp_path / "db" / "lock.mdb").unlink()  # made anew by the reader: 8 slots, not 126
    spans = np.array([[3, 3 + len(f), len(record(f, 7 * i))] for i, f in enumerate(files)],
                     np.int64)
    stored = StoredFiles(db, tuple(b"%08d_img%d.jpg" % (i, i) for i in range(4)), spans)
    processes = DecodeProcesses(1)
    crops = ProcessCrops(processes, db, (3, H, W), None)
    try:
        with open_db(db) as reader_db:  # open in the training process when the process forks
            cursor = reader_db.cursor()
            want = decode(crops, files)
            for _ in range(30):
                assert np.array_equal(decode(crops, stored), want)
            cursor.close()
    finally:
        crops.close()
        processes.close()

def test_a_database_a_process_cannot_open_is_one_line(tmp_path):
    from caffe_py.io.db.lmdb_store import StoredFiles

    processes = DecodeProcesses(1)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    gone = str(tmp_path / "gone")
    try:
        with pytest.raises(DataError) as error:
            decode(crops, StoredFiles(gone, (b"a",), np.array([[0, 9, 9]], np.int64)))
        assert str(error.value) == (f"{gone}: database not found; create it with `cpy convert` "
                                    "or fix data_param.source")
        assert len(children()) == 1  # the process goes on
    finally:
        crops.close()
        processes.close()

def test_a_process_lets_go_of_buffers_their_feed_has_unlinked():
    """A buffer made anew for a bigger batch leaves the old one unlinked: a process that
    mapped it unmaps it at its next new buffer (its pages are freed), keeping the others."""
    from multiprocessing import shared_memory

    from caffe_py.io.decoders import decode_processes

    made = [shared_memory.SharedMemory(create=True, size=4096) for _ in range(3)]
    try:
        for buffer in made[:2]:
            decode_processes._buffer(buffer.name)
        made[0].close()
        made[0].unlink()  # outgrown by the feed
        decode_processes._buffer(made[2].name)
        assert list(decode_processes._attached) == [made[1].name, made[2].name]
    finally:
        while decode_processes._attached:
            decode_processes._attached.popitem()[1].close()
        for buffer in made[1:]:
            buffer.close()
            buffer.unlink()


def test_a_process_that_dies_stops_the_feed_with_one_line():
    processes = DecodeProcesses(2)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    try:
        decode(crops, [image_file(i) for i in range(4)])
        assert processes._pool is not None  # started by the first batch
        os.kill(processes._pool.processes[0].pid, signal.SIGKILL)  # one of this pool's own
        with pytest.raises(DataError, match=r"^db: a decode process died \(.*\); see the log for "
                                            r"what killed it \(memory\?\), or set "
                                            r"CPY_DECODE_PROCESSES=off$"):
            for _ in range(50):  # until the pool has seen the death
                decode(crops, [image_file(i) for i in range(4)])
                time.sleep(0.05)
    finally:
        crops.close()
        processes.close()
    assert children() == []


def test_a_closed_pool_refuses_work_with_one_line():
    processes = DecodeProcesses(2)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    decode(crops, [image_file(0), image_file(1)])
    processes.close()
    processes.close()  # idempotent
    with pytest.raises(DataError, match=r"^db: the decode processes were closed$"):
        decode(crops, [image_file(0), image_file(1)])
    crops.close()
    assert children() == []


def test_ctrl_c_is_the_training_processes_to_handle():
    processes = DecodeProcesses(2)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    try:
        want = decode(crops, [image_file(i) for i in range(4)])
        for child in children():
            os.kill(child.pid, signal.SIGINT)
        time.sleep(0.3)
        assert len(children()) == 2
        assert np.array_equal(decode(crops, [image_file(i) for i in range(4)]), want)
    finally:
        crops.close()
        processes.close()



def test_a_ctrl_c_while_the_processes_start_is_discarded(monkeypatch):
    """The processes are forked with SIGINT blocked: a Ctrl-C that reaches one before it has
    set SIGINT to be ignored (held here for 0.5 s before that) neither kills it nor breaks the
    batch."""
    process_start = decode_processes._process_start

    def slow_start(parent: int) -> None:
        time.sleep(0.5)
        process_start(parent)

    monkeypatch.setattr(decode_processes, "_process_start", slow_start)
    processes = DecodeProcesses(2)
    crops = ProcessCrops(processes, "db", (3, H, W), None)
    try:
        files = [image_file(i) for i in range(4)]
        out = np.zeros((4, 3, 7, 7), np.uint8)
        batch = crops.submit(files, [b"k%d" % i for i in range(4)],
                             [[i % 3, i % 4] for i in range(4)], [False] * 4, out)
        starting = children()
        assert len(starting) == 2
        for child in starting:
            os.kill(child.pid, signal.SIGINT)
        batch.wait()
        assert {child.pid for child in children()} == {child.pid for child in starting}
        assert np.array_equal(out, decode(crops, files, [False] * 4))
    finally:
        crops.close()
        processes.close()

@pytest.mark.slow
def test_the_processes_end_when_the_training_process_is_killed(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        import multiprocessing
        import numpy as np
        from synthetic import image_file
        from caffe_py.io.decoders.decode_processes import DecodeProcesses, ProcessCrops
        crops = ProcessCrops(DecodeProcesses(2), "db", (3, 12, 10), None)
        crops.submit([image_file(0)] * 2, [b"a", b"b"], [[0, 0]] * 2, [False] * 2,
                     np.zeros((2, 3, 7, 7), np.uint8)).wait()
        print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_pool_with_processes_leaves_no_process_or_buffer(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    layer, net = data_layer_over(tmp_path, [image_file(i) for i in range(10)], 4, crop_size=6)
    before = shared_buffers()
    with ReaderPool(decode=DecodeOptions(2, "off", processes="on")) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        data, label = layer()
        assert tuple(data.shape) == (4, 3, 6, 6) and label.tolist() == [0, 7, 14, 21]
        assert len(children()) == 2
    assert children() == [] and shared_buffers() == before


def test_auto_leaves_nvjpeg_out_where_processes_decode(monkeypatch, caplog):
    import logging

    import torch

    from caffe_py.io.decoders.workers import DecodeWorkers
    from caffe_py.io.feed.image_batch import BatchImages

    monkeypatch.setattr(BatchImages, "_gpu_decoder", lambda self: "nvJPEG")
    caplog.set_level(logging.INFO, logger="caffe_py")
    processes = DecodeProcesses(6)
    for gpu, nvjpeg in (("auto", False), ("on", True)):
        images = BatchImages("db", (3, H, W), None, DecodeWorkers(1),
                             DecodeOptions(1, gpu, processes="on"), torch.device("cuda", 0),
                             processes)
        assert images.crops is not None and (images.gpu == "nvJPEG") is nvjpeg
        images.close()
    assert processes.feeds == 0
    reads = "torchvision" if images.libjpeg else "pil"
    assert caplog.text.count(f"db: JPEG records are decoded in 6 CPU processes by {reads} "
                             "(faster than nvJPEG beside training; CPY_GPU_DECODE=on for "
                             "nvJPEG)") == 1
    processes.close()


def _no_room(monkeypatch):
    import errno

    from caffe_py.io.decoders import decode_processes

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decode_processes.os, "posix_fallocate", full)


def test_too_little_shared_memory_is_one_line_not_a_crash(monkeypatch):
    _no_room(monkeypatch)
    refused(2, r"^db: the decode processes need 0 MB of shared memory for a batch and /dev/shm "
               r"cannot hold it \(No space left on device; [\d,]+ MB free\)$")


@pytest.mark.parametrize("stored", [True, False])
@pytest.mark.parametrize("processes", ["auto", "on"])
def test_a_feed_without_room_decodes_on_threads_or_says_so(tmp_path, monkeypatch, caplog,
                                                           processes, stored):
    """(The files left in the LMDB for the processes are then read by the feed.)"""
    import logging

    from caffe_py.io.decoders import workers as workers_module

    if not stored:
        through_buffers(monkeypatch)
    _no_room(monkeypatch)
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 12)  # auto: processes
    caplog.set_level(logging.WARNING, logger="caffe_py")
    files = [image_file(i) for i in range(8)]
    layer, net = data_layer_over(tmp_path, files, 4)
    with ReaderPool(decode=DecodeOptions(2, "off", processes=processes)) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        if processes == "on":
            with pytest.raises(DataError, match=r"cannot hold it .*; give it more room \(docker "
                                                r"run --shm-size=1g\) or set "
                                                r"CPY_DECODE_PROCESSES=off$"):
                layer()
            return
        first, second = layer(), layer()
    assert np.array_equal(first[0].numpy(), np.stack([decode_image(f) for f in files[:4]]))
    assert np.array_equal(second[0].numpy(), np.stack([decode_image(f) for f in files[4:]]))
    assert caplog.text.count("this feed decodes on 2 CPU threads instead") == 1


@pytest.mark.parametrize("processes", ["auto", "on"])
def test_room_for_one_batch_in_flight_but_not_two(tmp_path, monkeypatch, caplog, processes):
    """The second batch's buffers do not fit while the first is in the processes: the first
    is collected and the feed goes on in the processes with one batch in flight."""
    import errno
    import logging

    from caffe_py.io.decoders import decode_processes
    from caffe_py.io.decoders import workers as workers_module

    reserved = []

    def first_pair_only(fd, offset, length):
        reserved.append(length)
        if len(reserved) > 2:  # the first pair's files and crops fit, nothing after them
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decode_processes.os, "posix_fallocate", first_pair_only)
    through_buffers(monkeypatch)
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 12)  # auto: processes
    caplog.set_level(logging.WARNING, logger="caffe_py")
    files = [image_file(i) for i in range(12)]
    layer, net = data_layer_over(tmp_path, files, 3)
    before = shared_buffers()
    with ReaderPool(decode=DecodeOptions(2, "off", processes=processes)) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        batches = [layer()[0].numpy() for _ in range(6)]
        assert len(children()) == 2  # still the processes'
    assert children() == [] and shared_buffers() == before
    for k, batch in enumerate(batches):
        want = np.stack([decode_image(files[(3 * k + i) % 12]) for i in range(3)])
        assert np.array_equal(batch, want), k
    assert len(reserved) == 3  # one pair made, the second refused once
    assert re.search(r"db: the decode processes need 0 MB of shared memory for a batch and "
                     r"/dev/shm cannot hold it \(No space left on device; [\d,]+ MB free\); "
                     r"this feed keeps one batch in the decode processes instead of 2 \(give "
                     r"it more room, e\.g\. docker run --shm-size=1g\)", caplog.text)
    assert caplog.text.count("keeps one batch") == 1


def test_a_batch_in_flight_finishes_when_the_next_leaves_for_the_threads(tmp_path, monkeypatch,
                                                                        caplog):
    """Batch 3's files outgrow the first pair's buffer and /dev/shm cannot hold a bigger one
    while batch 2 is in the processes (auto): batch 2 finishes there, the threads go on."""
    import errno
    import logging

    from caffe_py.io.decoders import decode_processes
    from caffe_py.io.decoders import workers as workers_module

    reserved = []

    def two_pairs_only(fd, offset, length):
        reserved.append(length)
        if len(reserved) > 4:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decode_processes.os, "posix_fallocate", two_pairs_only)
    through_buffers(monkeypatch)
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 12)  # auto: processes
    caplog.set_level(logging.WARNING, logger="caffe_py")
    # bytes after a JPEG's end are ignored by decoders: the last files are 20 KB longer
    files = [image_file(i) + (b"\0" * 20000 if i >= 6 else b"") for i in range(12)]
    layer, net = data_layer_over(tmp_path, files, 3)
    before = shared_buffers()
    with ReaderPool(decode=DecodeOptions(2, "off", processes="auto")) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        batches = [layer()[0].numpy() for _ in range(6)]
    assert children() == [] and shared_buffers() == before
    for k, batch in enumerate(batches):
        want = np.stack([decode_image(files[(3 * k + i) % 12]) for i in range(3)])
        assert np.array_equal(batch, want), k
    assert len(reserved) == 5 and caplog.text.count("decodes on 2 CPU threads instead") == 1


def test_processes_that_cannot_start_are_one_line(monkeypatch):
    import errno

    def no_fork():
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    refused(3, r"^db: cannot start 3 decode processes \(Resource temporarily unavailable\); "
               r"set CPY_DECODE_WORKERS lower, or CPY_DECODE_PROCESSES=off$")


def test_a_failing_process_part_is_one_line(monkeypatch):
    from caffe_py.io.decoders import decode_processes

    def broken(*args):
        raise MemoryError("no room\nat all")

    monkeypatch.setattr(decode_processes, "crop_record", broken)  # forked with the processes
    refused(2, r"^db: decoding failed \(MemoryError: no room at all\)$")


def test_a_stored_file_that_does_not_decode_is_raised_naming_its_key(tmp_path, monkeypatch):
    """Read from the LMDB by a process, a file no decoder reads is the one-line error of its
    record, raised by the layer's forward."""
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    files = [image_file(i) for i in range(4)]
    files[2] = b"\xff\xd8 not a JPEG"
    layer, net = data_layer_over(tmp_path, files, 4)
    with ReaderPool(decode=DecodeOptions(2, "off", processes="on")) as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        with pytest.raises(DataError, match=r"db: record '00000002_img2\.jpg': encoded image "
                                            r"does not decode \(cannot identify image file"):
            layer()

class Counting(DecodeProcesses):
    """Records the parts it is given instead of starting processes."""

    def __init__(self, count):
        super().__init__(count)
        self.parts = []

    def submit(self, part, where):
        self.parts.append((part.start, part.stop))

    def wait(self, futures, where):
        pass


@pytest.mark.parametrize(("count", "feeds", "batch", "parts"), [
    (14, 1, 256, 14), (62, 4, 256, 15), (62, 5, 256, 12), (3, 4, 8, 1), (16, 1, 5, 5)])
def test_a_batch_is_cut_so_every_feeds_parts_find_a_process(count, feeds, batch, parts):
    processes = Counting(count)
    feeds_crops = [ProcessCrops(processes, "db", (3, H, W), None) for _ in range(feeds)]
    files = [image_file(0)] * batch
    out = np.zeros((batch, 3, 7, 7), np.uint8)
    feeds_crops[0].submit(files, [b"k"] * batch, [[0, 0]] * batch, [False] * batch, out).wait()
    sizes = [stop - start for start, stop in processes.parts]
    assert len(sizes) == parts and sum(sizes) == batch and max(sizes) - min(sizes) <= 1
    assert processes.parts[0][0] == 0 and processes.parts[-1][1] == batch
    for crops in feeds_crops:
        crops.close()
    assert processes.feeds == 0


def test_shared_memory_that_cannot_be_made_is_one_line(monkeypatch):
    import errno

    from caffe_py.io.decoders import decode_processes

    def refuse(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(decode_processes.shared_memory, "SharedMemory", refuse)
    refused(2, r"^db: the decode processes need 0 MB of shared memory for a batch and /dev/shm "
               r"cannot hold it \(Too many open files; [\d,]+ MB free\)$")


@pytest.mark.parametrize("kept", [False, True], ids=["too big to keep decoded", "kept decoded"])
def test_the_queue_says_whether_its_records_go_over_as_files(tmp_path, monkeypatch, kept):
    """Fixed by the pool's start, before the feeds start: a CUDA feed makes its slots for the
    processes only where files come."""
    if not kept:
        monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    layer, net = data_layer_over(tmp_path, [image_file(i) for i in range(6)], 2)
    with ReaderPool(decode=DecodeOptions(2, "off", processes="on")) as pool:
        feed = attach_feeds(net, pool, seed=1)[0]
        pool.start()
        assert feed.records.hands_files is not kept
        layer()


@pytest.mark.gpu
@pytest.mark.parametrize("kept", [False, True], ids=["too big to keep decoded", "kept decoded"])
def test_on_cuda_the_processes_decode_into_the_feeds_shared_slots(tmp_path, monkeypatch, kept):
    """JPEG files: the slots are shared buffers the processes write the crops into, nothing
    is copied out and the pixels are the reader decoder's; a database kept decoded (no files)
    keeps torch's pinned slots. Closing leaves no shared buffer behind."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not kept:
        monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    files = [image_file(i) for i in range(10)]
    layer, net = data_layer_over(tmp_path, files, 4)
    before = shared_buffers()
    with ReaderPool(decode=DecodeOptions(2, "off", processes="on")) as pool:
        feed = attach_feeds(net, pool, device="cuda", seed=1)[0]
        pool.start()
        shared = [slot.shared is not None for slot in feed._slots]   # made by the start
        batches = [layer() for _ in range(4)]
        copied = feed.images.crops.seconds["copy"] if not kept else 0.0
    assert shared == [not kept] * 4 and copied == 0.0
    for k, (data, label) in enumerate(batches):
        order = [(4 * k + i) % 10 for i in range(4)]
        want = np.stack([decode_image(files[i]) for i in order])
        assert np.array_equal(data.cpu().numpy(), want) and data.device.type == "cuda"
        assert label.tolist() == [7 * i for i in order]
    assert shared_buffers() == before and children() == []
