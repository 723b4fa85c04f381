"""Prefetcher and the in-loop gather: batches in order, transformed on the device, failures raised
in the loop, the same batches from the threads and from the loop."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import data_net, lockstep_batches, write_db, write_records

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.io.feed.transformer import Transformer
from caffe_py.io.formats.datum import datum_from_array
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

SHAPE = (3, 6, 6)


pytestmark = pytest.mark.usefixtures("no_stray_threads")


def make_db(path, n: int, corrupt: int | None = None) -> tuple[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(n)]
    replace = {corrupt: b"\x0a\xff"} if corrupt is not None else None
    return write_records(path, ((a, 100 + i) for i, a in enumerate(arrays)), replace), arrays


def data_layer(db, phase="TRAIN", batch_size=4, tops=("data", "label")):
    spec = parse_layer({"name": "data", "type": "Data", "top": list(tops),
                        "data_param": {"source": db, "batch_size": batch_size, "prefetch": 2},
                        "transform_param": {"crop_size": 4, "mirror": True, "scale": 0.5,
                                            "mean_value": [10, 20, 30]}},
                       Source(), "layer")
    return lookup("Data")(spec, [], BuildContext(phase=phase))


def expected(layer, arrays, positions, seed, device="cpu"):
    t = Transformer(layer.param("transform_param"), layer.phase, SHAPE, seed=seed)
    return t([arrays[p % len(arrays)] for p in positions], positions).to(device)


def check_batches(device: str):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        db, arrays = make_db(f"{tmp}/db", 10)
        layer = data_layer(db)
        with ReaderPool() as pool:
            (feed,) = attach_feeds(data_net(layer), pool, device=device, seed=11)
            pool.start()
            batches = [layer() for _ in range(5)]
            first = batches[0][0].clone()
            assert feed.delivered == 5
        for step, (data, label) in enumerate(batches):
            positions = list(range(4 * step, 4 * step + 4))
            assert data.device.type == device and label.device.type == device
            assert data.dtype == torch.float32 and label.dtype == torch.int64
            assert data.shape == (4, 3, 4, 4)
            assert label.tolist() == [100 + p % 10 for p in positions]
            torch.testing.assert_close(data, expected(layer, arrays, positions, 11, device),
                                       rtol=0, atol=0)
        assert torch.equal(batches[0][0], first)  # no buffer reuse behind the loop's back


def test_batches_in_order_transformed_on_cpu():
    check_batches("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_in_order_transformed_on_cuda():
    check_batches("cuda")


def _cpu_and_cuda_batches(db: str, transform: dict, n: int) -> tuple[dict, dict]:
    """``n`` batches of 4 of a Data layer over ``db`` fed on the CPU and on CUDA (seed 5),
    and each device's feed."""
    out, feeds = {}, {}
    for device in ("cpu", "cuda"):
        spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                            "data_param": {"source": db, "batch_size": 4},
                            "transform_param": transform}, Source(), "layer")
        layer = lookup("Data")(spec, [], BuildContext(phase="TRAIN"))
        with ReaderPool() as pool:
            (feeds[device],) = attach_feeds(data_net(layer), pool, device=device, seed=5)
            pool.start()
            out[device] = [layer() for _ in range(n)]
        torch.cuda.synchronize()
    return out, feeds


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("transform", [{"scale": 0.5}, {}, {"mirror": True,
                                                           "mean_value": [1, 2, 3]}])
def test_cuda_ring_gives_the_cpu_feeds_batches(tmp_path, transform):
    """More batches than the ring has slots, all kept: every one equals the CPU feed's (the
    one-op float path, the plain conversion, and flips with a mean)."""
    db, _ = make_db(tmp_path / "db", 10)
    out, _ = _cpu_and_cuda_batches(db, transform, 11)
    for (data, label), (want, want_label) in zip(out["cuda"], out["cpu"], strict=True):
        assert data.device.type == "cuda" and data.dtype == torch.float32
        assert torch.equal(data.cpu(), want) and torch.equal(label.cpu(), want_label)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_whole_records_cropped_on_the_device_give_the_cpu_feeds_batches(tmp_path,
                                                                        monkeypatch):
    """Random crops of records at most WHOLE_RATIO times the crop (6 x 6 -> 5 x 5) cross
    whole and are cropped on the device: every batch equals the CPU feed's, over several
    passes of a database read again each pass (runs of records split across batches)."""
    from caffe_py.io.reader import reader

    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    monkeypatch.setattr(reader, "CHUNK", 3)  # runs of 3 records: batches of 4 span two
    db, _ = make_db(tmp_path / "db", 10)
    transform = {"crop_size": 5, "mirror": True, "scale": 0.5, "mean_value": [10, 20, 30]}
    out, feeds = _cpu_and_cuda_batches(db, transform, 9)
    assert {device: feed._whole for device, feed in feeds.items()} == {"cpu": False,
                                                                       "cuda": True}
    for (data, label), (want, want_label) in zip(out["cuda"], out["cpu"], strict=True):
        assert data.shape == (4, 3, 5, 5)
        assert torch.equal(data.cpu(), want) and torch.equal(label.cpu(), want_label)


