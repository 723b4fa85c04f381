"""Input, DummyData and Data layers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import write_db, write_records

from caffe_py.errors import DataError, NetError
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

pytestmark = pytest.mark.usefixtures("no_stray_threads")


def build(node: dict, bottom_shapes=(), phase="TRAIN", seed=0):
    spec = parse_layer(node, Source(), "layer")
    ctx = BuildContext(phase=phase, generator=torch.Generator().manual_seed(seed))
    return lookup(spec.type)(spec, list(bottom_shapes), ctx)


# --- Input ----------------------------------------------------------------------------------
def test_input_one_shape_for_every_top():
    layer = build({"name": "in", "type": "Input", "top": ["a", "b"],
                   "input_param": {"shape": {"dim": [2, 3]}}})
    assert layer.top_shapes == [(2, 3), (2, 3)]


def test_input_returns_provided_tensors_by_name():
    layer = build({"name": "in", "type": "Input", "top": ["data", "label"],
                   "input_param": {"shape": [{"dim": [2, 1, 4, 4]}, {"dim": [2]}]}})
    assert layer.top_shapes == [(2, 1, 4, 4), (2,)]
    x, y = torch.arange(48.0).view(3, 1, 4, 4), torch.tensor([0, 1, 2])
    layer.provide_named({"label": y, "data": x})
    out = layer()
    assert out[0] is x and out[1] is y


def test_input_without_tensors_is_an_error():
    layer = build({"name": "in", "type": "Input", "top": "data",
                   "input_param": {"shape": {"dim": [1, 2]}}})
    with pytest.raises(NetError, match="layer 'in' \\(Input\\): has no input tensors; pass"):
        layer()


def test_input_checks_counts_and_axes():
    with pytest.raises(NetError, match="input_param.shape has 2 entries for 3 tops"):
        build({"name": "in", "type": "Input", "top": ["a", "b", "c"],
               "input_param": {"shape": [{"dim": [1]}, {"dim": [2]}]}})
    layer = build({"name": "in", "type": "Input", "top": ["a"],
                   "input_param": {"shape": {"dim": [1, 2]}}})
    with pytest.raises(NetError, match=r"input 'a' has shape \[3\]; expected 2 axes like \[1, 2\]"):
        layer.provide(torch.zeros(3))
    with pytest.raises(NetError, match="no tensor given for input\\(s\\) a"):
        layer.provide_named({"b": torch.zeros(1, 2)})


# --- DummyData ------------------------------------------------------------------------------
def test_dummy_data_default_is_constant_zero_and_the_same_tensor():
    layer = build({"name": "d", "type": "DummyData", "top": "x",
                   "dummy_data_param": {"shape": {"dim": [2, 3]}}})
    first, second = layer(), layer()
    assert first is second
    assert torch.equal(first, torch.zeros(2, 3))


def test_dummy_data_legacy_shape_and_per_top_fillers():
    layer = build({"name": "d", "type": "DummyData", "top": ["x", "y"],
                   "dummy_data_param": {
                       "num": 2, "channels": [3, 1], "height": 4, "width": 5,
                       "data_filler": [{"type": "constant", "value": 7},
                                       {"type": "uniform", "min": 1, "max": 2}]}})
    assert layer.top_shapes == [(2, 3, 4, 5), (2, 1, 4, 5)]
    x1, y1 = layer()
    x2, y2 = layer()
    assert x1 is x2 and torch.equal(x1, torch.full((2, 3, 4, 5), 7.0))
    # non-constant fillers are drawn again on every forward
    assert not torch.equal(y1, y2)
    assert float(y1.min()) >= 1.0 and float(y1.max()) <= 2.0


def test_dummy_data_random_fillers_are_seeded():
    node = {"name": "d", "type": "DummyData", "top": "x",
            "dummy_data_param": {"shape": {"dim": [4]}, "data_filler": {"type": "gaussian"}}}
    a, b, c = build(node, seed=3), build(node, seed=3), build(node, seed=4)
    first = a()
    assert torch.equal(first, b())
    assert not torch.equal(first, c())


def test_dummy_data_count_errors():
    with pytest.raises(NetError, match="dummy_data_param.data_filler has 2 entries for 3 tops"):
        build({"name": "d", "type": "DummyData", "top": ["a", "b", "c"],
               "dummy_data_param": {"shape": {"dim": [1]},
                                    "data_filler": [{"value": 1}, {"value": 2}]}})
    with pytest.raises(NetError, match="dummy_data_param.channels has 2 entries for 3 tops"):
        build({"name": "d", "type": "DummyData", "top": ["a", "b", "c"],
               "dummy_data_param": {"num": 1, "channels": [1, 2], "height": 1, "width": 1}})


def test_dummy_data_refuses_an_empty_top_and_a_sparse_filler_past_its_outputs():
    """A 0-sized batch ended in the loss's reshape error; a gaussian filler's sparse above the
    top's first dimension in torch's Bernoulli error at the first forward."""
    with pytest.raises(NetError) as info:
        build({"name": "d", "type": "DummyData", "top": ["a", "b"],
               "dummy_data_param": {"shape": [{"dim": [0, 3]}, {"dim": [0]}]}})
    assert str(info.value).endswith("layer 'd' (DummyData): top 'a' has the shape [0, 3], with "
                                    "nothing in it; give every dimension >= 1")
    with pytest.raises(NetError) as info:
        build({"name": "d", "type": "DummyData", "top": ["a"],
               "dummy_data_param": {"shape": {"dim": [4, 3]},
                                    "data_filler": {"type": "gaussian", "sparse": 9}}})
    assert str(info.value).endswith("layer 'd' (DummyData): top 'a': gaussian filler's sparse 9 "
                                    "is more than the blob's 4 outputs (sparse / outputs is the "
                                    "chance a weight is kept); use sparse <= 4")
    with pytest.raises(NetError) as info:
        build({"name": "ip", "type": "InnerProduct", "bottom": "x", "top": "y",
               "inner_product_param": {"num_output": 2, "weight_filler": {
                   "type": "gaussian", "sparse": 1000}}}, [(2, 4)])
    assert str(info.value).endswith("layer 'ip' (InnerProduct): blob 'weight': gaussian "
                                    "filler's sparse 1000 is more than the blob's 2 outputs "
                                    "(sparse / outputs is the chance a weight is kept); use "
                                    "sparse <= 2")


# --- Data -----------------------------------------------------------------------------------
def make_db(path, shape=(3, 10, 12), n=3, floats=False) -> str:
    dtype = np.float32 if floats else np.uint8
    return write_records(path, ((np.full(shape, i, dtype), i) for i in range(n)))


def data_node(db, tops=("data", "label"), **transform):
    return {"name": "mnist", "type": "Data", "top": list(tops),
            "data_param": {"source": db, "batch_size": 5}, "transform_param": transform}


def test_data_shapes_come_from_the_first_record(tmp_path):
    db = make_db(tmp_path / "db")
    layer = build(data_node(db))
    assert layer.top_shapes == [(5, 3, 10, 12), (5,)]
    assert (layer.record_shape, layer.record_dtype) == ((3, 10, 12), np.uint8)
    cropped = build(data_node(db, tops=("data",), crop_size=8))
    assert cropped.top_shapes == [(5, 3, 8, 8)]
    floats = build(data_node(make_db(tmp_path / "f", floats=True)))
    assert floats.record_dtype == np.float32


def test_data_missing_database_names_the_path_and_the_fix(tmp_path):
    db = tmp_path / "fashion_mnist" / "train_lmdb"
    with pytest.raises(DataError, match=rf"^{db}: database not found; run `make data`$"):
        build(data_node(str(db)))
    other = tmp_path / "mine"
    with pytest.raises(DataError, match="database not found; create it with `cpy convert`"):
        build(data_node(str(other)))


def test_data_transform_errors_name_the_layer(tmp_path):
    db = make_db(tmp_path / "db")
    with pytest.raises(NetError, match=r"layer 'mnist' \(Data\): transform_param.crop_size 11 "
                                       r"is larger than the records \(3 x 10 x 12\)"):
        build(data_node(db, crop_size=11))
    with pytest.raises(NetError, match=r"crop_size is set in both data_param and "
                                       r"transform_param; keep transform_param.crop_size only"):
        build({**data_node(db, crop_size=4),
               "data_param": {"source": db, "batch_size": 5, "crop_size": 8}})


def test_data_moves_deprecated_data_param_fields_into_the_transform(tmp_path):
    db = make_db(tmp_path / "db")
    layer = build({**data_node(db, scale=0.5),
                   "data_param": {"source": db, "batch_size": 5, "crop_size": 8,
                                  "mirror": True}})
    assert layer.top_shapes[0] == (5, 3, 8, 8)
    t = layer.transform
    assert (t.crop_size, t.mirror, t.scale) == (8, True, 0.5)
    assert layer.param("transform_param").crop_size == 0  # the spec is left as written


def test_data_without_a_feed_is_a_clear_error(tmp_path):
    layer = build(data_node(make_db(tmp_path / "db")))
    with pytest.raises(NetError, match=r"layer 'mnist' \(Data\): has no data feed attached; "
                                       r"start the data pipeline"):
        layer()


def test_data_returns_the_feed_batches(tmp_path):
    class Feed:
        def next(self):
            return torch.ones(5, 3, 10, 12), torch.arange(5)

    both = build(data_node(make_db(tmp_path / "db")))
    both.attach(Feed())
    data, label = both()
    assert data.shape == (5, 3, 10, 12) and label.tolist() == [0, 1, 2, 3, 4]
    only = build(data_node(str(tmp_path / "db"), tops=("data",)))
    only.attach(Feed())
    assert only().shape == (5, 3, 10, 12)


class OneLayerNet:
    """A net of one data layer, as far as attach_feeds looks."""

    def __init__(self, layer):
        self.layer = layer

    def data_layers(self):
        return [self.layer]


def make_leveldb(path, shape=(3, 10, 12), n=3) -> str:
    from caffe_py.io.formats.datum import datum_from_array

    return write_db(path, [datum_from_array(np.full(shape, i, np.uint8), i) for i in range(n)],
                    backend="leveldb")


def test_data_reads_leveldb_as_lmdb_and_names_the_other_kind(tmp_path):
    pytest.importorskip("plyvel")
    from caffe_py.io import ReaderPool, attach_feeds

    lev, lm = make_leveldb(tmp_path / "lev", n=4), make_db(tmp_path / "lm", n=4)
    batches = {}
    for db, backend in ((lev, "LEVELDB"), (lm, "LMDB")):
        node = data_node(db, crop_size=4)
        node["data_param"]["backend"] = backend
        layer = build(node, phase="TEST")

        with ReaderPool() as pool:
            attach_feeds(OneLayerNet(layer), pool, seed=0)
            pool.start()
            batches[backend] = [layer() for _ in range(2)]
    for (a, la), (b, lb) in zip(batches["LEVELDB"], batches["LMDB"], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert batches["LMDB"][1][1].tolist() == [1, 2, 3, 0, 1]  # wrapped after record 3
    node = data_node(lm)
    node["data_param"]["backend"] = "LEVELDB"
    with pytest.raises(DataError) as err:
        build(node)
    assert str(err.value) == f"{lm}: is an LMDB database, not LevelDB; set data_param.backend: LMDB"
