"""Big raw records of an LMDB too big to keep decoded, cropped by the decode processes: the
reader hands them over as files (where each record's pixels lie in it, indexed by the first
pass), the processes read and crop them, and every batch is the one the reader's own decode
gives, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import count_cursor_reads, lockstep_batches, write_records

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool
from caffe_py.io.db.lmdb_store import StoredFiles
from caffe_py.io.decoders.file_crops import RAW, crop_record
from caffe_py.io.decoders.workers import DecodeOptions
from caffe_py.io.formats.blobproto import blob_from_array, write_blob_file
from caffe_py.io.formats.datum import datum_from_array, encode_datum
from caffe_py.io.reader import decode, reader
from caffe_py.io.reader.decode import ChunkDecoder
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

SHAPE = (3, 12, 10)
RECORDS = 30

pytestmark = pytest.mark.usefixtures("no_stray_threads")


def pixels(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, SHAPE, dtype=np.uint8)


@pytest.fixture(scope="module")
def raw_db(tmp_path_factory):
    """30 raw records, labels 0..203 (one- and two-byte varints: two record lengths), and a
    mean file."""
    root = tmp_path_factory.mktemp("raw")
    db = write_records(root / "db", [(pixels(i), 7 * i) for i in range(RECORDS)])
    mean = np.random.default_rng(1).uniform(0, 255, SHAPE).astype(np.float32)
    write_blob_file(root / "mean.binaryproto", blob_from_array(mean[None]))
    return db, str(root / "mean.binaryproto")


def data_layer(db, transform, batch_size=4):
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": batch_size,
                                       "rand_skip": 5, "prefetch": 2},
                        "transform_param": transform}, Source(), "layer")
    return lookup("Data")(spec, [], BuildContext(phase="TRAIN"))


def run(db, transform, steps, *, processes, replicas=2, state=None, device="cpu", slots=None):
    """``steps`` lockstep batches of ``replicas`` feeds, the pool state, and per feed whether
    it took raw files (its images read RAW) and the stream's index then. ``slots`` (a list,
    CUDA): gets per feed whether every slot was a shared one and the seconds it spent copying
    crops out."""
    layers = [data_layer(db, transform) for _ in range(replicas)]
    with ReaderPool(replicas=replicas, decode=DecodeOptions(2, "off", processes=processes)
                    ) as pool:
        feeds, batches = lockstep_batches(pool, layers, steps, device=device, state=state)
        took = [f.images is not None and f.images.reads == RAW and f.records.raw_files
                and f.records.hands_files for f in feeds]
        if slots is not None:
            slots += [(all(slot.shared is not None for slot in f._slots),
                       f.images.crops.seconds["copy"]) for f in feeds]
        stream = next(iter(pool._sources[db].streams.values()))
        return batches, pool.state_dict(), took, stream.stored


def same(a, b) -> bool:
    return all(torch.equal(x, y) for sa, sb in zip(a, b, strict=True)
               for ra, rb in zip(sa, sb, strict=True) for x, y in zip(ra, rb, strict=True))


TRANSFORMS = [{"crop_size": 8, "mirror": True, "scale": 0.5, "mean_value": [10, 20, 30]},
              {"crop_size": 6, "mirror": True, "mean_file": None}, {"scale": 0.25}]


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_raw_records_cropped_by_the_processes_are_the_readers_batches(raw_db, monkeypatch,
                                                                      transform):
    """2 replicas x 4 records x 9 steps = 72 records, 2.4 passes: the first pass indexes
    where each record's pixels lie, the later ones read no record; every batch and the saved
    state equal those of the reader's own decode."""
    db, mean_file = raw_db
    if "mean_file" in transform:
        transform = dict(transform, mean_file=mean_file)
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    want, want_state, took, _ = run(db, transform, 9, processes="off")
    assert took == [False, False]
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    read = count_cursor_reads(monkeypatch)
    got, state, took, index = run(db, transform, 9, processes="on")
    assert took == [True, True]
    assert same(got, want) and state == want_state
    # the first pass only (from the rand_skip origin round the end; its last chunk may run
    # on past where it began): 72 records and the queues' prefetch without the index
    assert RECORDS <= sum(read) < 2 * RECORDS and index is not None and index.complete
    assert index.labels.tolist() == [7 * i for i in range(RECORDS)]
    start = len(encode_datum(datum_from_array(pixels(0), 0))) - 2 - 360  # prefix: tag, shape
    assert index.spans[:, :2].tolist() == [[start, start + 360]] * RECORDS