def test_a_corrupt_record_is_raised_by_forward_naming_the_key(tmp_path):
    db, _ = make_db(tmp_path / "db", 10, corrupt=5)
    layer = data_layer(db)
    with ReaderPool() as pool:
        attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        assert layer()[1].tolist() == [100, 101, 102, 103]
        for _ in range(2):  # the second batch, and every call after it
            with pytest.raises(DataError, match=f"^{db}: record '00000005' is not a Caffe "
                                                "Datum"):
                layer()


def test_forward_before_start_and_after_close(tmp_path):
    db, _ = make_db(tmp_path / "db", 10)
    layer = data_layer(db, tops=("data",))
    pool = ReaderPool()
    attach_feeds(data_net(layer), pool, seed=0)
    with pytest.raises(DataError, match="the data feed TRAIN/data#0 has not started; call "
                                        r"ReaderPool.start\(\)"):
        layer()
    pool.start()
    assert layer().shape == (4, 3, 4, 4)  # a single top: data only
    pool.close()
    with pytest.raises(DataError, match="reader was closed|feed TRAIN/data#0 stopped"):
        for _ in range(10):  # batches already prefetched may still come out
            layer()


def test_close_wakes_a_feed_waiting_for_a_free_slot(tmp_path, monkeypatch):
    """The ring is full and the thread waits for a slot: closing wakes it at once (with the
    wait slice made a minute long, only the wake-up can end the thread within the join)."""
    from caffe_py.io.feed import prefetch

    monkeypatch.setattr(prefetch, "WAIT_SLICE_S", 60.0)
    monkeypatch.setattr(prefetch, "JOIN_TIMEOUT_S", 5.0)
    monkeypatch.setattr(prefetch, "DIRECT_BYTES", 0)  # the feed keeps its thread
    db, _ = make_db(tmp_path / "db", 10)
    layer = data_layer(db)
    with ReaderPool() as pool:
        (feed,) = attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        layer()
        pool.settle()
        assert not feed.gathers_in_loop
        threads = list(pool.threads())
    assert [t.name for t in threads if t.is_alive()] == []


def _pipeline_batch(db, transform, batch_size=2):
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": batch_size},
                        "transform_param": transform}, Source(), "layer")
    layer = lookup("Data")(spec, [], BuildContext(phase="TEST"))
    with ReaderPool() as pool:
        attach_feeds(data_net(layer), pool, seed=0)
        pool.start()
        return layer, layer()


def test_encoded_images_decode_in_bgr_or_forced_gray(tmp_path):
    import io

    from PIL import Image

    from caffe_py.io.formats.datum import Datum

    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 10, 20, 30  # R, G, B
    png = io.BytesIO()
    Image.fromarray(rgb).save(png, format="PNG")
    db = write_db(tmp_path / "db", [Datum(data=png.getvalue(), label=i, encoded=True)
                                    for i in range(2)], key=b"%d")
    layer, (data, label) = _pipeline_batch(db, {})
    assert layer.top_shapes[0] == (2, 3, 2, 3)
    assert data[0, :, 0, 0].tolist() == [30.0, 20.0, 10.0]  # BGR, as OpenCV gives Caffe
    assert label.tolist() == [0, 1]
    gray_layer, (gray, _) = _pipeline_batch(db, {"force_gray": True})
    assert gray_layer.top_shapes[0] == (2, 1, 2, 3)
    # ITU-R 601 luma, as both OpenCV and Pillow compute it
    assert gray[0, 0, 0, 0].item() == round(0.299 * 10 + 0.587 * 20 + 0.114 * 30)


