"""Encoded records decoded in parallel: the feeds' batches of image files (a database the reader
does not keep decoded) and the reader's pooled decode (one it keeps) give the single-threaded
decoder's batches, in the same order, across replicas, passes and a resume; failures are one
line naming the record; no thread outlives the pool."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import data_net, lockstep_batches, write_records
from synthetic import image_file as jpeg
from synthetic import write_encoded_db as write_db

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.io.decoders.workers import DecodeOptions, DecodeWorkers
from caffe_py.io.feed.image_batch import BatchImages
from caffe_py.io.feed.transformer import Transformer
from caffe_py.io.formats.blobproto import blob_from_array, write_blob_file
from caffe_py.io.formats.datum import Datum, decode_image, encode_datum
from caffe_py.io.reader import reader
from caffe_py.io.reader.records import RecordBatch
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import TransformationParameter, parse_layer
from caffe_py.spec.schema import Source

H, W = 12, 10
RECORDS = 30


pytestmark = pytest.mark.usefixtures("no_stray_threads")


@pytest.fixture(scope="module")
def jpeg_db(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpeg")
    files = [jpeg(i) for i in range(RECORDS)]
    mean = np.random.default_rng(1).uniform(0, 255, (3, H, W)).astype(np.float32)
    write_blob_file(root / "mean.binaryproto", blob_from_array(mean[None]))
    return write_db(root / "db", files), files, str(root / "mean.binaryproto")


def data_layer(db, transform, batch_size=4, rand_skip=5):
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": batch_size,
                                       "rand_skip": rand_skip, "prefetch": 2},
                        "transform_param": transform}, Source(), "layer")
    return lookup("Data")(spec, [], BuildContext(phase="TRAIN"))


def run(db, transform, workers, steps, *, replicas=2, state=None, device="cpu", processes="off"):
    """``steps`` lockstep batches of ``replicas`` feeds: their batches and the pool state."""
    layers = [data_layer(db, transform) for _ in range(replicas)]
    options = DecodeOptions(workers, "off", processes=processes)
    with ReaderPool(replicas=replicas, decode=options) as pool:
        _, batches = lockstep_batches(pool, layers, steps, device=device, state=state)
        return batches, pool.state_dict()


def oracle(db, transform, files, positions):
    """What the single-threaded decoder and the transformer make of these stream positions."""
    layer = data_layer(db, transform)
    origin = int(np.random.default_rng(3).integers(0, 6))  # rand_skip 5, seed 3
    t = Transformer(layer.transform, "TRAIN", layer.record_shape, seed=3)
    records = [(origin + p) % RECORDS for p in positions]
    return t([decode_image(files[r]) for r in records], positions), [7 * r for r in records]


TRANSFORMS = [{"crop_size": 8, "mirror": True, "scale": 0.5, "mean_value": [10, 20, 30]},
              {"crop_size": 6, "mirror": True, "mean_file": None}, {"scale": 0.25}]


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_feeds_decode_their_own_files_as_the_single_thread_decoder(jpeg_db, monkeypatch,
                                                                   transform):
    db, files, mean_file = jpeg_db
    if "mean_file" in transform:
        transform = dict(transform, mean_file=mean_file)
    steps = 9  # 2 replicas x 4 records x 9 = 72 records: 2.4 passes over 30
    kept, kept_state = run(db, transform, 3, steps)  # kept decoded: the reader decodes
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)  # not kept: files go to the feeds
    for workers, processes in ((1, "off"), (3, "off"), (2, "on")):
        got, state = run(db, transform, workers, steps, processes=processes)
        assert state == kept_state
        for step in range(steps):
            for replica in range(2):
                positions = [replica + 2 * (4 * step + j) for j in range(4)]
                want, labels = oracle(db, transform, files, positions)
                for batches in (kept, got):
                    data, label = batches[step][replica]
                    assert label.tolist() == labels, (workers, step, replica)
                    assert torch.equal(data, want), (workers, step, replica)


def test_a_resumed_run_goes_on_with_the_same_decoded_batches(jpeg_db, monkeypatch):
    db, _, _ = jpeg_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    transform = TRANSFORMS[0]
    whole, _ = run(db, transform, 3, 8)
    first, state = run(db, transform, 2, 5, processes="on")
    rest, _ = run(db, transform, 3, 3, state=state)
    for want, got in zip(whole, first + rest, strict=True):
        assert all(torch.equal(a, b) for w, g in zip(want, got, strict=True)
                   for a, b in zip(w, g, strict=True))


@pytest.mark.parametrize(("workers", "processes"), [(1, "off"), (3, "off"), (2, "on")])
@pytest.mark.parametrize("kept", [True, False])
def test_a_file_that_does_not_decode_is_raised_by_forward_naming_the_key(tmp_path, monkeypatch,
                                                                         workers, processes,
                                                                         kept):
    if not kept:  # the feeds decode (else the reader, in the chunk)
        monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    broken = encode_datum(Datum(data=b"\xff\xd8 not a jpeg", label=1, encoded=True))
    db = write_db(tmp_path / "db", [jpeg(i) for i in range(12)], bad={6: broken})
    layer = data_layer(db, {}, rand_skip=0)
    with ReaderPool(decode=DecodeOptions(workers, processes=processes)) as pool:
        attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        layer()
        with pytest.raises(DataError) as err:
            layer()
        assert str(err.value).startswith(f"{db}: record '00000006_img6.jpg': encoded image does "
                                         "not decode (")
        assert "\n" not in str(err.value)
        with pytest.raises(DataError, match="00000006_img6.jpg"):
            layer()  # and again on every later forward


def test_a_file_of_another_size_is_raised_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    files = [jpeg(i) for i in range(8)]
    files[5] = jpeg(5, size=(H + 2, W))
    layer = data_layer(write_db(tmp_path / "db", files), {}, rand_skip=0)
    with ReaderPool(decode=DecodeOptions(2, processes="off")) as pool:
        attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        layer()
        with pytest.raises(DataError, match=r"record '00000005_img5.jpg' is uint8 \[3, 14, 10\] "
                                            r"but the first record is uint8 \[3, 12, 10\]"):
            layer()


def test_a_failing_worker_is_one_line_from_forward(jpeg_db, monkeypatch):
    db, _, _ = jpeg_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)

    def broken(*args):
        raise MemoryError("no room\nat all")

    monkeypatch.setattr(BatchImages, "_decode_into", broken)
    layer = data_layer(db, {})
    with ReaderPool(decode=DecodeOptions(3, processes="off")) as pool:
        attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        with pytest.raises(DataError) as err:
            layer()
        assert str(err.value) == f"{db}: decoding failed (MemoryError: no room at all)"


def test_the_decode_threads_run_with_the_pool_and_stop_with_it(jpeg_db, monkeypatch):
    db, _, _ = jpeg_db
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    layer = data_layer(db, {})
    with ReaderPool(decode=DecodeOptions(3, processes="off")) as pool:
        attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        layer()
        names = sorted(t.name for t in pool.threads())
        assert [n for n in names if n.startswith("cpy-decode")] == [f"cpy-decode:{i}"
                                                                    for i in range(3)]
        threads = list(pool.threads())
    assert not any(t.is_alive() for t in threads)


def test_raw_databases_start_no_decode_threads(tmp_path):
    db = write_records(tmp_path / "db", [(np.zeros((3, 4, 4), np.uint8), i) for i in range(4)])
    layer = data_layer(db, {}, rand_skip=0)
    with ReaderPool(decode=DecodeOptions(4, processes="off")) as pool:
        attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        layer()
        assert not any(t.name.startswith("cpy-decode") for t in pool.threads())


# --- one batch's files, every kind of image ---------------------------------------------------
@pytest.mark.parametrize(("mode", "fmt", "color", "channels"), [
    ("RGB", "JPEG", None, 3), ("L", "JPEG", None, 1), ("L", "PNG", True, 3),
    ("RGB", "PNG", False, 1), ("RGBA", "PNG", None, 4), ("RGBA", "PNG", True, 3),
    ("P", "PNG", None, 3)])
def test_host_crops_are_the_reader_decoders_pixels(mode, fmt, color, channels):
    files = tuple(memoryview(jpeg(i, mode, fmt)) for i in range(6))
    tp = TransformationParameter(crop_size=7, mirror=True)
    t = Transformer(tp, "TRAIN", (channels, H, W), seed=9)
    choices = t.choices_for(4, 3, 6)
    workers = DecodeWorkers(2)
    workers.start()
    try:
        images = BatchImages("db", (channels, H, W), color, workers, DecodeOptions(2, "off"),
                             torch.device("cpu"))
        out = np.empty((6, channels, 7, 7), np.uint8)
        images.host(RecordBatch(4, 3, None, np.arange(6), (b"k",) * 6, files), choices, out)
    finally:
        workers.close()
    want = np.empty_like(out)
    t.host([decode_image(f, color=color) for f in files], choices, want)
    assert np.array_equal(out, want)
