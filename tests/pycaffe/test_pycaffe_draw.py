"""caffe_py.pycaffe.draw: pycaffe's Graphviz graph of a net, exactly as BVLC's draws it (the
draw_net fixtures hold the source BVLC's pycaffe rendered)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("google.protobuf")
pytest.importorskip("pydot")

from google.protobuf import text_format  # noqa: E402

import caffe_py.pycaffe as caffe  # noqa: E402
from caffe_py.pycaffe import draw  # noqa: E402
from caffe_py.pycaffe.proto import caffe_pb2  # noqa: E402

HERE = Path(__file__).resolve().parent
LENET = HERE.parents[1] / "tools" / "oracles" / "pycaffe" / "caffe_tree" / "examples" / \
    "mnist" / "lenet_train_test.prototxt"


@pytest.mark.parametrize("fixture, kwargs", [
    ("draw_net", {"rankdir": "LR"}),
    ("draw_net-test-phase", {"rankdir": "TB", "phase": caffe.TEST, "display_lrm": True}),
])
def test_the_graph_is_bvlc_pycaffes(fixture, kwargs):
    net = caffe_pb2.NetParameter()
    text_format.Merge(LENET.read_text(), net)
    graph = draw.get_pydot_graph(net, kwargs.pop("rankdir"), **kwargs)
    texts = json.loads((HERE / "fixtures" / fixture / "texts.json").read_text())
    assert "pydot: " + graph.to_string() == texts[0]


def test_labels_and_lr_mults():
    layer = caffe_pb2.LayerParameter(name="c", type="Convolution")
    layer.convolution_param.kernel_size.append(3)
    layer.param.add(lr_mult=0.5)
    assert draw.get_layer_label(layer, "TB", display_lrm=True) == \
        '"c (Convolution) kernel size: 3 stride: 1 pad: 0 lr mult: 0.5, 1.0"'
    assert draw.get_layer_lr_mult(layer) == (0.5, 1.0)
    with pytest.raises(ValueError, match="^ReLU layers do not have a learning rate multiplier$"):
        draw.get_layer_lr_mult(caffe_pb2.LayerParameter(type="ReLU"))