def test_float_records_flow_through_as_floats(tmp_path):
    values = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3) / 7
    db = write_db(tmp_path / "db", [datum_from_array(values + i, i) for i in range(3)], key=b"%d")
    layer, (data, label) = _pipeline_batch(db,
                                           {"scale": 2.0, "mean_value": [0.5]}, batch_size=3)
    assert layer.record_dtype == np.float32
    want = torch.from_numpy(np.stack([(values + i - 0.5) * 2 for i in range(3)]))
    torch.testing.assert_close(data, want, rtol=0, atol=0)


# --- gathering in the training thread once the database is kept decoded -----------------------
def _run_replicas(db, transform, device, steps, *, direct, monkeypatch, state=None,
                  direct_bytes=1 << 20, local=2, offset=0, total=None, phase="TRAIN",
                  gatherers=None):
    """``steps`` lockstep iterations of ``local`` replicas (global ``offset`` .. of ``total``;
    batch 3 of a 10-record database, rand_skip so the stream starts mid-database): their
    batches, the pool state, whether the feeds went direct, and whether any pool thread was
    alive at the end. ``gatherers`` (a list) receives the class name of each feed's in-loop
    gather."""
    from caffe_py.io.feed import gather, prefetch

    monkeypatch.setattr(prefetch, "DIRECT_BYTES", direct_bytes if direct else 0)
    with pytest.MonkeyPatch.context() as this_run:
        if not direct:  # nor from a database kept on the device (this run only)
            this_run.setattr(gather, "RESIDENT_BYTES", 0)
        return _replicas(db, transform, device, steps, state, local, offset, total, phase,
                         gatherers)


def _replicas(db, transform, device, steps, state, local, offset, total, phase, gatherers):
    layers = []
    for _ in range(local):
        spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                            "data_param": {"source": db, "batch_size": 3, "rand_skip": 7},
                            "transform_param": transform}, Source(), "layer")
        layers.append(lookup("Data")(spec, [], BuildContext(phase=phase)))
    with ReaderPool(replicas=local, replica_offset=offset, total_replicas=total) as pool:
        feeds, batches = lockstep_batches(pool, layers, steps, device=device, state=state)
        went = [f.gathers_in_loop for f in feeds]
        if gatherers is not None:
            gatherers += [type(f.gatherer).__name__ for f in feeds]
        for thread in pool.threads() if all(went) else ():
            thread.join(2.0)  # the producer stops on its next look at the queues
        alive = any(t.is_alive() for t in pool.threads())
        return batches, pool.state_dict(), went, alive


def check_direct_matches_threaded(tmp_path, monkeypatch, device):
    from caffe_py.io.formats.blobproto import blob_from_array, write_blob_file

    db, _ = make_db(tmp_path / "db", 10)
    mean = np.random.default_rng(1).uniform(0, 255, SHAPE).astype(np.float32)
    write_blob_file(tmp_path / "mean.binaryproto", blob_from_array(mean[None]))
    mean_file = str(tmp_path / "mean.binaryproto")
    # on CUDA the random transforms are staged from the host, the fixed ones (no mirror, no
    # crop or TEST's centre crop) slice the database kept on the device
    for transform, phase, kind in (
            ({"crop_size": 4, "mirror": True, "scale": 0.25, "mean_file": mean_file}, "TRAIN",
             "StagedGather"),
            ({"mirror": True, "mean_value": [10, 20, 30]}, "TRAIN", "StagedGather"),
            ({"scale": 0.5}, "TRAIN", "DeviceGather"),
            ({"crop_size": 4, "scale": 0.25, "mean_file": mean_file}, "TEST", "DeviceGather")):
        def run(direct, steps, state=None, transform=transform, phase=phase, kinds=None):
            return _run_replicas(db, transform, device, steps, direct=direct,
                                 monkeypatch=monkeypatch, state=state, phase=phase,
                                 gatherers=kinds)

        kinds: list[str] = []
        threaded, t_state, t_direct, _ = run(False, 12)
        gathered, g_state, g_direct, alive = run(True, 12, kinds=kinds)
        assert kinds == [kind if device == "cuda" else "HostGather"] * 2
        assert t_direct == [False, False] and g_direct == [True, True]
        assert not alive  # the feed threads stopped, and the producer with them
        assert g_state == t_state  # 12 x 3 records per replica: 7 passes over 10 records
        for step, (want, got) in enumerate(zip(threaded, gathered, strict=True)):
            for (data, label), (w_data, w_label) in zip(got, want, strict=True):
                assert torch.equal(label, w_label), (transform, step)
                assert torch.equal(data, w_data), (transform, step)
        # a run resumed from the gathered run's state goes on with the threaded run's batches
        more, _, _, _ = run(False, 16)
        resumed, _, resumed_direct, _ = run(True, 4, g_state)
        assert resumed_direct == [True, True]  # the first pass of a resumed run is 20 records
        for want, got in zip(more[12:], resumed, strict=True):
            assert all(torch.equal(a, b) for g, w in zip(got, want, strict=True)
                       for a, b in zip(g, w, strict=True))


