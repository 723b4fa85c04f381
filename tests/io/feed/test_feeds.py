"""attach_feeds, feed_of and swap_feed: the one place that knows Data layers; and the narrow
interfaces of the data pipeline (no module reaches into another's private names)."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from support import write_records

from caffe_py.errors import DataError
from caffe_py.io import ReaderPool, attach_feeds, feed_of, swap_feed
from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

ROOT = Path(__file__).resolve().parents[3]


pytestmark = pytest.mark.usefixtures("no_stray_threads")


def make_db(path, n: int) -> str:
    return write_records(path, ((np.full((1, 2, 2), i, np.uint8), i) for i in range(n)))


class TwoDataLayers:
    """A net with a data layer and a label-only layer reading one database."""

    def __init__(self, db):
        self.layers = [self._layer(db, "data", ["data", "label"], 2),
                       self._layer(db, "labels", ["data2"], 3)]

    @staticmethod
    def _layer(db, name, tops, batch_size):
        spec = parse_layer({"name": name, "type": "Data", "top": tops,
                            "data_param": {"source": db, "batch_size": batch_size}},
                           Source(), "layer")
        return lookup("Data")(spec, [], BuildContext())

    def data_layers(self):
        return list(self.layers)


def test_attach_feeds_gives_every_data_layer_a_feed_started_and_closed_with_the_pool(tmp_path):
    net = TwoDataLayers(make_db(tmp_path / "db", 5))
    assert [feed_of(layer) for layer in net.layers] == [None, None]
    with ReaderPool() as pool:
        feeds = attach_feeds(net, pool, device="cpu", seed=4)
        assert [feed_of(layer) for layer in net.layers] == feeds
        assert [f.name for f in feeds] == ["TRAIN/data#0", "TRAIN/labels#0"]
        assert [f.transformer.seed for f in feeds] == [4, 4]
        pool.start()
        assert len(list(pool.threads())) == 3  # one producer for the database, a thread a feed
        assert net.layers[0]()[1].tolist() == [0, 1]
        assert net.layers[1]().shape == (3, 1, 2, 2)  # its own stream: records 0, 1, 2
        assert net.layers[1]()[:, 0, 0, 0].tolist() == [3, 4, 0]
    assert not any(t.is_alive() for t in pool.threads())


def test_no_feed_or_reader_is_added_after_the_pool_started(tmp_path):
    net = TwoDataLayers(make_db(tmp_path / "db", 5))
    with ReaderPool() as pool:
        pool.start()
        with pytest.raises(DataError, match="cannot attach a reader after the pool has started"):
            attach_feeds(net, pool, seed=0)
        with pytest.raises(DataError, match="cannot add a data feed after the pool has started"):
            pool.manage(feed_of(net.layers[0]))


def test_swap_feed_hands_back_the_feed_it_replaced(tmp_path):
    class Constant:
        def next(self):
            return torch.zeros(2, 1, 2, 2), torch.tensor([7, 7])

    net = TwoDataLayers(make_db(tmp_path / "db", 5))
    layer = net.layers[0]
    with ReaderPool() as pool:
        (real, _) = attach_feeds(net, pool, seed=0)
        pool.start()
        constant = Constant()
        assert swap_feed(layer, constant) is real
        assert feed_of(layer) is constant and layer()[1].tolist() == [7, 7]
        assert swap_feed(layer, real) is constant
        assert layer()[1].tolist() == [0, 1]  # the real feed consumed nothing meanwhile
        assert pool.state_dict()[net.layers[0].param("data_param").source]["TRAIN/data"] == \
            {"replicas": 1, "origin": 0, "next": [2]}


# --- narrow interfaces ------------------------------------------------------------------------
# (No room reaches another room's private attributes, the reader's queues included: that rule is
# package-wide, in tests/test_layering.py. Here: the feed's attribute stays the data layer's.)
def private_reaches(path: Path) -> list[str]:
    """``x._name`` in ``path`` where x is not self or cls."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__") and \
                not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_data_layer_holds_its_feed():
    """Other code reads and swaps a Data layer's feed through feed_of / swap_feed."""
    hits = []
    for path in sorted((ROOT / "caffe_py").rglob("*.py")) + sorted((ROOT / "benchmarks")
                                                                   .rglob("*.py")):
        if path.name != "data.py" or path.parent.name != "layers":
            hits += [h for h in private_reaches(path) if h.endswith("._feed")]
    assert hits == []
