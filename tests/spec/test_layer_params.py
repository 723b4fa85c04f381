"""The table of layer types and their parameter blocks (caffe_py.spec.layer_params)."""
from __future__ import annotations

import pytest

from caffe_py.errors import SpecError
from caffe_py.spec import layer_params
from caffe_py.spec.layer_params.common import SoftmaxParameter
from caffe_py.spec.layer_params.loss import LossParameter
from caffe_py.spec.layer_params.vision import ConvolutionParameter
from caffe_py.spec.schema import Source


def test_blocks_in_the_order_the_layer_reads_them():
    assert dict(layer_params.blocks("SoftmaxWithLoss")) == {
        "loss_param": LossParameter, "softmax_param": SoftmaxParameter}
    assert dict(layer_params.blocks("Deconvolution")) == {
        "convolution_param": ConvolutionParameter}
    assert dict(layer_params.blocks("Split")) == {}
    with pytest.raises(TypeError):  # the table is changed by declare, never through a view
        layer_params.blocks("Split")["x_param"] = object


def test_unknown_type_names_the_place_and_the_nearest():
    with pytest.raises(SpecError) as err:
        layer_params.blocks("Convolutoin", src=Source("net.yaml"), line=4, path="layer[0].type")
    assert str(err.value) == (
        "net.yaml:4: layer[0].type: unknown layer type 'Convolutoin'; did you mean "
        "'Convolution'?")


def test_takes_block():
    assert layer_params.takes_block("pooling_param")
    assert not layer_params.takes_block("poolin_param")


def test_declare_and_undeclare_a_type():
    layer_params.declare("Probe", {"softmax_param": SoftmaxParameter})
    try:
        assert "Probe" in layer_params.known_types()
        with pytest.raises(RuntimeError) as err:
            layer_params.declare("Probe", {})
        assert str(err.value) == \
            "layer type 'Probe' is already declared, with blocks softmax_param"
    finally:
        layer_params.undeclare("Probe")
    assert "Probe" not in layer_params.known_types()
    with pytest.raises(RuntimeError, match="'Pooling' is already declared, with blocks "
                                           "pooling_param"):
        layer_params.declare("Pooling", {})


def type_error(text: str) -> str:
    from caffe_py.spec.net_spec import parse_net
    from caffe_py.spec.yamlio import loads
    with pytest.raises(SpecError) as err:
        parse_net(loads(text, "net.yaml"), Source("net.yaml"))
    return str(err.value)


def test_a_fork_type_names_its_fork_and_the_bvlc_form():
    assert type_error("name: n\nlayer:\n  - {name: a, type: MKLBatchNorm}\n") == (
        "net.yaml:3: layer[0].type: 'MKLBatchNorm' is a layer of Intel's Caffe fork, not of "
        "BVLC Caffe; use BatchNorm followed by Scale with bias_term: true, or port it as a "
        "Python layer (type: Python, python_param: {module, layer})")
    assert type_error("name: n\nlayer:\n  - {name: a, type: ReLU6}\n") == (
        "net.yaml:3: layer[0].type: 'ReLU6' is a layer of MobileNet-YOLO's Caffe fork, not of "
        "BVLC Caffe; use Clip with clip_param {min: 0, max: 6}, or port it as a Python layer "
        "(type: Python, python_param: {module, layer})")
    assert type_error("name: n\nlayer:\n  - {name: a, type: Proposal}\n") == (
        "net.yaml:3: layer[0].type: 'Proposal' is a layer of several Faster R-CNN Caffe forks, "
        "not of BVLC Caffe; use py-faster-rcnn's Python layer: type: Python, python_param "
        "{module: rpn.proposal_layer, layer: ProposalLayer}")


def test_a_fork_type_is_not_suggested_toward_a_bvlc_type():
    # 'Correlation' is close to no BVLC name: the fork is named
    message = type_error("name: n\nlayer:\n  - {name: a, type: Correlation}\n")
    assert message.startswith("net.yaml:3: layer[0].type: 'Correlation' is a layer of "
                              "FlowNet 2.0's Caffe fork")
    assert "did you mean" not in message


def test_every_unsupported_type_of_a_file_in_one_error():
    assert type_error(
        "name: n\nlayer:\n"
        "  - {name: a, type: Yolov3DetectionOutput}\n"
        "  - {name: b, type: Convolution, convolution_param: {num_output: 1}}\n"
        "  - {name: c, type: Yolov3DetectionOutput}\n"
        "  - {name: d, type: Convlution}\n"
        "  - {name: e, type: Zebra}\n") == (
        "net.yaml:3: layer[0].type: the net uses 3 layer types caffe-py does not have: "
        "'Yolov3DetectionOutput' (MobileNet-YOLO's Caffe fork; lines 3, 5), 'Convlution' "
        "(unknown; did you mean 'Convolution'?; line 6), 'Zebra' (unknown; line 7); replace "
        "them with BVLC Caffe 1.0 layers (docs/layers.md) or port them as "
        "Python layers (type: Python)")


def test_an_unknown_type_with_no_near_name_points_at_the_docs():
    assert type_error("name: n\nlayer:\n  - {name: a, type: Zebra}\n") == (
        "net.yaml:3: layer[0].type: unknown layer type 'Zebra'; caffe-py has BVLC Caffe 1.0's "
        "layer types (docs/layers.md lists them) and Python layers (type: Python)")


def test_a_bvlc_type_caffe_py_lacks_says_so(monkeypatch):
    monkeypatch.delitem(layer_params.LAYER_PARAMS, "Tile")
    assert type_error("name: n\nlayer:\n  - {name: a, type: Tile}\n") == (
        "net.yaml:3: layer[0].type: 'Tile' is a BVLC Caffe 1.0 layer type that caffe-py does "
        "not have yet; replace it with other layers, or port it as a Python layer (type: "
        "Python, python_param: {module, layer})")


def test_the_fork_table_holds_no_bvlc_type():
    from caffe_py.spec.layer_params.forks import BVLC_TYPES, FORKS, REPOSITORIES
    for fork, types in FORKS.items():
        assert not set(types) & BVLC_TYPES, fork
    assert set(REPOSITORIES) == set(FORKS)


def test_every_type_caffe_py_has_beyond_bvlc_names_its_fork():
    """The table says whose every non-BVLC type is (docs/layers.md names it); no fix is kept
    for a type caffe-py has."""
    from caffe_py.spec.layer_params.forks import BVLC_TYPES, FIXES, forks_of
    ours = set(layer_params.LAYER_PARAMS) - BVLC_TYPES
    assert [t for t in sorted(ours) if not forks_of(t)] == []
    assert not set(FIXES) & set(layer_params.LAYER_PARAMS)