def test_direct_gathering_gives_the_threads_batches_on_cpu(tmp_path, monkeypatch):
    check_direct_matches_threaded(tmp_path, monkeypatch, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_direct_gathering_gives_the_threads_batches_on_cuda(tmp_path, monkeypatch):
    check_direct_matches_threaded(tmp_path, monkeypatch, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_database_over_the_device_share_is_staged_with_the_same_batches(tmp_path,
                                                                          monkeypatch):
    from caffe_py.io.feed import gather

    db, _ = make_db(tmp_path / "db", 10)
    runs = {}
    for limit in (1 << 20, 10 * (3 * 6 * 6 + 8) - 1):  # the database's bytes, and a byte short
        monkeypatch.setattr(gather, "RESIDENT_BYTES", limit)
        kinds: list[str] = []
        runs[limit] = _run_replicas(db, {"scale": 0.5}, "cuda", 9, direct=True,
                                    monkeypatch=monkeypatch, gatherers=kinds)[0]
        assert kinds == ["DeviceGather" if limit == 1 << 20 else "StagedGather"] * 2
    resident, staged = runs.values()
    for want, got in zip(staged, resident, strict=True):
        assert all(torch.equal(a, b) for g, w in zip(got, want, strict=True)
                   for a, b in zip(g, w, strict=True))


def test_big_batches_or_uncached_databases_stay_on_the_threads(tmp_path, monkeypatch):
    from caffe_py.io.feed import prefetch
    from caffe_py.io.reader import reader

    db, _ = make_db(tmp_path / "db", 10)
    batches, _, went, alive = _run_replicas(db, {}, "cpu", 8, direct=True,
                                            monkeypatch=monkeypatch,
                                            direct_bytes=3 * 3 * 6 * 6 - 1)  # a byte short
    assert prefetch.DIRECT_BYTES == 3 * 3 * 6 * 6 - 1
    assert went == [False, False] and alive
    monkeypatch.setattr(reader, "CACHE_BYTES", 0)
    uncached, _, went, alive = _run_replicas(db, {}, "cpu", 8, direct=True,
                                             monkeypatch=monkeypatch)
    assert went == [False, False] and alive
    assert all(torch.equal(a[0][0], b[0][0]) for a, b in zip(batches, uncached, strict=True))


def test_direct_gathering_in_a_slice_of_a_larger_round_robin(tmp_path, monkeypatch):
    """A pool holding global replicas 1 and 2 of 4 (several hosts): the loop gathers the
    records the threads hand those replicas, and the same state."""
    db, _ = make_db(tmp_path / "db", 10)
    transform = {"crop_size": 4, "mirror": True, "mean_value": [10, 20, 30]}
    runs = [_run_replicas(db, transform, "cpu", 9, direct=direct, monkeypatch=monkeypatch,
                          local=2, offset=1, total=4) for direct in (False, True)]
    (threaded, t_state, t_went, _), (gathered, g_state, g_went, _) = runs
    assert t_went == [False, False] and g_went == [True, True]
    assert g_state == t_state
    assert g_state[db]["TRAIN/data"]["next"] == [1 + 4 * 27, 2 + 4 * 27]
    for want, got in zip(threaded, gathered, strict=True):
        assert all(torch.equal(a, b) for g, w in zip(got, want, strict=True)
                   for a, b in zip(g, w, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_staged_cuda_batches_stay_valid_when_kept_and_across_streams(tmp_path, monkeypatch):
    """On CUDA the loop stages k batches per copy and hands out views of them: batches kept
    over several stages keep their values, and a current stream changed mid-stage (the side
    stream below) still gets the CPU feed's batches."""
    from caffe_py.io.feed import gather

    monkeypatch.setattr(gather, "STAGE_BATCHES", 3)
    db, _ = make_db(tmp_path / "db", 10)
    transform = {"crop_size": 4, "mirror": True, "scale": 0.5, "mean_value": [10, 20, 30]}
    want, _, went, _ = _run_replicas(db, transform, "cpu", 16, direct=True,
                                     monkeypatch=monkeypatch, local=1)
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": 3, "rand_skip": 7},
                        "transform_param": transform}, Source(), "layer")
    layer = lookup("Data")(spec, [], BuildContext(phase="TRAIN"))
    side = torch.cuda.Stream()
    with ReaderPool() as pool:
        (feed,) = attach_feeds(data_net(layer), pool, device="cuda", seed=3)
        pool.start()
        kept = []
        for step in range(16):
            if 9 <= step < 12:
                with torch.cuda.stream(side):
                    kept.append(layer())
            else:
                kept.append(layer())
        assert feed.gathers_in_loop and feed.gatherer.k == 3
        torch.cuda.synchronize()
    assert went == [True]
    for step, ((data, label), [(w_data, w_label)]) in enumerate(zip(kept, want, strict=True)):
        assert torch.equal(label.cpu(), w_label), step
        assert torch.equal(data.cpu(), w_data), step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_big_batches_of_a_database_kept_on_the_device_are_gathered_there(tmp_path,
                                                                         monkeypatch):
    """A batch over DIRECT_BYTES still leaves the threads on CUDA where the database stays on
    the device (a fixed transform): the gather is the device's, with the threads' batches; a
    random transform keeps them on the threads."""
    db, _ = make_db(tmp_path / "db", 10)
    short = 3 * 3 * 6 * 6 - 1  # a batch's bytes, less one
    for transform, goes in (({"scale": 0.5}, True), ({"mirror": True}, False)):
        threaded, t_state, _, _ = _run_replicas(db, transform, "cuda", 9, direct=False,
                                                monkeypatch=monkeypatch)
        kinds: list[str] = []
        got, g_state, went, _ = _run_replicas(db, transform, "cuda", 9, direct=True,
                                              monkeypatch=monkeypatch, direct_bytes=short,
                                              gatherers=kinds)
        assert went == [goes, goes] and g_state == t_state
        assert kinds == (["DeviceGather"] * 2 if goes else ["NoneType"] * 2)
        for want, step in zip(threaded, got, strict=True):
            assert all(torch.equal(a, b) for g, w in zip(step, want, strict=True)
                       for a, b in zip(g, w, strict=True))


class _Unregistering:
    """torch.cuda.cudart()'s stand-in: records cudaHostUnregister's pointers."""

    def __init__(self):
        self.unregistered = []

    def cudaHostUnregister(self, ptr):
        self.unregistered.append(ptr)
        return 0


def _shared_slot(used: bool, synchronize):
    """A ring slot over a shared buffer (its CUDA parts stood in for), as _HostSlot makes it
    for the decode processes: the slot, its buffer's path and the buffer's address."""
    from pathlib import Path

    from caffe_py.io.decoders.decode_processes import SHM_DIR, shared_buffer
    from caffe_py.io.feed.prefetch import _HostSlot

    slot = object.__new__(_HostSlot)
    slot.shared = shared_buffer(4096, "db")
    slot.host = torch.frombuffer(slot.shared.buf, dtype=torch.uint8, count=4096)
    slot.data, slot.label = slot.host.numpy()[:4000], slot.host.numpy()[4000:].view(np.int64)
    slot.used = used
    slot.done = type("Event", (), {"synchronize": staticmethod(synchronize)})()
    return slot, Path(SHM_DIR) / slot.shared.name.lstrip("/"), slot.host.data_ptr()


@pytest.mark.parametrize("used", [True, False])
def test_a_shared_slot_is_unregistered_unmapped_and_removed_after_its_last_copy(monkeypatch,
                                                                                  used):
    waited, cudart = [], _Unregistering()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    slot, path, address = _shared_slot(used, lambda: waited.append(True))
    assert path.exists()
    slot.release()
    assert waited == [True] * used and cudart.unregistered == [address]
    assert not path.exists() and slot.shared is None and not hasattr(slot, "host")
    slot.release()  # once
    assert cudart.unregistered == [address]


def test_a_slot_of_a_failed_device_is_removed_but_stays_mapped(monkeypatch):
    """The device's error is the run's to report; its copy may never end, so the slot's
    buffer is not unmapped under it."""
    def failed():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cudart = _Unregistering()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    slot, path, _ = _shared_slot(True, failed)
    buffer = slot.shared
    slot.release()
    assert not path.exists() and slot.shared is None and cudart.unregistered == []
    slot.host[:3] = 7   # still mapped
    assert slot.data[:3].tolist() == [7, 7, 7]
    del slot.host, slot.data, slot.label
    buffer.close()
