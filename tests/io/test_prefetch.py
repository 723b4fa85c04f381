"""Prefetcher: batches in order, transformed on the device, failures raised in the loop."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from caffe_py.errors import DataError
from caffe_py.io.datum import datum_from_array, encode_datum
from caffe_py.io.lmdb_store import LmdbWriter
from caffe_py.io.reader import ReaderPool
from caffe_py.io.transformer import Transformer
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

SHAPE = (3, 6, 6)


@pytest.fixture(autouse=True)
def no_stray_threads():
    before = threading.active_count()
    yield
    assert threading.active_count() == before


def make_db(path, n: int, corrupt: int | None = None) -> tuple[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(n)]
    with LmdbWriter(path) as writer:
        for i, array in enumerate(arrays):
            value = encode_datum(datum_from_array(array, 100 + i))
            writer.put(b"%08d" % i, b"\x0a\xff" if i == corrupt else value)
    return str(path), arrays


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
            (feed,) = pool.attach(type("Net", (), {"data_layers": lambda self: [layer]})(),
                                  device=device, seed=11)
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("transform", [{"scale": 0.5}, {}, {"mirror": True,
                                                           "mean_value": [1, 2, 3]}])
def test_cuda_ring_gives_the_cpu_feeds_batches(tmp_path, transform):
    """More batches than the ring has slots, all kept: every one equals the CPU feed's (the
    one-op float path, the plain conversion, and flips with a mean)."""
    db, _ = make_db(tmp_path / "db", 10)
    out = {}
    for device in ("cpu", "cuda"):
        spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                            "data_param": {"source": db, "batch_size": 4},
                            "transform_param": transform}, Source(), "layer")
        layer = lookup("Data")(spec, [], BuildContext(phase="TRAIN"))
        with ReaderPool() as pool:
            pool.attach_layer(layer, device=device, seed=5)
            pool.start()
            out[device] = [layer() for _ in range(11)]
        torch.cuda.synchronize()
    for (data, label), (want, want_label) in zip(out["cuda"], out["cpu"], strict=True):
        assert data.device.type == "cuda" and data.dtype == torch.float32
        assert torch.equal(data.cpu(), want) and torch.equal(label.cpu(), want_label)


def test_a_corrupt_record_is_raised_by_forward_naming_the_key(tmp_path):
    db, _ = make_db(tmp_path / "db", 10, corrupt=5)
    layer = data_layer(db)
    with ReaderPool() as pool:
        pool.attach(type("Net", (), {"data_layers": lambda self: [layer]})())
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
    pool.attach(type("Net", (), {"data_layers": lambda self: [layer]})())
    with pytest.raises(DataError, match="the data feed TRAIN/data#0 has not started; call "
                                        r"ReaderPool.start\(\)"):
        layer()
    pool.start()
    assert layer().shape == (4, 3, 4, 4)  # a single top: data only
    pool.close()
    with pytest.raises(DataError, match="reader was closed|feed TRAIN/data#0 stopped"):
        for _ in range(10):  # batches already prefetched may still come out
            layer()


def _pipeline_batch(db, transform, batch_size=2):
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": batch_size},
                        "transform_param": transform}, Source(), "layer")
    layer = lookup("Data")(spec, [], BuildContext(phase="TEST"))
    with ReaderPool() as pool:
        pool.attach(type("Net", (), {"data_layers": lambda self: [layer]})())
        pool.start()
        return layer, layer()


def test_encoded_images_decode_in_bgr_or_forced_gray(tmp_path):
    import io

    from PIL import Image

    from caffe_py.io.datum import Datum

    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 10, 20, 30  # R, G, B
    png = io.BytesIO()
    Image.fromarray(rgb).save(png, format="PNG")
    with LmdbWriter(tmp_path / "db") as writer:
        for i in range(2):
            writer.put(b"%d" % i, encode_datum(Datum(data=png.getvalue(), label=i,
                                                     encoded=True)))
    db = str(tmp_path / "db")
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
    with LmdbWriter(tmp_path / "db") as writer:
        for i in range(3):
            writer.put(b"%d" % i, encode_datum(datum_from_array(values + i, i)))
    layer, (data, label) = _pipeline_batch(str(tmp_path / "db"),
                                           {"scale": 2.0, "mean_value": [0.5]}, batch_size=3)
    assert layer.record_dtype == np.float32
    want = torch.from_numpy(np.stack([(values + i - 0.5) * 2 for i in range(3)]))
    torch.testing.assert_close(data, want, rtol=0, atol=0)