def test_a_resumed_run_takes_raw_files_on_from_the_saved_state(raw_db, monkeypatch):
    db, _ = raw_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    transform = TRANSFORMS[0]
    whole, _, _, _ = run(db, transform, 8, processes="off")
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    first, state, _, _ = run(db, transform, 5, processes="on")
    rest, _, took, _ = run(db, transform, 3, processes="on", state=state)
    assert took == [True, True] and same(first + rest, whole)


def test_a_record_in_another_layout_goes_over_as_the_decoders_pixels(tmp_path, monkeypatch):
    """A negative label (a ten-byte varint) is not the fast layout: its chunk goes over as the
    full decoder's pixels, a buffer a record, the index is dropped, and the batches are still
    the reader's own."""
    labels = [7 * i if i != 4 else -1 for i in range(RECORDS)]
    db = write_records(tmp_path / "db", [(pixels(i), labels[i]) for i in range(RECORDS)])
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    transform = TRANSFORMS[0]
    want, _, _, _ = run(db, transform, 9, processes="off")
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    got, _, took, index = run(db, transform, 9, processes="on")
    assert took == [True, True] and index is None and same(got, want)
    assert -1 in [int(v) for step in got for _, label in step for v in label]


def test_a_database_kept_decoded_hands_its_raw_records_over_decoded(raw_db, monkeypatch):
    db, _ = raw_db
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    want, _, _, _ = run(db, TRANSFORMS[0], 9, processes="off")
    got, _, took, index = run(db, TRANSFORMS[0], 9, processes="on")
    assert took == [False, False] and index is None and same(got, want)


def test_small_raw_records_stay_with_the_reader(raw_db, monkeypatch):
    """Records under RAW_FILES_BYTES (360 bytes here, 64 KB by default) are decoded by the
    reader, processes or not."""
    db, _ = raw_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    _, _, took, index = run(db, TRANSFORMS[0], 2, processes="on")
    assert decode.RAW_FILES_BYTES == 1 << 16 and took == [False, False] and index is None


def test_without_shared_memory_the_threads_crop_the_raw_files(raw_db, monkeypatch, caplog):
    """/dev/shm too small for the processes' buffers ("auto"): the feed's threads read the
    records' pixels from the LMDB and crop them, one warning a feed, the same batches."""
    import errno
    import logging

    from caffe_py.io.decoders import decode_processes
    from caffe_py.io.decoders import workers as workers_module

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    db, _ = raw_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    want, _, _, _ = run(db, TRANSFORMS[0], 6, processes="off")
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    monkeypatch.setattr(decode_processes.os, "posix_fallocate", full)
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 12)  # auto: processes
    caplog.set_level(logging.WARNING, logger="caffe_py")
    got, _, took, _ = run(db, TRANSFORMS[0], 6, processes="auto")
    assert took == [True, True] and same(got, want)
    assert caplog.text.count("this feed decodes on 2 CPU threads instead") == 2


def test_the_decoder_hands_stored_raw_spans_and_falls_back_to_pixel_files():
    values = [encode_datum(datum_from_array(pixels(i), 200 * i)) for i in range(3)]
    decoder = ChunkDecoder("db", SHAPE, np.dtype(np.uint8), None, raw_processes=True)
    decoder.raw_files, decoder.stored_in = True, "db"
    files, labels = decoder.decode([b"a", b"b", b"c"], values)
    assert isinstance(files, StoredFiles) and labels.tolist() == [0, 200, 400]
    for value, (start, stop, size) in zip(values, files.spans.tolist(), strict=True):
        assert size == len(value) and value[start:stop] == pixels(values.index(value)).tobytes()
    other = [*values[:2], encode_datum(datum_from_array(pixels(2), -3))]
    files, labels = decoder.decode([b"a", b"b", b"c"], other)
    assert isinstance(files, tuple) and labels.tolist() == [0, 200, -3]
    assert [bytes(f) for f in files] == [pixels(i).tobytes() for i in range(3)]


def test_a_raw_file_of_another_size_is_one_line_naming_the_record():
    out = np.empty((3, 4, 4), np.uint8)
    with pytest.raises(DataError) as caught:
        crop_record("db", SHAPE, None, RAW, b"\0" * 100, b"00000007", out, (0, 0), False)
    assert str(caught.value) == (
        "db: record '00000007' holds 100 bytes of pixels but the first record is uint8 "
        "[3, 12, 10] (360 bytes); a Data layer needs records of one size (resize when "
        "converting)")


def test_a_raw_crop_is_the_window_mirrored():
    chw = pixels(5)
    out = np.empty((3, 4, 5), np.uint8)
    crop_record("db", SHAPE, None, RAW, chw.tobytes(), b"k", out, (2, 3), True)
    assert np.array_equal(out, chw[:, 2:6, 3:8][:, :, ::-1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_raw_files_on_cuda_are_the_whole_records_batches(raw_db, monkeypatch):
    """On CUDA the reader's records cross whole and are cropped on the device (12 x 10 ->
    8 x 8 is within WHOLE_RATIO); the processes' crops give the same batches."""
    db, mean_file = raw_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    transform = {"crop_size": 8, "mirror": True, "mean_file": mean_file, "scale": 0.5}
    want, _, _, _ = run(db, transform, 9, processes="off", device="cuda")
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    got, _, took, _ = run(db, transform, 9, processes="on", device="cuda")
    assert took == [True, True] and same(got, want)


def _shm_names() -> set[str]:
    from pathlib import Path
    return {p.name for p in Path("/dev/shm").iterdir()}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_processes_crop_into_the_feeds_page_locked_slots(raw_db, monkeypatch):
    """The slots are shared buffers the processes write the crops into: nothing is copied
    out, the batches are the reader's own, and closing leaves no shared buffer behind."""
    db, _ = raw_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    transform = {"crop_size": 4, "mirror": True, "scale": 0.5, "mean_value": [10, 20, 30]}
    want, _, _, _ = run(db, transform, 9, processes="off", device="cuda")
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    before, slots = _shm_names(), []
    got, _, _, _ = run(db, transform, 9, processes="on", device="cuda", slots=slots)
    assert same(got, want) and slots == [(True, 0.0), (True, 0.0)]
    assert _shm_names() == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_slot_cuda_cannot_page_lock_is_a_pinned_one_the_crops_are_copied_into(
        raw_db, monkeypatch, caplog):
    import logging

    class Refusing:   # cudaHostRegister answers cudaErrorInvalidValue (1)
        @staticmethod
        def cudaHostRegister(ptr, size, flags):
            return 1

    db, _ = raw_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    transform = {"crop_size": 4, "mirror": True, "scale": 0.5}
    want, _, _, _ = run(db, transform, 9, processes="off", device="cuda")
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: Refusing)
    caplog.set_level(logging.WARNING, logger="caffe_py")
    before, slots = _shm_names(), []
    got, _, _, _ = run(db, transform, 9, processes="on", device="cuda", slots=slots)
    assert same(got, want) and [shared for shared, _ in slots] == [False, False]
    assert all(copied > 0 for _, copied in slots)
    assert caplog.text.count(f"{db}: cannot page-lock a shared batch buffer (CUDA error 1); "
                             "this feed copies the crops out of the processes' buffers") == 2
    assert _shm_names() == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_without_shared_memory_the_slots_are_pinned_and_the_threads_crop(
        raw_db, monkeypatch, caplog):
    """/dev/shm too small ("auto"): each feed says once that its slots are pinned memory,
    once that its threads crop, and the batches are the reader's own."""
    import errno
    import logging

    from caffe_py.io.decoders import decode_processes
    from caffe_py.io.decoders import workers as workers_module

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    db, _ = raw_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    transform = {"crop_size": 4, "mirror": True, "scale": 0.5}
    want, _, _, _ = run(db, transform, 6, processes="off", device="cuda")
    monkeypatch.setattr(decode, "RAW_FILES_BYTES", 0)
    monkeypatch.setattr(decode_processes.os, "posix_fallocate", full)
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 12)  # auto: processes
    caplog.set_level(logging.WARNING, logger="caffe_py")
    before = _shm_names()
    got, _, took, _ = run(db, transform, 6, processes="auto", device="cuda")
    assert took == [True, True] and same(got, want)
    assert caplog.text.count("this feed's batch slots are pinned memory instead, and the "
                             "crops are copied out of the processes' buffers") == 2
    assert caplog.text.count("this feed decodes on 2 CPU threads instead") == 2
    assert _shm_names() == before
